"""The rollout reconcile: caches -> plan_rollout (pure) -> intent annotation, then restart.

The order of writes is the crash-safety argument: the intent (revision, target VMI uid, time) is
merge-patched onto the VM guarded by its resourceVersion *before* the restart call, so a controller
killed in between finds the intent and never restarts a VMI twice for one revision. After acting,
the next pass waits until the watch cache shows our own writes ("expectations", as client-go's
ReplicaSet controller does), so a stale cache can never plan past maxUnavailable.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from licensectl import config, logs
from licensectl.controllers.guests import GuestStore, gates_of
from licensectl.controllers.planner import CacheCopies, PlannerThread, objects_of
from licensectl.controllers.restart_preflight import RestartGate
from licensectl.controllers.settings import rollout_settings
from licensectl.controllers.vm_restart import restart_vmi, vm_object, vmi_object
from licensectl.core.delivery import Skip, refusal_text
from licensectl.core.guest_report import GuestState
from licensectl.core.model import ObjectRef, ReplicaSecret, Vm, Vmi, source_of
from licensectl.core.ports import (
    EventSink,
    InvolvedObject,
    KubevirtApi,
    MonotonicClock,
    RestartResult,
    RolloutCaches,
    WallClock,
    WorkerDrain,
)
from licensectl.core.reasons import EventType, Reason
from licensectl.core.revision_text import replica_revision, source_revision, source_revision_of
from licensectl.core.rollout import (
    RESULT_RETRY,
    PauseReason,
    Phase,
    PlanMemo,
    RecordResult,
    ReplicaRevision,
    RestartVm,
    RolloutPlan,
    RolloutStatus,
    SourceControl,
    VmiRolloutState,
    VmiState,
    plan_rollout,
)
from licensectl.core.rollout.view import rollout_json, vmis_json
from licensectl.core.timecodec import format_micro_time
from licensectl.metrics import GaugeSample, Metrics

log = logs.get(__name__)

# Per namespace: VMIs missing their volume, undeliverable by (namespace, reason), backstop retries; and
# the overdue manual-restart VMIs: what the VMI gauges show (RolloutLoop._vmi_aggregates).
_VmiAggregates = tuple[dict[str, int], dict[tuple[str, str], int], dict[str, int],
                       list[tuple[tuple[str, str], VmiRolloutState]]]

WantedVolumes = Callable[[Sequence[Vmi]], Mapping[tuple[str, str], tuple[str, ...]]]


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """One pass's view of the cluster, gathered on the event loop for the planner thread."""

    replicas: Sequence[ReplicaRevision]
    sources: dict[ObjectRef, SourceControl]
    vmis: Sequence[Vmi]
    vms: Sequence[Vm]
    guest_states: dict[tuple[str, str], GuestState]
    now: dt.datetime
    evidence_at: dt.datetime | None
    delivery_ready: bool
    worker_limits: Mapping[str, int] | None
    busy_clusters: frozenset[str] = frozenset()


EXPECTATION_TIMEOUT = 15.0
ACT_CONCURRENCY = 16


def _bucket(state: VmiState) -> str:
    """Metric buckets: a VMI restarted and done for the current revision is simply current."""
    return "current" if state is VmiState.DONE else state.value


# Label values of `rollout_vmis{state}` (plus "overdue", a count across states) and
# `rollout_paused{reason}`, derived from the enums so a new value is exported with its zeros:
# the VMI states in enum order with DONE folded into current, the pause reasons alphabetically.
ROLLOUT_VMI_STATES: tuple[str, ...] = tuple(dict.fromkeys(_bucket(s) for s in VmiState))
PAUSE_REASONS: tuple[str, ...] = tuple(sorted(r.value for r in PauseReason))


class RolloutController:
    def __init__(self, *, caches: RolloutCaches, kubevirt: KubevirtApi, events: EventSink, metrics: Metrics,
                 settings: config.Settings, guests: GuestStore, clock: WallClock | None = None,
                 monotonic: MonotonicClock = time.monotonic, wanted: WantedVolumes | None = None,
                 token_sha_for: Callable[[str, str], str | None] | None = None,
                 delivery_ready: Callable[[], bool] = lambda: True, drainer: WorkerDrain | None = None,
                 preflight: RestartGate | None = None, on_volume_missing: Callable[[], None] = lambda: None) -> None:
        self.caches = caches
        self.kubevirt = kubevirt
        self.events = events
        self.metrics = metrics
        self.settings = settings
        self.rollout_settings = rollout_settings(settings)
        self.guests = guests
        self.clock: WallClock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._monotonic = monotonic
        # VMI -> the replica volumes it must carry (licensectl.core.delivery, via the App): the backstop.
        self._wanted: WantedVolumes = wanted or (lambda _vmis: {})
        # (namespace, VMI) -> SHA-256 of the token its replica holds now: judges guest evidence at plan time.
        self._token_sha_for = token_sha_for
        # Evidence that the apiserver reaches a webhook that mutates (the App's delivery probe): no backstop
        # or rollout restart without it, since a VMI admitted without the volume helps nobody.
        self._delivery_ready = delivery_ready
        self.plan: RolloutPlan | None = None
        self._memo = PlanMemo()  # incremental planning: a pass re-evaluates only guests that changed
        self._expect: dict[tuple[str, str], tuple[str, float]] = {}  # vm -> (rv we wrote over, since)
        self._phases: dict[ObjectRef, Phase] = {}
        # Two different times, kept apart: the last restart progress (a gauge) and the revision a
        # completed rollout was already measured for (the duration histogram, once per revision).
        self._progress_at: dict[ObjectRef, dt.datetime] = {}
        self._measured: dict[ObjectRef, str] = {}
        self._revisions: dict[tuple[str, str], tuple[str, ReplicaRevision | None]] = {}
        self._copies = CacheCopies()  # the gather's copies, once per cache generation
        # Tenant-cluster workers are drained before their restart (controllers/worker_drain.py); None: restart
        # them like any VM (a deployment that manages no tenant clusters, or tests of the plain rollout).
        self.drainer = drainer
        if drainer is not None:
            drainer.set_expect(self._expect_write)
        self.drain_wakeup: dt.datetime | None = None
        # Each restart is asked about first: a VM whose new VMI would be refused is held, never restarted
        # (controllers/restart_preflight.py); None: no pre-flight (tests of the plain rollout).
        self.preflight = preflight
        if preflight is not None:
            preflight.set_expect(self._expect_write)
        self._on_volume_missing = on_volume_missing  # a restart came back without its volume: re-check delivery
        self.plan_cpu_seconds = 0.0  # CPU time of the last pass's plan (observe)
        self._aggregates: tuple[RolloutPlan, _VmiAggregates] | None = None
        self._notable: tuple[RolloutPlan, list[tuple[tuple[str, str], VmiRolloutState]]] | None = None
        self._planner = PlannerThread("rollout")  # plan_from runs there (docs/design.md#plans-off-the-loop)

    @property
    def awaiting_own_writes(self) -> bool:
        """True while the watch cache has not yet shown a VM write of the last pass."""
        return bool(self._expect)

    def _expectations_met(self) -> bool:
        vms = self.caches.vms
        if vms is None:
            return True
        now = self._monotonic()
        for key, (old_rv, since) in list(self._expect.items()):
            cur = vms.cache.get(key)
            if cur is None or cur.resource_version != old_rv or now - since > EXPECTATION_TIMEOUT:
                del self._expect[key]
        return not self._expect

    def gather(self) -> PlanInputs | None:
        """What a plan is made from, taken on the event loop in one synchronous step: copies of the VM and
        VMI caches and of the guest reports, so the planner thread iterates nothing the loop changes."""
        c = self.caches
        if c.vms is None or c.vmis is None or not (c.core_synced() and c.kubevirt_healthy()):
            return None
        return PlanInputs(
            replicas=self._replica_revisions(),
            sources={ref: SourceControl.from_annotations(s.annotations)
                     for ref, s in c.source_states().items() if s is not None},
            vmis=self._copies.of(c.vmis, objects_of), vms=self._copies.of(c.vms, objects_of),
            guest_states=self.guests.states(), now=self.clock(), evidence_at=self.guests.evidence_complete_at(),
            delivery_ready=self._delivery_ready(),
            worker_limits=self.drainer.worker_limits() if self.drainer else None,
            busy_clusters=self.drainer.busy_clusters() if self.drainer else frozenset())

    def plan_from(self, inputs: PlanInputs) -> RolloutPlan:
        """The pure plan over gathered inputs; runs in the planner thread (one at a time: it owns the memo).
        Besides the copies it reads the live caches only by key (`token_sha_for`, the delivery view behind
        `wanted`), as the webhook thread does: safe while the loop writes them, and no more out of step
        with the copies than two informers ever are with each other."""
        return plan_rollout(replicas=inputs.replicas, vmis=inputs.vmis, vms=inputs.vms,
                            guests=gates_of(inputs.guest_states, self._token_sha_for), sources=inputs.sources,
                            settings=self.rollout_settings, now=inputs.now, wanted=self._wanted(inputs.vmis),
                            memo=self._memo, evidence_at=inputs.evidence_at,
                            delivery_ready=inputs.delivery_ready, worker_limits=inputs.worker_limits,
                            busy_clusters=inputs.busy_clusters)

    def observe(self) -> RolloutPlan | None:
        """gather + plan_from in the caller's thread (tests, tools); `reconcile` plans off the loop."""
        inputs = self.gather()
        return None if inputs is None else self.plan_from(inputs)

    def _plan_with_aggregates(self, inputs: PlanInputs) -> RolloutPlan:
        plan = self.plan_from(inputs)
        self._vmi_aggregates(plan)  # what a scrape shows of it, counted here rather than on the loop
        self._needs_event(plan)  # and the few VMIs a pass writes an Event about
        return plan

    def close(self) -> None:
        self._planner.close()

    def _replica_revisions(self) -> tuple[ReplicaRevision, ...]:
        """Parsed revisions of all replicas: the same tuple while the replica cache's generation holds."""
        return self._copies.of(self.caches.replicas, self._parse_revisions)

    def _parse_revisions(self, live: Mapping[tuple[str, str], ReplicaSecret]) -> tuple[ReplicaRevision, ...]:
        """Re-parsed only for replicas whose resourceVersion changed (a rotation touches every replica;
        the passes between touch few)."""
        out: list[ReplicaRevision] = []
        for key, secret in live.items():
            hit = self._revisions.get(key)
            if hit is None or hit[0] != secret.resource_version:
                hit = (secret.resource_version, ReplicaRevision.from_secret(secret))
                self._revisions[key] = hit
            if hit[1] is not None:
                out.append(hit[1])
        if len(self._revisions) > len(live):
            for key in [k for k in self._revisions if k not in live]:
                del self._revisions[key]
        return tuple(out)

    async def reconcile(self, *, leader: bool = True) -> RolloutPlan | None:
        if not self._expectations_met():
            return self.plan
        start = time.monotonic()
        result = "ok"
        try:
            inputs = self.gather()
            if inputs is None:
                self.plan_cpu_seconds = 0.0
                return None
            # The plan's own CPU (the planner thread's) paces the loop (runner.Pacing).
            plan, self.plan_cpu_seconds = await self._planner.run(lambda: self._plan_with_aggregates(inputs))
            self.plan = plan
            if leader and not self.settings.dry_run:
                await self._act(plan)
            elif self.settings.dry_run:
                for a in plan.restarts:
                    log.info("dry-run: would restart", namespace=a.namespace, vm=a.vm, revision=a.revision[:12])
            if leader:
                await self._source_events(plan)
            return plan
        except Exception:
            result = "error"
            raise
        finally:
            self.metrics.reconcile_total.labels("rollout", result).inc()
            self.metrics.reconcile_duration.labels("rollout").observe(time.monotonic() - start)

    async def _act(self, plan: RolloutPlan) -> None:
        """Restarts and results concurrently, restarts first (they free nothing, but every moment a
        restart waits behind bookkeeping delays the rollout): the plan already respects every limit,
        and each VM gets at most one action per pass, so no two calls touch the same VM."""
        sem = asyncio.Semaphore(ACT_CONCURRENCY)

        async def bounded(coro: Any) -> None:
            async with sem:
                try:
                    await coro
                except Exception as e:  # one VM's trouble must not stop the others; next pass retries
                    log.warning("rollout action failed", error=type(e).__name__, status=getattr(e, "status", None))

        # Workers (and control-plane machines, never picked) go through the drain shell instead; the
        # rollout's own re-issues of a worker's restart too: its drain cycle re-issues it.
        restarts = plan.restarts if self.drainer is None else tuple(r for r in plan.restarts if not r.drained)
        await asyncio.gather(*(bounded(self._restart(r)) for r in restarts),
                             *(bounded(self._record(rec)) for rec in plan.results))
        if self.drainer is not None and self.caches.vms is not None and self.caches.vmis is not None:
            if self.preflight is not None:
                plan = await self.preflight.screen_workers(plan, self.caches.vms.cache)
            self.drain_wakeup = await self.drainer.reconcile(plan, self.caches.vms.cache, self.caches.vmis.cache)
        for (ns, vmi), st in self._needs_event(plan):
            if st.state is VmiState.BLOCKED:
                await self.events.emit(vmi_object(ns, vmi), EventType.WARNING, Reason.RESTART_BLOCKED,
                                       f"VMI runs an older license than {replica_revision(st.revision)} but cannot be "
                                       f"restarted by licensectl: {st.reason or 'no owning VirtualMachine'}")
            if st.state is VmiState.UNDELIVERABLE:
                await self.events.emit(vmi_object(ns, vmi), EventType.WARNING, Reason.LICENSE_DELIVERY_BLOCKED,
                                       f"VMI of an entitled vGPU claim runs without its license volume "
                                       f"({st.replica}) and the admission webhook cannot add one to this spec "
                                       f"({st.blocker}: {refusal_text(Skip(st.blocker), st.blocked_volume)}): "
                                       f"not restarted; rename the VM's conflicting volume, disk or serial, then "
                                       f"restart it")
            elif st.missing_volume:
                await self.events.emit(vmi_object(ns, vmi), EventType.WARNING, Reason.LICENSE_VOLUME_MISSING,
                                       f"VMI of an entitled vGPU claim runs without its license volume "
                                       f"({st.replica}): {st.state.value}, {st.reason}")

    async def _record(self, rec: RecordResult) -> None:
        ok = await self.kubevirt.annotate_vm(namespace=rec.namespace, name=rec.vm,
                                             resource_version=rec.vm_resource_version,
                                             annotations=rec.annotations())
        if not ok:
            return
        self._expect[(rec.namespace, rec.vm)] = (rec.vm_resource_version, self._monotonic())
        self.metrics.restarts_total.labels(rec.result).inc()
        self._mark_progress(rec.namespace, rec.vm)
        # A done restart is routine: counted in licensectl_restarts_total, no Event
        # (docs/design.md#event-policy); a failed one is where a person must look.
        if rec.result == RESULT_RETRY:
            self._on_volume_missing()
            st = self.plan.vmi_states.get((rec.namespace, rec.vm)) if self.plan else None
            when = format_micro_time(st.retry_at) if st is not None and st.retry_at else "after a backoff"
            await self.events.emit(vm_object(rec.namespace, rec.vm), EventType.WARNING, Reason.LICENSE_VOLUME_MISSING,
                                   f"The restarted VMI came back without its license volume (restart "
                                   f"{st.attempt if st else '?'}); retrying at {when}")
        elif rec.result != "done":
            await self.events.emit(vm_object(rec.namespace, rec.vm), EventType.WARNING, Reason.RESTART_FAILED,
                                   f"VMI did not come back done within {self.settings.restart_timeout_seconds:g}s "
                                   f"after the restart for {replica_revision(rec.revision)}")

    async def _restart(self, r: RestartVm) -> None:
        # 0. Only a VM whose new VMI would be admitted (a refusal is recorded on the VM instead).
        if self.preflight is not None and not await self.preflight.admits(r):
            return
        # 1. Intent first, guarded by the resourceVersion the plan was made from.
        if not await self.kubevirt.annotate_vm(namespace=r.namespace, name=r.vm,
                                               resource_version=r.vm_resource_version,
                                               annotations=r.intent_annotations()):
            log.info("restart dropped: VM changed since the plan", namespace=r.namespace, vm=r.vm)
            return
        self._expect[(r.namespace, r.vm)] = (r.vm_resource_version, self._monotonic())
        # 2. Then the restart itself, only if the VMI the plan targeted is the one running now.
        res = await self._restart_target(r)
        self.metrics.restarts_total.labels(res.value).inc()
        log.info("restart", namespace=r.namespace, vm=r.vm, revision=r.revision[:12], result=res.value,
                 reissue=r.reissue)
        if res in (RestartResult.ISSUED, RestartResult.FALLBACK_DELETE):
            self._mark_progress(r.namespace, r.vm)  # routine: counted in licensectl_restarts_total, no Event

    async def _restart_target(self, r: RestartVm) -> RestartResult:
        """Restart unless the planned VMI was already replaced or is going away (read live: the
        restart call stops whatever VMI runs now, and the watch cache may lag). The read is skipped
        only when the plan shows no call of ours that could have replaced it (`check_live`), which
        the intent write just made, guarded by the planned resourceVersion, has proven current."""
        vm = self.caches.vms.cache.get((r.namespace, r.vm)) if self.caches.vms else None
        return await restart_vmi(self.kubevirt, self.events, namespace=r.namespace, vm=r.vm, vmi_uid=r.vmi_uid,
                                 run_strategy=vm.run_strategy if vm else None,
                                 check_live=r.check_live or not r.vm_resource_version)

    def _expect_write(self, namespace: str, vm: str, old_rv: str) -> None:
        self._expect[(namespace, vm)] = (old_rv, self._monotonic())

    def _mark_progress(self, namespace: str, vm: str) -> None:
        """A VM's VMI carries its name (KubeVirt), which leads to the source being rolled out."""
        st = self.plan.vmi_states.get((namespace, vm)) if self.plan else None
        if st is not None:
            self._progress_at[st.source] = self.clock()

    async def _source_events(self, plan: RolloutPlan) -> None:
        now = self.clock()
        for ref, st in plan.sources.items():
            before = self._phases.get(ref)
            self._phases[ref] = st.phase
            if before == st.phase or (before is None and st.phase in (Phase.IDLE, Phase.COMPLETE)):
                continue
            obj = InvolvedObject("v1", "Secret", ref.namespace, ref.name)
            rev = self._revision_text(ref, st)
            if st.phase is Phase.PROGRESSING and before in (None, Phase.IDLE, Phase.SETTLING, Phase.COMPLETE):
                stale = st.counts.get(VmiState.STALE, 0)
                await self.events.emit(obj, EventType.NORMAL, Reason.ROLLOUT_STARTED,
                                       f"Rolling out {rev}: {stale} of {st.affected} VMIs to "
                                       f"restart (maxUnavailable {st.max_unavailable})")
            elif st.phase is Phase.PAUSED:
                await self.events.emit(obj, EventType.WARNING, Reason.ROLLOUT_PAUSED, st.message or "rollout paused")
            elif st.phase is Phase.COMPLETE and before in (Phase.PROGRESSING, Phase.PAUSED, Phase.SETTLING):
                await self.events.emit(obj, EventType.NORMAL, Reason.ROLLOUT_COMPLETED,
                                       f"{rev[:1].upper()}{rev[1:]} rolled out")
                self._observe_duration(ref, now)

    def _source_revision(self, ref: ObjectRef, st: RolloutStatus) -> str | None:
        """The source revision the newest replica revision of `ref` was rendered from (the replicas say)."""
        if not st.revisions:
            return None
        mine = (s.annotations for s in self.caches.replicas.cache.values() if source_of(s.annotations) == ref)
        return source_revision_of(mine, st.revisions[-1])

    def _revision_text(self, ref: ObjectRef, st: RolloutStatus) -> str:
        """Event wording (core/revision_text.py): the source revision, else the labelled replica revision."""
        src = self._source_revision(ref, st)
        if src:
            return source_revision(src)
        return replica_revision(st.revisions[-1]) if st.revisions else "the current license"

    def _observe_duration(self, ref: ObjectRef, completed: dt.datetime) -> None:
        """Revision written -> rollout complete, both on the apiserver's clock, once per revision.

        The start is the revision time the replicas carry (not when this process noticed the
        rollout), so a controller restarted or failed over mid-rollout still measures the whole of it.
        """
        started = rollout_started_at(self._replica_revisions(), ref)
        if started is None:
            return
        revision, at = started
        if self._measured.get(ref) == revision:
            return
        self._measured[ref] = revision
        self.metrics.rollout_duration.observe(max(0.0, (completed - at).total_seconds()))

    def _needs_event(self, plan: RolloutPlan) -> list[tuple[tuple[str, str], VmiRolloutState]]:
        """The VMIs `_act` writes a Warning about (blocked, undeliverable, missing their volume), once per
        plan: picked in the planner thread, so the loop does not walk every VMI's state for a handful."""
        hit = self._notable
        if hit is not None and hit[0] is plan:
            return hit[1]
        out = [(k, st) for k, st in plan.vmi_states.items()
               if st.state in (VmiState.BLOCKED, VmiState.UNDELIVERABLE) or st.missing_volume]
        self._notable = (plan, out)
        return out

    # -- metrics / status ---------------------------------------------------------------------------
    def _vmi_aggregates(self, plan: RolloutPlan) -> _VmiAggregates:
        """The per-namespace counts the VMI gauges show, once per plan: a scrape then reads a few
        namespaces' numbers instead of walking every VMI's state again."""
        if self._aggregates is not None and self._aggregates[0] is plan:
            return self._aggregates[1]
        missing: dict[str, int] = {}
        blocked: dict[tuple[str, str], int] = {}
        retrying: dict[str, int] = {}
        overdue: list[tuple[tuple[str, str], VmiRolloutState]] = []
        for key, vs in plan.vmi_states.items():
            ns = key[0]
            if vs.state is VmiState.UNDELIVERABLE:  # in the blocked family only: one cause, one alert
                blocked[(ns, vs.blocker)] = blocked.get((ns, vs.blocker), 0) + 1
            elif vs.missing_volume:
                missing[ns] = missing.get(ns, 0) + 1
            if vs.attempt:
                retrying[ns] = retrying.get(ns, 0) + 1
            if vs.overdue:
                overdue.append((key, vs))
        out: _VmiAggregates = (missing, blocked, retrying, sorted(overdue, key=lambda kv: kv[0]))
        self._aggregates = (plan, out)
        return out

    def samples(self) -> Iterable[GaugeSample]:
        plan = self.plan
        if plan is None:
            return
        for ref, st in sorted(plan.sources.items(), key=lambda kv: str(kv[0])):
            labels = (("source_namespace", ref.namespace), ("source_name", ref.name))
            for state in ROLLOUT_VMI_STATES:
                n = sum(v for k, v in st.counts.items() if _bucket(k) == state)
                yield GaugeSample("rollout_vmis", (*labels, ("state", state)), float(n))
            yield GaugeSample("rollout_vmis", (*labels, ("state", "overdue")), float(st.overdue))
            active = st.phase in (Phase.SETTLING, Phase.PROGRESSING, Phase.PAUSED)
            yield GaugeSample("rollout_in_progress", labels, 1.0 if active else 0.0)
            for reason in PAUSE_REASONS:
                paused = st.phase is Phase.PAUSED and st.pause_reason is not None and st.pause_reason.value == reason
                yield GaugeSample("rollout_paused", (*labels, ("reason", reason)), 1.0 if paused else 0.0)
            at = self._progress_at.get(ref)
            if at is not None:
                yield GaugeSample("rollout_last_progress_timestamp_seconds", labels, at.timestamp())
            # Failure budgets per tenant first (docs/design.md#failure-budget-per-tenant).
            yield GaugeSample("rollout_failed_restarts", labels, float(st.failures))
            for ns, n in st.failures_by_namespace.items():
                yield GaugeSample("rollout_namespace_failed_restarts", (*labels, ("namespace", ns)), float(n))
                yield GaugeSample("rollout_namespace_paused", (*labels, ("namespace", ns)),
                                  1.0 if ns in st.paused_namespaces else 0.0)
        missing, blocked, retrying, overdue = self._vmi_aggregates(plan)
        for (ns, why), n in sorted(blocked.items()):
            yield GaugeSample("vmis_delivery_blocked", (("namespace", ns), ("reason", why)), float(n))
        # Every namespace with a delivery problem (a VMI missing its volume, retrying or undeliverable) has
        # both series, 0 when it has none of that kind: "none" is a value, not a gap, and an undeliverable
        # VMI is counted in vmis_delivery_blocked only (one cause, one alert).
        for ns in sorted(missing.keys() | retrying.keys() | {ns for ns, _ in blocked}):
            yield GaugeSample("vmis_missing_license_volume", (("namespace", ns),), float(missing.get(ns, 0)))
            yield GaugeSample("vmis_backstop_retrying", (("namespace", ns),), float(retrying.get(ns, 0)))
        # Per VMI, but only the overdue manual ones (a handful): what LicensectlManualRestartOverdue names.
        for (ns, vmi), vs in overdue:
            if vs.overdue:
                yield GaugeSample("rollout_manual_restart_overdue",
                                  (("namespace", ns), ("vmi", vmi), ("source_namespace", vs.source.namespace),
                                   ("source_name", vs.source.name)), 1.0)

    def status_dict(self) -> dict[str, Any]:
        plan = self.plan
        if plan is None:
            return {"synced": False}
        sources: dict[str, Any] = {}
        for ref, st in sorted(plan.sources.items(), key=lambda kv: str(kv[0])):
            sources[str(ref)] = {**rollout_json(st, self._source_revision(ref, st)), "failures": st.failures,
                                 "failures_by_namespace": dict(st.failures_by_namespace),
                                 "paused_namespaces": list(st.paused_namespaces),
                                 "awaiting_evidence": st.counts.get(VmiState.AWAITING_EVIDENCE, 0),
                                 "undeliverable": st.counts.get(VmiState.UNDELIVERABLE, 0)}
        vmis = vmis_json(plan)
        for row in vmis:  # which rule judged it, and the backstop's retries (docs/operations.md#rollout-status)
            vs = plan.vmi_states[(row["namespace"], row["vmi"])]
            row.update({"rule": vs.rule.value if vs.rule else None, "blocker": vs.blocker or None,
                        "attempt": vs.attempt,
                        "retry_at": format_micro_time(vs.retry_at) if vs.retry_at else None})
        return {"synced": True, "sources": sources, "vmis": vmis}


def rollout_started_at(replicas: Iterable[ReplicaRevision], source: ObjectRef) -> tuple[str, dt.datetime] | None:
    """The newest revision of `source` and when it was first written (its earliest revision time).

    Each replica stamps its own revision time when it is written, so the rollout of a revision
    starts at the earliest stamp among the replicas carrying it.
    """
    mine = [r for r in replicas if r.source == source]
    if not mine:
        return None
    newest = max(mine, key=lambda r: (r.revision_time, r.revision)).revision
    return newest, min(r.revision_time for r in mine if r.revision == newest)
