"""A minimal list+watch cache of raw custom objects, for the KubeVirt simulator.

The simulator must react to events the way virt-controller's informers do (not by polling):
list, then watch from the list's resourceVersion, resume after server-side timeouts, and relist
on 410 Gone. Objects are kept as plain dicts keyed by (namespace, name).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.rest import ApiException

log = structlog.get_logger(__name__)

Key = tuple[str, str]
Obj = dict[str, Any]
OnEvent = Callable[[str, Obj], None]


def key_of(obj: Obj) -> Key:
    md = obj.get("metadata") or {}
    return (str(md.get("namespace") or ""), str(md.get("name") or ""))


class Informer:
    """Keeps `store` in sync with one cluster-wide custom resource and calls `on_event(type, obj)`."""

    def __init__(
        self, api: ApiClient, group: str, version: str, plural: str, on_event: OnEvent,
        watch_timeout_seconds: int = 240,
    ) -> None:
        self._co = client.CustomObjectsApi(api)
        self._gvp = (group, version, plural)
        self._on_event = on_event
        self._timeout = watch_timeout_seconds
        self.store: dict[Key, Obj] = {}
        self.synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"informer-{self._gvp[2]}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _relist(self) -> str:
        group, version, plural = self._gvp
        resp = await self._co.list_cluster_custom_object(group, version, plural)
        fresh = {key_of(o): o for o in resp.get("items", [])}
        for k, old in list(self.store.items()):
            if k not in fresh:
                del self.store[k]
                self._on_event("DELETED", old)
        for k, o in fresh.items():
            kind = "MODIFIED" if k in self.store else "ADDED"
            self.store[k] = o
            self._on_event(kind, o)
        self.synced.set()
        return str(resp["metadata"]["resourceVersion"])

    async def _run(self) -> None:
        group, version, plural = self._gvp
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    rv = await self._relist()
                async with watch.Watch() as w:
                    async for ev in w.stream(
                        self._co.list_cluster_custom_object, group, version, plural,
                        resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=self._timeout,
                    ):
                        typ, obj = ev["type"], ev["raw_object"]
                        rv = str(obj.get("metadata", {}).get("resourceVersion") or rv)
                        if typ == "BOOKMARK":
                            continue
                        k = key_of(obj)
                        if typ == "DELETED":
                            self.store.pop(k, None)
                        else:
                            self.store[k] = obj
                        self._on_event(typ, obj)
            except asyncio.CancelledError:
                raise
            except ApiException as e:
                if e.status == 410:
                    rv = None  # history compacted: relist
                    continue
                if e.status == 429:  # a just-Established CRD is not served yet; retry shortly
                    rv = None
                    await asyncio.sleep(0.2)
                    continue
                log.warning("informer watch failed", resource=plural, status=e.status, reason=e.reason)
                rv = None
                await asyncio.sleep(0.5)
            except Exception as e:  # connection drops while the apiserver restarts, etc.
                log.warning("informer watch failed", resource=plural, error=repr(e))
                rv = None
                await asyncio.sleep(0.5)
