"""Raw-JSON calls: a response read into a dict, any non-2xx status raised as ApiException.

The exception carries the status and reason only — the body of a failed Secret write is not carried
into logs. `RawApi` wraps licensectl's own API classes (kube/api.py) and, in the test kit and the dev
cluster, kubernetes-asyncio's generated ones; for those it raises the library's own ApiException, so
code there keeps catching one exception family for all its calls.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

from licensectl.kube import jsoncodec
from licensectl.kube.api import ApiException


def error_type(api: Any) -> type[Exception]:
    """ApiException, or kubernetes-asyncio's for one of its generated APIs (already imported then)."""
    library = sys.modules.get("kubernetes_asyncio.client")
    if library is not None and type(api).__module__.startswith("kubernetes_asyncio."):
        found: type[Exception] = library.ApiException
        return found
    return ApiException


async def checked(call: Awaitable[Any], *, error: type[Exception] = ApiException) -> dict[str, Any]:
    resp = await call
    try:
        status = int(getattr(resp, "status", 0) or 0)
        raw = await resp.read()
    finally:
        release = getattr(resp, "release", None)
        if release is not None:
            release()
    doc: Any = None
    if raw:
        try:
            doc = jsoncodec.loads(raw)
        except ValueError:
            doc = None
    if not 200 <= status <= 299:
        reason = doc.get("reason") if isinstance(doc, dict) else None
        raise error(status=status, reason=str(reason or "HTTPError"))  # type: ignore[call-arg]
    return doc if isinstance(doc, dict) else {}


class RawApi:
    """`RawApi(CoreV1Api(c)).read_namespaced_secret(...)` -> dict, raising ApiException on errors."""

    def __init__(self, api: Any) -> None:
        self._api = api
        self._error = error_type(api)

    def __getattr__(self, name: str) -> Callable[..., Awaitable[dict[str, Any]]]:
        method = getattr(self._api, name)

        async def call(*args: Any, **kwargs: Any) -> dict[str, Any]:
            kwargs["_preload_content"] = False
            return await checked(method(*args, **kwargs), error=self._error)

        return call
