"""The offline fallback of `licensectl status` and `rollout status`: the state recomputed from the cluster.

Used only when the controller cannot be reached: one paged LIST per resource (or, for `rollout status
--watch`, informers), the same pure planners and the same rotation records from the revision stores,
but this workstation's settings and no guest states.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from licensectl import config
from licensectl.cli.status_fetch import VIEW_OFFLINE, ControllerUnreachable, class_fields, token_problem
from licensectl.controllers.replication_loop import class_status
from licensectl.controllers.settings import rollout_settings, rotation_settings, tenant_settings
from licensectl.core import tokeninfo
from licensectl.core.credentials import keyring_from_secret_data
from licensectl.core.delivery import DeliveryView, wanted_volumes
from licensectl.core.model import (
    ANN_REVISION,
    ANN_SOURCE_REVISION,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    REVISION_STORE_LABEL,
    ObjectRef,
    RevisionStore,
    SourceSecret,
)
from licensectl.core.render import ReplicaState
from licensectl.core.replication import ReplicationInputs, ReplicationPlan, plan_replication
from licensectl.core.revision_text import short
from licensectl.core.rollout import (
    ReplicaRevision,
    RolloutPlan,
    SourceControl,
    plan_rollout,
)
from licensectl.core.rollout.view import rollout_json, rotation_json
from licensectl.core.rotation import RotationRecord
from licensectl.kube import contract, projections
from licensectl.kube import revision_store as rs
from licensectl.kube.api import AnyClient, ApiException, CoreV1Api, CustomObjectsApi
from licensectl.kube.caches import Caches
from licensectl.kube.errors import Forbidden
from licensectl.kube.raw import RawApi, checked
from licensectl.kube.signing_key import SECRET_NAME

Projection = Callable[[Mapping[str, Any]], Any]

# `rollout status --watch` offline: how long the informers may take to fill their caches.
SYNC_TIMEOUT = 60.0


async def list_all(call: Callable[..., Any], projection: Projection, **kw: Any) -> list[Any]:
    """Every object of a paged LIST, projected; raises on any failed page (never a partial view)."""
    out: list[Any] = []
    token: str | None = None
    while True:
        args = dict(kw, limit=500)
        if token:
            args["_continue"] = token
        doc = await checked(call(**args, _preload_content=False))
        for item in doc.get("items") or []:
            p = projection(item)
            if p is not None:
                out.append(p)
        token = (doc.get("metadata") or {}).get("continue") or None
        if not token:
            return out


@dataclass
class ClusterView:
    replication: ReplicationPlan
    rollout: RolloutPlan
    sources: dict[ObjectRef, SourceSecret | None]
    now: dt.datetime
    # The rotation records (None: the revision stores could not be read, so replicas of rotated
    # sources are judged against the live source, as before safe rotation).
    records: dict[ObjectRef, RotationRecord | None] | None = None
    settings: config.Settings | None = None


def offline_rotations(records: Mapping[ObjectRef, RotationRecord | None] | None,
                      settings: config.Settings | None) -> dict[str, Any]:
    """`rotations` as the controller's status has them, from the records the offline read found
    (no wave progress: that needs the guest reports only the controller holds)."""
    if records is None or settings is None:
        return {}
    st = rotation_settings(settings)
    return {str(ref): ({"phase": "invalid"} if rec is None else
                       rotation_json(rec, steps=st.steps, canary=not st.canary.none))
            for ref, rec in sorted(records.items(), key=lambda kv: str(kv[0]))}


async def read_stores(core: CoreV1Api, settings: config.Settings) -> dict[ObjectRef, RevisionStore] | None:
    """The revision stores in licensectl's namespace by source; None when this user may not list them."""
    try:
        found = await list_all(lambda **kw: core.list_namespaced_secret(settings.namespace, **kw),
                               projections.revision_store_from, label_selector=f"{REVISION_STORE_LABEL}=true")
    except Forbidden:
        return None
    return rs.stores_by_source(found)


async def read_cluster(api: AnyClient, settings: config.Settings, now: dt.datetime | None = None) -> ClusterView:
    core, custom = CoreV1Api(api), CustomObjectsApi(api)
    now = now or dt.datetime.now(dt.UTC)
    namespaces = await list_all(core.list_namespace, projections.namespace_from)
    classes = await list_all(contract.gpu_class_lister(custom, settings), projections.gpu_class_from)
    claims = await list_all(contract.gpu_claim_lister(custom, settings), projections.gpu_claim_from)
    replicas = await list_all(core.list_secret_for_all_namespaces, projections.replica_secret_from,
                              label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")
    vms = await list_all(contract.vm_lister(custom), projections.vm_from)
    vmis = await list_all(contract.vmi_lister(custom), projections.vmi_from)
    sources: dict[ObjectRef, SourceSecret | None] = {}
    for c in classes:
        ref = c.secret_ref
        if c.mode != "vgpu" or ref is None or ref in sources:
            continue
        found = await list_all(lambda ns=ref.namespace, **kw: core.list_namespaced_secret(ns, **kw),
                               projections.source_secret_from, field_selector=f"metadata.name={ref.name}")
        sources[ref] = found[0] if found else None
    ring = None
    try:
        key = await RawApi(core).read_namespaced_secret(SECRET_NAME, settings.namespace)
        ring = keyring_from_secret_data({k: base64.b64decode(v) for k, v in (key.get("data") or {}).items()})
    except (ApiException, ValueError):
        ring = None
    # The same rotation records the controller renders replicas from, so a rotated namespace is not "drifted".
    stores = await read_stores(core, settings)
    rotations = None if stores is None else rs.source_rotations(stores, sources, token_key=settings.token_key)
    records = None if stores is None else {ref: RotationRecord.from_annotations(s.annotations)
                                           for ref, s in stores.items()}
    # The CA bundle replicas carry (kube/serving_tls.py), so replicas written with it compare in sync.
    report_ca = b""
    if not settings.reports_plain_http:
        try:
            tls = await RawApi(core).read_namespaced_secret(settings.tls_secret, settings.namespace)
            report_ca = base64.b64decode((tls.get("data") or {}).get("ca.crt") or "")
        except (ApiException, ValueError):
            report_ca = b""
    replication = plan_replication(ReplicationInputs(
        namespaces={n.name: n for n in namespaces}, classes={c.name: c for c in classes}, claims=claims,
        sources=sources, replicas={(r.namespace, r.name): r for r in replicas}, conflicts=frozenset(),
        credential_for=(lambda ns: ring.credential(ns)) if ring else (lambda ns: ""),
        report_url=config.report_url_for(settings), token_key=settings.token_key,
        tenant=tenant_settings(settings), now=now, report_ca=report_ca, rotations=rotations,
        steps=rotation_settings(settings).steps,
        credential_key=ring.current_id if ring else "", credential_epoch=ring.revocation if ring else ""))
    view = DeliveryView(claims={(c.namespace, c.name): c for c in claims}, classes={("", c.name): c for c in classes},
                        entitled=replication.entitlement.entitled if replication.entitlement else {},
                        replicas={(r.namespace, r.name): r for r in replicas})
    wanted = wanted_volumes(vmis, view)
    rollout = plan_rollout(
        replicas=[r for r in (ReplicaRevision.from_secret(s) for s in replicas) if r], vmis=vmis, vms=vms,
        guests={}, sources={ref: SourceControl.from_annotations(s.annotations) for ref, s in sources.items() if s},
        settings=rollout_settings(settings), now=now, wanted=wanted)
    return ClusterView(replication, rollout, sources, now, records, settings)


def status_json(view: ClusterView, guests: Mapping[str, Any] | None) -> dict[str, Any]:
    """`licensectl status` JSON recomputed from a cluster read: the offline fallback."""
    rep = view.replication
    ent = rep.entitlement.entitled if rep.entitlement else {}
    classes = class_status(rep)
    records = view.records or {}
    return {
        "sources": [{
            "class": cls, "source": str(lic_src), "valid": cls in rep.licenses,
            "source_revision": short(rep.licenses[cls].source_revision) if cls in rep.licenses else None,
            "token": _readability(view, lic_src, rep.licenses[cls].token) if cls in rep.licenses else None,
            "problem": rep.source_problems[cls].message if cls in rep.source_problems else
            token_problem(_readability(view, lic_src, rep.licenses[cls].token)) if cls in rep.licenses else None,
            "entitled_namespaces": sum(1 for (_, c) in ent if c == cls),
            **class_fields(classes.get(cls)),
        } for cls, lic_src in sorted({c: r for (_, c), r in ent.items()}.items())],
        "replicas": offline_replica_counts(rep),
        "tenant_problems": [{"kind": p.kind.value, "object": str(p.ref), "message": p.message}
                            for p in rep.tenant_problems],
        "rollouts": {str(ref): rollout_json(st, offline_source_revision(records.get(ref)))
                     for ref, st in sorted(view.rollout.sources.items(), key=lambda kv: str(kv[0]))},
        "rotations": offline_rotations(view.records, view.settings),
        "rotation_records_read": view.records is not None,
        "guests": guests,
    }


def labelled_offline(doc: Mapping[str, Any], reason: str) -> dict[str, Any]:
    """The offline view as `status` prints it: labelled partial, not authoritative, and why."""
    return {**doc, "from": "offline", "offline_reason": reason, "partial": True, "view": VIEW_OFFLINE,
            "authoritative": False}


def offline_replica_counts(rep: ReplicationPlan) -> dict[str, int]:
    """Replica states as the controller counts them, except that a replica carrying the revision and
    source revision its namespace should have counts as in sync: its report URL, credential and CA
    follow the deployed settings, which a workstation does not have (docs/operations.md#status-from-the-controller)."""
    counts = dict(rep.state_counts())
    for existing, desired in rep.updates:
        ann = existing.annotations
        if ann.get(ANN_REVISION) == desired.revision and \
                ann.get(ANN_SOURCE_REVISION) == desired.annotations.get(ANN_SOURCE_REVISION):
            counts[ReplicaState.DRIFTED.value] -= 1
            counts[ReplicaState.IN_SYNC.value] += 1
    return counts


def _readability(view: ClusterView, ref: ObjectRef, token: bytes) -> str:
    """Readable, unreadable or opaque (core/tokeninfo.py), as the controller's status says it."""
    src = view.sources.get(ref)
    return tokeninfo.readability(tokeninfo.token_info(token).format, src.annotations if src else {}).value


def offline_source_revision(rec: RotationRecord | None) -> str | None:
    """Offline, the rollout's source revision is the record's: the candidate while one is out, else stable."""
    if rec is None:
        return None
    return rec.candidate if rec.candidate and rec.phase.value in ("canary", "promoting", "promoted") else rec.stable


class WatchedCluster:
    """The offline fallback of `rollout status --watch`: one LIST per resource, then watches.

    Re-listing the whole cluster every second would load the apiserver like a controller per
    hoster terminal; informers keep the view current from watch events instead.
    """

    def __init__(self, api: AnyClient, settings: config.Settings, clock: Callable[[], dt.datetime]) -> None:
        self.settings = settings
        self.clock = clock
        self.caches = Caches(api, settings, on_change=lambda _kind: None)
        self.plan: RolloutPlan | None = None

    async def start(self) -> None:
        c = self.caches
        c.start()
        try:
            async with asyncio.timeout(SYNC_TIMEOUT):
                while True:
                    if c.core_synced() and c.kubevirt_healthy():
                        c.ensure_sources(self._wanted_sources())
                        if len(c.source_states()) == len(c.sources):
                            return
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise ControllerUnreachable(f"the cluster's caches did not sync within {SYNC_TIMEOUT:g} s") from None

    def _wanted_sources(self) -> set[ObjectRef]:
        return {gc.secret_ref for gc in self.caches.classes.snapshot().values()
                if gc.mode == "vgpu" and gc.secret_ref is not None}

    def records(self) -> dict[ObjectRef, RotationRecord | None]:
        stores = rs.stores_by_source(self.caches.revision_stores.cache.values())
        return {ref: RotationRecord.from_annotations(s.annotations) for ref, s in stores.items()}

    def rollouts(self) -> dict[str, Any]:
        c = self.caches
        c.ensure_sources(self._wanted_sources())
        assert c.vms is not None and c.vmis is not None
        replicas = [r for r in (ReplicaRevision.from_secret(s) for s in c.replicas.cache.values()) if r]
        plan = plan_rollout(
            replicas=replicas, vmis=list(c.vmis.snapshot().values()), vms=list(c.vms.snapshot().values()),
            guests={}, sources={ref: SourceControl.from_annotations(s.annotations)
                                for ref, s in c.source_states().items() if s is not None},
            settings=rollout_settings(self.settings), now=self.clock())
        self.plan = plan
        records = self.records()
        return {str(ref): rollout_json(st, offline_source_revision(records.get(ref)))
                for ref, st in plan.sources.items()}

    async def stop(self) -> None:
        await self.caches.stop()


