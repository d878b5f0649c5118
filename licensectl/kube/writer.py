"""Replica Secret writes: create, update, delete — only ever on Secrets licensectl owns.

Every write is idempotent and guarded: updates carry the observed resourceVersion (optimistic
concurrency; on 409 the object is re-read and ownership re-checked before one more try), deletes
carry uid + resourceVersion preconditions so a Secret replaced behind our back is never removed.
A Secret under a replica's name without licensectl's marks is a conflict and is left untouched.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from licensectl import logs
from licensectl.core.model import ANN_CLASS, MANAGED_BY_LABEL, MANAGED_BY_VALUE
from licensectl.core.ports import ObservedMeta, SecretBody, WriteResult
from licensectl.kube.api import CoreV1Api, absent_on_404
from licensectl.kube.errors import Conflict, NotFound
from licensectl.kube.raw import RawApi

log = logs.get(__name__)


def _encode(data: Mapping[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode("ascii") for k, v in data.items()}


def is_owned(meta: Mapping[str, Any]) -> bool:
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    return labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE and ANN_CLASS in annotations


def merged_body(current: Mapping[str, Any] | None, want: SecretBody) -> dict[str, Any]:
    """Full object for create/replace: our labels/annotations win, others' extra ones are kept."""
    meta = dict((current or {}).get("metadata") or {})
    labels = dict(meta.get("labels") or {})
    labels.update(want.labels)
    annotations = dict(meta.get("annotations") or {})
    annotations.update(want.annotations)
    out_meta: dict[str, Any] = {"name": want.name, "namespace": want.namespace, "labels": labels,
                                "annotations": annotations}
    if current is not None:
        out_meta["resourceVersion"] = meta.get("resourceVersion")
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": out_meta,
            "data": _encode(want.data)}


class SecretWriter:
    def __init__(self, api: CoreV1Api, *, dry_run: bool = False, retries: int = 3) -> None:
        self._api: Any = RawApi(api)
        self._dry_run = dry_run
        self._retries = retries

    async def _read(self, namespace: str, name: str) -> dict[str, Any] | None:
        raw: dict[str, Any] | None = await absent_on_404(self._api.read_namespaced_secret(name, namespace))
        return raw

    async def create(self, want: SecretBody) -> WriteResult:
        if self._dry_run:
            return WriteResult.DRY_RUN
        try:
            await self._api.create_namespaced_secret(want.namespace, merged_body(None, want))
            return WriteResult.CREATED
        except Conflict:
            pass
        # AlreadyExists: someone (maybe us, before a crash) holds the name. Decide from the object.
        return await self.update(want, observed=None)

    async def update(self, want: SecretBody, observed: ObservedMeta | None) -> WriteResult:
        """Replace the replica if it is ours and differs.

        With `observed` (labels/annotations/resourceVersion from the watch cache) the first try is a
        single PUT guarded by that resourceVersion; only on 409 do we re-read and re-check ownership.
        """
        if self._dry_run:
            return WriteResult.DRY_RUN
        current: dict[str, Any] | None = observed.as_object() if observed is not None else None
        for attempt in range(self._retries):
            if current is None or attempt > 0:
                current = await self._read(want.namespace, want.name)
            if current is None:
                try:
                    await self._api.create_namespaced_secret(want.namespace, merged_body(None, want))
                    return WriteResult.CREATED
                except Conflict:
                    continue
            meta = current.get("metadata") or {}
            if not is_owned(meta):
                return WriteResult.CONFLICT
            body = merged_body(current, want)
            if "data" in current and body["data"] == (current.get("data") or {}) and body["metadata"][
                    "labels"] == (meta.get("labels") or {}) and body["metadata"]["annotations"] == (
                    meta.get("annotations") or {}):
                return WriteResult.UNCHANGED
            try:
                await self._api.replace_namespaced_secret(want.name, want.namespace, body)
                return WriteResult.UPDATED
            except (Conflict, NotFound) as e:
                log.debug("replica changed under us, re-reading", namespace=want.namespace, name=want.name,
                          status=e.status)
        return WriteResult.ERROR

    async def delete(self, namespace: str, name: str, uid: str) -> WriteResult:
        """Delete only the exact object observed (uid + resourceVersion) and only if it is ours."""
        if self._dry_run:
            return WriteResult.DRY_RUN
        for _ in range(self._retries):
            current = await self._read(namespace, name)
            if current is None:
                return WriteResult.GONE
            meta = current.get("metadata") or {}
            if not is_owned(meta):
                return WriteResult.CONFLICT
            if meta.get("uid") != uid:
                return WriteResult.GONE  # a different object now holds the name; the next pass decides
            body = {"apiVersion": "v1", "kind": "DeleteOptions",
                    "preconditions": {"uid": uid, "resourceVersion": meta.get("resourceVersion")}}
            try:
                if await absent_on_404(self._api.delete_namespaced_secret(name, namespace, body=body)) is None:
                    return WriteResult.GONE
                return WriteResult.DELETED
            except Conflict:
                pass  # changed since the read: read it again
        return WriteResult.ERROR
