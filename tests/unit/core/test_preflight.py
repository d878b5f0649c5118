"""The restart pre-flight's decisions (core/preflight.py) and how the planner reads a recorded refusal, with
plain values; the loop's use of them is in tests/unit/controllers/test_restart_preflight.py."""

from __future__ import annotations

import datetime as dt

import pytest

from licensectl.core import preflight
from licensectl.core.preflight import Admission, PreflightHold, hold_of
from licensectl.core.rollout import GuestGate, VmiState
from licensectl.kube.preflight import classify
from tests.unit.core.rollout.test_rollout import at
from tests.unit.core.rollout.test_rollout_no_harm import LIC, plan, rep, state, vm, vmi


@pytest.mark.parametrize(("status", "admitted", "answered"), [
    (201, True, True), (200, True, True),
    (409, True, True),  # AlreadyExists: admission ran first and passed; the running VMI holds the name
    (403, False, True), (422, False, True), (400, False, True), (404, False, True),
    (408, False, False), (429, False, False), (500, False, False), (503, False, False), (None, False, False),
])
def test_an_answer_is_admitted_refused_or_unanswered(status: int | None, admitted: bool, answered: bool) -> None:
    got = classify(status, "x")
    assert (got.admitted, got.answered) == (admitted, answered)
    assert got.result == (preflight.ADMITTED if admitted else preflight.DENIED if answered else preflight.UNANSWERED)


def test_a_refusal_is_one_bounded_line_and_never_empty() -> None:
    long = classify(403, "denied:\n" + "x" * 2000)
    assert "\n" not in long.message and len(long.message) == preflight.MESSAGE_LIMIT
    assert classify(500, "").message == "HTTP 500"
    assert Admission(False, "m", answered=False).result == "unanswered"


def test_the_hold_round_trips_through_the_annotations_and_holds_only_its_revision_vmi_and_time() -> None:
    h = PreflightHold("r1", "u1", at(0), "denied")
    back = hold_of(h.render_annotations())
    assert back == h
    assert h.holds("r1", "u1", at(59)) and not h.holds("r1", "u1", at(preflight.RECHECK_SECONDS))
    assert not h.holds("r2", "u1", at(1)) and not h.holds("r1", "u2", at(1))
    assert hold_of({preflight.ANN_PREFLIGHT_REVISION: "r1", preflight.ANN_PREFLIGHT_AT: "garbage"}) is None
    assert hold_of({}) is None
    assert preflight.cleared() == dict.fromkeys(preflight.HOLD_ANNOTATIONS)


def held_vm(rev: str = "r1", uid: str = "u1", t: float = 150) -> object:
    return vm(ann=PreflightHold(rev, uid, at(t), "denied by policy").render_annotations())


def test_the_planner_blocks_a_held_vm_until_the_recheck_time_then_plans_it_again() -> None:
    p = plan([rep(t=100)], [vmi(started=50)], [held_vm()], now=160)  # type: ignore[list-item]
    assert state(p) is VmiState.BLOCKED and p.restarts == ()
    assert "denied by policy" in p.vmi_states[("t-a", "vm1")].reason
    assert p.next_wakeup == at(150) + dt.timedelta(seconds=preflight.RECHECK_SECONDS)
    again = plan([rep(t=100)], [vmi(started=50)], [held_vm()], now=150 + preflight.RECHECK_SECONDS)  # type: ignore[list-item]
    assert state(again) is VmiState.STALE and [r.vm for r in again.restarts] == ["vm1"]
    # A hold for another revision or another VMI holds nothing.
    for other in (held_vm(rev="r0"), held_vm(uid="u0")):
        q = plan([rep(t=100)], [vmi(started=50)], [other], now=160)  # type: ignore[list-item]
        assert state(q) is VmiState.STALE and len(q.restarts) == 1


def test_a_vmi_started_without_its_volume_is_restarted_as_never_reporting_inside_the_evidence_window() -> None:
    want = {("t-a", "vm1"): (LIC,)}
    (r,) = plan([rep(t=100)], [vmi(started=150, secrets=())], [vm()], now=200, evidence_at=380, wanted=want).restarts
    assert r.guest_reports is False  # it had no credential: it cannot have reported to the previous leader
    reported = {("t-a", "vm1"): GuestGate(True, True, at(120))}
    (kept,) = plan([rep(t=100)], [vmi(started=150, secrets=())], [vm()], now=200, evidence_at=380, wanted=want,
                   guests=reported).restarts
    assert kept.guest_reports is True
    # So its restart is done once the new VMI is Ready with its volume, not at the end of the window.
    issued = {k: v for k, v in r.intent_annotations().items() if v is not None}
    back = plan([rep(t=100)], [vmi(uid="u2", started=210)], [vm(ann=issued)], now=220, evidence_at=380, wanted=want)
    assert state(back) is VmiState.DONE
