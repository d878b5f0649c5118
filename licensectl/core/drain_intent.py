"""The drain state record: the intent a worker's drain cycle writes on its VM before each step, and the
hold a condition leaves there. Separate from `drain`, which decides the next step from it: this is the
record itself (annotation names and their codec), which the rollout planner and the shell read too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from licensectl.core.model import DOMAIN
from licensectl.core.timecodec import annotation_value_time, format_micro_time

# licensectl's own names: the intent on the VM, the marker on the tenant Node.
ANN_DRAIN_STEP = f"{DOMAIN}/drain-step"
ANN_DRAIN_REVISION = f"{DOMAIN}/drain-revision"
ANN_DRAIN_STARTED_AT = f"{DOMAIN}/drain-started-at"
ANN_DRAIN_STEP_AT = f"{DOMAIN}/drain-step-at"
ANN_DRAIN_NODE = f"{DOMAIN}/drain-node"
ANN_DRAIN_CORDONED = f"{DOMAIN}/drain-cordoned"
ANN_DRAIN_BOOT_ID = f"{DOMAIN}/drain-boot-id"
ANN_DRAIN_VMI_UID = f"{DOMAIN}/drain-vmi-uid"
ANN_DRAIN_REASON = f"{DOMAIN}/drain-reason"
ANN_DRAIN_EVICTED_AT = f"{DOMAIN}/drain-evicted-at"  # the last eviction round: the next one waits the retry interval
# Every intent key: those absent from `render_annotations()` are to be removed from the VM.
INTENT_ANNOTATIONS = (ANN_DRAIN_STEP, ANN_DRAIN_REVISION, ANN_DRAIN_STARTED_AT, ANN_DRAIN_STEP_AT, ANN_DRAIN_NODE,
                      ANN_DRAIN_CORDONED, ANN_DRAIN_BOOT_ID, ANN_DRAIN_VMI_UID, ANN_DRAIN_REASON, ANN_DRAIN_EVICTED_AT)
# The hoster's way out of a BootTimeout (`licensectl rollout retry-worker`): when it was asked, on the
# apiserver's clock. A request newer than the closed cycle restarts the worker once more; handled once, since
# the retry's own steps are newer than it. Written by the CLI only, never part of the intent.
ANN_DRAIN_RETRY_AT = f"{DOMAIN}/drain-retry-at"
ANN_DRAIN_SKIP_AT = f"{DOMAIN}/drain-skip-at"  # `licensectl rollout skip-worker`: the same, to give it up
# A condition that holds a worker's cycle without closing it (unreachable tenant, no Node yet): the reason
# and when it was seen. The rollout plans the worker again only after DrainSettings.hold, so one
# tenant's unreachable cluster never spends another tenant's restart budget pass after pass.
ANN_DRAIN_HELD = f"{DOMAIN}/drain-held"
ANN_DRAIN_HELD_AT = f"{DOMAIN}/drain-held-at"
HELD_ANNOTATIONS = (ANN_DRAIN_HELD, ANN_DRAIN_HELD_AT)
ANN_CORDONED_BY = f"{DOMAIN}/cordoned-by"  # on the Node: `<vm namespace>/<vm name>`


class Step(StrEnum):
    """The step written on the VM before it is taken."""

    CORDON = "cordon"
    DRAIN = "drain"
    RESTART = "restart"
    WAIT_BOOT = "wait-boot"
    UNCORDON = "uncordon"  # closing: `reason` says why (None: done or undone)
    BLOCKED = "blocked"  # closed without a restart for this revision; `reason` names the condition


class BlockReason(StrEnum):
    """Condition reasons. The first four close a cycle for its revision; the others hold or wait."""

    PDB_BLOCKED = "PDBBlocked"  # the drain timed out on Pods whose last eviction got a 429
    DRAIN_TIMEOUT = "DrainTimeout"  # the drain timed out otherwise
    BOOT_TIMEOUT = "BootTimeout"  # restarted, but the Node did not come back Ready with a new boot ID
    INTENT_UNREADABLE = "IntentUnreadable"  # intent annotations present but unreadable: never guessed at
    # A BootTimeout the hoster gave up on (`licensectl rollout skip-worker`): closed for its revision, no longer
    # counted as down; its Node, while not Ready, still counts as any such Node does.
    SKIPPED = "Skipped"
    CLUSTER_UNREACHABLE = "ClusterUnreachable"  # the tenant API did not answer (and no opt-in)
    NODE_MISSING = "NodeMissing"  # no Node with the worker's providerID
    CONTROL_PLANE_MANUAL = "ControlPlaneManual"  # control-plane machines are restarted by hand
    # The cluster's disrupted workers (licensectl's open records and Nodes down or cordoned for any other
    # reason) reach its limit: no new cycle starts (Cluster API's MachineDeployment maxUnavailable).
    BUDGET_SPENT = "DisruptionBudgetSpent"


@dataclass(frozen=True, slots=True)
class Held:
    reason: BlockReason
    at: dt.datetime

    def render_annotations(self) -> dict[str, str]:
        return {ANN_DRAIN_HELD: self.reason.value, ANN_DRAIN_HELD_AT: format_micro_time(self.at)}


def held_of(annotations: Mapping[str, str]) -> Held | None:
    """The hold recorded on the VM; None when absent or unreadable (then nothing is held back)."""
    reason, at = annotations.get(ANN_DRAIN_HELD), annotation_value_time(annotations.get(ANN_DRAIN_HELD_AT))
    if not reason or at is None:
        return None
    try:
        return Held(BlockReason(reason.strip()), at)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class IntentProblem:
    """Intent annotations that cannot be read (a hand edit, another writer): named, never guessed at."""

    kind: str  # unknown-step, missing-field, bad-time, bad-flag, bad-reason
    detail: str


@dataclass(frozen=True, slots=True)
class DrainIntent:
    """One cycle's record on the VM. `cordoned` means licensectl may have cordoned the Node: while the
    tenant cannot be reached it keeps the cycle open; once it can, the Node's marker decides."""

    step: Step
    revision: str  # the restart decision the cycle serves
    started_at: dt.datetime  # cycle start: the drain timeout counts from here
    step_at: dt.datetime  # when `step` was entered (restart re-issue, boot timeout)
    node: str = ""
    cordoned: bool = False
    boot_id: str = ""  # the Node's bootID before the restart
    vmi_uid: str = ""  # the VMI the restart targets: another UID means it was restarted
    reason: BlockReason | None = None
    evicted_at: dt.datetime | None = None  # the last eviction round was posted (unreadable: none, post now)
    retry_at: dt.datetime | None = None  # the hoster asked to retry a BootTimeout (ANN_DRAIN_RETRY_AT)
    skip_at: dt.datetime | None = None  # the hoster gave a BootTimeout up (ANN_DRAIN_SKIP_AT)

    @property
    def active(self) -> bool:
        """The cycle is open (any step but blocked)."""
        return self.step is not Step.BLOCKED

    @property
    def down(self) -> bool:
        """Closed after the restart without the Node's return: the worker is down until its Node is Ready
        with a new boot ID, whatever the revision (docs/design.md#tenant-worker-drain)."""
        return self.step is Step.BLOCKED and self.reason is BlockReason.BOOT_TIMEOUT

    @property
    def retry_requested(self) -> bool:
        """Down, and the hoster asked for another try since the cycle closed."""
        return self.down and self.retry_at is not None and self.retry_at > self.step_at

    @property
    def skip_requested(self) -> bool:
        """Down, and the hoster gave it up since the cycle closed (a later retry wins)."""
        return (self.down and self.skip_at is not None and self.skip_at > self.step_at
                and not (self.retry_requested and self.retry_at is not None and self.retry_at > self.skip_at))

    @property
    def holds_budget(self) -> bool:
        """Counts against its cluster's disruption limit: an open cycle, or a worker restarted and not back."""
        return self.active or self.down

    def render_annotations(self) -> dict[str, str]:
        out = {ANN_DRAIN_STEP: self.step.value, ANN_DRAIN_REVISION: self.revision,
               ANN_DRAIN_STARTED_AT: format_micro_time(self.started_at),
               ANN_DRAIN_STEP_AT: format_micro_time(self.step_at),
               ANN_DRAIN_CORDONED: "true" if self.cordoned else "false"}
        for key, value in ((ANN_DRAIN_NODE, self.node), (ANN_DRAIN_BOOT_ID, self.boot_id),
                           (ANN_DRAIN_VMI_UID, self.vmi_uid), (ANN_DRAIN_REASON, self.reason or "")):
            if value:
                out[key] = value
        if self.evicted_at is not None:
            out[ANN_DRAIN_EVICTED_AT] = format_micro_time(self.evicted_at)
        return out


def parse_annotations(annotations: Mapping[str, str]) -> DrainIntent | IntentProblem | None:
    """None without a drain-step annotation; a named problem for anything unreadable; never raises."""
    raw = {k: annotations.get(k) for k in INTENT_ANNOTATIONS}
    if raw[ANN_DRAIN_STEP] is None:
        return None
    text = {k: v.strip() if isinstance(v, str) else "" for k, v in raw.items()}
    try:
        step = Step(text[ANN_DRAIN_STEP])
    except ValueError:
        return IntentProblem("unknown-step", repr(raw[ANN_DRAIN_STEP])[:80])
    if not text[ANN_DRAIN_REVISION]:
        return IntentProblem("missing-field", ANN_DRAIN_REVISION)
    if step in (Step.CORDON, Step.DRAIN, Step.UNCORDON) and not text[ANN_DRAIN_NODE]:
        return IntentProblem("missing-field", ANN_DRAIN_NODE)
    if step is Step.RESTART and not text[ANN_DRAIN_VMI_UID]:
        return IntentProblem("missing-field", ANN_DRAIN_VMI_UID)
    started, step_at = annotation_value_time(raw[ANN_DRAIN_STARTED_AT]), annotation_value_time(raw[ANN_DRAIN_STEP_AT])
    if started is None or step_at is None:
        return IntentProblem("bad-time", f"{ANN_DRAIN_STARTED_AT} / {ANN_DRAIN_STEP_AT}")
    cordoned = {"true": True, "false": False}.get(text[ANN_DRAIN_CORDONED])
    if cordoned is None:
        return IntentProblem("bad-flag", ANN_DRAIN_CORDONED)
    reason = None
    if text[ANN_DRAIN_REASON]:
        try:
            reason = BlockReason(text[ANN_DRAIN_REASON])
        except ValueError:
            return IntentProblem("bad-reason", repr(raw[ANN_DRAIN_REASON])[:80])
    if step is Step.BLOCKED and reason is None:
        return IntentProblem("missing-field", ANN_DRAIN_REASON)
    return DrainIntent(step, text[ANN_DRAIN_REVISION], started, step_at, text[ANN_DRAIN_NODE], cordoned,
                       text[ANN_DRAIN_BOOT_ID], text[ANN_DRAIN_VMI_UID], reason,
                       annotation_value_time(raw[ANN_DRAIN_EVICTED_AT]),
                       annotation_value_time(annotations.get(ANN_DRAIN_RETRY_AT)),
                       annotation_value_time(annotations.get(ANN_DRAIN_SKIP_AT)))
