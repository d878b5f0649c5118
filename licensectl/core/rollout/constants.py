"""The rollout planner's vocabulary: the restart results written on a VM, the restart-policy and
done-gate names, the run strategies KubeVirt refuses to restart, and the states a VMI, a source's
rollout and a pause can be in. At the bottom of the package so inputs, outputs and the planner share one
set of names; it imports nothing.
"""

from __future__ import annotations

from enum import StrEnum

RESULT_DONE = "done"
RESULT_FAILED = "failed"
# A backstop restart whose new VMI came back without its license volume: retried with backoff, never a failure
# (docs/design.md#backstop-retry).
RESULT_RETRY = "retry"
POLICY_MANUAL = "manual"
DONE_GATE_READY = "ready"
DONE_GATE_READY_LICENSED = "ready-licensed"
# kubevirt pkg/virt-api/rest/lifecycle.go: RestartVMRequestHandler rejects these with 409.
UNRESTARTABLE_RUN_STRATEGIES = frozenset({"Halted", "Once"})


class VmiState(StrEnum):
    CURRENT = "current"  # already runs the current revision
    STALE = "stale"  # pending an automatic restart
    RESTARTING = "restarting"  # intent issued, new VMI not yet done
    # A tenant cluster's worker whose Node is being cordoned and drained before its restart
    # (docs/design.md#tenant-worker-drain): disrupted, so it holds a restart slot like a restart does.
    DRAINING = "draining"
    DONE = "done"  # restarted for this revision and Ready (and licensed, if gated)
    FAILED = "failed"  # restart timed out or was recorded as failed
    BLOCKED = "blocked"  # stale, but licensectl cannot restart it (standalone VMI, run strategy)
    MANUAL = "manual"  # stale, the VM opted out of automatic restarts
    # Judged on guest evidence this leader has not had the time to receive (docs/design.md#evidence-after-takeover):
    # neither stale nor current, nor done; the wait is bounded.
    AWAITING_EVIDENCE = "awaiting-evidence"
    # Lacks its license volume and the webhook cannot add one to a VMI of this spec (a volume name taken):
    # never restarted, never a failure (docs/design.md#delivery-blocked).
    UNDELIVERABLE = "undeliverable"


class Rule(StrEnum):
    """Which rule judged whether a VMI runs its replica's revision (docs/design.md#decision-stale-rule)."""

    STAMP = "stamp"  # the webhook's delivered-revision annotation on the VMI
    TIME = "time"  # start time against revision time (VMIs admitted without a stamp)
    REPORT = "report"  # time rule, overruled (or awaited) by a guest report
    VOLUME = "volume"  # no license volume at all (backstop)


class Phase(StrEnum):
    IDLE = "idle"
    SETTLING = "settling"
    PROGRESSING = "progressing"
    PAUSED = "paused"
    COMPLETE = "complete"


class PauseReason(StrEnum):
    MANUAL = "manual"
    FAILURES = "failures"  # failures in several tenants (docs/design.md#failure-budget-per-tenant)
    TENANT_FAILURES = "tenant_failures"  # all that is left is in tenants paused by their own failures
    WEBHOOK = "webhook"  # no evidence yet that the admission webhook delivers: no restart helps
