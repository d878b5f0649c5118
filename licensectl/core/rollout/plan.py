"""`plan_rollout`: from every guest's evaluation to the plan -- the per-tenant and per-source failure pauses, the
wait for the admission webhook, the unavailability, per-namespace and rate budgets, round-robin restart picks,
each source's phase and message, and the next wakeup. The top of the package: it imports the other modules and
none imports it.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from licensectl.core import drain, model
from licensectl.core.revision_text import replica_revision
from licensectl.core.rollout.constants import PauseReason, Phase, VmiState
from licensectl.core.rollout.evaluation import (
    _Eval,
    _evaluate,
    _restartable,
    guest_reports,
    needs_live_check,
    next_attempt,
)
from licensectl.core.rollout.inputs import GuestGate, ReplicaRevision, RolloutSettings, SourceControl
from licensectl.core.rollout.memo import PlanMemo
from licensectl.core.rollout.outputs import Action, RecordResult, RestartVm, RolloutPlan, RolloutStatus, VmiRolloutState
from licensectl.core.rollout.slots import _collect_slots, _Slot
from licensectl.core.rollout.timing import _Now, _secs, _settle
from licensectl.core.timecodec import format_micro_time


def _message(phase: Phase, revisions: tuple[str, ...], counts: Mapping[VmiState, int], overdue: int,
             unavailable: int, limit: int, pause: PauseReason | None, failures: int,
             max_failures: int, settles_at: dt.datetime | None, paused_ns: tuple[str, ...] = (),
             failed_ns: int = 0) -> str:
    parts = [f"{n} {s.value}" for s, n in counts.items() if n]
    text = f"{phase.value}"
    if len(revisions) == 1:
        text += f" ({revisions[0]})"
    elif revisions:
        text += f" (oldest first: {', '.join(revisions)})"
    if parts:
        text += ": " + ", ".join(parts)
    if overdue:
        text += f"; {overdue} manual overdue"
    if phase is Phase.PROGRESSING:
        text += f"; {unavailable}/{limit} unavailable"
    if pause is PauseReason.MANUAL:
        text += "; paused by the source annotation"
    elif pause is PauseReason.FAILURES:
        text += (f"; paused after {failures} failed restarts in {failed_ns} namespaces (max {max_failures} per "
                 "namespace), resume to continue")
    elif pause is PauseReason.WEBHOOK:
        text += "; waiting for the admission webhook: no restart until it is seen to deliver"
    if paused_ns:
        shown = ", ".join(paused_ns[:5]) + (" ..." if len(paused_ns) > 5 else "")
        text += f"; namespaces paused after {max_failures} failed restarts each: {shown} (resume to continue)"
    if settles_at is not None:
        text += f"; settles at {format_micro_time(settles_at)}"
    return text


def plan_rollout(
    *,
    replicas: Iterable[ReplicaRevision],
    vmis: Iterable[model.Vmi],
    vms: Iterable[model.Vm],
    guests: Mapping[tuple[str, str], GuestGate],
    sources: Mapping[model.ObjectRef, SourceControl],
    settings: RolloutSettings,
    now: dt.datetime,
    wanted: Mapping[tuple[str, str], tuple[str, ...]] | None = None,
    memo: PlanMemo | None = None,
    evidence_at: dt.datetime | None = None,
    delivery_ready: bool = True,
    worker_limits: Mapping[str, int] | None = None,
    busy_clusters: frozenset[str] = frozenset(),
) -> RolloutPlan:
    """Decide restarts and report state for every VMI that mounts a replica or should (``wanted``:
    (namespace, VMI) -> replica names it must carry, from `licensectl.core.delivery`).

    ``evidence_at``: before this time a guest without a report may have reported to a previous leader,
    so "no report" is "no report yet" (None: the guest reports are complete). ``delivery_ready``: the
    admission webhook was seen to deliver; while False no restart is issued at all. ``worker_limits``: tenant
    cluster (``namespace/cluster``) -> workers that may be disrupted at once, where the hoster raised it
    (default ``settings.max_disrupted_workers``; docs/design.md#tenant-worker-drain). ``busy_clusters``: tenant
    clusters whose drain task has not answered its last work yet: none of their workers is picked now
    (docs/design.md#failure-domains).

    Deterministic: the same observed state always yields the same plan, so a crashed controller
    resumes exactly where the cluster says it was. ``memo`` (kept by the caller from pass to pass)
    only saves work: the plan is the same with or without it.
    """
    st = settings
    by_key = {r.key: r for r in replicas}
    evals = _evaluations(by_key, vmis, vms, wanted or {}, guests, sources, st, now, memo, evidence_at)

    by_source: dict[model.ObjectRef, list[_Eval]] = defaultdict(list)
    for e in evals:
        by_source[e.slot.replica.source].append(e)
    all_sources = sorted({r.source for r in by_key.values()} | set(sources),
                         key=lambda s: (s.namespace, s.name))

    ns_unavailable: dict[str, int] = defaultdict(int)
    for e in evals:
        if e.unavailable:
            ns_unavailable[e.slot.namespace] += 1
    workers = _open_worker_cycles(vms, worker_limits or {}, st.max_disrupted_workers, busy_clusters)

    results: list[Action] = [
        RecordResult(e.slot.namespace, e.slot.name, e.revision, e.record,
                     e.slot.vm.resource_version if e.slot.vm else "")
        for e in evals if e.record is not None and e.slot.intent is not None and e.slot.intent.result != e.record
    ]
    fleet = _Pass(st, now, guests, evidence_at, delivery_ready, ns_unavailable, workers)
    _rate_budget(evals, fleet)
    statuses = {src: _plan_source(src, by_source.get(src, []), sources.get(src, SourceControl()), by_key, fleet)
                for src in all_sources}

    vmi_states = _vmi_states(evals, memo)
    for key, why in fleet.workers.waiting.items():  # refused by its cluster's budget this pass: say so
        if (state := vmi_states.get(key)) is not None and state.state is VmiState.STALE:
            vmi_states[key] = replace(state, reason=why)
    results.sort(key=lambda a: (a.namespace, a.vm))
    # The restart each draining worker's cycle makes once its Node is drained (the shell decides when).
    drains = {(e.slot.namespace, e.slot.name): _restart_for(e, now, guests, evidence_at)
              for e in evals if e.state is VmiState.DRAINING and e.slot.vm is not None and e.slot.vmi is not None}
    return RolloutPlan(
        actions=tuple(results + fleet.restarts),
        vmi_states=MappingProxyType(vmi_states),
        sources=MappingProxyType(statuses),
        next_wakeup=min(fleet.wakeups, default=None),
        drains=MappingProxyType(drains),
    )


def _evaluations(by_key: Mapping[tuple[str, str], ReplicaRevision], vmis: Iterable[model.Vmi],
                 vms: Iterable[model.Vm], wanted: Mapping[tuple[str, str], tuple[str, ...]],
                 guests: Mapping[tuple[str, str], GuestGate], sources: Mapping[model.ObjectRef, SourceControl],
                 st: RolloutSettings, now: dt.datetime, memo: PlanMemo | None,
                 evidence_at: dt.datetime | None) -> list[_Eval]:
    """Every guest's evaluation, through the memo when there is one (the same evaluations, less work)."""
    no_control = SourceControl()

    def control_of(s: _Slot) -> SourceControl:
        return sources.get(s.replica.source, no_control)

    if memo is None:
        return [_evaluate(s, st, guests, control_of(s), _Now(now, evidence_at))
                for s in _collect_slots(by_key, vmis, vms, wanted)]
    return memo.evaluate(memo.collect(by_key, vmis, vms, wanted=wanted), st, guests, control_of=control_of, now=now,
                         evidence_at=evidence_at)


def _open_worker_cycles(vms: Iterable[model.Vm], limits: Mapping[str, int], default: int,
                        busy: frozenset[str] = frozenset()) -> _Workers:
    """Open drain cycles per tenant cluster, over every VM (a cycle outlives its restart: wait-boot, uncordon)."""
    return _Workers(drain.in_progress_by_cluster(
        (w, drain.parse_annotations(vm.annotations)) for vm in vms
        if (w := drain.WorkerIdentity.from_vm(vm.namespace, vm.name, vm.labels)) is not None
        and drain.ANN_DRAIN_STEP in vm.annotations), limits, default, busy)


@dataclass(slots=True)
class _Pass:
    """What every source of one pass reads, and the fleet-wide budgets they spend in turn (sources in order):
    the unavailable guests per namespace, the restart rate, the tenant clusters' disruption slots."""

    st: RolloutSettings
    now: dt.datetime
    guests: Mapping[tuple[str, str], GuestGate]
    evidence_at: dt.datetime | None
    delivery_ready: bool
    ns_unavailable: dict[str, int]
    workers: _Workers
    rate: list[int] = field(default_factory=lambda: [-1])  # restarts still allowed this minute (-1: unlimited)
    restarts: list[Action] = field(default_factory=list)
    wakeups: list[dt.datetime] = field(default_factory=list)


def _rate_budget(evals: Iterable[_Eval], fleet: _Pass) -> None:
    """Fleet-wide restart rate: restarts first issued in the last minute, read back from the intents."""
    st, now = fleet.st, fleet.now
    if st.max_restarts_per_minute >= 1:
        window = now - _secs(60)
        recent = sorted(e.slot.intent.issued_at for e in evals
                        if e.slot.intent is not None and window < e.slot.intent.issued_at <= now)
        fleet.rate[0] = max(0, st.max_restarts_per_minute - len(recent))
        if fleet.rate[0] == 0 and recent:
            fleet.wakeups.append(recent[0] + _secs(60))


def _plan_source(src: model.ObjectRef, group: list[_Eval], control: SourceControl,
                 by_key: Mapping[tuple[str, str], ReplicaRevision], fleet: _Pass) -> RolloutStatus:
    """One source: its pause, its re-issued and new restarts (spending the fleet's budgets), its phase and
    status. Its wakeups and restarts are added to ``fleet``."""
    st, now = fleet.st, fleet.now
    revisions = _revisions(src, by_key)
    failures_by_ns, pause = _failures(group, control, st, fleet.delivery_ready)
    failures = sum(failures_by_ns.values())
    paused_ns = _paused_namespaces(failures_by_ns, st)
    held = frozenset(paused_ns)

    affected = len(group)
    limit = st.unavailable_limit(affected)
    unavailable = sum(1 for e in group if e.unavailable)

    for e in group:
        # While paused, eligibility and re-issue times change nothing: no restart is made.
        frozen = pause is not None or e.slot.namespace in held
        times = [e.deadline] if frozen else [e.deadline, e.eligible_at, e.reissue_at]
        fleet.wakeups.extend(t for t in times if t is not None and t > now)

    if pause is None:
        _reissue(group, held, fleet)
        unavailable = _pick([e for e in group if e.slot.namespace not in held], st, limit, unavailable,
                            fleet.ns_unavailable, now, fleet.restarts, fleet.rate, fleet.guests, fleet.evidence_at,
                            fleet.workers)

    counts = {s: 0 for s in VmiState}
    for e in group:
        counts[e.state] += 1
    overdue = sum(1 for e in group if e.overdue)
    phase, settles_at, pause = _phase(group, counts, pause, held, st, now)
    return RolloutStatus(
        source=src, revisions=revisions, phase=phase, counts=MappingProxyType(counts),
        overdue=overdue, affected=affected, unavailable=unavailable, max_unavailable=limit,
        failures=failures, pause_reason=pause, settles_at=settles_at,
        failures_by_namespace=MappingProxyType(dict(sorted(failures_by_ns.items()))),
        paused_namespaces=paused_ns,
        message=_message(phase, _labelled(src, revisions, by_key), counts, overdue, unavailable, limit, pause, failures,
                         st.max_failures, settles_at, paused_ns, len(failures_by_ns)),
    )


def _revisions(src: model.ObjectRef, by_key: Mapping[tuple[str, str], ReplicaRevision]) -> tuple[str, ...]:
    """The source's revisions among its replicas, oldest first, so the last is what the newest replica write
    carries (during a safe rotation the stable revision written back after an abort is newer than the
    candidate it replaced)."""
    newest: dict[str, dt.datetime] = {}
    for r in by_key.values():
        if r.source == src and (r.revision not in newest or r.revision_time > newest[r.revision]):
            newest[r.revision] = r.revision_time
    return tuple(sorted(newest, key=lambda rev: (newest[rev], rev)))


def _labelled(src: model.ObjectRef, revisions: tuple[str, ...],
              by_key: Mapping[tuple[str, str], ReplicaRevision]) -> tuple[str, ...]:
    """Each replica revision as the summary line names it: one class's rendering of a source revision,
    so ``replica revision <12 hex> (class <name>)`` (core/revision_text.py)."""
    classes: dict[str, set[str]] = {r: set() for r in revisions}
    for r in by_key.values():
        if r.source == src and r.class_name and r.revision in classes:
            classes[r.revision].add(r.class_name)
    return tuple(replica_revision(r) + (f" (class {', '.join(sorted(classes[r]))})" if classes[r] else "")
                 for r in revisions)


def _failures(group: Iterable[_Eval], control: SourceControl, st: RolloutSettings,
              delivery_ready: bool) -> tuple[dict[str, int], PauseReason | None]:
    """Failed restarts per namespace, and the source's pause. Failure budgets are per tenant first
    (docs/design.md#failure-budget-per-tenant): a namespace pauses on its own failures; the source only when
    failures span several namespaces."""
    failures_by_ns: dict[str, int] = defaultdict(int)
    for e in group:
        if e.counts_failure:
            failures_by_ns[e.slot.namespace] += 1
    budget = st.max_failures >= 1
    pause: PauseReason | None = None
    if control.paused:
        pause = PauseReason.MANUAL
    elif budget and len(failures_by_ns) >= st.source_failure_namespaces():
        pause = PauseReason.FAILURES
    elif not delivery_ready:
        pause = PauseReason.WEBHOOK
    return failures_by_ns, pause


def _paused_namespaces(failures_by_ns: Mapping[str, int], st: RolloutSettings) -> tuple[str, ...]:
    """The namespaces paused on their own failures, sorted."""
    budget = st.max_failures >= 1
    return tuple(sorted(ns for ns, n in failures_by_ns.items() if budget and n >= st.max_failures))


def _reissue(group: Iterable[_Eval], held: frozenset[str], fleet: _Pass) -> None:
    """Restarts whose call may have been lost, issued again for the same VMI (not while its namespace is held)."""
    now = fleet.now
    for e in group:
        if (e.reissue_at is not None and e.reissue_at <= now and e.slot.intent and e.slot.vmi
                and _restartable(e.slot.vm) and e.slot.namespace not in held):
            fleet.restarts.append(RestartVm(
                e.slot.namespace, e.slot.name, e.slot.vmi.uid, e.slot.intent.revision,
                e.slot.intent.replica or e.slot.replica.name, e.slot.intent.issued_at, now,
                reissue=True, vm_resource_version=e.slot.vm.resource_version if e.slot.vm else "",
                check_live=True, attempt=e.slot.intent.attempt,
                guest_reports=e.slot.intent.guest_reports, drained=_drained(e.slot.vm)))


def _phase(group: list[_Eval], counts: Mapping[VmiState, int], pause: PauseReason | None, held: frozenset[str],
           st: RolloutSettings, now: dt.datetime) -> tuple[Phase, dt.datetime | None, PauseReason | None]:
    """The source's phase, when it settles (settling only), and its pause as reported: a source whose guests
    all wait for the hoster is paused on tenant failures; one with nothing to restart does not wait for
    the webhook."""
    stale = [e for e in group if e.state is VmiState.STALE and e.slot.namespace not in held]
    # A worker licensectl restarted whose Node is not back keeps the source progressing: never complete.
    restarting = counts[VmiState.RESTARTING] + counts[VmiState.DRAINING] > 0 or any(e.down for e in group)
    settles_at: dt.datetime | None = None
    if pause is None and held and not stale and not restarting:
        pause = PauseReason.TENANT_FAILURES  # all that is left waits for the hoster
    if not group:
        phase = Phase.IDLE
    elif pause in (PauseReason.FAILURES, PauseReason.TENANT_FAILURES) or (
            pause is not None and (stale or restarting)):
        phase = Phase.PAUSED  # a failure pause needs the hoster, even when nothing else is left
    elif (restarting or counts[VmiState.AWAITING_EVIDENCE]
          or any(e.eligible_at is None or e.eligible_at <= now for e in stale)):
        phase = Phase.PROGRESSING  # awaiting evidence: not complete until judged
    elif stale:
        settle_times = [e.slot.replica.revision_time + _secs(_settle(st)) for e in stale]
        future = [t for t in settle_times if t > now]
        if future:
            phase, settles_at = Phase.SETTLING, min(future)
        else:
            phase = Phase.PROGRESSING  # only held back by an earlier in-flight restart
    else:
        phase = Phase.COMPLETE
    if pause is PauseReason.WEBHOOK and phase is not Phase.PAUSED:
        pause = None  # nothing to restart: nothing waits for the webhook
    return phase, settles_at, pause


class _Workers:
    """The per-cluster disruption budget of tenant-cluster workers (drain.admit_workers' rule), spent as
    `_pick` admits them: at most the cluster's limit with an open cycle, new ones included."""

    def __init__(self, open_cycles: Mapping[str, int], limits: Mapping[str, int], default: int,
                 busy: frozenset[str] = frozenset()) -> None:
        self._used = dict(open_cycles)
        self._limits = limits
        self._default = max(1, default)
        self._busy = busy
        self.waiting: dict[tuple[str, str], str] = {}  # workers refused this pass -> the reason shown

    def admits(self, vm: model.Vm) -> bool:
        worker = drain.WorkerIdentity.from_vm(vm.namespace, vm.name, vm.labels)
        if worker is None:
            return True
        key = worker.cluster_key
        if key in self._busy:
            self.waiting[(vm.namespace, vm.name)] = (
                f"worker waits: tenant cluster {worker.cluster} has not answered its last drain step yet")
            return False
        used, limit = self._used.get(key, 0), max(1, self._limits.get(key, self._default))
        if used < limit:
            return True
        self.waiting[(vm.namespace, vm.name)] = (
            f"worker waits ({drain.BlockReason.BUDGET_SPENT.value}): tenant cluster {worker.cluster} has {used} of "
            f"{limit} workers disrupted")
        return False

    def spend(self, vm: model.Vm) -> None:
        worker = drain.WorkerIdentity.from_vm(vm.namespace, vm.name, vm.labels)
        if worker is not None:
            self._used[worker.cluster_key] = self._used.get(worker.cluster_key, 0) + 1


def _restart_for(e: _Eval, now: dt.datetime, guests: Mapping[tuple[str, str], GuestGate],
                 evidence_at: dt.datetime | None) -> RestartVm:
    vmi, vm = e.slot.vmi, e.slot.vm
    assert vmi is not None and vm is not None
    key = (e.slot.namespace, e.slot.name)
    # A VMI that started without its license volume has no report credential: it cannot have reported to any
    # leader, so its restart waits for no evidence window (docs/design.md#evidence-after-takeover).
    reports = False if e.slot.missing and key not in guests else guest_reports(guests, key, _Now(now, evidence_at))
    return RestartVm(e.slot.namespace, vm.name, vmi.uid, e.slot.replica.revision, e.slot.replica.name, now, now,
                     vm_resource_version=vm.resource_version,
                     check_live=needs_live_check(e.slot.intent, e.slot.replica.revision, vmi.uid),
                     attempt=next_attempt(e.slot.intent, e.slot.replica.revision),
                     guest_reports=reports, drained=_drained(vm))


def _drained(vm: model.Vm | None) -> bool:
    return vm is not None and drain.worker_role(vm.labels) is not drain.Role.NONE


def _vmi_states(evals: Iterable[_Eval], memo: PlanMemo | None) -> dict[tuple[str, str], VmiRolloutState]:
    """Every guest's state. With a memo, keys and states are the ones it holds where nothing changed (see
    `PlanMemo.state_of`); without one, equal states still share one instance within the plan."""
    if memo is not None:
        return dict(memo.state_of(e, _state) for e in evals)
    states: dict[VmiRolloutState, VmiRolloutState] = {}
    out: dict[tuple[str, str], VmiRolloutState] = {}
    for e in evals:
        state = _state(e)
        out[(e.slot.namespace, e.slot.name)] = states.setdefault(state, state)
    return out


def _state(e: _Eval) -> VmiRolloutState:
    return VmiRolloutState(
        e.state, e.revision, e.slot.replica.source, e.slot.replica.name, e.overdue, e.reason,
        missing_volume=bool(e.slot.missing), rule=e.rule, blocker=e.slot.blocker or "",
        blocked_volume=e.slot.blocked_volume,
        attempt=e.retry, retry_at=e.eligible_at if e.retry else None)


def _pick(group: list[_Eval], st: RolloutSettings, limit: int, unavailable: int,
          ns_unavailable: dict[str, int], now: dt.datetime, out: list[Action], rate: list[int],
          guests: Mapping[tuple[str, str], GuestGate], evidence_at: dt.datetime | None,
          workers: _Workers | None = None) -> int:
    """Round-robin new restarts across namespaces within the limits; returns the new unavailable count.

    ``rate`` holds the restarts still allowed this minute (-1: unlimited), shared by all sources.

    Namespaces with the fewest restarts issued for their current revision go first (then by name),
    one pick per namespace per round, so a large tenant cannot starve small ones. Within a
    namespace, VMIs that are already not Ready go first: restarting them costs no availability.
    """
    queues: dict[str, list[_Eval]] = defaultdict(list)
    issued: dict[str, int] = defaultdict(int)
    for e in group:
        if e.issued_for_current:
            issued[e.slot.namespace] += 1
        if (e.state is VmiState.STALE and e.eligible_at is not None and e.eligible_at <= now
                and e.slot.vm is not None and e.slot.vmi is not None and not e.slot.vmi.deleting):
            queues[e.slot.namespace].append(e)
    for q in queues.values():
        q.sort(key=lambda e: (e.slot.vmi is not None and e.slot.vmi.ready, e.slot.name))
    order = sorted(queues, key=lambda ns: (issued[ns], ns))
    progress = True
    while progress:
        progress = False
        for ns in order:
            q = queues[ns]
            # A worker whose tenant cluster has its limit of disrupted workers waits for a later pass.
            while q and workers is not None and q[0].slot.vm is not None and not workers.admits(q[0].slot.vm):
                q.pop(0)
            if not q:
                continue
            e = q[0]
            cost = 0 if e.unavailable else 1
            if unavailable + cost > limit or ns_unavailable[ns] + cost > st.max_per_namespace or rate[0] == 0:
                continue
            q.pop(0)
            if rate[0] > 0:
                rate[0] -= 1
            unavailable += cost
            ns_unavailable[ns] += cost
            assert e.slot.vm is not None  # guaranteed by the queue filter
            if workers is not None:
                workers.spend(e.slot.vm)
            out.append(_restart_for(e, now, guests, evidence_at))
            progress = True
    return unavailable
