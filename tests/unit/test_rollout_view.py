"""`licensectl rollout status` exit codes and progress text, with and without a safe rotation."""

from __future__ import annotations

from typing import Any

import pytest

from licensectl.core.rollout_view import progress_line, rollout_exit


def src(phase: str, *, rotation: str | None = None, wave: int = 0, failed: int = 0) -> dict[str, Any]:
    return {"phase": phase, "revision": "abc", "affected": 4, "current": 4, "stale": 0, "restarting": 0,
            "failed": failed, "blocked": 0, "manual": 0, "message": "",
            "rotation": None if rotation is None else {"phase": rotation, "wave": wave}}


@pytest.mark.parametrize(("rollouts", "code"), [
    ({"a": src("complete")}, 0),
    ({"a": src("complete", rotation="stable")}, 0),
    ({"a": src("complete", rotation="promoted")}, 0),
    ({"a": src("progressing")}, None),
    ({"a": src("paused")}, 1),
    # Between two waves every restart is done, yet the rotation goes on.
    ({"a": src("complete", rotation="canary")}, None),
    ({"a": src("complete", rotation="promoting", wave=2)}, None),
    ({"a": src("complete", rotation="aborted")}, 1),
    ({"a": src("complete", rotation="undone")}, 1),
    # Back on stable, but VMIs still restarting: not settled yet.
    ({"a": src("progressing", rotation="aborted")}, None),
    ({"a": src("complete", rotation="promoted"), "b": src("complete", rotation="canary")}, None),
])
def test_exit_code_follows_rollout_and_rotation(rollouts: dict[str, dict[str, Any]], code: int | None) -> None:
    assert rollout_exit(rollouts) == code


def test_progress_line_names_the_rotation_phase_and_wave() -> None:
    assert progress_line("ns/s", src("complete"), tty=False).endswith("0 manual")
    assert "rotation canary (canary)" in progress_line("ns/s", src("complete", rotation="canary"), tty=False)
    assert "rotation promoting (step 2)" in progress_line("ns/s", src("complete", rotation="promoting", wave=2),
                                                           tty=False)
    assert progress_line("ns/s", src("complete", rotation="aborted"), tty=False).endswith("; rotation aborted")
