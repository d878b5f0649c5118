"""The revision store: one Secret per source in licensectl's own namespace (docs/design.md#safe-rotation).

It holds the bytes of the stable and the candidate source revision (so a namespace can get the
stable token back after the hoster overwrote the source) and the rotation record as annotations.
Tenants cannot read licensectl's namespace; the bytes never leave this Secret except into replicas.
Writes are guarded by resourceVersion: a leader that lost its lease, or planned from a stale cache,
gets 409 and decides again from what the cluster says.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from licensectl import logs
from licensectl.core import render
from licensectl.core.model import (
    ANN_SOURCE_NAME,
    ANN_SOURCE_NAMESPACE,
    REVISION_STORE_LABEL,
    ObjectRef,
    RevisionStore,
    SourceSecret,
)
from licensectl.core.replication import SourceRevisions
from licensectl.core.rotation import Decision, RotationRecord, content_revision
from licensectl.kube.api import CoreV1Api
from licensectl.kube.errors import Conflict
from licensectl.kube.raw import RawApi

log = logs.get(__name__)

PREFIX = "licensectl-revisions-"
PART_OF_LABEL = "app.kubernetes.io/part-of"
SLOTS = ("stable", "candidate")


def store_name(source: ObjectRef) -> str:
    """`licensectl-revisions-<16 hex>`: fixed length whatever the source's names."""
    return PREFIX + hashlib.sha256(f"{source.namespace}/{source.name}".encode()).hexdigest()[:16]


def live_revision(source: SourceSecret | None, token_key: str) -> str | None:
    """The content revision of the live source, or None when it is no usable content (the same checks
    the renderer makes; the replication reports why): such a source never becomes a candidate."""
    if source is None or isinstance(render.source_content(source, token_key), render.SourceProblem):
        return None
    return content_revision(source.data[token_key], source.data.get(render.SOURCE_GRIDD_CONF_KEY))


def _slot_keys(slot: str) -> tuple[str, str]:
    return f"{slot}.token", f"{slot}.gridd.conf"


def slot_source(store: RevisionStore, slot: str, *, live: SourceSecret, token_key: str) -> SourceSecret | None:
    """The stable or candidate bytes, shaped as the source Secret they were copied from (so the
    renderer treats both alike); None when the slot is empty."""
    tk, ck = _slot_keys(slot)
    token = store.data.get(tk)
    if token is None:
        return None
    data = {token_key: token}
    if ck in store.data:
        data[render.SOURCE_GRIDD_CONF_KEY] = store.data[ck]
    return SourceSecret(live.namespace, live.name, live.uid, live.resource_version, MappingProxyType(data),
                        live.annotations)


def stores_by_source(stores: Iterable[RevisionStore]) -> dict[ObjectRef, RevisionStore]:
    """The stores keyed by the source they name; a Secret whose name is not its source's store name
    (a copy, a hand-made one) is no store."""
    out: dict[ObjectRef, RevisionStore] = {}
    for store in stores:
        ref = store.source
        if ref is not None and store.name == store_name(ref):
            out[ref] = store
    return out


def source_rotations(stores: Mapping[ObjectRef, RevisionStore], live: Mapping[ObjectRef, SourceSecret | None], *,
                     token_key: str) -> dict[ObjectRef, SourceRevisions]:
    """Per source with a readable record: the record and the bytes it names (what replication renders
    from). A source without one is left out: replication then changes nothing for it (unknown, not
    "no revision"). The controller and the CLI's offline view read stores through this one function."""
    out: dict[ObjectRef, SourceRevisions] = {}
    for ref, store in stores.items():
        src = live.get(ref)
        rec = RotationRecord.from_annotations(store.annotations)
        if src is None or rec is None:
            continue
        stable = slot_source(store, "stable", live=src, token_key=token_key)
        if stable is None:
            continue
        cand = slot_source(store, "candidate", live=src, token_key=token_key) if rec.candidate else None
        out[ref] = SourceRevisions(rec, stable, cand)
    return out


def slot_revision(store: RevisionStore, slot: str) -> str | None:
    tk, ck = _slot_keys(slot)
    token = store.data.get(tk)
    return None if token is None else content_revision(token, store.data.get(ck))


@dataclass(frozen=True, slots=True)
class StoreBody:
    namespace: str
    name: str
    annotations: Mapping[str, str]
    data: Mapping[str, bytes]
    resource_version: str  # "" creates

    def __repr__(self) -> str:
        return f"StoreBody({self.namespace}/{self.name}, keys={sorted(self.data)})"

    def as_object(self, source: ObjectRef) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": self.name, "namespace": self.namespace,
            "labels": {REVISION_STORE_LABEL: "true", PART_OF_LABEL: "licensectl"},
            "annotations": {ANN_SOURCE_NAMESPACE: source.namespace, ANN_SOURCE_NAME: source.name,
                            **self.annotations},
        }
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta,
                "data": {k: base64.b64encode(v).decode("ascii") for k, v in self.data.items()}}


def store_body(*, namespace: str, source: ObjectRef, existing: RevisionStore | None, decision: Decision,
               live: SourceSecret | None, token_key: str) -> StoreBody | None:
    """The store after `decision`; None when the bytes it needs are not there (never a record whose
    revisions the store cannot back)."""
    rec: RotationRecord | None = decision.record
    if rec is None:
        return None
    data = dict(existing.data) if existing is not None else {}
    if decision.promote:
        for src, dst in zip(_slot_keys("candidate"), _slot_keys("stable"), strict=True):
            if src in data:
                data[dst] = data[src]
            else:
                data.pop(dst, None)
    if decision.snapshot is not None:
        if live is None:
            return None
        tk, ck = _slot_keys(decision.snapshot)
        data[tk] = live.data[token_key]
        if render.SOURCE_GRIDD_CONF_KEY in live.data:
            data[ck] = live.data[render.SOURCE_GRIDD_CONF_KEY]
        else:
            data.pop(ck, None)
    if not rec.candidate:
        for k in _slot_keys("candidate"):
            data.pop(k, None)
    # The record may only name revisions whose bytes it holds.
    probe = RevisionStore(namespace, store_name(source), "", "", {}, MappingProxyType(data))
    if slot_revision(probe, "stable") != rec.stable:
        return None
    if rec.candidate and slot_revision(probe, "candidate") != rec.candidate:
        return None
    return StoreBody(namespace, store_name(source), rec.annotations(), MappingProxyType(data),
                     existing.resource_version if existing is not None else "")


async def write_store(api: CoreV1Api, body: StoreBody, source: ObjectRef) -> bool:
    """Create or replace (guarded by resourceVersion); False on a conflict (decide again)."""
    raw = RawApi(api)
    try:
        if body.resource_version:
            await raw.replace_namespaced_secret(body.name, body.namespace, body.as_object(source))
        else:
            await raw.create_namespaced_secret(body.namespace, body.as_object(source))
    except Conflict:
        log.info("revision store changed since the decision; deciding again", store=body.name)
        return False
    return True
