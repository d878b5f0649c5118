"""`PlanMemo`'s public seam: one pass is `collect`, `evaluate`, `state_of`, and the planner uses nothing else."""

from __future__ import annotations

import ast
import datetime as dt
from pathlib import Path

import licensectl.core.rollout.plan as planner
from licensectl.core.model import ObjectRef, Vm, Vmi, frozen_map
from licensectl.core.rollout import PlanMemo, ReplicaRevision, RolloutSettings, SourceControl, VmiRolloutState
from licensectl.core.rollout.evaluation import _Eval
from licensectl.core.timecodec import to_epoch_us

T0 = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
SRC = ObjectRef("licensectl-system", "nvidia-license")
ST = RolloutSettings(settle_seconds=60, max_unavailable="10", max_per_namespace=10, max_failures=3,
                     restart_timeout_seconds=600, manual_deadline_seconds=3600, done_gate="ready")


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def guest(name: str) -> tuple[Vmi, Vm]:
    vmi = Vmi(namespace="t-a", name=name, uid=f"uid-{name}", created_us=to_epoch_us(at(-1000)), owner_vm=name,
              phase="Running", ready=True, running_since_us=None, secret_volumes=("lic",), firmware_uuid=None)
    return vmi, Vm("t-a", name, "Always", frozen_map({}), resource_version="7")


def made(e: _Eval) -> VmiRolloutState:
    return VmiRolloutState(e.state, e.revision, e.slot.replica.source, e.slot.replica.name, e.overdue, e.reason)


def test_a_pass_through_the_public_api_reuses_unchanged_guests() -> None:
    memo = PlanMemo()
    replicas = {("t-a", "lic"): ReplicaRevision("t-a", "lic", "r1", at(0), SRC)}
    pairs = [guest(f"vm{i}") for i in range(3)]
    vmis, vms = [p[0] for p in pairs], [p[1] for p in pairs]

    def one_pass(now: float) -> dict[tuple[str, str], VmiRolloutState]:
        slots = memo.collect(replicas, vmis, vms, wanted={})
        evals = memo.evaluate(slots, ST, {}, control_of=lambda s: SourceControl(), now=at(now))
        return dict(memo.state_of(e, made) for e in evals)

    first = one_pass(10)
    assert memo.hits == 0
    assert memo.last_slot("t-a", "vm1") is not None and memo.last_slot("t-a", "nope") is None
    held = memo.held_key("t-a", "vm1")
    assert memo.held_key("t-a", "vm1") is held  # the tuple the memo holds, not a new one
    second = one_pass(20)
    assert memo.hits == 3
    assert all(second[k] is first[k] for k in first)  # unchanged guests: the very states of the last pass
    assert len({id(s) for s in second.values()}) == 1  # equal states are one shared instance


def test_the_planner_reaches_into_no_private_member_of_the_memo() -> None:
    tree = ast.parse(Path(planner.__file__).read_text())
    private = [f"{n.value.id}.{n.attr}" for n in ast.walk(tree)
               if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "memo"
               and n.attr.startswith("_")]
    assert private == []
