"""Short mode of the fault scenarios under pytest: a few seeds each, every invariant must hold."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient

from licensectl.devcluster.controlplane import ControlPlane

from .scenarios import SCENARIOS, Env, run_scenario

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.integration]

CASES = [(name, seed) for name, spec in SCENARIOS.items() for seed in spec.short_seeds]


@pytest.mark.parametrize(("scenario", "seed"), CASES, ids=[f"{n}-seed{s}" for n, s in CASES])
async def test_scenario_holds_every_invariant(scenario: str, seed: int, control_plane: ControlPlane,
                                              api_client: ApiClient, tmp_path: Path) -> None:
    outcome = await run_scenario(Env(control_plane, api_client, tmp_path), SCENARIOS[scenario], seed, "short")
    checked = sum(outcome.verdict.checks.values())
    assert checked > 0, "the scenario checked nothing"
    assert outcome.verdict.ok, "\n".join([f"{scenario} seed {seed} ({outcome.notes}):",
                                          *outcome.verdict.violations])
