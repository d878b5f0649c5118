"""The rollout planner's vocabulary: the restart results written on a VM, the restart-policy and
done-gate names, the run strategies KubeVirt refuses to restart, and the states a VMI, a source's
rollout and a pause can be in. At the bottom of the package so inputs, outputs and the planner share one
set of names; it imports nothing.
"""

from __future__ import annotations

from enum import StrEnum

RESULT_DONE = "done"
RESULT_FAILED = "failed"
POLICY_MANUAL = "manual"
DONE_GATE_READY = "ready"
DONE_GATE_READY_LICENSED = "ready-licensed"
# kubevirt pkg/virt-api/rest/lifecycle.go: RestartVMRequestHandler rejects these with 409.
UNRESTARTABLE_RUN_STRATEGIES = frozenset({"Halted", "Once"})


class VmiState(StrEnum):
    CURRENT = "current"  # already runs the current revision
    STALE = "stale"  # pending an automatic restart
    RESTARTING = "restarting"  # intent issued, new VMI not yet done
    DONE = "done"  # restarted for this revision and Ready (and licensed, if gated)
    FAILED = "failed"  # restart timed out or was recorded as failed
    BLOCKED = "blocked"  # stale, but licensectl cannot restart it (standalone VMI, run strategy)
    MANUAL = "manual"  # stale, the VM opted out of automatic restarts


class Phase(StrEnum):
    IDLE = "idle"
    SETTLING = "settling"
    PROGRESSING = "progressing"
    PAUSED = "paused"
    COMPLETE = "complete"


class PauseReason(StrEnum):
    MANUAL = "manual"
    FAILURES = "failures"
