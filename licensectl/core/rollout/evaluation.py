"""One guest's rollout state: each slot's evaluation -- current, stale, restarting, done, failed, blocked,
manual, awaiting evidence or undeliverable -- with the times at which it would change. Separate from the
planner because it looks at one guest at a time; the slots come from `slots`, budgets and ordering across
guests belong to `plan`, and `memo` reuses these evaluations between passes.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from licensectl.core import drain, model, preflight
from licensectl.core.delivery import Skip, refusal_text
from licensectl.core.rollout.constants import (
    DONE_GATE_READY_LICENSED,
    POLICY_MANUAL,
    RESULT_DONE,
    RESULT_FAILED,
    RESULT_RETRY,
    UNRESTARTABLE_RUN_STRATEGIES,
    Rule,
    VmiState,
)
from licensectl.core.rollout.inputs import GuestGate, ReplicaRevision, RestartIntent, RolloutSettings, SourceControl
from licensectl.core.rollout.slots import _Slot
from licensectl.core.rollout.timing import _Now, _secs, _settle, _started


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
    rule: Rule | None = None  # which rule judged current/stale/awaiting
    retry: int = 0  # backstop restarts that came back without the volume (next one is retry + 1)
    drain_held: bool = False  # a worker held by a condition (its tenant unreachable): no slot held
    down: bool = False  # a worker restarted whose Node is not back (BootTimeout): the source is not complete

    @property
    def unavailable(self) -> bool:
        # Failed, blocked or held: not a rollout step in flight, so no restart slot of its namespace or source
        # (a worker restarted and not back holds its tenant cluster's budget instead: docs/design.md#failure-domains).
        if self.state in (VmiState.FAILED, VmiState.BLOCKED) or self.failed_vmi or self.drain_held:
            return False
        if self.state is VmiState.RESTARTING:
            return True
        if self.state is VmiState.DRAINING:
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


class Verdict:
    CURRENT = "current"
    STALE = "stale"
    AWAITING = "awaiting"  # no report yet: only a report this leader may still receive can decide


def judge(vmi: model.Vmi, replica: ReplicaRevision, guest: GuestGate | None, *, stamp: bool | None = None,
          missing: tuple[str, ...] = (), evidence_pending: bool = False) -> tuple[str, Rule]:
    """Whether ``vmi`` runs ``replica``'s revision (a `Verdict`), and the rule that said so.

    No license disk: stale (only a restart through the webhook brings one). A webhook stamp decides by
    revision, never by time (docs/design.md#delivery-stamp). Without one, the time rule: started after
    the revision time is current; else a guest report since the revision time proving the current
    token is; a guest with no report while ``evidence_pending`` (a leader that just took over, whose
    predecessor held the reports) is neither (docs/design.md#evidence-after-takeover); else stale.
    """
    if missing:
        return Verdict.STALE, Rule.VOLUME
    if stamp is not None:
        return (Verdict.CURRENT if stamp else Verdict.STALE), Rule.STAMP
    if _started(vmi) > replica.revision_time:
        return Verdict.CURRENT, Rule.TIME
    if guest is not None and guest.proves_current(replica.revision_time):
        return Verdict.CURRENT, Rule.REPORT
    if guest is None and evidence_pending:
        return Verdict.AWAITING, Rule.REPORT
    return Verdict.STALE, Rule.TIME


def _is_stale(slot: _Slot, guest: GuestGate | None) -> bool:
    """Stale for certain (awaiting evidence is not stale)."""
    assert slot.vmi is not None
    return judge(slot.vmi, slot.replica, guest, stamp=slot.stamp, missing=slot.missing)[0] == Verdict.STALE


def _track(slot: _Slot, intent: RestartIntent, st: RolloutSettings,
           guests: Mapping[tuple[str, str], GuestGate], now: _Now) -> _Eval:
    """State of a restart the intent says was issued: restarting, done or failed."""
    vmi, rev = slot.vmi, intent.revision
    if intent.result == RESULT_DONE:
        return _Eval(slot, VmiState.DONE, rev, "restart recorded done")
    if intent.result == RESULT_FAILED:
        return _Eval(slot, VmiState.FAILED, rev, "restart recorded failed")
    if intent.result == RESULT_RETRY:
        return _retry(slot, intent, st, now, record=None)
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
        if slot.missing and not vmi.deleting:
            # The new VMI runs without its volume: final (volumes cannot change while it runs), so no
            # point waiting for the timeout; no failure either -- retried with backoff.
            return _retry(slot, intent, st, now, record=RESULT_RETRY)
        if vmi.ready and not vmi.deleting:
            gate_ok, why = _done_gate(slot, intent, st, guests, now)
            if gate_ok:
                return _Eval(slot, VmiState.DONE, rev, "restarted and Ready", record=RESULT_DONE)
            if why == _AWAITING and now.evidence_pending() and now.evidence_at is not None:
                # No failure on evidence this leader cannot have yet: the deadline waits for it.
                in_progress = max(in_progress, now.evidence_at)
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
    if (held := _preflight_hold(slot, rev, vmi, now)) is not None:
        # A re-issue the pre-flight refused: the call was never made again, the VMI runs on.
        return _Eval(slot, VmiState.BLOCKED, rev, held.reason(), eligible_at=held.recheck_at)
    if now.reached(untouched):
        return _Eval(slot, VmiState.FAILED, rev, "VMI was not restarted in time", record=RESULT_FAILED)
    # Intent written, target still running untouched: the call may have been lost in a crash.
    reissue_at = intent.attempted_at + _secs(st.reissue_after_seconds)
    return _Eval(slot, VmiState.RESTARTING, rev, "restart issued, not yet observed",
                 reissue_at=reissue_at, deadline=untouched)


_AWAITING = "awaiting guest evidence: this leader has not yet heard from this guest"


def _retry(slot: _Slot, intent: RestartIntent, st: RolloutSettings, now: _Now, *, record: str | None) -> _Eval:
    """A backstop restart came back without the volume: stale again, eligible after a bounded backoff."""
    at = intent.attempted_at + _secs(st.retry_delay(intent.attempt))
    reason = (f"restart {intent.attempt} came back without the license volume; "
              f"{'retrying' if now.reached(at) else 'retry after backoff'}")
    return _Eval(slot, VmiState.STALE, intent.revision, reason, eligible_at=at, record=record,
                 retry=intent.attempt, rule=Rule.VOLUME)


def _done_gate(slot: _Slot, intent: RestartIntent, st: RolloutSettings,
               guests: Mapping[tuple[str, str], GuestGate], now: _Now) -> tuple[bool, str]:
    if slot.missing:
        return False, "the new VMI lacks its license volume: is the admission webhook reachable?"
    if st.done_gate != DONE_GATE_READY_LICENSED:
        return True, ""
    report = guests.get((slot.namespace, slot.name))
    if report is None:
        if intent.guest_reports:  # it reported when the restart was issued: wait for its report, as ever
            return False, "waiting for a licensed guest report with the current token"
        if intent.guest_reports is None and now.evidence_pending():
            return False, _AWAITING  # maybe it reported to the previous leader: wait, do not pass it
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
    if intent.result == RESULT_RETRY and not slot.missing:
        return False  # the volume arrived (a restart by hand, say): judged afresh
    if slot.missing and intent.result in (RESULT_DONE, RESULT_FAILED) and vmi.created > intent.issued_at + _secs(
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


def guest_reports(guests: Mapping[tuple[str, str], GuestGate], key: tuple[str, str], now: _Now) -> bool | None:
    """What a restart intent records about its guest: it reported (True), it never did though this leader
    listened a whole silence window (False), or unknown yet (None) (docs/design.md#evidence-after-takeover)."""
    if key in guests:
        return True
    return None if now.evidence_pending() else False


def next_attempt(intent: RestartIntent | None, revision: str) -> int:
    """The attempt number of a new restart for ``revision``: after a backstop retry result, one more."""
    if intent is not None and intent.revision == revision and intent.result == RESULT_RETRY:
        return intent.attempt + 1
    return 1


def _restartable(vm: model.Vm | None) -> bool:
    """Automatic restarts allowed: an owning VM, not opted out, with a run strategy that restarts."""
    return (vm is not None and vm.run_strategy not in UNRESTARTABLE_RUN_STRATEGIES
            and vm.annotations.get(model.ANN_RESTART_POLICY, "").strip().lower() != POLICY_MANUAL)


def _evaluate(slot: _Slot, st: RolloutSettings, guests: Mapping[tuple[str, str], GuestGate],
              control: SourceControl, now: _Now) -> _Eval:
    replica, vmi, vm, intent = slot.replica, slot.vmi, slot.vm, slot.intent
    rev = replica.revision
    guest = guests.get((slot.namespace, slot.name))
    if vmi is not None and slot.blocker is not None:
        # A restart rebuilds the VMI from the same spec: the webhook would refuse it again. Not ours to fix,
        # never a failure (docs/design.md#delivery-blocked).
        return _Eval(slot, VmiState.UNDELIVERABLE, rev,
                     f"license volume cannot be delivered to this VM's spec ({slot.blocker}: "
                     f"{refusal_text(Skip(slot.blocker), slot.blocked_volume)}): fix the VM template",
                     rule=Rule.VOLUME)
    if vm is not None and vmi is not None and _worker_down(vm):
        # Restarted by its drain, its Node not back: blocked, whatever the VMI's revision says, so no view
        # calls the rollout complete while it is down (docs/design.md#tenant-worker-drain).
        return _Eval(slot, VmiState.BLOCKED, rev, "worker restarted, its Node not back Ready with a new boot ID "
                     "(BootTimeout): it holds its cluster's disruption budget", down=True)
    if intent is not None and _applies(intent, slot, st):
        tracked = _track(slot, intent, st, guests, now)
        forgiven = control.resumed_at is not None and intent.issued_at < control.resumed_at
        if tracked.state is not VmiState.FAILED:
            return tracked
        if not forgiven:
            tracked.counts_failure = tracked.revision == rev
            return tracked
        # A forgiven failure: the VM is planned afresh, but only if its VMI still runs stale.
        if vmi is None or vmi.deleting or not _is_stale(slot, guest):
            return tracked
    if vmi is None:  # unreachable: slots without a VMI always carry an intent
        return _Eval(slot, VmiState.RESTARTING, rev, "waiting for the new VMI")
    # Recreated by a restart for a superseded revision: if that restart failed, the VMI is a failure,
    # not a rollout step, and stays out of the unavailability budget -- also once a newer revision
    # makes it stale, or a few such VMIs would hold the budget forever and stall the rollout.
    previous = _track(slot, intent, st, guests, now) if intent and not _intent_targets(intent, vmi) else None
    failed_vmi = previous is not None and previous.state is VmiState.FAILED
    verdict, rule = judge(vmi, replica, guest, stamp=slot.stamp, missing=slot.missing,
                          evidence_pending=now.evidence_pending())
    if verdict != Verdict.STALE:
        if previous is not None and failed_vmi:
            return previous  # say so
        if verdict == Verdict.AWAITING:
            assert now.evidence_at is not None  # evidence_pending
            return _Eval(slot, VmiState.AWAITING_EVIDENCE, rev, "no guest report yet since this leader took over",
                         deadline=now.evidence_at, failed_vmi=failed_vmi, rule=rule)
        return _Eval(slot, VmiState.CURRENT, rev, "runs the current revision", rule=rule)
    if vm is None:
        return _Eval(slot, VmiState.BLOCKED, rev, "no owning VirtualMachine: restart it by hand")
    role = drain.worker_role(vm.labels)
    if role is drain.Role.CONTROL_PLANE or (
            vm.annotations.get(model.ANN_RESTART_POLICY, "").strip().lower() == POLICY_MANUAL):
        due = replica.revision_time + _secs(st.manual_deadline_seconds)
        overdue = now.reached(due)
        what = (f"control-plane machine of tenant cluster {vm.labels.get(drain.LABEL_CLUSTER_NAME)}: restart it by "
                "hand" if role is drain.Role.CONTROL_PLANE else "manual restart pending")
        return _Eval(slot, VmiState.MANUAL, rev, what + (" (overdue)" if overdue else ""),
                     overdue=overdue, deadline=None if overdue else due)
    if vm.run_strategy in UNRESTARTABLE_RUN_STRATEGIES:
        return _Eval(slot, VmiState.BLOCKED, rev, f"runStrategy {vm.run_strategy} does not support restart")
    hold: dt.datetime | None = None
    if role is drain.Role.WORKER:
        worker = _worker_state(slot, vm, rev, st, now, failed_vmi, rule)
        if isinstance(worker, _Eval):
            return worker
        hold = worker
    if vmi.deleting:
        return _Eval(slot, VmiState.STALE, rev, "VMI already shutting down")
    if (refused := _preflight_hold(slot, rev, vmi, now)) is not None:
        # Its new VMI would be refused admission: never restarted, no slot, not in progress, asked again later
        # (docs/design.md#restart-preflight).
        return _Eval(slot, VmiState.BLOCKED, rev, refused.reason(), eligible_at=refused.recheck_at,
                     failed_vmi=failed_vmi, rule=rule)
    eligible = replica.revision_time + _secs(_settle(st))
    if hold is not None and hold > eligible:
        eligible = hold
    reason = "license volume missing: pending restart" if slot.missing else "pending restart"
    if intent is not None and _intent_targets(intent, vmi):
        # A restart for another revision (or a forgiven one) targeted this very VMI: its call may
        # still be in flight, so wait out the re-issue delay before targeting the same UID again.
        hold = intent.attempted_at + _secs(st.reissue_after_seconds)
        if hold > eligible:
            eligible, reason = hold, "earlier restart may still be in flight"
    held_now = hold is not None and hold >= eligible and not now.reached(eligible)
    if held_now:
        held = drain.held_of(vm.annotations)
        reason = f"worker drain held ({held.reason.value if held else 'condition'}): planned again later"
    elif reason.endswith("pending restart") and not now.reached(eligible):
        reason = "waiting for the revision to settle"
    return _Eval(slot, VmiState.STALE, rev, reason, eligible_at=eligible, failed_vmi=failed_vmi, rule=rule,
                 drain_held=held_now)


def _preflight_hold(slot: _Slot, rev: str, vmi: model.Vmi, now: _Now) -> preflight.PreflightHold | None:
    """The pre-flight refusal recorded on the VM for a restart of this very VMI for `rev`, while it holds."""
    held = preflight.hold_of(slot.vm.annotations) if slot.vm is not None else None
    if held is None or held.revision != rev or held.vmi_uid != vmi.uid or now.reached(held.recheck_at):
        return None
    return held


def _worker_down(vm: model.Vm) -> bool:
    if drain.ANN_DRAIN_STEP not in vm.annotations or drain.worker_role(vm.labels) is not drain.Role.WORKER:
        return False
    intent = drain.parse_annotations(vm.annotations)
    return isinstance(intent, drain.DrainIntent) and intent.down


def _worker_state(slot: _Slot, vm: model.Vm, rev: str, st: RolloutSettings, now: _Now, failed_vmi: bool,
                  rule: Rule | None) -> _Eval | dt.datetime | None:
    """A stale tenant-cluster worker: draining (its cycle open), blocked for this revision (the cycle closed
    on a condition), or held back until a time (a condition seen without a cycle); None: plan it as any VM."""
    intent = drain.parse_annotations(vm.annotations)
    held = drain.held_of(vm.annotations)
    if isinstance(intent, drain.IntentProblem) or (intent is not None and intent.active):
        step = "unreadable intent" if isinstance(intent, drain.IntentProblem) else intent.step.value if intent else ""
        why = f"tenant Node cordoned and drained before the restart ({step})"
        if held is not None:
            why += f"; held: {held.reason.value}"
        return _Eval(slot, VmiState.DRAINING, rev, why, drain_held=held is not None, failed_vmi=failed_vmi,
                     rule=rule)
    if intent is not None and intent.step is drain.Step.BLOCKED and intent.revision == rev:
        why = intent.reason.value if intent.reason else ""
        return _Eval(slot, VmiState.BLOCKED, rev, f"worker drain blocked: {why} (resolve it, then restart the VM "
                     "by hand or wait for the next revision)", rule=rule)
    if held is not None:
        until = held.at + _secs(st.drain_hold_seconds)
        if now.reached(until):
            return None
        return until
    return None
