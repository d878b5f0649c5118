"""What the planner returns: the actions the shell carries out (write the intent then restart, record
a result), each VMI's rollout state and each source's status, gathered in a `RolloutPlan`. Kept apart
from the rules that build them because this is the contract with the shell (annotations to write,
preconditions to hold), read on its own.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field

from licensectl.core import model, preflight
from licensectl.core.rollout.constants import PauseReason, Phase, Rule, VmiState
from licensectl.core.timecodec import format_micro_time


@dataclass(frozen=True, slots=True)
class RestartVm:
    """Write the intent on the VM, then PUT .../virtualmachines/{vm}/restart.

    The shell must write the intent with the VM's ``resource_version`` as precondition (a conflict
    means the plan was made from a stale cache: drop the action) and must call restart only after
    the write succeeded. ``reissue`` marks a retry for the same target after a lost call.
    ``check_live``: confirm live that ``vmi_uid`` still runs before the call, because a restart of
    ours may already have replaced it (`needs_live_check`); False only when the VM, as planned, shows
    none that could have (docs/design.md#decision-restart-intent).
    """

    namespace: str
    vm: str
    vmi_uid: str
    revision: str
    replica: str
    issued_at: dt.datetime
    attempted_at: dt.datetime
    reissue: bool = False
    vm_resource_version: str = ""
    check_live: bool = True
    attempt: int = 1  # which restart for this revision: backstop retries back off on it
    guest_reports: bool | None = None  # the guest had reported (None: unknown, the leader's evidence pending)
    drained: bool = False  # a tenant-cluster machine: the drain shell restarts it, after the drain

    def intent_annotations(self) -> Mapping[str, str | None]:
        """Annotations to merge-patch onto the VM; None removes a key (a stale result, a pre-flight hold)."""
        return {
            model.ANN_RESTART_REVISION: self.revision,
            model.ANN_RESTART_REPLICA: self.replica,
            model.ANN_RESTART_VMI_UID: self.vmi_uid,
            model.ANN_RESTART_ISSUED_AT: format_micro_time(self.issued_at),
            model.ANN_RESTART_ATTEMPTED_AT: format_micro_time(self.attempted_at),
            model.ANN_RESTART_ATTEMPT: str(self.attempt),
            model.ANN_RESTART_GUEST_REPORTS: None if self.guest_reports is None else str(self.guest_reports).lower(),
            model.ANN_RESTART_RESULT: None,
            **preflight.cleared(),  # the pre-flight passed for this restart: a refusal recorded before is over
        }


@dataclass(frozen=True, slots=True)
class RecordResult:
    """Write the outcome of the restart for ``revision`` onto the VM (idempotent).

    The shell should only write it while the VM's restart-revision annotation still names
    ``revision`` (use ``vm_resource_version`` as precondition)."""

    namespace: str
    vm: str
    revision: str
    result: str
    vm_resource_version: str = ""

    def annotations(self) -> Mapping[str, str | None]:
        return {model.ANN_RESTART_RESULT: self.result}


Action = RestartVm | RecordResult


@dataclass(frozen=True, slots=True)
class VmiRolloutState:
    state: VmiState
    revision: str  # the revision this state refers to
    source: model.ObjectRef
    replica: str  # replica Secret name in the VMI's namespace
    overdue: bool = False  # manual VMs still stale past the manual deadline
    reason: str = ""  # short human explanation (no secrets)
    missing_volume: bool = False  # should carry a license volume and does not (backstop)
    rule: Rule | None = None  # which rule judged it current or stale (None: a restart's state)
    blocker: str = ""  # undeliverable: why the webhook cannot add the volume (a delivery.Skip value)
    blocked_volume: str = ""  # undeliverable: the license volume name the webhook refuses
    attempt: int = 0  # backstop restarts that came back without the volume so far (retrying when > 0)
    retry_at: dt.datetime | None = None  # when the next backstop retry may be issued


@dataclass(frozen=True, slots=True)
class RolloutStatus:
    source: model.ObjectRef
    revisions: tuple[str, ...]
    phase: Phase
    counts: Mapping[VmiState, int]
    overdue: int = 0
    affected: int = 0
    unavailable: int = 0
    max_unavailable: int = 0
    failures: int = 0  # failures counted against the budget, over every namespace
    # Per namespace with counted failures; the namespaces whose own failures paused them.
    failures_by_namespace: Mapping[str, int] = field(default_factory=dict)
    paused_namespaces: tuple[str, ...] = ()
    pause_reason: PauseReason | None = None
    settles_at: dt.datetime | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class RolloutPlan:
    actions: tuple[Action, ...]
    vmi_states: Mapping[tuple[str, str], VmiRolloutState]
    sources: Mapping[model.ObjectRef, RolloutStatus]
    next_wakeup: dt.datetime | None
    # Draining tenant-cluster workers -> the restart their drain cycle makes once the Node is drained
    # (docs/design.md#tenant-worker-drain): written and issued by the drain shell, not from `actions`.
    drains: Mapping[tuple[str, str], RestartVm] = field(default_factory=dict)

    @property
    def restarts(self) -> tuple[RestartVm, ...]:
        return tuple(a for a in self.actions if isinstance(a, RestartVm))

    @property
    def results(self) -> tuple[RecordResult, ...]:
        return tuple(a for a in self.actions if isinstance(a, RecordResult))
