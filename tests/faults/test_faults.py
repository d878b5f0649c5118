"""Short mode of the fault scenarios under pytest: a few seeds each, every invariant must hold."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient

from licensectl_dev.devcluster.controlplane import ControlPlane

from .scenarios import SCENARIOS, Env, run_scenario
from .toolkit import controller_story

CASES = [(name, seed) for name, spec in SCENARIOS.items() for seed in spec.short_seeds]


@pytest.mark.parametrize(("scenario", "seed"), CASES, ids=[f"{n}-seed{s}" for n, s in CASES])
@pytest.mark.asyncio(loop_scope="session")
async def test_scenario_holds_every_invariant(scenario: str, seed: int, control_plane: ControlPlane,
                                              api_client: ApiClient, tmp_path: Path) -> None:
    outcome = await run_scenario(Env(control_plane, api_client, tmp_path), SCENARIOS[scenario], seed, "short")
    checked = sum(outcome.verdict.checks.values())
    assert checked > 0, "the scenario checked nothing"
    assert outcome.verdict.ok, "\n".join([f"{scenario} seed {seed} ({outcome.notes}):",
                                          *outcome.verdict.violations, "the controllers' decisions, oldest first:",
                                          *controller_story(tmp_path)])


def test_deletion_budget_counts_a_batch_from_its_completion() -> None:
    """A batch that takes 40 s to carry out must not let the next batch start 60 s after admission
    (that put more than the cap into one 60 s window in the 5,000-namespace revocation)."""
    from licensectl.controllers.replication_loop import DeletionBudget

    b = DeletionBudget(10)
    assert b.take(25, now=0.0) == 10
    b.settle(10, now=40.0)  # the deletions finished at t=40
    assert b.take(10, now=61.0) == 0
    assert b.next_free(61.0) == pytest.approx(39.0)
    assert b.take(10, now=100.0) == 10


def test_the_deletion_window_counts_only_what_surely_fell_in_one_minute() -> None:
    """A slow poll that sees the first batch late does not put it into the next batch's minute; deletions
    carried out all at once are counted together however they were seen."""
    from .scenarios import worst_minute

    first = [(0.0, 3.5)] * 200  # deleted at t~0, seen by a poll that returned at 3.5 s
    second = [(60.0, 61.0)] * 100  # deleted right after the minute
    assert worst_minute(first + second) == 200
    assert worst_minute([(0.0, 1.0)] * 300) == 300
    assert worst_minute([(t * 0.1, t * 0.1 + 1.0) for t in range(300)]) == 300
    assert worst_minute([]) == 0
