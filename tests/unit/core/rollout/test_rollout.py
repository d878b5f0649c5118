"""Rollout planner: unit tests per rule, then a simulation of KubeVirt stepped with the planner."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as hst

from licensectl.core import model
from licensectl.core.model import ObjectRef, ReplicaSecret, Vm, Vmi, frozen_map
from licensectl.core.rollout import (
    GuestGate,
    PauseReason,
    Phase,
    PlanMemo,
    RecordResult,
    ReplicaRevision,
    RestartIntent,
    RestartVm,
    RolloutPlan,
    RolloutSettings,
    SourceControl,
    VmiState,
    needs_live_check,
    plan_rollout,
)
from licensectl.core.timecodec import annotation_time, to_epoch_us

T0 = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
SRC = ObjectRef("licensectl-system", "nvidia-license")
SRC2 = ObjectRef("licensectl-system", "compute-license")
LIC = "nvidia-license"
ST = RolloutSettings(settle_seconds=60, max_unavailable="10", max_per_namespace=10, max_failures=3,
                     restart_timeout_seconds=600, manual_deadline_seconds=3600, done_gate="ready",
                     reissue_after_seconds=60)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def rep(ns: str = "t-a", name: str = LIC, rev: str = "r1", t: float = 0, source: ObjectRef = SRC
        ) -> ReplicaRevision:
    return ReplicaRevision(ns, name, rev, at(t), source)


_uids = itertools.count()


def vmi(ns: str = "t-a", name: str = "vm1", *, uid: str | None = None, started: float = -1000,
        ready: bool = True, deleting: bool = False, owner: str | None = "", secrets: Sequence[str] = (LIC,),
        running_since: float | None = None) -> Vmi:
    return Vmi(namespace=ns, name=name, uid=uid or f"uid-{next(_uids)}", created_us=to_epoch_us(at(started)),
               owner_vm=name if owner == "" else owner, phase="Running" if ready else "Scheduling",
               ready=ready, running_since_us=None if running_since is None else to_epoch_us(at(running_since)),
               secret_volumes=tuple(secrets), firmware_uuid=None, deleting=deleting)


def vm(ns: str = "t-a", name: str = "vm1", *, run_strategy: str | None = "Always",
       ann: Mapping[str, str] | None = None) -> Vm:
    return Vm(ns, name, run_strategy, frozen_map(ann), resource_version="7")


def intent(rev: str, issued: float, uid: str, *, attempted: float | None = None, replica: str = LIC,
           result: str | None = None) -> dict[str, str]:
    action = RestartVm("t-a", "vm1", uid, rev, replica, at(issued), at(issued if attempted is None else attempted))
    ann = {k: v for k, v in action.intent_annotations().items() if v is not None}
    if result:
        ann[model.ANN_RESTART_RESULT] = result
    return ann


def plan(replicas: Sequence[ReplicaRevision], vmis: Sequence[Vmi], vms: Sequence[Vm], now: float, *,
         st: RolloutSettings = ST, guests: Mapping[tuple[str, str], GuestGate] | None = None,
         sources: Mapping[ObjectRef, SourceControl] | None = None) -> RolloutPlan:
    return plan_rollout(replicas=replicas, vmis=vmis, vms=vms, guests=guests or {}, sources=sources or {},
                        settings=st, now=at(now))


def state(p: RolloutPlan, ns: str = "t-a", name: str = "vm1") -> VmiState:
    return p.vmi_states[(ns, name)].state


def test_replica_revision_from_secret() -> None:
    ann = {model.ANN_CLASS: "vws", model.ANN_REVISION: "abc", model.ANN_REVISION_TIME: "2024-05-01T12:00:00Z",
           model.ANN_SOURCE_NAMESPACE: SRC.namespace, model.ANN_SOURCE_NAME: SRC.name}
    labels = {model.MANAGED_BY_LABEL: model.MANAGED_BY_VALUE}
    s = ReplicaSecret("t-a", LIC, "u", "1", frozen_map(labels), frozen_map(ann))
    assert ReplicaRevision.from_secret(s) == ReplicaRevision("t-a", LIC, "abc", at(0), SRC, "vws")
    broken = dict(ann, **{model.ANN_REVISION_TIME: "soon"})
    assert ReplicaRevision.from_secret(dataclasses.replace(s, annotations=frozen_map(broken))) is None
    assert ReplicaRevision.from_secret(dataclasses.replace(s, labels=frozen_map({}))) is None


def test_source_control_from_annotations() -> None:
    assert SourceControl.from_annotations({}) == SourceControl(False, None)
    c = SourceControl.from_annotations({model.ANN_ROLLOUT_PAUSED: "true",
                                        model.ANN_ROLLOUT_RESUMED_AT: "2024-05-01T12:00:00Z"})
    assert c == SourceControl(True, at(0))
    assert not SourceControl.from_annotations({model.ANN_ROLLOUT_PAUSED: "false"}).paused


def test_intent_roundtrip_through_annotations() -> None:
    a = RestartVm("t-a", "vm1", "u1", "r1", LIC, at(5), at(65), reissue=True)
    ann = a.intent_annotations()
    assert ann[model.ANN_RESTART_RESULT] is None  # a new intent clears the previous result
    parsed = RestartIntent.from_annotations({k: v for k, v in ann.items() if v is not None})
    assert parsed == RestartIntent("r1", at(5), at(65), "u1", LIC, None)
    assert RestartIntent.from_annotations({model.ANN_RESTART_REVISION: "r1"}) is None
    assert RecordResult("t-a", "vm1", "r1", "done").annotations() == {model.ANN_RESTART_RESULT: "done"}


def test_unavailable_limits() -> None:
    s = RolloutSettings(max_unavailable="25%", reissue_after_seconds=12.0)
    assert s.unavailable_limit(10) == 2  # 2.5 rounded down
    assert s.unavailable_limit(3) == 1  # minimum 1
    assert RolloutSettings(max_unavailable="5").unavailable_limit(1000) == 5
    assert RolloutSettings(max_unavailable="100%").unavailable_limit(7) == 7


# ---------------------------------------------------------------------------------------------
# Staleness
# ---------------------------------------------------------------------------------------------


def test_stale_vs_current_by_start_time() -> None:
    vs = [vmi(name="old", started=-10), vmi(name="new", started=10),
          vmi(name="tie", started=0),  # same second as the revision: cannot tell, so stale
          vmi(name="resumed", started=-10, running_since=5),  # running_since wins over created
          vmi(name="other", started=-10, secrets=("unrelated",))]
    p = plan([rep()], vs, [vm(name=v.name) for v in vs], now=100)
    assert state(p, name="old") is VmiState.STALE
    assert state(p, name="new") is VmiState.CURRENT
    assert state(p, name="tie") is VmiState.STALE
    assert state(p, name="resumed") is VmiState.CURRENT
    assert ("t-a", "other") not in p.vmi_states
    assert {r.vm for r in p.restarts} == {"old", "tie"}


def test_guest_report_proves_current_only_when_after_revision_and_licensed() -> None:
    vs = [vmi(name=n) for n in ("proven", "early", "unlicensed", "oldtoken")]
    guests = {("t-a", "proven"): GuestGate(True, True, at(30)),
              ("t-a", "early"): GuestGate(True, True, at(-1)),
              ("t-a", "unlicensed"): GuestGate(False, True, at(30)),
              ("t-a", "oldtoken"): GuestGate(True, False, at(30))}
    p = plan([rep()], vs, [vm(name=v.name) for v in vs], now=100, guests=guests)
    assert state(p, name="proven") is VmiState.CURRENT
    assert {r.vm for r in p.restarts} == {"early", "unlicensed", "oldtoken"}


def test_vmi_mounting_two_replicas_is_governed_by_the_newest() -> None:
    r_a = rep(name="a", rev="ra", t=-500, source=SRC)
    r_b = rep(name="b", rev="rb", t=0, source=SRC2)
    v = vmi(started=-100, secrets=("a", "b"))  # current for a, stale for b
    p = plan([r_a, r_b], [v], [vm()], now=100)
    s = p.vmi_states[("t-a", "vm1")]
    assert (s.state, s.revision, s.source, s.replica) == (VmiState.STALE, "rb", SRC2, "b")
    assert p.restarts == (RestartVm("t-a", "vm1", v.uid, "rb", "b", at(100), at(100), vm_resource_version="7",
                                    check_live=False, guest_reports=False),)
    assert p.sources[SRC].phase is Phase.IDLE and p.sources[SRC2].phase is Phase.PROGRESSING


# ---------------------------------------------------------------------------------------------
# Settle, blocked, manual
# ---------------------------------------------------------------------------------------------


def test_settle_delays_restarts_and_sets_wakeup() -> None:
    vs, ms = [vmi()], [vm()]
    early = plan([rep(t=0)], vs, ms, now=30)
    assert early.restarts == ()
    assert state(early) is VmiState.STALE
    st = early.sources[SRC]
    assert st.phase is Phase.SETTLING and st.settles_at == at(60)
    assert early.next_wakeup == at(60)
    assert "settles at" in st.message
    # A second edit bumps the revision time: the settle window starts over, still one rollout.
    bumped = plan([rep(rev="r2", t=50)], vs, ms, now=70)
    assert bumped.restarts == () and bumped.sources[SRC].settles_at == at(110)
    ready = plan([rep(t=0)], vs, ms, now=60)
    assert [r.vm for r in ready.restarts] == ["vm1"]
    assert ready.sources[SRC].phase is Phase.PROGRESSING


def test_standalone_vmi_and_missing_owner_are_blocked_never_restarted() -> None:
    vs = [vmi(name="solo", owner=None), vmi(name="orphan", owner="gone"), vmi(name="fresh", owner=None, started=5)]
    p = plan([rep()], vs, [], now=1000)
    assert state(p, name="solo") is VmiState.BLOCKED
    assert state(p, name="orphan") is VmiState.BLOCKED
    assert state(p, name="fresh") is VmiState.CURRENT
    assert p.restarts == ()
    assert p.sources[SRC].phase is Phase.COMPLETE
    assert p.sources[SRC].counts[VmiState.BLOCKED] == 2


@pytest.mark.parametrize("strategy", ["Once", "Halted"])
def test_run_strategies_without_restart_are_blocked(strategy: str) -> None:
    p = plan([rep()], [vmi()], [vm(run_strategy=strategy)], now=1000)
    assert state(p) is VmiState.BLOCKED and strategy in p.vmi_states[("t-a", "vm1")].reason
    assert p.restarts == ()


@pytest.mark.parametrize("strategy", ["Always", "RerunOnFailure", "Manual", None])
def test_restartable_run_strategies(strategy: str | None) -> None:
    assert len(plan([rep()], [vmi()], [vm(run_strategy=strategy)], now=1000).restarts) == 1


def test_manual_policy_is_pending_never_restarted_and_overdue_after_deadline() -> None:
    ms = [vm(ann={model.ANN_RESTART_POLICY: "manual"})]
    before = plan([rep()], [vmi()], ms, now=3599)
    s = before.vmi_states[("t-a", "vm1")]
    assert s.state is VmiState.MANUAL and not s.overdue
    assert before.restarts == ()
    assert before.next_wakeup == at(3600)
    after = plan([rep()], [vmi()], ms, now=3600)
    assert after.vmi_states[("t-a", "vm1")].overdue
    assert after.sources[SRC].overdue == 1 and "overdue" in after.sources[SRC].message
    assert after.restarts == () and after.next_wakeup is None
    assert after.sources[SRC].phase is Phase.COMPLETE  # no automatic work left
    # A manual VM that was restarted by its owner is simply current.
    assert state(plan([rep()], [vmi(started=10)], ms, now=4000)) is VmiState.CURRENT


# ---------------------------------------------------------------------------------------------
# Intent tracking, crash safety, exactly once
# ---------------------------------------------------------------------------------------------


def test_restart_action_carries_intent_fields() -> None:
    v = vmi(uid="u1")
    (a,) = plan([rep()], [v], [vm()], now=100).restarts
    assert a == RestartVm("t-a", "vm1", "u1", "r1", LIC, at(100), at(100), reissue=False, vm_resource_version="7",
                          check_live=False, guest_reports=False)


@pytest.mark.parametrize(("intent_", "expected"), [
    (None, False),  # never restarted by us
    (RestartIntent("r0", at(-900), at(-900), "old", LIC, "done"), False),  # settled, another revision and VMI
    (RestartIntent("r0", at(-900), at(-900), "old", LIC, "failed"), False),
    (RestartIntent("r0", at(-900), at(-900), "old", LIC, None), True),  # an earlier call may still land
    (RestartIntent("r0", at(-900), at(-900), "u1", LIC, "failed"), True),  # it named this very VMI
    (RestartIntent("r0", at(-900), at(-900), None, LIC, "done"), True),  # it named no VMI
    (RestartIntent("r1", at(-900), at(-900), "old", LIC, "done"), True),  # a restart of ours for this revision
    (RestartIntent("r1", at(-900), at(-900), "u1", LIC, "failed"), True),
])
def test_live_check_only_where_a_restart_of_ours_could_have_replaced_the_target(
        intent_: RestartIntent | None, expected: bool) -> None:
    assert needs_live_check(intent_, "r1", "u1") is expected


def test_restarts_carry_the_live_check_decision() -> None:
    # First restart of a fleet, and the next revision after a recorded one: no live read needed.
    (a,) = plan([rep()], [vmi(uid="u1")], [vm()], now=100).restarts
    assert not a.check_live
    done_before = vm(ann=intent("r0", -2000, "u0", result="done"))
    (b,) = plan([rep()], [vmi(uid="u1", started=-1500)], [done_before], now=100).restarts
    assert not b.check_live
    # A forgiven failure for the same revision and VMI: a late call may have replaced it meanwhile.
    failed = vm(ann=intent("r1", 100, "u1", result="failed"))
    resumed = {SRC: SourceControl(resumed_at=at(200))}
    (c,) = plan([rep()], [vmi(uid="u1")], [failed], now=300, sources=resumed).restarts
    assert c.check_live and not c.reissue
    # A restart for an older revision still unsettled when the next revision arrives.
    pending = vm(ann=intent("r0", -2000, "u0"))
    (d,) = plan([rep()], [vmi(uid="u1", started=-1500)], [pending], now=100).restarts
    assert d.check_live


def test_a_plan_shares_equal_states_and_keeps_the_keys_it_holds() -> None:
    """50,000 guests in a handful of states hold a handful of state objects, and a pass over unchanged
    guests holds no new key tuple: what the plan costs in memory is the guests that changed."""
    memo = PlanMemo()
    vs = [vmi(ns=f"t-{i % 3}", name=f"vm{i}", uid=f"u{i}") for i in range(30)]
    ms = [vm(ns=f"t-{i % 3}", name=f"vm{i}") for i in range(30)]
    reps = [rep(ns=f"t-{i}", rev="r2" if i == 2 else "r1") for i in range(3)]

    def once(now: float, vmis: Sequence[Vmi] = vs) -> RolloutPlan:
        p = plan_rollout(replicas=reps, vmis=vmis, vms=ms, guests={}, sources={}, settings=ST, now=at(now),
                         memo=memo)
        assert p == plan(reps, vmis, ms, now)
        return p

    first = once(10)
    assert {st.state for st in first.vmi_states.values()} == {VmiState.STALE}
    assert len({id(st) for st in first.vmi_states.values()}) == 2  # one per revision, not one per guest
    without_memo = plan(reps, vs, ms, 10)
    assert len({id(st) for st in without_memo.vmi_states.values()}) == 2
    changed = [*vs[:1], dataclasses.replace(vs[1], ready=False), *vs[2:]]
    second = once(20, changed)
    keys_before = {k: k for k in first.vmi_states}
    assert all(k is keys_before[k] for k in second.vmi_states)  # the same tuples, not equal copies
    assert all(second.vmi_states[k] is first.vmi_states[k] for k in first.vmi_states)


def test_memo_parses_a_vm_intent_once_per_vm_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass needs every VM's intent; the memo hands back the last pass's slot, parse included, for
    the very same VM object (no cache of parses of its own), and a VM replaced by a write is parsed again."""
    parsed: list[str] = []
    real = RestartIntent.from_annotations

    def counting(annotations: Mapping[str, str]) -> RestartIntent | None:
        parsed.append(annotations.get(model.ANN_RESTART_RESULT, "-"))
        return real(annotations)

    monkeypatch.setattr(RestartIntent, "from_annotations", counting)
    memo = PlanMemo()
    in_flight = vm(ann=intent("r1", 50, "u0"))
    current = [vmi(uid="u1", started=100)]

    def once(v: Vm, now: float) -> RolloutPlan:
        p = plan_rollout(replicas=[rep()], vmis=current, vms=[v], guests={}, sources={}, settings=ST,
                         now=at(now), memo=memo)
        assert p == plan([rep()], current, [v], now)
        return p

    once(in_flight, 200)
    slot = memo.last_slot("t-a", "vm1")
    once(in_flight, 210)
    once(in_flight, 220)
    assert parsed.count("-") == 1 + 3  # the memo's pass once; each plan without a memo once
    assert memo.last_slot("t-a", "vm1") is slot is not None  # an unchanged guest makes no new slot
    recorded = vm(ann=intent("r1", 50, "u0", result="done"))
    assert state(once(recorded, 230)) is VmiState.DONE
    assert parsed.count("done") == 2  # the replaced VM, in the memo's pass and in the plan without one


def test_memo_reevaluates_only_changed_guests_and_those_whose_times_came() -> None:
    memo = PlanMemo()
    vs = [vmi(name=f"vm{i}", uid=f"u{i}") for i in range(4)]
    ms = [vm(name=f"vm{i}") for i in range(4)]
    ms[3] = vm(name="vm3", ann=intent("r1", 50, "u3"))  # in flight: re-issue at 110, fails at 650

    def both(now: float, vmis: Sequence[Vmi] = vs) -> RolloutPlan:
        p = plan_rollout(replicas=[rep()], vmis=vmis, vms=ms, guests={}, sources={}, settings=ST, now=at(now),
                         memo=memo)
        assert p == plan([rep()], vmis, ms, now)
        return p

    both(10)  # settling until 60
    assert memo.hits == 0
    both(20)
    assert memo.hits == 4
    both(61)  # settled: the three stale ones are re-evaluated, the in-flight one holds until 650
    assert memo.hits == 5
    replaced = [*vs[:1], dataclasses.replace(vs[1], ready=False), *vs[2:]]
    p = both(70, replaced)
    assert memo.hits == 8  # only the changed VMI was evaluated again
    assert state(p, name="vm3") is VmiState.RESTARTING
    assert state(both(651, replaced), name="vm3") is VmiState.FAILED
    both(640)  # the clock stepped back: nothing reused
    assert memo.hits == 11


def test_intent_written_but_restart_lost_is_reissued_for_same_uid_after_delay() -> None:
    ms = [vm(ann=intent("r1", 100, "u1"))]
    vs = [vmi(uid="u1")]
    soon = plan([rep()], vs, ms, now=159)
    assert state(soon) is VmiState.RESTARTING and soon.restarts == ()
    assert soon.next_wakeup == at(160)
    later = plan([rep()], vs, ms, now=160)
    assert later.restarts == (RestartVm("t-a", "vm1", "u1", "r1", LIC, at(100), at(160), reissue=True,
                                        vm_resource_version="7", check_live=True),)
    # After the re-issue the shell recorded the attempt: the next one waits again.
    again = plan([rep()], vs, [vm(ann=intent("r1", 100, "u1", attempted=160))], now=200)
    assert again.restarts == () and again.next_wakeup == at(220)


def test_no_restart_for_deleting_vmi() -> None:
    with_intent = plan([rep()], [vmi(uid="u1", deleting=True)], [vm(ann=intent("r1", 100, "u1"))], now=500)
    assert state(with_intent) is VmiState.RESTARTING and with_intent.restarts == ()
    no_intent = plan([rep()], [vmi(deleting=True)], [vm()], now=500)
    assert state(no_intent) is VmiState.STALE and no_intent.restarts == ()
    assert no_intent.sources[SRC].unavailable == 1


def test_recreated_vmi_is_never_restarted_again_and_becomes_done() -> None:
    ms = [vm(ann=intent("r1", 100, "u1"))]
    booting = plan([rep()], [vmi(uid="u2", started=130, ready=False)], ms, now=150)
    assert state(booting) is VmiState.RESTARTING and booting.restarts == ()
    assert booting.next_wakeup == at(700)  # the restart timeout
    done = plan([rep()], [vmi(uid="u2", started=130)], ms, now=200)
    assert state(done) is VmiState.DONE and done.restarts == ()
    assert done.results == (RecordResult("t-a", "vm1", "r1", "done", "7"),)
    recorded = plan([rep()], [vmi(uid="u2", started=130)], [vm(ann=intent("r1", 100, "u1", result="done"))],
                    now=200)
    assert state(recorded) is VmiState.DONE and recorded.actions == ()  # idempotent: nothing to rewrite
    assert recorded.sources[SRC].phase is Phase.COMPLETE and recorded.next_wakeup is None


def test_vmi_missing_while_restarting_counts_unavailable_then_times_out() -> None:
    ms = [vm(ann=intent("r1", 100, "u1"))]
    gone = plan([rep()], [], ms, now=200)
    assert state(gone) is VmiState.RESTARTING
    assert gone.sources[SRC].unavailable == 1 and gone.sources[SRC].affected == 1
    late = plan([rep()], [], ms, now=700)
    assert state(late) is VmiState.FAILED
    assert late.results == (RecordResult("t-a", "vm1", "r1", "failed", "7"),)
    # A VM stopped on purpose (Halted, no VMI) is not part of the rollout.
    assert plan([rep()], [], [vm(run_strategy="Halted", ann=intent("r1", 100, "u1"))], now=700).vmi_states == {}


def test_late_reissue_restarts_the_timeout_clock_once_under_way() -> None:
    # Issued at 100, lost, re-issued at 650: the restart really started then and is not failed
    # at 700 although more than the timeout passed since 100; it still counts as unavailable.
    ms = [vm(ann=intent("r1", 100, "u1", attempted=650))]
    for vs in ([vmi(uid="u1", deleting=True)], [], [vmi(uid="u2", started=690, ready=False)]):
        p = plan([rep()], vs, ms, now=700)
        assert state(p) is VmiState.RESTARTING and p.sources[SRC].unavailable == 1
        assert p.next_wakeup == at(1250)
    # But a call that never takes effect fails on the first clock, however often it is re-issued.
    assert state(plan([rep()], [vmi(uid="u1")], ms, now=700)) is VmiState.FAILED


def test_restart_timeout_and_recorded_failure() -> None:
    never_ready = plan([rep()], [vmi(uid="u2", started=130, ready=False)], [vm(ann=intent("r1", 100, "u1"))],
                       now=700)
    assert state(never_ready) is VmiState.FAILED and never_ready.results[0].result == "failed"
    # A failed VMI is covered by the failure budget, not the unavailability budget.
    assert never_ready.sources[SRC].unavailable == 0 and never_ready.sources[SRC].failures == 1
    never_restarted = plan([rep()], [vmi(uid="u1")], [vm(ann=intent("r1", 100, "u1"))], now=700)
    assert state(never_restarted) is VmiState.FAILED and never_restarted.restarts == ()
    recorded = plan([rep()], [vmi(uid="u1")], [vm(ann=intent("r1", 100, "u1", result="failed"))], now=300)
    assert state(recorded) is VmiState.FAILED and recorded.actions == ()


def test_intent_without_uid_infers_target_from_start_time() -> None:
    ann = {k: v for k, v in intent("r1", 100, "x").items() if k != model.ANN_RESTART_VMI_UID}
    still_old = plan([rep()], [vmi(uid="u1", started=-50)], [vm(ann=ann)], now=200)
    assert state(still_old) is VmiState.RESTARTING
    assert [a.vmi_uid for a in still_old.restarts] == ["u1"]  # re-issue for the VMI that was running
    recreated = plan([rep()], [vmi(uid="u9", started=150)], [vm(ann=ann)], now=200)
    assert state(recreated) is VmiState.DONE and recreated.restarts == ()


def test_intent_naming_another_uid_while_vmi_is_stale_does_not_mark_done() -> None:
    # The intent was written from an outdated view; the VMI we see was never restarted.
    p = plan([rep()], [vmi(uid="u7", started=-50)], [vm(ann=intent("r1", 100, "u1"))], now=200)
    assert state(p) is VmiState.STALE
    assert [a.vmi_uid for a in p.restarts] == ["u7"]


def test_ready_licensed_gate() -> None:
    st = dataclasses.replace(ST, done_gate="ready-licensed")
    ms = [vm(ann=intent("r1", 100, "u1"))]
    vs = [vmi(uid="u2", started=130)]
    never_reported = plan([rep()], vs, ms, now=200, st=st)
    assert state(never_reported) is VmiState.DONE
    old_report = plan([rep()], vs, ms, now=200, st=st, guests={("t-a", "vm1"): GuestGate(True, True, at(90))})
    assert state(old_report) is VmiState.RESTARTING and "licensed" in old_report.vmi_states[("t-a", "vm1")].reason
    bad = plan([rep()], vs, ms, now=200, st=st, guests={("t-a", "vm1"): GuestGate(False, True, at(150))})
    assert state(bad) is VmiState.RESTARTING
    good = plan([rep()], vs, ms, now=200, st=st, guests={("t-a", "vm1"): GuestGate(True, True, at(150))})
    assert state(good) is VmiState.DONE
    timed_out = plan([rep()], vs, ms, now=700, st=st, guests={("t-a", "vm1"): GuestGate(False, True, at(150))})
    assert state(timed_out) is VmiState.FAILED


# ---------------------------------------------------------------------------------------------
# Supersede
# ---------------------------------------------------------------------------------------------


def test_new_revision_supersedes_in_flight_restart() -> None:
    r2 = rep(rev="r2", t=200)
    ms = [vm(ann=intent("r1", 100, "u1"))]
    after_new = plan([r2], [vmi(uid="u2", started=250)], ms, now=400)
    assert state(after_new) is VmiState.CURRENT and after_new.restarts == ()
    before_new = plan([r2], [vmi(uid="u2", started=150)], ms, now=400)
    assert state(before_new) is VmiState.STALE
    assert [(a.vmi_uid, a.revision) for a in before_new.restarts] == [("u2", "r2")]
    # The old intent targets the running VMI and its call may be in flight: hold, then restart.
    held = plan([r2], [vmi(uid="u1")], [vm(ann=intent("r1", 230, "u1"))], now=265)
    assert state(held) is VmiState.STALE and held.restarts == ()
    assert held.next_wakeup == at(290)
    assert [a.vmi_uid for a in plan([r2], [vmi(uid="u1")], [vm(ann=intent("r1", 230, "u1"))],
                                    now=290).restarts] == ["u1"]
    # Missing VMI with an intent for the old revision: still in flight, counted unavailable.
    gone = plan([r2], [], ms, now=300)
    assert state(gone) is VmiState.RESTARTING and gone.sources[SRC].unavailable == 1


def test_failures_count_per_revision() -> None:
    st = dataclasses.replace(ST, max_failures=1)
    ms = [vm(ann=intent("r1", 100, "u1", result="failed")), vm(name="vm2")]
    vs = [vmi(uid="u2", started=130, ready=False), vmi(name="vm2")]
    old = plan([rep()], vs, ms, now=800, st=st)
    assert old.sources[SRC].pause_reason is PauseReason.TENANT_FAILURES and old.restarts == ()
    new = plan([rep(rev="r2", t=700)], vs, ms, now=800, st=st)
    assert new.sources[SRC].pause_reason is None
    assert {a.vm for a in new.restarts} == {"vm1", "vm2"}


def test_vmis_of_failed_restarts_do_not_hold_the_budget_of_a_newer_revision() -> None:
    """Two VMIs recreated by failed r1 restarts never become Ready; once r2 makes them stale they
    must not count as unavailable, or a limit of 1 would stall the r2 rollout forever."""
    st = dataclasses.replace(ST, max_unavailable="1", max_per_namespace=1)
    ms = [vm(name="a", ann=intent("r1", 100, "a-old", result="failed")),
          vm(name="b", ann=intent("r1", 100, "b-old", attempted=150))]  # times out at 750, unrecorded
    vs = [vmi(name="a", uid="a-new", started=130, ready=False), vmi(name="b", uid="b-new", started=160, ready=False)]
    p = plan([rep(rev="r2", t=700)], vs, ms, now=800, st=st)
    assert (state(p, name="a"), state(p, name="b")) == (VmiState.STALE, VmiState.STALE)
    assert [(a.vm, a.vmi_uid, a.revision) for a in p.restarts] == [("a", "a-new", "r2")]
    assert p.sources[SRC].unavailable == 1  # the restart just issued, nothing else
    # Before b's r1 restart timed out it is a rollout step under way: it holds the budget.
    early = plan([rep(rev="r2", t=220)], vs, ms, now=260, st=st)
    assert early.sources[SRC].unavailable == 1 and early.restarts == ()


# ---------------------------------------------------------------------------------------------
# Pause and resume
# ---------------------------------------------------------------------------------------------


def _failed_fleet(n_failed: int, n_pending: int, spread: bool = True) -> tuple[list[Vmi], list[Vm]]:
    """``n_failed`` failed restarts, one per namespace t-f0, t-f1, ... (all in t-a unless ``spread``),
    and ``n_pending`` stale VMs in t-a."""
    def ns(i: int) -> str:
        return f"t-f{i}" if spread else "t-a"
    vs = [vmi(ns(i), name=f"f{i}", uid=f"new{i}", started=130, ready=False) for i in range(n_failed)]
    ms = [vm(ns(i), name=f"f{i}", ann=intent("r1", 100, f"old{i}", result="failed")) for i in range(n_failed)]
    vs += [vmi(name=f"p{i}") for i in range(n_pending)]
    ms += [vm(name=f"p{i}") for i in range(n_pending)]
    return vs, ms


FAILED_REPS = [rep(), *(rep(ns=f"t-f{i}") for i in range(3))]


def test_failure_budget_pauses_and_resume_continues() -> None:
    vs, ms = _failed_fleet(3, 2)
    paused = plan(FAILED_REPS, vs, ms, now=800)
    s = paused.sources[SRC]
    assert (s.phase, s.pause_reason, s.failures) == (Phase.PAUSED, PauseReason.FAILURES, 3)
    assert paused.restarts == () and "resume" in s.message
    only_failures = plan(FAILED_REPS, *_failed_fleet(3, 0), now=800).sources[SRC]
    assert only_failures.phase is Phase.PAUSED  # the hoster must look, even with nothing left to do
    below = plan(FAILED_REPS, *_failed_fleet(2, 2), now=800)
    assert below.sources[SRC].pause_reason is None and len(below.restarts) == 2
    resumed = plan(FAILED_REPS, vs, ms, now=800, sources={SRC: SourceControl(resumed_at=at(500))})
    assert resumed.sources[SRC].pause_reason is None and resumed.sources[SRC].failures == 0
    assert {a.vm for a in resumed.restarts} == {"p0", "p1"}  # recreated failures are not restarted again
    assert state(resumed, ns="t-f0", name="f0") is VmiState.FAILED


def test_forgiven_failure_whose_vmi_never_restarted_is_retried() -> None:
    ms = [vm(ann=intent("r1", 100, "u1", result="failed"))]
    p = plan([rep()], [vmi(uid="u1")], ms, now=800, sources={SRC: SourceControl(resumed_at=at(750))})
    assert state(p) is VmiState.STALE
    (a,) = p.restarts
    assert (a.vmi_uid, a.issued_at, a.reissue) == ("u1", at(800), False)


def test_manual_pause_stops_all_restarts_but_tracks_in_flight() -> None:
    vs = [vmi(name="a"), vmi(name="b", uid="ub")]
    ms = [vm(name="a"), vm(name="b", ann=intent("r1", 100, "ub"))]
    p = plan([rep()], vs, ms, now=300, sources={SRC: SourceControl(paused=True)})
    s = p.sources[SRC]
    assert (s.phase, s.pause_reason) == (Phase.PAUSED, PauseReason.MANUAL)
    assert p.restarts == ()  # neither new restarts nor re-issues
    assert p.next_wakeup == at(700)  # only the in-flight timeout matters while paused
    assert state(p, name="b") is VmiState.RESTARTING


# ---------------------------------------------------------------------------------------------
# Limits and fairness
# ---------------------------------------------------------------------------------------------


def test_global_limit_absolute_and_percent() -> None:
    vs = [vmi(name=f"v{i}") for i in range(10)]
    ms = [vm(name=f"v{i}") for i in range(10)]
    assert len(plan([rep()], vs, ms, now=100, st=dataclasses.replace(ST, max_unavailable="3")).restarts) == 3
    assert len(plan([rep()], vs, ms, now=100, st=dataclasses.replace(ST, max_unavailable="25%")).restarts) == 2
    assert len(plan([rep()], vs, ms, now=100, st=dataclasses.replace(ST, max_unavailable="5%")).restarts) == 1


def test_in_flight_and_not_ready_vmis_use_the_budget() -> None:
    st = dataclasses.replace(ST, max_unavailable="2")
    vs = [vmi(name="busy", uid="u2", started=130, ready=False), vmi(name="sick", started=30, ready=False),
          vmi(name="a"), vmi(name="b")]
    ms = [vm(name="busy", ann=intent("r1", 100, "u1")), vm(name="sick"), vm(name="a"), vm(name="b")]
    p = plan([rep()], vs, ms, now=200, st=st)
    assert p.sources[SRC].unavailable == 2 and p.restarts == ()


def test_not_ready_stale_vmi_goes_first_and_costs_nothing() -> None:
    st = dataclasses.replace(ST, max_unavailable="1", max_per_namespace=1)
    vs = [vmi(name="a"), vmi(name="z", ready=False)]
    p = plan([rep()], vs, [vm(name="a"), vm(name="z")], now=100, st=st)
    assert [a.vm for a in p.restarts] == ["z"]  # already down: restarting it first costs no availability


def test_per_namespace_limit_and_round_robin() -> None:
    st = dataclasses.replace(ST, max_unavailable="100", max_per_namespace=2)
    reps = [rep(ns=ns) for ns in ("t-a", "t-b")]
    vs = [vmi(ns=ns, name=f"v{i}") for ns in ("t-a", "t-b") for i in range(4)]
    ms = [vm(ns=ns, name=f"v{i}") for ns in ("t-a", "t-b") for i in range(4)]
    p = plan(reps, vs, ms, now=100, st=st)
    assert [(a.namespace, a.vm) for a in p.restarts] == [
        ("t-a", "v0"), ("t-b", "v0"), ("t-a", "v1"), ("t-b", "v1")]


def test_namespace_with_fewest_issued_restarts_goes_first() -> None:
    st = dataclasses.replace(ST, max_unavailable="1")
    reps = [rep(ns=ns) for ns in ("t-a", "t-b")]
    vs = [vmi(ns="t-a", name="done", uid="n", started=150), vmi(ns="t-a", name="v"), vmi(ns="t-b", name="v")]
    ms = [vm(ns="t-a", name="done", ann=intent("r1", 100, "o", result="done")), vm(ns="t-a", name="v"),
          vm(ns="t-b", name="v")]
    p = plan(reps, vs, ms, now=200, st=st)
    assert [(a.namespace, a.vm) for a in p.restarts] == [("t-b", "v")]


def test_deterministic_and_next_wakeup_none_when_idle() -> None:
    vs = [vmi(name=f"v{i}") for i in range(5)]
    ms = [vm(name=f"v{i}") for i in range(5)]
    assert plan([rep()], vs, ms, now=100) == plan([rep()], list(reversed(vs)), list(reversed(ms)), now=100)
    idle = plan([], vs, ms, now=100, sources={SRC: SourceControl()})
    assert idle.vmi_states == {} and idle.actions == () and idle.next_wakeup is None
    assert idle.sources[SRC].phase is Phase.IDLE


def test_status_counts_and_message() -> None:
    vs = [vmi(name="cur", started=10), vmi(name="st"), vmi(name="solo", owner=None)]
    ms = [vm(name="cur"), vm(name="st")]
    s = plan([rep()], vs, ms, now=100).sources[SRC]
    assert s.counts[VmiState.CURRENT] == 1 and s.counts[VmiState.STALE] == 1 and s.counts[VmiState.BLOCKED] == 1
    assert s.revisions == ("r1",) and s.affected == 3
    assert "1 stale" in s.message and "1 blocked" in s.message and "r1" in s.message


# ---------------------------------------------------------------------------------------------
# Simulation: a tiny KubeVirt stepped together with the planner
# ---------------------------------------------------------------------------------------------

STEP = dt.timedelta(seconds=10)


@dataclasses.dataclass
class SimVmi:
    uid: str
    owner: str | None
    started: dt.datetime
    ready_at: dt.datetime | None  # None: never becomes Ready (a failing restart)
    deleting: bool = False


@dataclasses.dataclass
class SimVm:
    run_strategy: str
    annotations: dict[str, str]
    rv: int = 1


class Cluster:
    """KubeVirt as the planner sees it: restart marks the VMI deleting, the next step removes it, the
    one after creates a new VMI (new UID) that becomes Ready after a few steps — or never."""

    def __init__(self, rng: random.Random, doom_rate: float) -> None:
        self.rng, self.doom_rate = rng, doom_rate
        self._seen: dict[tuple[object, ...], Any] = {}
        self.now = T0
        self.vmis: dict[tuple[str, str], SimVmi] = {}
        self.vms: dict[tuple[str, str], SimVm] = {}
        self.to_create: dict[tuple[str, str], dt.datetime] = {}
        self.restarted_uids: set[str] = set()
        self.restart_log: list[tuple[str, str, str]] = []  # (namespace, vm, revision)
        self.doomed: set[str] = set()
        self.violations: list[str] = []
        self.uids = itertools.count()

    def new_uid(self) -> str:
        return f"u{next(self.uids)}"

    def add(self, ns: str, name: str, *, owned: bool = True, run_strategy: str = "Always",
            manual: bool = False, started: dt.datetime | None = None) -> None:
        when = self.now if started is None else started
        self.vmis[(ns, name)] = SimVmi(self.new_uid(), name if owned else None, when, when)
        if owned:
            ann = {model.ANN_RESTART_POLICY: "manual"} if manual else {}
            self.vms[(ns, name)] = SimVm(run_strategy, ann)

    def tick(self) -> None:
        self.now += STEP
        for key, when in list(self.to_create.items()):
            if when <= self.now:
                del self.to_create[key]
                uid = self.new_uid()
                doomed = self.rng.random() < self.doom_rate
                ready_at = None if doomed else self.now + STEP * self.rng.randint(0, 3)
                if doomed:
                    self.doomed.add(uid)
                self.vmis[key] = SimVmi(uid, key[1], self.now, ready_at)
        for key, v in list(self.vmis.items()):
            if v.deleting:
                del self.vmis[key]
                self.to_create[key] = self.now + STEP

    def restart(self, a: RestartVm, revision_times: Mapping[str, dt.datetime]) -> None:
        key = (a.namespace, a.vm)
        v, m = self.vmis.get(key), self.vms.get(key)
        if m is None or v is None or v.owner != a.vm:
            self.violations.append(f"restart of {key} without a VM-owned VMI")
            return
        if v.uid != a.vmi_uid or v.deleting:
            self.violations.append(f"restart of {key} targets {a.vmi_uid}, VMI is {v.uid} deleting={v.deleting}")
            return
        if v.uid in self.restarted_uids:
            self.violations.append(f"VMI {v.uid} restarted twice")
        if m.run_strategy in ("Once", "Halted") or m.annotations.get(model.ANN_RESTART_POLICY) == "manual":
            self.violations.append(f"restart of {key}, which must never be restarted automatically")
        if v.started > revision_times[a.revision]:
            self.violations.append(f"restart of {key} started after revision {a.revision}")
        self.restarted_uids.add(v.uid)
        self.restart_log.append((a.namespace, a.vm, a.revision))
        v.deleting = True

    def apply(self, p: RolloutPlan, crash_rate: float, revision_times: Mapping[str, dt.datetime]) -> None:
        """The shell: intent first, then the call; a crash between the two drops the rest of the plan."""
        for a in p.actions:
            m = self.vms[(a.namespace, a.vm)]
            if a.vm_resource_version != str(m.rv):
                continue  # optimistic concurrency: stale plan
            if isinstance(a, RestartVm):
                m.annotations.update({k: v for k, v in a.intent_annotations().items() if v is not None})
                m.annotations.pop(model.ANN_RESTART_RESULT, None)
                m.rv += 1
                if self.rng.random() < crash_rate:
                    return
                self.restart(a, revision_times)
            else:
                m.annotations.update({k: v for k, v in a.annotations().items() if v is not None})
                m.rv += 1

    def observe(self) -> tuple[list[Vmi], list[Vm]]:
        vmis = [Vmi(ns, name, v.uid, to_epoch_us(v.started), v.owner, "Running",
                    v.ready_at is not None and v.ready_at <= self.now, to_epoch_us(v.started), (LIC,), None, v.deleting)
                for (ns, name), v in self.vmis.items()]
        vms = [Vm(ns, name, m.run_strategy, frozen_map(m.annotations), str(m.rv))
               for (ns, name), m in self.vms.items()]
        # Like a watch cache: an unchanged object is the same object from one pass to the next (what
        # lets the planner's memo reuse an evaluation at all).
        vmis = [self._seen.setdefault(("vmi", v.namespace, v.name, v), v) for v in vmis]
        vms = [self._seen.setdefault(("vm", m.namespace, m.name, m.resource_version), m) for m in vms]
        return vmis, vms

    def ground_truth_unavailable(self, timeout: dt.timedelta) -> Counter[str]:
        """Per namespace: VMs without a Ready VMI, minus failed restarts (covered by the failure budget)."""
        out: Counter[str] = Counter()
        for key in set(self.vmis) | set(self.to_create):
            v = self.vmis.get(key)
            if v is not None and not v.deleting and v.ready_at is not None and v.ready_at <= self.now:
                continue
            if v is not None and v.uid in self.doomed and self.failed_at(key, timeout):
                continue
            out[key[0]] += 1
        return out

    def failed_at(self, key: tuple[str, str], timeout: dt.timedelta) -> bool:
        """A restart that took effect fails when no Ready VMI exists timeout after its last call; one
        that never did (its target VMI still runs untouched: every call was lost) timeout after it was
        first issued, so lost calls cannot postpone the failure forever."""
        m, v = self.vms.get(key), self.vmis.get(key)
        if m is None:
            return False
        untouched = v is not None and not v.deleting and m.annotations.get(model.ANN_RESTART_VMI_UID) == v.uid
        clock = model.ANN_RESTART_ISSUED_AT if untouched else model.ANN_RESTART_ATTEMPTED_AT
        called = annotation_time(m.annotations, clock)
        return called is not None and self.now >= called + timeout


@dataclasses.dataclass(frozen=True)
class Fleet:
    namespaces: tuple[tuple[tuple[str, str], ...], ...]  # per namespace: (kind, run strategy) per VM
    st: RolloutSettings
    crash_rate: float
    doom_rate: float
    bump_at: int | None  # step of a second revision
    added: tuple[tuple[int, int], ...]  # (step, namespace index): VMs created after the revision
    pause: tuple[int, int] | None  # manual pause window (start step, length)
    seed: int


@hst.composite
def fleets(draw: hst.DrawFn) -> Fleet:
    kinds = hst.tuples(hst.sampled_from(["auto"] * 6 + ["manual", "standalone"]),
                       hst.sampled_from(["Always"] * 4 + ["RerunOnFailure", "Manual", "Once"]))
    namespaces = draw(hst.lists(hst.lists(kinds, max_size=6).map(tuple), min_size=1, max_size=4).map(tuple))
    st = RolloutSettings(
        settle_seconds=30, max_unavailable=draw(hst.sampled_from(["1", "2", "3", "50%"])),
        max_per_namespace=draw(hst.integers(1, 2)), max_failures=draw(hst.integers(1, 3)),
        restart_timeout_seconds=120, manual_deadline_seconds=200, done_gate="ready", reissue_after_seconds=30)
    return Fleet(
        namespaces=namespaces, st=st,
        crash_rate=draw(hst.sampled_from([0.0, 0.1, 0.3])), doom_rate=draw(hst.sampled_from([0.0, 0.1, 0.25])),
        bump_at=draw(hst.none() | hst.integers(1, 25)),
        added=tuple(draw(hst.lists(hst.tuples(hst.integers(1, 30), hst.integers(0, len(namespaces) - 1)),
                                   max_size=3))),
        pause=draw(hst.none() | hst.tuples(hst.integers(1, 20), hst.integers(1, 8))),
        seed=draw(hst.integers(0, 2**32)),
    )


def run_simulation(f: Fleet, max_steps: int = 1500) -> tuple[Cluster, RolloutPlan, dict[str, dt.datetime]]:
    rng = random.Random(f.seed)
    c = Cluster(rng, f.doom_rate)
    kinds: dict[tuple[str, str], str] = {}
    for i, vms_spec in enumerate(f.namespaces):
        for j, (kind, strategy) in enumerate(vms_spec):
            key = (f"t-{i}", f"vm{j}")
            kinds[key] = "blocked" if kind == "auto" and strategy == "Once" else kind
            c.add(*key, owned=kind != "standalone", run_strategy=strategy, manual=kind == "manual",
                  started=T0 - dt.timedelta(hours=1))
    revision, rev_time = "r1", T0
    revision_times = {"r1": T0}
    control = SourceControl()
    resume_at: int | None = None
    timeout = dt.timedelta(seconds=f.st.restart_timeout_seconds)
    deadline = dt.timedelta(seconds=f.st.manual_deadline_seconds)
    plan_: RolloutPlan | None = None
    memo = PlanMemo()  # a controller's memo, kept over the whole run: it must never change a plan
    for step in range(max_steps):
        if step:
            c.tick()
        if step == f.bump_at:
            revision, rev_time = "r2", c.now
            revision_times["r2"] = c.now
        for when, ns_index in f.added:
            if when == step:
                name = f"late{step}-{ns_index}-{len(c.vms)}"
                kinds[(f"t-{ns_index}", name)] = "auto"
                c.add(f"t-{ns_index}", name)
        paused_now = f.pause is not None and f.pause[0] <= step < f.pause[0] + f.pause[1]
        control = dataclasses.replace(control, paused=paused_now)
        if resume_at == step:
            control, resume_at = dataclasses.replace(control, resumed_at=c.now), None
        replicas = [ReplicaRevision(f"t-{i}", LIC, revision, rev_time, SRC) for i in range(len(f.namespaces))]
        vmis, vms = c.observe()
        plan_ = plan_rollout(replicas=replicas, vmis=vmis, vms=vms, guests={}, sources={SRC: control},
                             settings=f.st, now=c.now)
        status = plan_.sources[SRC]
        assert plan_ == plan_rollout(replicas=replicas, vmis=list(reversed(vmis)), vms=list(reversed(vms)),
                                     guests={}, sources={SRC: control}, settings=f.st, now=c.now), \
            "plan depends on input order"
        assert plan_rollout(replicas=replicas, vmis=vmis, vms=vms, guests={}, sources={SRC: control},
                            settings=f.st, now=c.now, memo=memo) == plan_, "the memo changed the plan"

        # At most one action per VM and pass: the shell runs them all concurrently.
        touched = [(a.namespace, a.vm) for a in plan_.actions]
        assert len(touched) == len(set(touched)), touched
        # Paused means no restart call at all.
        if status.pause_reason is not None:
            assert plan_.restarts == ()
        if paused_now:
            assert status.pause_reason is PauseReason.MANUAL
        # The failure budgets, per tenant first: the planner pauses a namespace at least whenever the
        # ground truth says its own failures reached the budget, and the source when they span enough namespaces.
        gt_failures = Counter(
            key[0] for key, v in c.vmis.items()
            if v.uid in c.doomed and c.failed_at(key, timeout)
            and c.vms[key].annotations.get(model.ANN_RESTART_REVISION) == revision
            and (control.resumed_at is None
                 or annotation_time(c.vms[key].annotations, model.ANN_RESTART_ISSUED_AT) >= control.resumed_at))
        for ns, n in gt_failures.items():
            if n >= f.st.max_failures:
                assert ns in status.paused_namespaces, (ns, n, status)
                assert all(a.namespace != ns for a in plan_.restarts), (ns, plan_.restarts)
        if len(gt_failures) >= f.st.source_failure_namespaces():
            assert status.pause_reason is not None, (gt_failures, status)
        # Standalone and manual VMIs: never acted on, reported as blocked / manual (overdue on time).
        for key, kind in kinds.items():
            s = plan_.vmi_states.get(key)
            v = c.vmis.get(key)
            if kind in ("standalone", "blocked") and v is not None and v.started <= rev_time:
                assert s is not None and s.state is VmiState.BLOCKED
            if kind == "manual" and v is not None and v.started <= rev_time:
                assert s is not None and s.state is VmiState.MANUAL
                assert s.overdue == (c.now >= rev_time + deadline)
        # A new revision supersedes: nothing is restarted for the old one any more; and nothing
        # new is restarted before the revision settled.
        assert all(a.revision == revision for a in plan_.restarts)
        settled = rev_time + dt.timedelta(seconds=f.st.settle_seconds)
        assert all(a.reissue or c.now >= settled for a in plan_.restarts)
        # The next wakeup is in the future.
        assert plan_.next_wakeup is None or plan_.next_wakeup > c.now

        c.apply(plan_, f.crash_rate, revision_times)
        assert c.violations == []
        unavailable = c.ground_truth_unavailable(timeout)
        assert sum(unavailable.values()) <= status.max_unavailable, (unavailable, status)
        assert max(unavailable.values(), default=0) <= f.st.max_per_namespace, unavailable

        if (status.pause_reason is PauseReason.FAILURES or status.paused_namespaces) and resume_at is None:
            resume_at = step + 2  # the hoster looks, fixes, resumes
        quiet = (not plan_.actions and not c.to_create and status.phase in (Phase.COMPLETE, Phase.IDLE)
                 and all(v.ready_at is not None and v.ready_at <= c.now for v in c.vmis.values()
                         if v.uid not in c.doomed)
                 and (f.bump_at is None or step > f.bump_at) and step > max((s for s, _ in f.added), default=0)
                 and (f.pause is None or step >= f.pause[0] + f.pause[1])
                 and c.now >= rev_time + deadline)
        if quiet and status.failures:
            if resume_at is None:
                resume_at = step + 1  # leftover failures: the hoster resumes once more
        elif quiet:
            return c, plan_, revision_times
    raise AssertionError("rollout did not converge")


def check_converged(f: Fleet, c: Cluster, final: RolloutPlan, revision_times: Mapping[str, dt.datetime]
                    ) -> None:
    tf = max(revision_times.values())
    per_revision = Counter(c.restart_log)
    assert all(n == 1 for n in per_revision.values()), per_revision  # exactly once per revision
    for key, v in c.vmis.items():
        m = c.vms.get(key)
        automatic = (m is not None and m.run_strategy != "Once"
                     and m.annotations.get(model.ANN_RESTART_POLICY) != "manual")
        if automatic:
            assert v.started > tf, f"{key} still runs a VMI from before the last revision"
        else:
            assert all(k[:2] != key for k in c.restart_log), f"{key} must never be restarted"
            if v.started <= tf:
                s = final.vmi_states[key]
                assert s.state in (VmiState.BLOCKED, VmiState.MANUAL)
                assert s.overdue == (s.state is VmiState.MANUAL)


@hsettings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_simulation_invariants_and_convergence(f: Fleet) -> None:
    c, final, revision_times = run_simulation(f)
    check_converged(f, c, final, revision_times)


def test_simulation_with_many_failures_pauses_and_resumes() -> None:
    f = Fleet(namespaces=(tuple([("auto", "Always")] * 8),) * 3,
              st=dataclasses.replace(ST, settle_seconds=30, max_unavailable="4", max_per_namespace=2,
                                     max_failures=2, restart_timeout_seconds=120, manual_deadline_seconds=200,
                                     reissue_after_seconds=30),
              crash_rate=0.2, doom_rate=0.4, bump_at=None, added=(), pause=None, seed=7)
    c, final, revision_times = run_simulation(f)
    check_converged(f, c, final, revision_times)
    assert c.doomed, "the scenario must produce failing restarts"


def test_simulation_fairness_small_tenants_are_not_starved() -> None:
    namespaces = (tuple([("auto", "Always")] * 50),) + (tuple([("auto", "Always")] * 2),) * 5
    f = Fleet(namespaces=namespaces,
              st=dataclasses.replace(ST, settle_seconds=0, max_unavailable="5", max_per_namespace=1,
                                     manual_deadline_seconds=0, reissue_after_seconds=30),
              crash_rate=0.0, doom_rate=0.0, bump_at=None, added=(), pause=None, seed=1)
    c, final, revision_times = run_simulation(f)
    check_converged(f, c, final, revision_times)
    order = [ns for ns, _, _ in c.restart_log]
    big = "t-0"
    second_big = [i for i, ns in enumerate(order) if ns == big][1]
    for small in (f"t-{i}" for i in range(1, 6)):
        assert order.index(small) < second_big, order[:12]
    assert set(order[:6]) == {f"t-{i}" for i in range(6)}
    # Every small namespace is finished (two rounds) before the big one had more than three restarts.
    last_small = max(i for i, ns in enumerate(order) if ns != big)
    assert order[: last_small + 1].count(big) <= 3


# -- backstop: VMIs that should carry a license volume and do not (docs/design.md#backstop) ----------
WANT = {("t-a", "vm1"): (LIC,)}


def plan_w(replicas: Sequence[ReplicaRevision], vmis: Sequence[Vmi], vms: Sequence[Vm], now: float,
           wanted: Mapping[tuple[str, str], tuple[str, ...]] = WANT) -> RolloutPlan:
    return plan_rollout(replicas=replicas, vmis=vmis, vms=vms, guests={}, sources={}, settings=ST, now=at(now),
                        wanted=wanted)


def test_missing_volume_is_stale_whatever_the_start_time_and_restarted_once() -> None:
    fresh = vmi(uid="u1", started=500, secrets=())  # started long after the revision
    p = plan_w([rep()], [fresh], [vm()], now=600)
    assert state(p) is VmiState.STALE and p.vmi_states[("t-a", "vm1")].missing_volume
    assert [r.vmi_uid for r in p.restarts] == ["u1"]
    # Without `wanted` (the backstop off, or no claim), the same VMI is simply not ours.
    assert ("t-a", "vm1") not in plan_w([rep()], [fresh], [vm()], now=600, wanted={}).vmi_states


def test_missing_volume_waits_for_settle_and_never_overrides_the_limits() -> None:
    p = plan_w([rep(t=590)], [vmi(uid="u1", started=500, secrets=())], [vm()], now=600)
    assert state(p) is VmiState.STALE and p.restarts == () and p.next_wakeup == at(650)
    many = [vmi("t-a", f"vm{i}", uid=f"u{i}", started=0, secrets=()) for i in range(5)]
    p = plan_rollout(replicas=[rep()], vmis=many, vms=[vm("t-a", f"vm{i}") for i in range(5)], guests={},
                     sources={}, settings=RolloutSettings(max_unavailable="2", max_per_namespace=10),
                     now=at(600), wanted={("t-a", f"vm{i}"): (LIC,) for i in range(5)})
    assert len(p.restarts) == 2


def test_restarted_vmi_with_the_volume_is_done_and_not_restarted_again() -> None:
    ms = [vm(ann=intent("r1", 100, "u1"))]
    done = plan_w([rep()], [vmi(uid="u2", started=130)], ms, now=200)
    assert state(done) is VmiState.DONE and done.restarts == ()
    assert done.results == (RecordResult("t-a", "vm1", "r1", "done", "7"),)


def test_restarted_vmi_still_without_the_volume_is_retried_with_backoff_never_a_failure() -> None:
    ms = [vm(ann=intent("r1", 100, "u1"))]
    back = plan_w([rep()], [vmi(uid="u2", started=110, secrets=())], ms, now=111)
    st_ = back.vmi_states[("t-a", "vm1")]
    # Final at once (a running VMI's volumes never change): recorded as a retry, not a failure.
    assert st_.state is VmiState.STALE and (st_.attempt, st_.retry_at) == (1, at(100 + ST.retry_delay(1)))
    assert [(r.vm, r.result) for r in back.results] == [("vm1", "retry")] and back.restarts == ()
    assert back.sources[SRC].failures == 0 and back.next_wakeup == at(130)
    recorded = [vm(ann=intent("r1", 100, "u1", result="retry"))]
    (again,) = plan_w([rep()], [vmi(uid="u2", started=130, secrets=())], recorded, now=130).restarts
    assert (again.vmi_uid, again.attempt) == ("u2", 2)
    recorded = [vm(ann={**intent("r1", 100, "u1", result="retry"), model.ANN_RESTART_ATTEMPT: "5"})]
    late = plan_w([rep()], [vmi(uid="u2", started=130, secrets=())], recorded, now=500)
    assert late.restarts == () and late.vmi_states[("t-a", "vm1")].retry_at == at(100 + ST.retry_delay(5))


def test_a_vmi_recreated_long_after_a_done_restart_is_planned_afresh() -> None:
    ms = [vm(ann=intent("r1", 100, "u1", result="done"))]
    within = plan_w([rep()], [vmi(uid="u2", started=300, secrets=())], ms, now=800)
    assert state(within) is VmiState.DONE  # could be that restart's own VMI: never twice
    later = plan_w([rep()], [vmi(uid="u3", started=800, secrets=())], ms, now=900)
    assert state(later) is VmiState.STALE and [r.vmi_uid for r in later.restarts] == ["u3"]


def test_the_summary_line_names_each_replica_revisions_class_oldest_first() -> None:
    """One source revision renders one replica revision per class: the line says which is which and which
    is newer (docs/operations.md#revisions)."""
    old, new = "a" * 64, "b" * 64
    replicas = [dataclasses.replace(rep("t-a", rev=old, t=0), class_name="vws"),
                dataclasses.replace(rep("t-b", rev=new, t=10), class_name="vws"),
                dataclasses.replace(rep("t-c", "other", rev=new, t=10), class_name="vcs")]
    msg = plan(replicas, [vmi("t-a", started=-100)], [vm("t-a")], 20).sources[SRC].message
    assert f"(oldest first: replica revision {old[:12]} (class vws), replica revision {new[:12]} (class vcs, vws))" \
        in msg, msg
    one = plan(replicas[:1], [vmi("t-a", started=-100)], [vm("t-a")], 20).sources[SRC].message
    assert f"(replica revision {old[:12]} (class vws))" in one, one
