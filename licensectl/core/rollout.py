"""Rollout planner: which KubeVirt VMs to restart so guests pick up a new license revision.

A Secret reaches a guest as a disk image fixed at VMI start, so a new token needs a VMI restart
(docs/design.md#kubevirt-secret-disks). It decides, from cluster state alone, which VMs to restart next and what
state every affected VMI is in. It is a pure function: no I/O, no clock (``now`` is passed in).

Memory lives only in the cluster: the shell writes the intent annotations on the VirtualMachine
(``RestartVm.intent_annotations``) *before* it calls the restart subresource, and the result
annotation afterwards (``RecordResult.annotations``). A controller that crashed anywhere in between
re-derives everything from those annotations and the VMIs it observes.

Upstream semantics encoded here (kubevirt/kubevirt, pkg/virt-api/rest/lifecycle.go,
``RestartVMRequestHandler``):
  * restart needs a VirtualMachine and is rejected for runStrategy ``Halted`` and ``Once``;
  * it appends a Stop request carrying the *UID* of the running VMI plus a Start request to the VM's
    ``status.stateChangeRequests`` and answers 409 "stop/start already underway" while such requests
    are pending — so re-issuing a restart for the same target UID after a crash cannot stop a VMI twice;
  * the VM controller then deletes that VMI and creates a new one with a new UID.

Decisions documented here (not upstream facts):
  * timestamps on Kubernetes objects have one-second resolution, so a VMI started in the same
    second as the revision is treated as stale (an extra restart beats a guest on an old token);
  * a VMI mounting several replicas is governed by the replica with the newest revision time: one
    restart delivers all of them;
  * a failed restart is covered by the failure budget, not by the unavailability budget: its VMI no
    longer counts as unavailable, otherwise one broken guest would stall its tenant forever and the
    failure budget could never be reached;
  * with ``done_gate == "ready-licensed"`` a VM that has never sent a guest report is done when
    Ready (the probe is optional); one that has reported before waits for a licensed report with the
    current token made after the restart, until the restart timeout;
  * while a source is paused (manually or by failures) no restart call is made at all, not even a
    re-issue; restarts already in flight are still tracked and can still time out;
  * every threshold is inclusive ("at or after"), so ``next_wakeup`` is exactly the moment it flips;
  * backstop (docs/design.md#backstop): a VMI that should carry a license volume (``wanted``) but does
    not is stale whatever its start time, and its restart is done only once the new VMI carries it;
    a VMI created after that restart's timeout is a new VMI, planned afresh.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from licensectl.core import model
from licensectl.core.timecodec import annotation_time, annotation_value_time, format_micro_time

RESULT_DONE = "done"
RESULT_FAILED = "failed"
POLICY_MANUAL = "manual"
DONE_GATE_READY = "ready"
DONE_GATE_READY_LICENSED = "ready-licensed"
# kubevirt pkg/virt-api/rest/lifecycle.go: RestartVMRequestHandler rejects these with 409.
UNRESTARTABLE_RUN_STRATEGIES = frozenset({"Halted", "Once"})


class VmiState(StrEnum):
    CURRENT = "current"  # already runs the current revision
    STALE = "stale"  # pending an automatic restart
    RESTARTING = "restarting"  # intent issued, new VMI not yet done
    DONE = "done"  # restarted for this revision and Ready (and licensed, if gated)
    FAILED = "failed"  # restart timed out or was recorded as failed
    BLOCKED = "blocked"  # stale, but licensectl cannot restart it (standalone VMI, run strategy)
    MANUAL = "manual"  # stale, the VM opted out of automatic restarts


class Phase(StrEnum):
    IDLE = "idle"
    SETTLING = "settling"
    PROGRESSING = "progressing"
    PAUSED = "paused"
    COMPLETE = "complete"


class PauseReason(StrEnum):
    MANUAL = "manual"
    FAILURES = "failures"


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplicaRevision:
    """The current content revision of one replica Secret (namespace/name) and its source."""

    namespace: str
    name: str
    revision: str
    revision_time: dt.datetime
    source: model.ObjectRef

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @classmethod
    def from_secret(cls, secret: model.ReplicaSecret) -> ReplicaRevision | None:
        """Read revision, revision time and source from an owned replica; None when incomplete."""
        if not secret.owned:
            return None
        ann = secret.annotations
        revision = ann.get(model.ANN_REVISION)
        when = annotation_time(ann, model.ANN_REVISION_TIME)
        src_ns, src_name = ann.get(model.ANN_SOURCE_NAMESPACE), ann.get(model.ANN_SOURCE_NAME)
        if not revision or when is None or not src_name or src_ns is None:
            return None
        return cls(secret.namespace, secret.name, revision, when, model.ObjectRef(src_ns, src_name))


@dataclass(frozen=True, slots=True)
class GuestGate:
    """What the newest in-guest probe report says about licensing (evidence, optional)."""

    licensed: bool
    token_sha256_current: bool
    reported_at: dt.datetime

    def proves_current(self, after: dt.datetime) -> bool:
        return self.licensed and self.token_sha256_current and self.reported_at > after


@dataclass(frozen=True, slots=True)
class SourceControl:
    """The hoster's switches on a source Secret."""

    paused: bool = False
    resumed_at: dt.datetime | None = None

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> SourceControl:
        paused = annotations.get(model.ANN_ROLLOUT_PAUSED, "").strip().lower() in ("true", "1", "yes")
        return cls(paused, annotation_time(annotations, model.ANN_ROLLOUT_RESUMED_AT))


@dataclass(frozen=True, slots=True)
class RolloutSettings:
    """The planner's knobs (config.Settings documents them; licensectl.controllers.settings maps them)."""

    settle_seconds: float = 60.0
    max_unavailable: str = "10%"
    max_per_namespace: int = 1
    max_failures: int = 3  # < 1 disables the failure pause
    restart_timeout_seconds: float = 600.0
    manual_deadline_seconds: float = 7 * 24 * 3600.0
    done_gate: str = DONE_GATE_READY_LICENSED
    reissue_after_seconds: float = 60.0
    max_restarts_per_minute: int = 0  # < 1: no rate limit beyond max_unavailable

    def unavailable_limit(self, affected: int) -> int:
        """An absolute count, or a percentage of the affected VMIs rounded down; at least 1."""
        raw = self.max_unavailable.strip()
        if raw.endswith("%"):
            return max(1, int(raw[:-1]) * affected // 100)
        return max(1, int(raw))


@dataclass(frozen=True, slots=True)
class RestartIntent:
    """The intent annotations on a VirtualMachine, parsed."""

    revision: str
    issued_at: dt.datetime
    attempted_at: dt.datetime
    vmi_uid: str | None = None
    replica: str | None = None
    result: str | None = None

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> RestartIntent | None:
        """None when there is no readable intent; a VM is then planned from its VMI alone, which is
        safe: a VMI recreated after the revision is current by its start time."""
        revision = annotations.get(model.ANN_RESTART_REVISION)
        if not revision:
            return None
        return _parse_intent(revision, annotations.get(model.ANN_RESTART_ISSUED_AT),
                             annotations.get(model.ANN_RESTART_ATTEMPTED_AT),
                             annotations.get(model.ANN_RESTART_VMI_UID), annotations.get(model.ANN_RESTART_REPLICA),
                             annotations.get(model.ANN_RESTART_RESULT))


# Every pass parses every VM's intent, and between two of our writes the annotations do not change:
# parsing the two timestamps was a third of a pass at 2,000 VMIs. The parse is pure, so it is memoized
# on the raw annotation values (a new write is a new key).
@functools.lru_cache(maxsize=1 << 16)
def _parse_intent(revision: str, issued_raw: str | None, attempted_raw: str | None, vmi_uid: str | None,
                  replica: str | None, result: str | None) -> RestartIntent | None:
    issued = annotation_value_time(issued_raw)
    if issued is None:
        return None
    attempted = annotation_value_time(attempted_raw) or issued
    return RestartIntent(
        revision=revision,
        issued_at=issued,
        attempted_at=max(attempted, issued),
        vmi_uid=vmi_uid or None,
        replica=replica or None,
        result=result if result in (RESULT_DONE, RESULT_FAILED) else None,
    )


# ---------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RestartVm:
    """Write the intent on the VM, then PUT .../virtualmachines/{vm}/restart.

    The shell must write the intent with the VM's ``resource_version`` as precondition (a conflict
    means the plan was made from a stale cache: drop the action) and must call restart only after
    the write succeeded. ``reissue`` marks a retry for the same target after a lost call.
    ``check_live``: confirm live that ``vmi_uid`` still runs before the call, because a restart of
    ours may already have replaced it (`needs_live_check`); False only when the VM, as planned, shows
    none that could have (docs/design.md#decision-restart-intent).
    """

    namespace: str
    vm: str
    vmi_uid: str
    revision: str
    replica: str
    issued_at: dt.datetime
    attempted_at: dt.datetime
    reissue: bool = False
    vm_resource_version: str = ""
    check_live: bool = True

    def intent_annotations(self) -> Mapping[str, str | None]:
        """Annotations to merge-patch onto the VM; None removes a key (a stale result)."""
        return {
            model.ANN_RESTART_REVISION: self.revision,
            model.ANN_RESTART_REPLICA: self.replica,
            model.ANN_RESTART_VMI_UID: self.vmi_uid,
            model.ANN_RESTART_ISSUED_AT: format_micro_time(self.issued_at),
            model.ANN_RESTART_ATTEMPTED_AT: format_micro_time(self.attempted_at),
            model.ANN_RESTART_RESULT: None,
        }


@dataclass(frozen=True, slots=True)
class RecordResult:
    """Write the outcome of the restart for ``revision`` onto the VM (idempotent).

    The shell should only write it while the VM's restart-revision annotation still names
    ``revision`` (use ``vm_resource_version`` as precondition)."""

    namespace: str
    vm: str
    revision: str
    result: str
    vm_resource_version: str = ""

    def annotations(self) -> Mapping[str, str | None]:
        return {model.ANN_RESTART_RESULT: self.result}


Action = RestartVm | RecordResult


@dataclass(frozen=True, slots=True)
class VmiRolloutState:
    state: VmiState
    revision: str  # the revision this state refers to
    source: model.ObjectRef
    replica: str  # replica Secret name in the VMI's namespace
    overdue: bool = False  # manual VMs still stale past the manual deadline
    reason: str = ""  # short human explanation (no secrets)
    missing_volume: bool = False  # should carry a license volume and does not (backstop)


@dataclass(frozen=True, slots=True)
class RolloutStatus:
    source: model.ObjectRef
    revisions: tuple[str, ...]
    phase: Phase
    counts: Mapping[VmiState, int]
    overdue: int = 0
    affected: int = 0
    unavailable: int = 0
    max_unavailable: int = 0
    failures: int = 0  # failures counted against the budget (highest over current revisions)
    pause_reason: PauseReason | None = None
    settles_at: dt.datetime | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class RolloutPlan:
    actions: tuple[Action, ...]
    vmi_states: Mapping[tuple[str, str], VmiRolloutState]
    sources: Mapping[model.ObjectRef, RolloutStatus]
    next_wakeup: dt.datetime | None

    @property
    def restarts(self) -> tuple[RestartVm, ...]:
        return tuple(a for a in self.actions if isinstance(a, RestartVm))

    @property
    def results(self) -> tuple[RecordResult, ...]:
        return tuple(a for a in self.actions if isinstance(a, RecordResult))


# ---------------------------------------------------------------------------------------------
# Internals
# ---------------------------------------------------------------------------------------------


def _secs(seconds: float) -> dt.timedelta:
    return dt.timedelta(seconds=seconds)


# Kubernetes timestamps have one-second resolution and revision times are truncated to the second.
# A restart issued at least this long after the revision time yields a VMI whose start time is
# strictly later, so it can never be mistaken for a stale one (which would restart it again).
MIN_SETTLE_SECONDS = 2.0


def _settle(st: RolloutSettings) -> float:
    return max(st.settle_seconds, MIN_SETTLE_SECONDS)


def _started(vmi: model.Vmi) -> dt.datetime:
    return vmi.running_since or vmi.created


@dataclass(frozen=True, slots=True)
class _Slot:
    """One guest: its VMI (None while being recreated), its VM (None if standalone), the governing
    replica and the parsed intent. Keyed by (namespace, VMI name) == (namespace, VM name)."""

    namespace: str
    name: str
    vmi: model.Vmi | None
    vm: model.Vm | None
    replica: ReplicaRevision
    intent: RestartIntent | None
    missing: tuple[str, ...] = ()  # wanted replica volumes the VMI does not carry (backstop)


@dataclass(slots=True)
class _Eval:
    slot: _Slot
    state: VmiState
    revision: str
    reason: str
    overdue: bool = False
    counts_failure: bool = False  # failed, for the current revision, issued after resume
    eligible_at: dt.datetime | None = None  # stale candidates: when a restart may be issued
    reissue_at: dt.datetime | None = None  # in-flight restart whose call may have been lost
    deadline: dt.datetime | None = None  # restarting: when it turns failed; manual: when overdue
    record: str | None = None  # result annotation to write
    failed_vmi: bool = False  # stale, but created by a restart that failed: a failure, not unavailable

    @property
    def unavailable(self) -> bool:
        if self.state is VmiState.FAILED or self.failed_vmi:
            return False
        if self.state is VmiState.RESTARTING:
            return True
        vmi = self.slot.vmi
        return vmi is None or vmi.deleting or not vmi.ready

    @property
    def issued_for_current(self) -> bool:
        return self.revision == self.slot.replica.revision and self.state in (
            VmiState.RESTARTING, VmiState.DONE, VmiState.FAILED)


def _intent_targets(intent: RestartIntent, vmi: model.Vmi) -> bool:
    """Whether ``vmi`` is the very VMI the intent meant to restart (not yet recreated)."""
    if intent.vmi_uid:
        return intent.vmi_uid == vmi.uid
    # Intent without a UID: the VMI running when the intent was written started before it.
    return _started(vmi) <= intent.issued_at


def _is_stale(vmi: model.Vmi, replica: ReplicaRevision, guest: GuestGate | None,
              missing: tuple[str, ...] = ()) -> bool:
    if missing:
        return True  # no license disk at all: only a restart through the webhook brings one
    if _started(vmi) > replica.revision_time:
        return False
    return not (guest is not None and guest.proves_current(replica.revision_time))


def _collect_slots(
    replicas: Mapping[tuple[str, str], ReplicaRevision],
    vmis: Iterable[model.Vmi],
    vms: Iterable[model.Vm],
    wanted: Mapping[tuple[str, str], tuple[str, ...]],
) -> list[_Slot]:
    vm_by_key = {(m.namespace, m.name): m for m in vms}
    by_ns: dict[str, list[ReplicaRevision]] = defaultdict(list)
    for r in replicas.values():
        by_ns[r.namespace].append(r)
    slots: list[_Slot] = []
    owned: set[tuple[str, str]] = set()
    for v in vmis:
        if v.owner_vm:
            owned.add((v.namespace, v.owner_vm))
        want = wanted.get((v.namespace, v.name), ())
        missing: tuple[str, ...] = ()
        if not want and len(v.secret_volumes) == 1:  # the common case, without the general one's allocations
            one = replicas.get((v.namespace, v.secret_volumes[0]))
            if one is None:
                continue
            governing = one
        else:
            names = dict.fromkeys(v.secret_volumes + want)
            refs = [replicas[(v.namespace, s)] for s in names if (v.namespace, s) in replicas]
            if not refs:
                continue
            missing = tuple(s for s in want if s not in v.secret_volumes and (v.namespace, s) in replicas)
            governing = max(refs, key=lambda r: (r.revision_time, r.name))
        vm = vm_by_key.get((v.namespace, v.owner_vm)) if v.owner_vm else None
        intent = RestartIntent.from_annotations(vm.annotations) if vm else None
        slots.append(_Slot(v.namespace, v.name, v, vm, governing, intent, missing))
    # VMs whose VMI is gone: a restart in flight (or a stopped VM, which is not our business).
    for key in sorted(vm_by_key.keys() - owned):
        vm = vm_by_key[key]
        if vm.run_strategy == "Halted":
            continue
        intent = RestartIntent.from_annotations(vm.annotations)
        if intent is None or intent.result == RESULT_DONE:
            continue
        replica: ReplicaRevision | None = None
        if intent.replica:
            replica = replicas.get((vm.namespace, intent.replica))
        else:
            matching = sorted((r for r in by_ns.get(vm.namespace, ()) if r.revision == intent.revision),
                              key=lambda r: r.name)
            replica = matching[0] if matching else None
        if replica is not None:
            slots.append(_Slot(vm.namespace, vm.name, None, vm, replica, intent))
    slots.sort(key=lambda s: (s.namespace, s.name))
    return slots


class _Now:
    """``now`` for one evaluation, remembering the earliest later time it was compared with: the
    evaluation cannot change before that time unless its inputs do (what `PlanMemo` relies on)."""

    __slots__ = ("horizon", "now")

    def __init__(self, now: dt.datetime) -> None:
        self.now = now
        self.horizon: dt.datetime | None = None

    def reached(self, t: dt.datetime) -> bool:
        if t <= self.now:
            return True
        if self.horizon is None or t < self.horizon:
            self.horizon = t
        return False


@dataclass(slots=True)
class _Memo:
    vmi: model.Vmi | None
    vm: model.Vm | None
    replica: ReplicaRevision
    missing: tuple[str, ...]
    guest: GuestGate | None
    control: SourceControl
    until: dt.datetime | None  # the evaluation holds before this time (None: until an input changes)
    ev: _Eval
    state: VmiRolloutState | None = None


class PlanMemo:
    """The last pass's per-guest evaluations, for `plan_rollout` to reuse (incremental planning).

    A guest's evaluation depends only on its VMI and VM (cache objects, replaced on every change),
    its governing replica, missing volumes, guest report, source switches, the settings, and on
    ``now`` only through the times it was compared with; it is reused while all of these are the
    same and the earliest such time still lies ahead. During a rollout most guests do not change
    between two passes, so a pass re-evaluates only the few that did. Owned by one caller; a plan
    made with a memo equals the plan made without one (tested).
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Memo] = {}
        self._settings: RolloutSettings | None = None
        self._now: dt.datetime | None = None
        self.hits = 0  # evaluations reused, for tests and benchmarks

    def _begin(self, settings: RolloutSettings, now: dt.datetime) -> None:
        if settings != self._settings or (self._now is not None and now < self._now):
            self._entries.clear()  # new knobs, or a clock stepped back: nothing is known to hold
        self._settings, self._now = settings, now

    def _keep(self, entries: dict[tuple[str, str], _Memo]) -> None:
        """This pass's evaluations replace the last pass's: guests gone since are forgotten."""
        self._entries = entries

    def _evaluate(self, slot: _Slot, st: RolloutSettings, guests: Mapping[tuple[str, str], GuestGate],
                  control: SourceControl, now: dt.datetime, keep: dict[tuple[str, str], _Memo]) -> _Memo:
        key = (slot.namespace, slot.name)
        guest = guests.get(key)
        m = self._entries.get(key)
        if (m is not None and m.vmi is slot.vmi and m.vm is slot.vm and m.replica == slot.replica
                and m.missing == slot.missing and m.guest == guest and m.control == control
                and (m.until is None or now < m.until)):
            self.hits += 1
        else:
            clock = _Now(now)
            m = _Memo(slot.vmi, slot.vm, slot.replica, slot.missing, guest, control, None,
                      _evaluate(slot, st, guests, control, clock))
            m.until = clock.horizon
        keep[key] = m
        return m


def _track(slot: _Slot, intent: RestartIntent, st: RolloutSettings,
           guests: Mapping[tuple[str, str], GuestGate], now: _Now) -> _Eval:
    """State of a restart the intent says was issued: restarting, done or failed."""
    vmi, rev = slot.vmi, intent.revision
    if intent.result == RESULT_DONE:
        return _Eval(slot, VmiState.DONE, rev, "restart recorded done")
    if intent.result == RESULT_FAILED:
        return _Eval(slot, VmiState.FAILED, rev, "restart recorded failed")
    # Two clocks: a restart that never took effect fails timeout after it was first issued (so a
    # call that keeps being lost cannot be re-issued forever); one under way (VMI shutting down,
    # gone or recreated) fails timeout after the last call, since a late re-issue started it anew.
    timeout = _secs(st.restart_timeout_seconds)
    in_progress = intent.attempted_at + timeout
    if vmi is None:
        if now.reached(in_progress):
            return _Eval(slot, VmiState.FAILED, rev, "VMI not recreated in time", record=RESULT_FAILED)
        return _Eval(slot, VmiState.RESTARTING, rev, "waiting for the new VMI", deadline=in_progress)
    if not _intent_targets(intent, vmi):
        if vmi.ready and not vmi.deleting:
            gate_ok, why = _done_gate(slot, intent, st, guests)
            if gate_ok:
                return _Eval(slot, VmiState.DONE, rev, "restarted and Ready", record=RESULT_DONE)
        else:
            why = "waiting for the new VMI to become Ready"
        if now.reached(in_progress):
            return _Eval(slot, VmiState.FAILED, rev, f"timed out {why}", record=RESULT_FAILED)
        return _Eval(slot, VmiState.RESTARTING, rev, why, deadline=in_progress)
    if vmi.deleting:
        if now.reached(in_progress):
            return _Eval(slot, VmiState.FAILED, rev, "old VMI did not shut down in time", record=RESULT_FAILED)
        return _Eval(slot, VmiState.RESTARTING, rev, "old VMI shutting down", deadline=in_progress)
    untouched = intent.issued_at + timeout
    if now.reached(untouched):
        return _Eval(slot, VmiState.FAILED, rev, "VMI was not restarted in time", record=RESULT_FAILED)
    # Intent written, target still running untouched: the call may have been lost in a crash.
    reissue_at = intent.attempted_at + _secs(st.reissue_after_seconds)
    return _Eval(slot, VmiState.RESTARTING, rev, "restart issued, not yet observed",
                 reissue_at=reissue_at, deadline=untouched)


def _done_gate(slot: _Slot, intent: RestartIntent, st: RolloutSettings,
               guests: Mapping[tuple[str, str], GuestGate]) -> tuple[bool, str]:
    if slot.missing:
        return False, "the new VMI lacks its license volume: is the admission webhook reachable?"
    if st.done_gate != DONE_GATE_READY_LICENSED:
        return True, ""
    report = guests.get((slot.namespace, slot.name))
    if report is None:
        return True, ""  # never reported: the probe is optional, Ready is the best evidence
    if report.proves_current(intent.issued_at):
        return True, ""
    return False, "waiting for a licensed guest report with the current token"


def _applies(intent: RestartIntent, slot: _Slot, st: RolloutSettings) -> bool:
    """Whether the intent tracks a restart that still matters for this slot.

    Without a VMI any intent does (a restart is in flight, possibly for a superseded revision).
    With a VMI only an intent for the governing replica's current revision does, and not when it
    names another VMI UID while the VMI we see is itself stale: then the intent was written from an
    outdated view and the VMI we see was never restarted.
    """
    vmi, replica = slot.vmi, slot.replica
    if vmi is None:
        return True
    if intent.revision != replica.revision or intent.replica not in (None, replica.name):
        return False
    if slot.missing and intent.result is not None and vmi.created > intent.issued_at + _secs(
            st.restart_timeout_seconds):
        return False  # created long after that restart ended: a new VMI, planned afresh
    return not (intent.vmi_uid and intent.vmi_uid != vmi.uid and _started(vmi) <= replica.revision_time)


def needs_live_check(intent: RestartIntent | None, revision: str, vmi_uid: str) -> bool:
    """Whether a restart call of ours could already have replaced the VMI a new restart targets.

    The restart subresource stops whatever VMI runs when it is called. Every call of ours is preceded
    by an intent on the VM, and the next intent is written guarded by the resourceVersion the plan
    saw, so once that write succeeds ``intent`` (the one it replaces) is the VM's whole restart
    history as far as it matters: with no intent, or one for another revision that is settled
    (a result recorded) and named another VMI, no call of ours for ``revision`` was ever made and
    none may still land on this VMI. The call about to be made is then the first for this revision
    whatever VMI it meets, so it needs no live read: a lagging VMI cache can at worst restart, once,
    a VMI someone else replaced in that lag. Otherwise (same revision: a forgiven failure or a view
    that disagreed with the intent; an unsettled or unnamed earlier call) read it live.
    """
    if intent is None:
        return False
    return intent.revision == revision or intent.result is None or intent.vmi_uid in (None, vmi_uid)


def _restartable(vm: model.Vm | None) -> bool:
    """Automatic restarts allowed: an owning VM, not opted out, with a run strategy that restarts."""
    return (vm is not None and vm.run_strategy not in UNRESTARTABLE_RUN_STRATEGIES
            and vm.annotations.get(model.ANN_RESTART_POLICY, "").strip().lower() != POLICY_MANUAL)


def _evaluate(slot: _Slot, st: RolloutSettings, guests: Mapping[tuple[str, str], GuestGate],
              control: SourceControl, now: _Now) -> _Eval:
    replica, vmi, vm, intent = slot.replica, slot.vmi, slot.vm, slot.intent
    rev = replica.revision
    guest = guests.get((slot.namespace, slot.name))
    if intent is not None and _applies(intent, slot, st):
        tracked = _track(slot, intent, st, guests, now)
        forgiven = control.resumed_at is not None and intent.issued_at < control.resumed_at
        if tracked.state is not VmiState.FAILED:
            return tracked
        if not forgiven:
            tracked.counts_failure = tracked.revision == rev
            return tracked
        # A forgiven failure: the VM is planned afresh, but only if its VMI still runs stale.
        if vmi is None or vmi.deleting or not _is_stale(vmi, replica, guest, slot.missing):
            return tracked
    if vmi is None:  # unreachable: slots without a VMI always carry an intent
        return _Eval(slot, VmiState.RESTARTING, rev, "waiting for the new VMI")
    # Recreated by a restart for a superseded revision: if that restart failed, the VMI is a failure,
    # not a rollout step, and stays out of the unavailability budget -- also once a newer revision
    # makes it stale, or a few such VMIs would hold the budget forever and stall the rollout.
    previous = _track(slot, intent, st, guests, now) if intent and not _intent_targets(intent, vmi) else None
    failed_vmi = previous is not None and previous.state is VmiState.FAILED
    if not _is_stale(vmi, replica, guest, slot.missing):
        if previous is not None and failed_vmi:
            return previous  # say so
        return _Eval(slot, VmiState.CURRENT, rev, "runs the current revision")
    if vm is None:
        return _Eval(slot, VmiState.BLOCKED, rev, "no owning VirtualMachine: restart it by hand")
    if vm.annotations.get(model.ANN_RESTART_POLICY, "").strip().lower() == POLICY_MANUAL:
        due = replica.revision_time + _secs(st.manual_deadline_seconds)
        overdue = now.reached(due)
        return _Eval(slot, VmiState.MANUAL, rev, "manual restart pending" + (" (overdue)" if overdue else ""),
                     overdue=overdue, deadline=None if overdue else due)
    if vm.run_strategy in UNRESTARTABLE_RUN_STRATEGIES:
        return _Eval(slot, VmiState.BLOCKED, rev, f"runStrategy {vm.run_strategy} does not support restart")
    if vmi.deleting:
        return _Eval(slot, VmiState.STALE, rev, "VMI already shutting down")
    eligible = replica.revision_time + _secs(_settle(st))
    reason = "license volume missing: pending restart" if slot.missing else "pending restart"
    if intent is not None and _intent_targets(intent, vmi):
        # A restart for another revision (or a forgiven one) targeted this very VMI: its call may
        # still be in flight, so wait out the re-issue delay before targeting the same UID again.
        hold = intent.attempted_at + _secs(st.reissue_after_seconds)
        if hold > eligible:
            eligible, reason = hold, "earlier restart may still be in flight"
    if reason.endswith("pending restart") and not now.reached(eligible):
        reason = "waiting for the revision to settle"
    return _Eval(slot, VmiState.STALE, rev, reason, eligible_at=eligible, failed_vmi=failed_vmi)


def _message(phase: Phase, revisions: tuple[str, ...], counts: Mapping[VmiState, int], overdue: int,
             unavailable: int, limit: int, pause: PauseReason | None, failures: int,
             max_failures: int, settles_at: dt.datetime | None) -> str:
    parts = [f"{n} {s.value}" for s, n in counts.items() if n]
    text = f"{phase.value}"
    if revisions:
        text += f" (revision {', '.join(revisions)})"
    if parts:
        text += ": " + ", ".join(parts)
    if overdue:
        text += f"; {overdue} manual overdue"
    if phase is Phase.PROGRESSING:
        text += f"; {unavailable}/{limit} unavailable"
    if pause is PauseReason.MANUAL:
        text += "; paused by the source annotation"
    elif pause is PauseReason.FAILURES:
        text += f"; paused after {failures} failed restarts (max {max_failures}), resume to continue"
    if settles_at is not None:
        text += f"; settles at {format_micro_time(settles_at)}"
    return text


# ---------------------------------------------------------------------------------------------
# The planner
# ---------------------------------------------------------------------------------------------


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
) -> RolloutPlan:
    """Decide restarts and report state for every VMI that mounts a replica or should (``wanted``:
    (namespace, VMI) -> replica names it must carry, from `licensectl.core.delivery`).

    Deterministic: the same observed state always yields the same plan, so a crashed controller
    resumes exactly where the cluster says it was. ``memo`` (kept by the caller from pass to pass)
    only saves work: the plan is the same with or without it.
    """
    st = settings
    by_key = {r.key: r for r in replicas}
    slots = _collect_slots(by_key, vmis, vms, wanted or {})
    no_control = SourceControl()
    memos: dict[tuple[str, str], _Memo] = {}
    if memo is None:
        evals = [_evaluate(s, st, guests, sources.get(s.replica.source, no_control), _Now(now)) for s in slots]
    else:
        memo._begin(st, now)
        evals = [memo._evaluate(s, st, guests, sources.get(s.replica.source, no_control), now, memos).ev
                 for s in slots]
        memo._keep(memos)

    by_source: dict[model.ObjectRef, list[_Eval]] = defaultdict(list)
    for e in evals:
        by_source[e.slot.replica.source].append(e)
    all_sources = sorted({r.source for r in by_key.values()} | set(sources),
                         key=lambda s: (s.namespace, s.name))

    ns_unavailable: dict[str, int] = defaultdict(int)
    for e in evals:
        if e.unavailable:
            ns_unavailable[e.slot.namespace] += 1

    results: list[Action] = [
        RecordResult(e.slot.namespace, e.slot.name, e.revision, e.record,
                     e.slot.vm.resource_version if e.slot.vm else "")
        for e in evals if e.record is not None and e.slot.intent is not None and e.slot.intent.result != e.record
    ]
    restarts: list[Action] = []
    statuses: dict[model.ObjectRef, RolloutStatus] = {}
    wakeups: list[dt.datetime] = []
    # Fleet-wide restart rate: restarts first issued in the last minute, read back from the intents.
    rate: list[int] = [-1]
    if st.max_restarts_per_minute >= 1:
        window = now - _secs(60)
        recent = sorted(e.slot.intent.issued_at for e in evals
                        if e.slot.intent is not None and window < e.slot.intent.issued_at <= now)
        rate = [max(0, st.max_restarts_per_minute - len(recent))]
        if rate[0] == 0 and recent:
            wakeups.append(recent[0] + _secs(60))

    for src in all_sources:
        group = by_source.get(src, [])
        control = sources.get(src, SourceControl())
        # Oldest first, so the last is what the newest replica write carries (during a safe rotation
        # the stable revision written back after an abort is newer than the candidate it replaced).
        newest: dict[str, dt.datetime] = {}
        for r in by_key.values():
            if r.source == src and (r.revision not in newest or r.revision_time > newest[r.revision]):
                newest[r.revision] = r.revision_time
        revisions = tuple(sorted(newest, key=lambda rev: (newest[rev], rev)))
        failures_by_rev: dict[str, int] = defaultdict(int)
        for e in group:
            if e.counts_failure:
                failures_by_rev[e.revision] += 1
        failures = max(failures_by_rev.values(), default=0)
        pause: PauseReason | None = None
        if control.paused:
            pause = PauseReason.MANUAL
        elif st.max_failures >= 1 and failures >= st.max_failures:
            pause = PauseReason.FAILURES

        affected = len(group)
        limit = st.unavailable_limit(affected)
        unavailable = sum(1 for e in group if e.unavailable)

        for e in group:
            # While paused, eligibility and re-issue times change nothing: no restart is made.
            times = [e.deadline] if pause is not None else [e.deadline, e.eligible_at, e.reissue_at]
            wakeups.extend(t for t in times if t is not None and t > now)

        if pause is None:
            for e in group:
                if (e.reissue_at is not None and e.reissue_at <= now and e.slot.intent and e.slot.vmi
                        and _restartable(e.slot.vm)):
                    restarts.append(RestartVm(
                        e.slot.namespace, e.slot.name, e.slot.vmi.uid, e.slot.intent.revision,
                        e.slot.intent.replica or e.slot.replica.name, e.slot.intent.issued_at, now,
                        reissue=True, vm_resource_version=e.slot.vm.resource_version if e.slot.vm else "",
                        check_live=True))
            unavailable = _pick(group, st, limit, unavailable, ns_unavailable, now, restarts, rate)

        counts = {s: 0 for s in VmiState}
        for e in group:
            counts[e.state] += 1
        overdue = sum(1 for e in group if e.overdue)
        stale = [e for e in group if e.state is VmiState.STALE]
        restarting = counts[VmiState.RESTARTING] > 0
        settles_at: dt.datetime | None = None
        if not group:
            phase = Phase.IDLE
        elif pause is PauseReason.FAILURES or (pause is not None and (stale or restarting)):
            phase = Phase.PAUSED  # a failure pause needs the hoster, even when nothing else is left
        elif restarting or any(e.eligible_at is None or e.eligible_at <= now for e in stale):
            phase = Phase.PROGRESSING
        elif stale:
            settle_times = [e.slot.replica.revision_time + _secs(_settle(st)) for e in stale]
            future = [t for t in settle_times if t > now]
            if future:
                phase, settles_at = Phase.SETTLING, min(future)
            else:
                phase = Phase.PROGRESSING  # only held back by an earlier in-flight restart
        else:
            phase = Phase.COMPLETE
        statuses[src] = RolloutStatus(
            source=src, revisions=revisions, phase=phase, counts=MappingProxyType(counts),
            overdue=overdue, affected=affected, unavailable=unavailable, max_unavailable=limit,
            failures=failures, pause_reason=pause, settles_at=settles_at,
            message=_message(phase, revisions, counts, overdue, unavailable, limit, pause, failures,
                             st.max_failures, settles_at),
        )

    vmi_states = {(e.slot.namespace, e.slot.name): _state_of(e, memos) for e in evals}
    results.sort(key=lambda a: (a.namespace, a.vm))
    return RolloutPlan(
        actions=tuple(results + restarts),
        vmi_states=MappingProxyType(vmi_states),
        sources=MappingProxyType(statuses),
        next_wakeup=min(wakeups, default=None),
    )


def _state_of(e: _Eval, memos: Mapping[tuple[str, str], _Memo]) -> VmiRolloutState:
    m = memos.get((e.slot.namespace, e.slot.name))
    if m is not None and m.state is not None:
        return m.state
    state = VmiRolloutState(e.state, e.revision, e.slot.replica.source, e.slot.replica.name, e.overdue, e.reason,
                            missing_volume=bool(e.slot.missing))
    if m is not None:
        m.state = state
    return state


def _pick(group: list[_Eval], st: RolloutSettings, limit: int, unavailable: int,
          ns_unavailable: dict[str, int], now: dt.datetime, out: list[Action], rate: list[int]) -> int:
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
            vmi, vm = e.slot.vmi, e.slot.vm
            assert vmi is not None and vm is not None  # guaranteed by the queue filter
            out.append(RestartVm(e.slot.namespace, vm.name, vmi.uid, e.slot.replica.revision,
                                 e.slot.replica.name, now, now, vm_resource_version=vm.resource_version,
                                 check_live=needs_live_check(e.slot.intent, e.slot.replica.revision, vmi.uid)))
            progress = True
    return unavailable
