"""The names licensectl puts on the wire stay named in one place: Event reasons are `Reason` members
documented in docs/operations.md#events, and the label values of the metrics that export one series
per enum value come from the enum, so a new value is exported (with its zeros) without a hand list."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import licensectl
from licensectl.config import Settings
from licensectl.controllers.guests import GuestStore
from licensectl.controllers.replication_loop import PROBLEM_REASONS, ReplicationController
from licensectl.controllers.rollout_loop import PAUSE_REASONS, ROLLOUT_VMI_STATES, RolloutController
from licensectl.core import rotation
from licensectl.core.entitlement import EntitlementResult, Problem, ProblemKind
from licensectl.core.model import ObjectRef
from licensectl.core.reasons import Reason
from licensectl.core.render import ReplicaState
from licensectl.core.replication import ReplicationPlan
from licensectl.core.rollout import PauseReason, Phase, RolloutPlan, RolloutStatus, VmiState
from licensectl.metrics import GaugeSample, Metrics
from licensectl_dev.testkit.memory import (
    ManualClock,
    MemoryCaches,
    MemoryCredentials,
    MemoryEvents,
    MemoryKubevirt,
    MemoryReplicaWriter,
)

PACKAGE = Path(licensectl.__file__).parent
OPERATIONS = PACKAGE.parent / "docs" / "operations.md"
UPPER_CAMEL = re.compile(r"[A-Z][a-z0-9]*(?:[A-Z]+[a-z0-9]*)*")  # acronyms allowed: ForeignTLSSecret
SRC = ObjectRef("licensectl-system", "vws-token")


def events_section() -> str:
    text = OPERATIONS.read_text()
    start = text.index("\n## Events\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def documented_reasons() -> set[str]:
    """Every backticked name in the first column of the Events table."""
    out: set[str] = set()
    for line in events_section().splitlines():
        if line.startswith("| `"):
            out.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return out


# -- Event reasons ------------------------------------------------------------------------------
@pytest.mark.parametrize("reason", list(Reason), ids=lambda r: r.name)
def test_every_reason_is_upper_camel_case_and_documented(reason: Reason) -> None:
    assert UPPER_CAMEL.fullmatch(reason.value), reason.value
    assert f"`{reason.value}`" in events_section(), f"{reason.value} is missing from docs/operations.md#events"


def test_every_documented_reason_is_a_member() -> None:
    assert documented_reasons() == {r.value for r in Reason}


def test_a_member_is_the_plain_wire_string() -> None:
    """The Event body, its deterministic name and the log line see exactly the old literal."""
    r = Reason.FOREIGN_TLS_SECRET
    assert (r == "ForeignTLSSecret", str(r), f"{r}", json.dumps(r)) == (True, "ForeignTLSSecret",
                                                                      "ForeignTLSSecret", '"ForeignTLSSecret"')


def emit_calls(tree: ast.AST) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr == "emit") or (isinstance(f, ast.Name) and f.id == "emit"):
                yield node


def test_no_emit_call_passes_a_string_literal_as_its_reason() -> None:
    """`emit(obj, type_, reason, message)`: the reason is a `Reason` member, never a literal."""
    found = 0
    bad: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for call in emit_calls(ast.parse(path.read_text())):
            found += 1
            reason = call.args[2] if len(call.args) > 2 else next(
                (k.value for k in call.keywords if k.arg == "reason"), None)
            if isinstance(reason, ast.Constant | ast.JoinedStr):
                bad.append(f"{path.relative_to(PACKAGE)}:{call.lineno}")
    assert found >= 20, "the scan no longer finds the emit calls"
    assert not bad, bad


def test_the_rotation_decisions_use_documented_reasons() -> None:
    """core/rotation.py builds its Events as values (`RotationEvent(type, reason, message)`) that the
    rotation loop emits as they are: each reason there must be a member too."""
    tree = ast.parse(Path(rotation.__file__).read_text())
    reasons = [c.args[1] for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
               and c.func.id == "RotationEvent"]
    assert reasons
    for r in reasons:
        if isinstance(r, ast.Attribute):  # `Reason.X`
            assert r.attr in Reason.__members__, ast.dump(r)
        else:
            assert isinstance(r, ast.Constant) and r.value in {m.value for m in Reason}, ast.dump(r)


def test_each_tenant_problem_kind_has_its_camel_case_reason() -> None:
    assert set(PROBLEM_REASONS) == set(ProblemKind)
    for kind, reason in PROBLEM_REASONS.items():
        assert reason == "".join(part.capitalize() for part in kind.value.split("_"))


# -- metric label sets ----------------------------------------------------------------------------
def labels_of(samples: list[GaugeSample], name: str, label: str) -> list[str]:
    return [dict(s.labels)[label] for s in samples if s.name == name]


def test_rollout_metrics_export_every_vmi_state_and_pause_reason() -> None:
    clock = ManualClock()
    caches = MemoryCaches()
    ctl = RolloutController(caches=caches, kubevirt=MemoryKubevirt(caches, clock), events=MemoryEvents(),
                            metrics=Metrics(), settings=Settings(), guests=GuestStore(60.0), clock=clock.now,
                            monotonic=clock.monotonic)
    counts = {VmiState.CURRENT: 1, VmiState.DONE: 2, VmiState.STALE: 3}
    ctl.plan = RolloutPlan(actions=(), vmi_states={}, next_wakeup=None, sources={SRC: RolloutStatus(
        source=SRC, revisions=("a" * 64,), phase=Phase.PAUSED, counts=counts, pause_reason=PauseReason.MANUAL)})
    samples = list(ctl.samples())

    states = labels_of(samples, "rollout_vmis", "state")
    assert states == [*ROLLOUT_VMI_STATES, "overdue"]
    # DONE is folded into current, in enum order otherwise.
    assert list(ROLLOUT_VMI_STATES) == list(dict.fromkeys("current" if s is VmiState.DONE else s.value
                                                          for s in VmiState))
    by_state = {dict(s.labels)["state"]: s.value for s in samples if s.name == "rollout_vmis"}
    assert (by_state["current"], by_state["stale"]) == (3.0, 3.0)

    assert labels_of(samples, "rollout_paused", "reason") == list(PAUSE_REASONS)
    assert set(PAUSE_REASONS) == {r.value for r in PauseReason}
    paused = {dict(s.labels)["reason"]: s.value for s in samples if s.name == "rollout_paused"}
    assert paused == {r.value: (1.0 if r is PauseReason.MANUAL else 0.0) for r in PauseReason}


def test_replication_metrics_export_every_replica_state_and_problem_kind() -> None:
    clock = ManualClock()
    caches = MemoryCaches(with_kubevirt=False)
    ctl = ReplicationController(caches=caches, writer=MemoryReplicaWriter(caches), events=MemoryEvents(),
                                metrics=Metrics(), settings=Settings(), credentials=MemoryCredentials(),
                                report_url="http://reports.invalid/v1/reports", clock=clock.now,
                                monotonic=clock.monotonic)
    problem = Problem(ProblemKind.MISSING_PARENT, ObjectRef("", "tenant-a"), "parent missing")
    ctl.status.plan = ReplicationPlan(
        states={("tenant-a", "x"): ReplicaState.IN_SYNC.value, ("tenant-b", "x"): ReplicaState.CONFLICT.value,
                ("tenant-c", "x"): ReplicaState.IN_SYNC.value},
        entitlement=EntitlementResult(effective={}, entitled={}, problems=(problem,), broken_by={}))
    samples = list(ctl.samples())

    assert labels_of(samples, "replicas", "state") == [s.value for s in ReplicaState]
    replicas = {dict(s.labels)["state"]: s.value for s in samples if s.name == "replicas"}
    assert replicas == {"in_sync": 2.0, "drifted": 0.0, "missing": 0.0, "conflict": 1.0, "held": 0.0}
    # The same counts `licensectl status` shows from the plan.
    assert replicas == {k: float(v) for k, v in ctl.status.plan.state_counts().items()}

    assert labels_of(samples, "tenant_problems", "kind") == [k.value for k in ProblemKind]
    kinds = {dict(s.labels)["kind"]: s.value for s in samples if s.name == "tenant_problems"}
    assert kinds == {k.value: (1.0 if k is ProblemKind.MISSING_PARENT else 0.0) for k in ProblemKind}
