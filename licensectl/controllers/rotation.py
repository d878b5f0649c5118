"""The rotation reconcile: caches -> rotation.decide (pure) -> one guarded write of the revision store.

Only the leader writes. The record in the store is the one decision: replication renders every
replica from it (`rotations()`), the rollout restarts whatever the replicas changed, and this loop
reads back what happened (replicas' source revisions, the rollout's VMI states, guest reports) to
decide the next step (docs/design.md#safe-rotation).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from licensectl import config, logs
from licensectl.controllers.guests import GuestStore
from licensectl.controllers.planner import CacheCopies
from licensectl.controllers.settings import rotation_settings
from licensectl.core.guest_report import GuestState, LicenseState
from licensectl.core.model import (
    ANN_REVISION,
    ANN_SOURCE_REVISION,
    ObjectRef,
    ReplicaSecret,
    RevisionStore,
    SourceSecret,
    Vmi,
    source_of,
)
from licensectl.core.ports import (
    EventSink,
    InvolvedObject,
    RevisionStores,
    RotationCaches,
    RotationInputs,
    WallClock,
)
from licensectl.core.reasons import EventType, Reason
from licensectl.core.replication import ReplicationPlan, SourceRevisions
from licensectl.core.revision_text import short
from licensectl.core.rollout import RolloutPlan, SourceControl, VmiState
from licensectl.core.rollout.view import rotation_json
from licensectl.core.rotation import (
    ACTIVE,
    Decision,
    HosterControl,
    RotationPhase,
    RotationRecord,
    SourceView,
    WaveStatus,
    WaveVmi,
    can_change,
    decide,
    guest_evidence,
    wave_status,
)
from licensectl.kube.api import ApiException
from licensectl.metrics import GaugeSample, Metrics

log = logs.get(__name__)

PHASES = tuple(p.value for p in RotationPhase)


@dataclass(frozen=True, slots=True)
class _Ask:
    """One source whose record may change this pass, as read on the loop."""
    ref: ObjectRef
    store: RevisionStore | None
    record: RotationRecord | None
    live: SourceSecret | None
    live_rev: str | None
    control: HosterControl
    namespaces: frozenset[str]


@dataclass(frozen=True, slots=True)
class _Snapshot:
    rollout: RolloutPlan | None
    replicas: Mapping[tuple[str, str], ReplicaSecret]
    vmis: Mapping[tuple[str, str], Vmi]
    guests: Mapping[tuple[str, str], GuestState]
    evidence_at: dt.datetime


def source_object(ref: ObjectRef) -> InvolvedObject:
    return InvolvedObject("v1", "Secret", ref.namespace, ref.name)


class RotationController:
    def __init__(self, *, caches: RotationCaches, stores: RevisionStores, events: EventSink, metrics: Metrics,
                 settings: config.Settings, guests: GuestStore, clock: WallClock, inputs: RotationInputs) -> None:
        self.caches = caches
        self._stores = stores
        self.events = events
        self.metrics = metrics
        self.settings = settings
        self.rotation_settings = rotation_settings(settings)
        self.guests = guests
        self.clock = clock
        # The other loops' results: the replication and rollout plans, and what each VMI's replica holds now
        # (judged here, not at report time).
        self._inputs = inputs
        self._lock = asyncio.Lock()
        self._invalid: set[str] = set()  # stores already reported unreadable (one Event each)
        self.next_check: dt.datetime | None = None
        # source -> (VMIs of the running wave settled on the candidate, VMIs in it): `rollout status` progress.
        self._wave_progress: dict[ObjectRef, tuple[int, int]] = {}
        self._copies = CacheCopies()  # the snapshot's copies, once per cache generation

    # -- what replication reads -------------------------------------------------------------------
    def stores(self) -> dict[ObjectRef, RevisionStore]:
        return self._stores.by_source(self.caches.revision_stores.cache.values())

    def rotations(self) -> Mapping[ObjectRef, SourceRevisions]:
        """Per source with a readable record: the record and the bytes it names. A source without one
        is left out: replication then changes nothing for it (unknown, not "no revision")."""
        out: dict[ObjectRef, SourceRevisions] = {}
        live = self.caches.source_states()
        stores = self.stores()
        if self.settings.dry_run:
            # A dry run writes no store: plan as the first decision would (the live content is stable).
            for ref, src in live.items():
                rev = self._stores.live_revision(src)
                if ref not in stores and src is not None and rev is not None:
                    out[ref] = SourceRevisions(RotationRecord(stable=rev), src, None)
        out.update(self._stores.rotations(stores, live))
        return out

    # -- decide + act -----------------------------------------------------------------------------
    async def reconcile(self, *, leader: bool) -> None:
        if not leader or self.settings.dry_run or not self.caches.core_synced():
            return
        plan = self._inputs.replication_plan()
        if plan is None or plan.entitlement is None:
            return
        async with self._lock:
            await self._reconcile(plan)

    async def _reconcile(self, plan: ReplicationPlan) -> None:
        now = self.clock()
        stores = self.stores()
        live_sources = self.caches.source_states()
        per_source = plan.namespaces_per_source()
        wanted = {gc.secret_ref for gc in self.caches.classes.cache.values() if gc.mode == "vgpu" and gc.secret_ref}
        asks: list[_Ask] = []
        for ref in sorted(wanted, key=str):
            if ref not in live_sources:
                continue  # source cache not synced: unknown, decide nothing
            live = live_sources[ref]
            store = stores.get(ref)
            record = RotationRecord.from_annotations(store.annotations) if store is not None else None
            if store is not None and record is None:
                await self._invalid_store(ref, store)
                continue
            live_rev = self._stores.live_revision(live)
            control = HosterControl.from_annotations(
                live.annotations if live else {},
                paused=SourceControl.from_annotations(live.annotations).paused if live else False)
            if can_change(record, live_rev, control):
                asks.append(_Ask(ref, store, record, live, live_rev, control, per_source.get(ref, frozenset())))
        checks: list[dt.datetime] = []
        if asks:
            # The views walk every VMI the rollout planned: judged in a worker thread over copies taken
            # here in one step, so the loop (Lease renewals, admission, watches) does not wait behind them.
            snap = self._snapshot()
            answers = await asyncio.to_thread(lambda: [self._judge(a, snap, now) for a in asks])
        else:
            answers = []
        for a, answer in zip(asks, answers, strict=True):
            if answer is None:
                continue
            view, judged, d = answer
            if judged is not None:
                self._wave_progress[a.ref] = (max(0, judged.members - judged.pending), judged.members)
            if d.next_check is not None:
                checks.append(d.next_check)
            if d.record is None:
                continue
            ref = a.ref
            try:
                written = await self._stores.write(source=ref, existing=a.store, decision=d, live=a.live)
            except (TimeoutError, ApiException, OSError) as e:
                # One source's trouble must not hold up the others or the loop that called us;
                # the decision is derived again on the next pass.
                log.warning("rotation decision not written", source=str(ref), error=type(e).__name__,
                            status=getattr(e, "status", None))
                continue
            if written is None:
                log.warning("rotation decision skipped: the store cannot back it", source=str(ref))
                continue
            if not written:
                continue
            log.info("rotation decision", source=str(ref), phase=d.record.phase.value, wave=d.record.wave,
                     stable=d.record.stable[:12], candidate=d.record.candidate[:12],
                     judged=None if judged is None else {"members": judged.members, "pending": judged.pending,
                                                         "proven": judged.proven, "capable": judged.capable},
                     namespaces=len(view.namespaces), vmis=len(view.vmis))
            for ev in d.events:
                await self.events.emit(source_object(ref), ev.type, ev.reason, ev.message)
        self.next_check = min(checks, default=None)

    def _snapshot(self) -> _Snapshot:
        """What the views read, taken on the loop in one synchronous step: the rollout plan (immutable)
        and copies of the replica and VMI caches (read only, shared while a cache is unchanged) and of
        the guest reports."""
        vmis = self.caches.vmis
        return _Snapshot(rollout=self._inputs.rollout_plan(), replicas=self._copies.of(self.caches.replicas, dict),
                         vmis=self._copies.of(vmis, dict) if vmis is not None else {}, guests=self.guests.states(),
                         evidence_at=self.guests.evidence_complete_at())

    def _judge(self, a: _Ask, snap: _Snapshot,
               now: dt.datetime) -> tuple[SourceView, WaveStatus | None, Decision] | None:
        """View, the running wave's status and the decision for one source (pure over the snapshot; runs in
        a worker thread). None while the rollout has no plan and the decision needs one."""
        view = self._view(a.ref, a.record, a.live_rev, a.control, a.namespaces, now, snap)
        if view is None:
            return None
        st = self.rotation_settings
        judged = wave_status(a.record, view, st.steps) if a.record is not None and a.record.phase in ACTIVE else None
        return view, judged, decide(a.record, view, st=st, now=now)

    def _view(self, ref: ObjectRef, record: RotationRecord | None, live: str | None, control: HosterControl,
              namespaces: frozenset[str], now: dt.datetime, snap: _Snapshot) -> SourceView | None:
        """The observations `decide` reads; None while the rollout has no plan (KubeVirt caches not
        synced): a wave is never judged, nor a canary chosen, without knowing the VMIs."""
        rollout = snap.rollout
        if rollout is None and record is not None:  # only the first decision (stable := live) needs no VMIs
            return None
        replicas = snap.replicas
        # Per namespace, the one source revision its replicas carry; None where they differ. (No set per
        # namespace: at xl that was 20,000 sets, 4.5 MiB, for a single value each.)
        carried: dict[str, str | None] = {}
        for (ns, _name), r in replicas.items():
            if ns in namespaces and r.owned and source_of(r.annotations) == ref:
                rev = r.annotations.get(ANN_SOURCE_REVISION, "")
                carried[ns] = rev if carried.get(ns, rev) == rev else None
        ns_view = {ns: carried.get(ns) or "" for ns in namespaces}
        vmis_cache = snap.vmis
        candidate = record.candidate if record is not None else ""
        out: list[WaveVmi] = []
        for (ns, name), vs in (rollout.vmi_states.items() if rollout else ()):
            if vs.source != ref or ns not in namespaces:
                continue
            rep = replicas.get((ns, vs.replica))
            on_cand = bool(candidate) and rep is not None and rep.annotations.get(
                ANN_SOURCE_REVISION) == candidate and rep.annotations.get(ANN_REVISION) == vs.revision
            vmi = vmis_cache.get((ns, name))
            started = (vmi.running_since or vmi.created) if vmi is not None else None
            g = snap.guests.get((ns, name))
            fresh = g is not None and started is not None and g.reported_at > started
            holds = (g is not None and on_cand and g.token_sha256 is not None
                     and g.token_sha256 == self._inputs.token_sha(ns, name))
            licensed, failure = (False, None) if g is None else guest_evidence(
                licensed=g.state is LicenseState.LICENSED, reason=g.reason,
                last_event=g.last_event.value if g.last_event else None, holds_candidate=holds, since_start=fresh)
            out.append(WaveVmi(
                namespace=ns, name=name, on_candidate=on_cand,
                settled=vs.state in (VmiState.CURRENT, VmiState.DONE),
                hoster_only=vs.state in (VmiState.BLOCKED, VmiState.MANUAL, VmiState.UNDELIVERABLE),
                reported=g is not None, licensed=licensed, failure=failure))
        # A leader that just took over has heard from no guest yet: where the canary was chosen among
        # reporting guests, it waits one silence window before judging a wave -- the same wait the rollout
        # takes before a decision that needs guest evidence (docs/design.md#evidence-after-takeover).
        patient = record is not None and record.evidence and now < snap.evidence_at
        return SourceView(live=live, control=control, namespaces=ns_view, vmis=out, evidence_ready=not patient)

    async def _invalid_store(self, ref: ObjectRef, store: RevisionStore) -> None:
        key = f"{store.name}@{store.resource_version}"
        if key in self._invalid:
            return
        self._invalid.add(key)
        await self.events.emit(source_object(ref), EventType.WARNING, Reason.REVISION_STORE_INVALID,
                               f"Revision store {store.namespace}/{store.name} holds no readable rotation record; "
                               "replicas of this source are left as they are. Delete the store to start over "
                               "from the source's current revision.")

    # -- metrics / status -------------------------------------------------------------------------
    def samples(self) -> Iterable[GaugeSample]:
        """From every replica: the record lives in the cluster, so all replicas export the same."""
        plan = self._inputs.replication_plan()
        per_source = plan.namespaces_per_source() if plan is not None else {}
        steps = self.rotation_settings.steps
        for ref, store in sorted(self.stores().items(), key=lambda kv: str(kv[0])):
            rec = RotationRecord.from_annotations(store.annotations)
            if rec is None:
                continue
            labels = (("source_namespace", ref.namespace), ("source_name", ref.name))
            for p in PHASES:
                yield GaugeSample("rotation_phase", (*labels, ("phase", p)), 1.0 if rec.phase.value == p else 0.0)
            yield GaugeSample("rotation_wave", labels, float(rec.wave))
            on = sum(1 for ns in per_source.get(ref, ()) if rec.on_candidate(ns, steps))
            total = len(per_source.get(ref, ()))
            yield GaugeSample("rotation_namespaces", (*labels, ("slot", "candidate")), float(on))
            yield GaugeSample("rotation_namespaces", (*labels, ("slot", "stable")), float(total - on))

    def status_dict(self) -> dict[str, Any]:
        """Per source the record, and `live_source_revision`: what the source Secret holds now (None:
        unknown or unusable). One that is neither stable nor candidate has not been decided on yet, so no
        reader takes the record's phase for the new token's (`rollout status -w` right after a write)."""
        out: dict[str, Any] = {}
        live = self.caches.source_states()
        for ref, store in sorted(self.stores().items(), key=lambda kv: str(kv[0])):
            rec = RotationRecord.from_annotations(store.annotations)
            if rec is None:
                out[str(ref)] = {"phase": "invalid"}
                continue
            st = self.rotation_settings
            rev = self._stores.live_revision(live[ref]) if ref in live else None
            out[str(ref)] = {**rotation_json(rec, steps=st.steps, canary=not st.canary.none,
                                             progress=self._wave_progress.get(ref) if rec.phase in ACTIVE else None),
                             "live_source_revision": short(rev) if rev else None}
        return out

