"""The rollout's no-harm rules (docs/design.md#evidence-after-takeover, #delivery-stamp, #delivery-blocked,
#backstop-retry, #failure-budget-per-tenant, #supersede): pure, with plain values."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import pytest

from licensectl.core import model
from licensectl.core.model import Vm, Vmi, frozen_map
from licensectl.core.rollout import (
    GuestGate,
    PauseReason,
    Phase,
    PlanMemo,
    ReplicaRevision,
    RestartIntent,
    RestartVm,
    RolloutPlan,
    RolloutSettings,
    Rule,
    Verdict,
    VmiState,
    judge,
    next_attempt,
    plan_rollout,
)
from licensectl.core.rotation import (
    CanarySpec,
    HosterControl,
    RotationPhase,
    RotationRecord,
    RotationSettings,
    SourceView,
    WaveVmi,
    content_revision,
    decide,
)
from licensectl.core.timecodec import to_epoch_us
from tests.unit.core.rollout.test_rollout import SRC, T0, at
from tests.unit.core.rollout.test_rollout import ST as BASE_SETTINGS

LIC = "nvidia-vgpu-license-a100"
ST = dataclasses.replace(BASE_SETTINGS, done_gate="ready-licensed")


def rep(ns: str = "t-a", rev: str = "r1", t: float = 0) -> ReplicaRevision:
    return ReplicaRevision(ns, LIC, rev, at(t), SRC)


def vmi(ns: str = "t-a", name: str = "vm1", *, uid: str = "u1", started: float = -1000, ready: bool = True,
        secrets: Sequence[str] = (LIC,), stamp: Sequence[tuple[str, str]] = (),
        volume_names: Sequence[str] = ()) -> Vmi:
    return Vmi(namespace=ns, name=name, uid=uid, created_us=to_epoch_us(at(started)), owner_vm=name,
               phase="Running" if ready else "Scheduling", ready=ready, running_since_us=None,
               secret_volumes=tuple(secrets), firmware_uuid=None, delivered_revisions=tuple(stamp),
               volume_names=tuple(volume_names) or tuple(f"vol-{s}" for s in secrets))


def vm(ns: str = "t-a", name: str = "vm1", ann: Mapping[str, str] | None = None) -> Vm:
    return Vm(ns, name, "Always", frozen_map(ann), resource_version="7")


def intent(rev: str, issued: float, uid: str, *, result: str | None = None, attempt: int = 1) -> dict[str, str]:
    action = RestartVm("t-a", "vm1", uid, rev, LIC, at(issued), at(issued), attempt=attempt)
    ann = {k: v for k, v in action.intent_annotations().items() if v is not None}
    if result:
        ann[model.ANN_RESTART_RESULT] = result
    return ann


def plan(replicas: Sequence[ReplicaRevision], vmis: Sequence[Vmi], vms: Sequence[Vm], now: float, *,
         st: RolloutSettings = ST, guests: Mapping[tuple[str, str], GuestGate] | None = None,
         evidence_at: float | None = None, delivery_ready: bool = True,
         wanted: Mapping[tuple[str, str], tuple[str, ...]] | None = None) -> RolloutPlan:
    kw = {"replicas": replicas, "vmis": vmis, "vms": vms, "guests": guests or {}, "sources": {}, "settings": st,
          "now": at(now), "wanted": wanted, "evidence_at": None if evidence_at is None else at(evidence_at),
          "delivery_ready": delivery_ready}
    p = plan_rollout(**kw)  # type: ignore[arg-type]
    memo = PlanMemo()
    assert plan_rollout(**kw, memo=memo) == p == plan_rollout(**kw, memo=memo)  # type: ignore[arg-type]
    return p


def state(p: RolloutPlan, ns: str = "t-a", name: str = "vm1") -> VmiState:
    return p.vmi_states[(ns, name)].state


# -- evidence survives a takeover --------------------------------------------------------------------


def test_judge_verdicts_and_rules() -> None:
    r = rep(t=100)
    old, new = vmi(started=50), vmi(started=150)
    proof = GuestGate(True, True, at(120))
    assert judge(new, r, None) == (Verdict.CURRENT, Rule.TIME)
    assert judge(old, r, None) == (Verdict.STALE, Rule.TIME)
    assert judge(old, r, proof) == (Verdict.CURRENT, Rule.REPORT)
    assert judge(old, r, None, evidence_pending=True) == (Verdict.AWAITING, Rule.REPORT)
    # A report that does not prove: stale even while evidence is pending (it is evidence, just not proof).
    assert judge(old, r, GuestGate(True, False, at(120)), evidence_pending=True) == (Verdict.STALE, Rule.TIME)
    assert judge(new, r, None, missing=(LIC,)) == (Verdict.STALE, Rule.VOLUME)


def test_no_report_yet_after_a_takeover_is_its_own_state_never_stale() -> None:
    """A new leader holds no report: a VMI judged by the time rule waits (bounded), then is judged."""
    p = plan([rep(t=100)], [vmi(started=50)], [vm()], now=200, evidence_at=300)
    assert state(p) is VmiState.AWAITING_EVIDENCE and p.restarts == ()
    assert p.vmi_states[("t-a", "vm1")].rule is Rule.REPORT
    assert p.next_wakeup == at(300)
    assert p.sources[SRC].phase is not Phase.COMPLETE
    # The guest reports within the window, proving the current token: current, never restarted.
    proved = plan([rep(t=100)], [vmi(started=50)], [vm()], now=250, evidence_at=300,
                  guests={("t-a", "vm1"): GuestGate(True, True, at(240))})
    assert state(proved) is VmiState.CURRENT and proved.restarts == ()
    # Silent for the whole window: a guest that does not report, restarted.
    silent = plan([rep(t=100)], [vmi(started=50)], [vm()], now=300, evidence_at=300)
    assert state(silent) is VmiState.STALE and [a.vm for a in silent.restarts] == ["vm1"]


def test_a_restarted_vmi_is_not_passed_nor_failed_on_evidence_the_leader_does_not_have() -> None:
    ms = [vm(ann=intent("r1", 100, "u1"))]
    vs = [vmi(uid="u2", started=110)]
    waiting = plan([rep()], vs, ms, now=200, evidence_at=250)
    assert state(waiting) is VmiState.RESTARTING and waiting.results == ()
    assert "awaiting guest evidence" in waiting.vmi_states[("t-a", "vm1")].reason
    # Past the restart timeout but inside the evidence window: not failed yet.
    late = plan([rep()], vs, ms, now=710, evidence_at=800)
    assert state(late) is VmiState.RESTARTING and late.results == () and late.next_wakeup == at(800)
    # Window over, still no report: the probe is optional, Ready is the evidence.
    done = plan([rep()], vs, ms, now=250, evidence_at=250)
    assert state(done) is VmiState.DONE and [r.result for r in done.results] == ["done"]


def test_the_intent_keeps_whether_the_guest_reported_so_a_new_leader_needs_no_wait() -> None:
    guests = {("t-a", "vm1"): GuestGate(True, True, at(50))}
    (known,) = plan([rep(t=100)], [vmi(started=50)], [vm()], now=200, guests=guests).restarts
    assert known.guest_reports is True and known.intent_annotations()[model.ANN_RESTART_GUEST_REPORTS] == "true"
    (silent,) = plan([rep(t=100)], [vmi(started=50)], [vm()], now=200).restarts
    assert silent.guest_reports is False
    # Issued within the leader's own evidence window (a stamp said stale): unknown, and nothing written.
    (unknown,) = plan([rep(t=100)], [vmi(started=50, stamp=((LIC, "r0"),))], [vm()], now=200, evidence_at=300).restarts
    assert unknown.guest_reports is None and unknown.intent_annotations()[model.ANN_RESTART_GUEST_REPORTS] is None
    vs = [vmi(uid="u2", started=110)]

    def with_flag(flag: str) -> list[Vm]:
        return [vm(ann={**intent("r1", 100, "u1"), model.ANN_RESTART_GUEST_REPORTS: flag})]
    # A new leader (no report, evidence pending) passes a never-reporting guest on Ready at once...
    assert state(plan([rep()], vs, with_flag("false"), now=200, evidence_at=500)) is VmiState.DONE
    # ...and waits for a report from one that reported, as the leader that issued the restart would have.
    waiting = plan([rep()], vs, with_flag("true"), now=600, evidence_at=100)
    assert state(waiting) is VmiState.RESTARTING
    assert "licensed guest report" in waiting.vmi_states[("t-a", "vm1")].reason


# -- no clock window: the delivery stamp -----------------------------------------------------------


def test_the_stamp_decides_by_revision_not_by_time() -> None:
    # Started after the revision time by the clock, but admitted with the old revision: stale.
    before = vmi(started=100.5, stamp=((LIC, "r0"),))
    p = plan([rep(rev="r1", t=100)], [before], [vm()], now=200)
    assert state(p) is VmiState.STALE and p.vmi_states[("t-a", "vm1")].rule is Rule.STAMP
    assert [a.vm for a in p.restarts] == ["vm1"]
    # Started long before a revision time, but admitted with that very revision (e.g. back on stable
    # after an abort): current, whatever the clock and the guest reports say.
    stamped = vmi(started=50, stamp=((LIC, "r1"),))
    q = plan([rep(rev="r1", t=100)], [stamped], [vm()], now=200, evidence_at=500)
    assert state(q) is VmiState.CURRENT and q.vmi_states[("t-a", "vm1")].rule is Rule.STAMP
    # Without a stamp the time rule judges, and status says so.
    r = plan([rep(rev="r1", t=100)], [vmi(started=150)], [vm()], now=200)
    assert state(r) is VmiState.CURRENT and r.vmi_states[("t-a", "vm1")].rule is Rule.TIME


def test_a_stamp_for_another_replica_leaves_the_time_rule() -> None:
    other = vmi(started=50, stamp=(("nvidia-vgpu-license-other", "r1"),))
    p = plan([rep(rev="r1", t=100)], [other], [vm()], now=200)
    assert state(p) is VmiState.STALE and p.vmi_states[("t-a", "vm1")].rule is Rule.TIME


# -- blocked is not failed -------------------------------------------------------------------------


def test_a_vmi_whose_spec_blocks_delivery_is_undeliverable_never_restarted_never_failed() -> None:
    blocked = vmi(started=500, secrets=(), volume_names=("licensectl-a100",))
    p = plan([rep()], [blocked], [vm()], now=600, wanted={("t-a", "vm1"): (LIC,)})
    s = p.vmi_states[("t-a", "vm1")]
    assert s.state is VmiState.UNDELIVERABLE and s.blocker == "volume_name_taken" and s.missing_volume
    # What it names: the volume name taken in the VM's spec.
    assert s.blocked_volume == "licensectl-a100" and "volume or disk named licensectl-a100" in s.reason
    assert p.restarts == () and p.sources[SRC].failures == 0 and p.sources[SRC].pause_reason is None
    # Three of them in one tenant do not stop the backstop for another tenant's VM.
    vs = [vmi(name=f"b{i}", started=500, secrets=(), volume_names=("licensectl-a100",)) for i in range(3)]
    vs.append(vmi("t-b", "x", started=500, secrets=()))
    wanted = {(v.namespace, v.name): (LIC,) for v in vs}
    q = plan([rep(), rep("t-b")], vs, [vm(name=v.name, ns=v.namespace) for v in vs], now=600, wanted=wanted)
    assert [(a.namespace, a.vm) for a in q.restarts] == [("t-b", "x")]
    assert q.sources[SRC].counts[VmiState.UNDELIVERABLE] == 3


# -- backstop retry --------------------------------------------------------------------------------


def test_retry_backoff_doubles_and_is_bounded() -> None:
    st = dataclasses.replace(ST, retry_base_seconds=10, retry_max_seconds=100)
    assert [st.retry_delay(n) for n in (0, 1, 2, 3, 4, 5, 1000)] == [10, 10, 20, 40, 80, 100, 100]


def test_next_attempt_counts_only_retries_for_the_same_revision() -> None:
    def parsed(**kw: object) -> RestartIntent | None:
        return RestartIntent.from_annotations(intent("r1", 100, "u1", **kw))  # type: ignore[arg-type]
    assert next_attempt(None, "r1") == 1
    assert next_attempt(parsed(result="retry", attempt=3), "r1") == 4
    assert next_attempt(parsed(result="retry", attempt=3), "r2") == 1
    assert next_attempt(parsed(result="failed", attempt=3), "r1") == 1
    assert RestartIntent.from_annotations({**intent("r1", 100, "u1"), model.ANN_RESTART_ATTEMPT: "x"}).attempt == 1


def test_a_restart_that_came_back_without_the_volume_is_retried_until_it_has_it() -> None:
    want = {("t-a", "vm1"): (LIC,)}
    ms = [vm(ann=intent("r1", 100, "u1", result="retry", attempt=2))]
    wait = plan([rep()], [vmi(uid="u2", started=110, secrets=())], ms, now=120, wanted=want)
    s = wait.vmi_states[("t-a", "vm1")]
    assert s.state is VmiState.STALE and s.attempt == 2 and s.retry_at == at(100 + ST.retry_delay(2))
    assert wait.restarts == () and wait.next_wakeup == s.retry_at
    go = plan([rep()], [vmi(uid="u2", started=110, secrets=())], ms, now=160, wanted=want)
    (r,) = go.restarts
    assert (r.vmi_uid, r.attempt, r.check_live) == ("u2", 3, True)
    assert r.intent_annotations()[model.ANN_RESTART_ATTEMPT] == "3"
    # It came back with the volume: judged afresh, current by its stamp.
    fine = plan([rep()], [vmi(uid="u3", started=170, stamp=((LIC, "r1"),))], ms, now=180, wanted=want)
    assert state(fine) is VmiState.CURRENT and fine.restarts == ()


def test_no_restart_at_all_while_the_webhook_is_not_seen_to_deliver() -> None:
    want = {("t-a", "vm1"): (LIC,)}
    p = plan([rep()], [vmi(started=500, secrets=())], [vm()], now=600, wanted=want, delivery_ready=False)
    s = p.sources[SRC]
    assert p.restarts == () and (s.phase, s.pause_reason) == (Phase.PAUSED, PauseReason.WEBHOOK)
    assert "admission webhook" in s.message
    # Nothing to restart: nothing waits for the webhook.
    idle = plan([rep(t=100)], [vmi(started=200)], [vm()], now=600, delivery_ready=False).sources[SRC]
    assert (idle.phase, idle.pause_reason) == (Phase.COMPLETE, None)
    # Rotation restarts wait too.
    rot = plan([rep(t=100)], [vmi(started=50)], [vm()], now=600, delivery_ready=False)
    assert rot.restarts == () and state(rot) is VmiState.STALE


# -- failure budgets per tenant first --------------------------------------------------------------


def _failures(spec: Mapping[str, int], pending: Sequence[str] = ()
              ) -> tuple[list[ReplicaRevision], list[Vmi], list[Vm]]:
    reps, vs, ms = [], [], []
    for ns in sorted(set(spec) | set(pending)):
        reps.append(rep(ns))
        for i in range(spec.get(ns, 0)):
            vs.append(vmi(ns, f"f{i}", uid=f"{ns}-new{i}", started=130, ready=False))
            ms.append(vm(ns, f"f{i}", ann=intent("r1", 100, f"{ns}-old{i}", result="failed")))
        if ns in pending:
            vs.append(vmi(ns, "p", uid=f"{ns}-p"))
            ms.append(vm(ns, "p"))
    return reps, vs, ms


def test_one_tenants_failures_pause_only_that_tenant() -> None:
    p = plan(*_failures({"t-a": 3}, pending=("t-a", "t-b")), now=800)
    s = p.sources[SRC]
    assert s.paused_namespaces == ("t-a",) and dict(s.failures_by_namespace) == {"t-a": 3}
    assert s.pause_reason is None and s.phase is Phase.PROGRESSING
    assert [(a.namespace, a.vm) for a in p.restarts] == [("t-b", "p")]
    assert "t-a" in s.message
    # Once the rest is done, what is left waits for the hoster: paused for the tenant's failures.
    left = plan(*_failures({"t-a": 3}, pending=("t-a",)), now=800).sources[SRC]
    assert (left.phase, left.pause_reason) == (Phase.PAUSED, PauseReason.TENANT_FAILURES)


@pytest.mark.parametrize(("max_failures", "spread", "source_paused"), [
    (3, {"t-a": 5, "t-b": 1}, False),  # failures in 2 tenants, 3 needed
    (3, {"t-a": 1, "t-b": 1, "t-c": 1}, True),
    (1, {"t-a": 1}, False),  # never one tenant alone
    (1, {"t-a": 1, "t-b": 1}, True),
])
def test_the_source_pauses_only_when_failures_span_several_tenants(
        max_failures: int, spread: Mapping[str, int], source_paused: bool) -> None:
    st = dataclasses.replace(ST, max_failures=max_failures, done_gate="ready")
    assert st.source_failure_namespaces() == max(2, max_failures)
    p = plan(*_failures(spread, pending=("t-z",)), now=800, st=st)
    s = p.sources[SRC]
    assert (s.pause_reason is PauseReason.FAILURES) == source_paused
    assert bool(p.restarts) != source_paused  # t-z's VM restarts unless the whole source paused
    assert s.failures == sum(spread.values())


# -- supersede cleanly -----------------------------------------------------------------------------

S, C, N = (content_revision(t, None) for t in (b"stable", b"candidate", b"next"))
RST = RotationSettings(canary=CanarySpec(count=1), steps=(50.0, 100.0), analysis_deadline_seconds=600)


def wave_view(live: str, namespaces: Mapping[str, str]) -> SourceView:
    vmis = [WaveVmi(ns, "vm", on_candidate=rev == C, settled=True, reported=True) for ns, rev in namespaces.items()]
    return SourceView(live=live, control=HosterControl(), namespaces=dict(namespaces), vmis=vmis)


@pytest.mark.parametrize("phase", [RotationPhase.CANARY, RotationPhase.PROMOTING])
def test_namespaces_on_a_superseded_candidate_go_straight_to_the_new_one(phase: RotationPhase) -> None:
    namespaces = {f"t-{i}": S for i in range(8)}
    rec = RotationRecord(stable=S, phase=phase, candidate=C, wave=0 if phase is RotationPhase.CANARY else 1,
                         wave_started_at=T0, canary=("t-3",), acted_at=T0)
    on = [ns for ns in namespaces if rec.on_candidate(ns, RST.steps)]
    d = decide(rec, wave_view(N, {ns: C if ns in on else S for ns in namespaces}), st=RST, now=at(10))
    assert d.record is not None and d.record.candidate == N and d.record.stable == S
    # Every namespace that ran C takes N next (one more restart), never stable first (two more).
    assert all(d.record.on_candidate(ns, RST.steps) for ns in on)
    ev = d.events[0]
    assert ev.reason == "RotationSuperseded" and ev.type == "Normal"
    assert f"source revision {C[:12]}" in ev.message and f"source revision {N[:12]}" in ev.message


def test_a_superseded_rejected_candidate_carries_nothing_and_a_promoted_one_is_not_superseded() -> None:
    namespaces = {f"t-{i}": S for i in range(8)}
    aborted = RotationRecord(stable=S, phase=RotationPhase.ABORTED, candidate=C, canary=("t-3",), acted_at=T0)
    d = decide(aborted, wave_view(N, namespaces), st=RST, now=at(10))
    assert d.record is not None and d.events[0].reason == "RotationSuperseded"
    assert "no namespace was on it" in d.events[0].message
    promoted = RotationRecord(stable=S, phase=RotationPhase.PROMOTED, candidate=C, wave=2, acted_at=T0)
    p = decide(promoted, wave_view(N, dict.fromkeys(namespaces, C)), st=RST, now=at(10))
    assert p.record is not None and p.record.stable == C
    assert "RotationSuperseded" not in [e.reason for e in p.events]


def test_supersede_without_a_canary_keeps_the_carried_namespaces_on_the_new_candidate() -> None:
    st = dataclasses.replace(RST, canary=CanarySpec(count=0))
    namespaces = {f"t-{i}": S for i in range(8)}
    rec = RotationRecord(stable=S, phase=RotationPhase.PROMOTING, candidate=C, wave=1, wave_started_at=T0,
                         acted_at=T0)
    on = [ns for ns in namespaces if rec.on_candidate(ns, st.steps)]
    d = decide(rec, wave_view(N, namespaces), st=st, now=at(10))
    assert d.record is not None and d.record.phase is RotationPhase.PROMOTING and d.record.wave == 1
    assert all(d.record.on_candidate(ns, st.steps) for ns in on)
