"""Raw-JSON calls through kubernetes-asyncio's generated APIs.

Typed models are slow to build and Secrets' data has no business in them, so the shell asks for
the raw response (`_preload_content=False`). kubernetes-asyncio then does *not* raise on HTTP
errors, so this wrapper restores that: any non-2xx status raises ApiException (with the status
and reason only — the body of a failed Secret write is not carried into logs).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio.client import ApiException


async def checked(call: Awaitable[Any]) -> dict[str, Any]:
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
            doc = json.loads(raw)
        except ValueError:
            doc = None
    if not 200 <= status <= 299:
        reason = doc.get("reason") if isinstance(doc, dict) else None
        raise ApiException(status=status, reason=str(reason or "HTTPError"))
    return doc if isinstance(doc, dict) else {}


class RawApi:
    """`RawApi(CoreV1Api(c)).read_namespaced_secret(...)` -> dict, raising ApiException on errors."""

    def __init__(self, api: Any) -> None:
        self._api = api

    def __getattr__(self, name: str) -> Callable[..., Awaitable[dict[str, Any]]]:
        method = getattr(self._api, name)

        async def call(*args: Any, **kwargs: Any) -> dict[str, Any]:
            kwargs["_preload_content"] = False
            return await checked(method(*args, **kwargs))

        return call
