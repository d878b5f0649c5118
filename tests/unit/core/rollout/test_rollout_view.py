"""`licensectl rollout status` exit codes and progress text, with and without a safe rotation."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from licensectl.core.revision_text import unlabeled_hashes
from licensectl.core.rollout.view import (
    RolloutExit,
    not_on_stable,
    progress,
    progress_line,
    rollout_exit,
    rotation_json,
    shown_phase,
)
from licensectl.core.rotation import RotationPhase, RotationRecord

STABLE, CAND = "a" * 64, "b" * 64


def src(phase: str, *, rotation: str | None = None, wave: int = 0, failed: int = 0,
        wave_progress: list[int] | None = None, current: int = 4, reason: str = "") -> dict[str, Any]:
    rot = None if rotation is None else {
        "phase": rotation, "wave": wave, "wave_number": wave + 1, "waves": 3, "stable": STABLE[:12],
        "candidate": CAND[:12], "reason": reason, "wave_progress": wave_progress}
    return {"phase": phase, "source_revision": CAND[:12], "replica_revision": "c" * 12, "affected": 4,
            "current": current, "stale": 4 - current, "restarting": 0, "failed": failed, "blocked": 0, "manual": 0,
            "message": "", "rotation": rot}


def live(r: dict[str, Any], revision: str) -> dict[str, Any]:
    return {**r, "rotation": {**r["rotation"], "live_source_revision": revision[:12]}}


@pytest.mark.parametrize(("rollouts", "code"), [
    # A token just written, not yet decided on: the record's phase is the previous token's, never final.
    ({"a": live(src("complete", rotation="promoted"), "d" * 64)}, None),
    ({"a": live(src("complete", rotation="aborted"), "d" * 64)}, None),
    ({"a": live(src("paused", rotation="stable"), "d" * 64)}, None),
    # Decided on: the record speaks for it.
    ({"a": live(src("complete", rotation="promoted"), CAND)}, RolloutExit.COMPLETE),
    ({"a": live(src("complete", rotation="aborted"), STABLE)}, RolloutExit.ABORTED),
])
def test_a_token_the_leader_has_not_decided_on_ends_nothing(rollouts: dict[str, dict[str, Any]],
                                                           code: int | None) -> None:
    assert rollout_exit(rollouts) == code
    line = progress_line("a", rollouts["a"], tty=False)
    assert (f"source revision {'d' * 12} written, not yet taken up by the controller" in line) == (code is None)


@pytest.mark.parametrize(("rollouts", "code"), [
    ({"a": src("complete")}, RolloutExit.COMPLETE),
    ({"a": src("complete", rotation="stable")}, RolloutExit.COMPLETE),
    ({"a": src("complete", rotation="promoted")}, RolloutExit.COMPLETE),
    ({"a": src("progressing")}, None),
    ({"a": src("paused")}, RolloutExit.PAUSED),
    ({"a": {**src("paused"), "pause_reason": "tenant_failures"}}, RolloutExit.PAUSED),
    # Waiting for the admission webhook lifts by itself: -w keeps following.
    ({"a": {**src("paused"), "pause_reason": "webhook"}}, None),
    # A paused canary: -w exits (it used to wait forever).
    ({"a": src("paused", rotation="canary")}, RolloutExit.PAUSED),
    # Between two waves every restart is done, yet the rotation goes on.
    ({"a": src("complete", rotation="canary")}, None),
    ({"a": src("complete", rotation="promoting", wave=2)}, None),
    ({"a": src("complete", rotation="aborted")}, RolloutExit.ABORTED),
    ({"a": src("complete", rotation="undone")}, RolloutExit.ABORTED),
    # The rotation's decision ends it, not every VM having arrived: VMIs still restarting onto stable, or
    # one that cannot come back (a worker whose Node is not back keeps the rollout progressing), are named
    # in the output, never waited for.
    ({"a": src("progressing", rotation="aborted")}, RolloutExit.ABORTED),
    ({"a": src("progressing", rotation="undone")}, RolloutExit.ABORTED),
    ({"a": src("complete", rotation="promoted"), "b": src("complete", rotation="canary")}, None),
    ({"a": src("paused"), "b": src("complete", rotation="aborted")}, RolloutExit.ABORTED),
])
def test_exit_code_follows_rollout_and_rotation(rollouts: dict[str, dict[str, Any]], code: int | None) -> None:
    assert rollout_exit(rollouts) == code


def test_progress_is_per_wave_and_never_goes_back_when_a_wave_starts() -> None:
    # Fleet-wide "current" drops when step 2 hands the candidate to more namespaces; the wave count does not.
    seen = [progress(src("progressing", rotation="promoting", wave=1, wave_progress=[n, 10], current=c))
            for n, c in ((3, 4), (7, 3), (10, 1))]
    assert seen == [(3, 10), (7, 10), (10, 10)]
    line = progress_line("ns/s", src("progressing", rotation="promoting", wave=1, wave_progress=[7, 10]), tty=False)
    assert line.startswith(f"ns/s promoting wave 2/3 (step 1): 7/10, candidate source revision {CAND[:12]}")
    bar = progress_line("ns/s", src("progressing", rotation="promoting", wave=1, wave_progress=[6, 12]), tty=True)
    assert bar.startswith("[" + "#" * 12 + "." * 12 + "]")


def test_a_line_never_reads_complete_while_the_rotation_goes_on() -> None:
    line = progress_line("ns/s", src("complete", rotation="promoting", wave=2), tty=False)
    assert " complete" not in line and "promoting wave 3/3 (step 2)" in line
    assert shown_phase(src("complete", rotation="canary")) == "canary"
    assert shown_phase(src("paused", rotation="canary")) == "paused"
    plain = progress_line("ns/s", src("complete"), tty=False)
    assert plain.startswith(f"ns/s complete source revision {CAND[:12]}: 4/4 current")


def test_an_aborted_rotation_names_its_reason() -> None:
    why = f"canary: 1 guest(s) failed to license with candidate source revision {CAND[:12]} (t/vm1: not_found)"
    line = progress_line("ns/s", src("complete", rotation="aborted", reason=why), tty=False)
    assert line.endswith(f"rotation aborted, back on stable source revision {STABLE[:12]}: {why}")


def test_an_aborted_rotation_names_the_vmis_not_back_on_stable() -> None:
    vmis = [{"namespace": "t", "vmi": f"vm{i}", "source": "ns/s", "state": state, "reason": why}
            for i, (state, why) in enumerate([("done", "restarted and Ready"), ("current", ""),
                                              ("blocked", "worker restarted, its Node not back"),
                                              ("restarting", "waiting for the new VMI"), ("failed", "")])]
    vmis.append({"namespace": "u", "vmi": "other", "source": "ns/other", "state": "failed", "reason": ""})
    behind = not_on_stable(vmis, "ns/s")
    assert [(v["vmi"], v["state"]) for v in behind] == [("vm2", "blocked"), ("vm3", "restarting"), ("vm4", "failed")]
    line = progress_line("ns/s", {**src("progressing", rotation="aborted"), "not_on_stable": behind}, tty=False)
    assert line.endswith("; 3 VMI(s) not back on stable: t/vm2 (blocked: worker restarted, its Node not back), "
                         "t/vm3 (restarting: waiting for the new VMI), t/vm4 (failed)")
    many = [{**behind[0], "vmi": f"w{i}"} for i in range(8)]
    line = progress_line("ns/s", {**src("progressing", rotation="aborted"), "not_on_stable": many}, tty=False)
    assert "8 VMI(s) not back on stable" in line and line.endswith("t/w4 (blocked: worker restarted, its Node not "
                                                                   "back) and 3 more (--vms)")


def test_every_hash_in_a_progress_line_is_labelled() -> None:
    for rot in (None, "canary", "promoting", "aborted", "promoted"):
        for tty in (False, True):
            line = progress_line("ns/s", src("progressing", rotation=rot, wave_progress=[1, 2]), tty=tty)
            assert unlabeled_hashes(line) == [], line


def test_rotation_json_counts_the_canary_as_a_wave() -> None:
    t = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rec = RotationRecord(stable=STABLE, phase=RotationPhase.PROMOTING, candidate=CAND, wave=2, wave_started_at=t)
    with_canary = rotation_json(rec, steps=(10.0, 50.0, 100.0), canary=True, progress=(3, 9))
    assert (with_canary["wave_number"], with_canary["waves"], with_canary["wave_progress"]) == (3, 4, [3, 9])
    assert (with_canary["stable"], with_canary["candidate"]) == (STABLE[:12], CAND[:12])
    without = rotation_json(rec, steps=(10.0, 50.0, 100.0), canary=False)
    assert (without["wave_number"], without["waves"], without["wave_progress"]) == (2, 3, None)
    assert rotation_json(RotationRecord(stable=STABLE), steps=(100.0,), canary=True)["candidate"] is None
