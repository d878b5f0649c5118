"""Rollout planner: which KubeVirt VMs to restart so guests pick up a new license revision.

A Secret reaches a guest as a disk image fixed at VMI start, so a new token needs a VMI restart
(docs/design.md#kubevirt-secret-disks). It decides, from cluster state alone, which VMs to restart next and what
state every affected VMI is in. It is a pure function: no I/O, no clock (``now`` is passed in).

Memory lives only in the cluster: the shell writes the intent annotations on the VirtualMachine
(``RestartVm.intent_annotations``) *before* it calls the restart subresource, and the result
annotation afterwards (``RecordResult.annotations``). A controller that crashed anywhere in between
re-derives everything from those annotations and the VMIs it observes.

Upstream semantics encoded here (kubevirt/kubevirt, pkg/virt-api/rest/lifecycle.go,
``RestartVMRequestHandler``):
  * restart needs a VirtualMachine and is rejected for runStrategy ``Halted`` and ``Once``;
  * it appends a Stop request carrying the *UID* of the running VMI plus a Start request to the VM's
    ``status.stateChangeRequests`` and answers 409 "stop/start already underway" while such requests
    are pending — so re-issuing a restart for the same target UID after a crash cannot stop a VMI twice;
  * the VM controller then deletes that VMI and creates a new one with a new UID.

Decisions documented here (not upstream facts):
  * timestamps on Kubernetes objects have one-second resolution, so a VMI started in the same
    second as the revision is treated as stale (an extra restart beats a guest on an old token);
  * a VMI mounting several replicas is governed by the replica with the newest revision time: one
    restart delivers all of them;
  * a failed restart is covered by the failure budget, not by the unavailability budget: its VMI no
    longer counts as unavailable, otherwise one broken guest would stall its tenant forever and the
    failure budget could never be reached;
  * with ``done_gate == "ready-licensed"`` a VM that has never sent a guest report is done when
    Ready (the probe is optional); one that has reported before waits for a licensed report with the
    current token made after the restart, until the restart timeout; "never" is judged only after
    ``evidence_at`` (one silence window after a takeover): before it, no report is "no report yet",
    neither done nor failed, and a VMI the time rule would call stale without a report awaits evidence;
  * a VMI the webhook stamped is judged by revision (the stamp), only unstamped ones by time;
  * a VMI whose spec blocks delivery is undeliverable: never restarted, never a failure;
  * a backstop restart that came back without the volume is retried with bounded backoff (no failure);
  * failure budgets are per namespace first; the source pauses when failures span
    ``max(2, max_failures)`` namespaces; while ``delivery_ready`` is False no restart is issued;
  * while a source is paused (manually or by failures) no restart call is made at all, not even a
    re-issue; restarts already in flight are still tracked and can still time out;
  * every threshold is inclusive ("at or after"), so ``next_wakeup`` is exactly the moment it flips;
  * backstop (docs/design.md#backstop): a VMI that should carry a license volume (``wanted``) but does
    not is stale whatever its start time, and its restart is done only once the new VMI carries it;
    a VMI created after that restart's timeout is a new VMI, planned afresh.

May import: the standard library and other core modules (model, timecodec); never the shell. Being
pure, the same cluster state always gives the same plan, so a crashed controller resumes where the
cluster says it was and every rule is tested with plain values.

One module per job, each importing only modules listed above it:

    constants   restart results, policy and gate names; the VMI, phase and pause-reason enums
    inputs      what the planner reads: replica revisions, guest gates, source switches, settings, intents
    outputs     what it returns: restart and record actions, per-VMI states, per-source status, the plan
    timing      the settle delay, a VMI's start time, and the clock an evaluation reads (``_Now``)
    slots       the guests to judge: VMI, owning VM, governing replica and intent, from the cluster view
    evaluation  one guest's rollout state from its slot at ``now``
    memo        ``PlanMemo``: the last pass's evaluations, reused while their inputs hold
    plan        ``plan_rollout``: pauses, budgets, round-robin picks, per-source status, next wakeup

The public names of these are re-exported here; callers import them from the package. Two modules are
built on the package's names and imported by their own path:

    view        rollout and rotation progress as plain data and text, for /v1/status and the CLI
    actions     the hoster's rollout actions (pause, resume, retry, undo): what each writes, when it is refused
"""

from __future__ import annotations

from licensectl.core.rollout.constants import (
    DONE_GATE_READY,
    DONE_GATE_READY_LICENSED,
    POLICY_MANUAL,
    RESULT_DONE,
    RESULT_FAILED,
    RESULT_RETRY,
    UNRESTARTABLE_RUN_STRATEGIES,
    PauseReason,
    Phase,
    Rule,
    VmiState,
)
from licensectl.core.rollout.evaluation import Verdict, judge, needs_live_check, next_attempt
from licensectl.core.rollout.inputs import GuestGate, ReplicaRevision, RestartIntent, RolloutSettings, SourceControl
from licensectl.core.rollout.memo import PlanMemo
from licensectl.core.rollout.outputs import (
    Action,
    RecordResult,
    RestartVm,
    RolloutPlan,
    RolloutStatus,
    VmiRolloutState,
)
from licensectl.core.rollout.plan import plan_rollout
from licensectl.core.rollout.timing import MIN_SETTLE_SECONDS

__all__ = [
    "DONE_GATE_READY",
    "DONE_GATE_READY_LICENSED",
    "MIN_SETTLE_SECONDS",
    "POLICY_MANUAL",
    "RESULT_DONE",
    "RESULT_FAILED",
    "RESULT_RETRY",
    "UNRESTARTABLE_RUN_STRATEGIES",
    "Action",
    "GuestGate",
    "PauseReason",
    "Phase",
    "PlanMemo",
    "RecordResult",
    "ReplicaRevision",
    "RestartIntent",
    "RestartVm",
    "RolloutPlan",
    "RolloutSettings",
    "RolloutStatus",
    "Rule",
    "SourceControl",
    "Verdict",
    "VmiRolloutState",
    "VmiState",
    "judge",
    "needs_live_check",
    "next_attempt",
    "plan_rollout",
]
