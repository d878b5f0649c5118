"""Cordon, drain, restart, wait for boot, uncordon: how licensectl restarts a tenant cluster's worker.

A tenant Kubernetes cluster on KubeVirt (Cluster API + CAPK) runs its workers as VMs, and restarting
one kills every Pod on its Node at once. So a worker's VMI is restarted the way Cluster API retires a
Machine: cordon its Node, evict its Pods through the Eviction API (PodDisruptionBudgets hold, a 429 is
retried until the drain timeout), restart, wait until the Node is Ready with a new boot ID, uncordon.

Each step is written on the VM as intent annotations *before* it is taken, and `next_step` decides
from that intent and what is observed alone: a controller killed anywhere resumes or undoes, never
restarts a VMI twice for one decision, and never leaves a Node it cordoned cordoned. The Node gets a
marker annotation in the same patch that cordons it; a Node cordoned by anyone else has none and is
never uncordoned by licensectl.

Pure: the shell observes (VM, VMI, the tenant's Node and its Pods), calls `next_step`, writes the
returned intent when it differs from the one on the VM, and only then acts.

Three modules, one job each: `drain_intent` (the record a cycle keeps on its VM), `drain_workers` (which
VMs are tenant machines, and the per-cluster disruption budget), and this one (the tenant's Nodes and
Pods, cluster-api's Pod filters, and the step decisions). Their public names are re-exported here, so
callers import them all from `licensectl.core.drain`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from licensectl.core.defaults import (
    DRAIN_RETRY_SECONDS,
    DRAIN_TIMEOUT_SECONDS,
    RESTART_REISSUE_SECONDS,
    WORKER_BOOT_TIMEOUT_SECONDS,
)
from licensectl.core.drain_intent import (
    ANN_CORDONED_BY,
    ANN_DRAIN_BOOT_ID,
    ANN_DRAIN_CORDONED,
    ANN_DRAIN_EVICTED_AT,
    ANN_DRAIN_HELD,
    ANN_DRAIN_HELD_AT,
    ANN_DRAIN_NODE,
    ANN_DRAIN_REASON,
    ANN_DRAIN_RETRY_AT,
    ANN_DRAIN_REVISION,
    ANN_DRAIN_SKIP_AT,
    ANN_DRAIN_STARTED_AT,
    ANN_DRAIN_STEP,
    ANN_DRAIN_STEP_AT,
    ANN_DRAIN_VMI_UID,
    HELD_ANNOTATIONS,
    INTENT_ANNOTATIONS,
    BlockReason,
    DrainIntent,
    Held,
    IntentProblem,
    Step,
    held_of,
    parse_annotations,
)
from licensectl.core.drain_workers import (
    ANN_MAX_DISRUPTED_WORKERS,
    ANN_RESTART_WITHOUT_DRAIN,
    LABEL_CLUSTER_NAME,
    LABEL_ROLE,
    PROVIDER_ID_PREFIX,
    ROLE_WORKER,
    ClusterPolicy,
    Role,
    WorkerIdentity,
    admit_workers,
    budget_holders,
    budget_holders_by_cluster,
    holds_budget,
    in_progress_by_cluster,
    worker_role,
)
from licensectl.core.timecodec import to_utc

__all__ = [
    "ANN_CORDONED_BY",
    "ANN_DRAIN_BOOT_ID",
    "ANN_DRAIN_CORDONED",
    "ANN_DRAIN_EVICTED_AT",
    "ANN_DRAIN_HELD",
    "ANN_DRAIN_HELD_AT",
    "ANN_DRAIN_NODE",
    "ANN_DRAIN_REASON",
    "ANN_DRAIN_RETRY_AT",
    "ANN_DRAIN_REVISION",
    "ANN_DRAIN_SKIP_AT",
    "ANN_DRAIN_STARTED_AT",
    "ANN_DRAIN_STEP",
    "ANN_DRAIN_STEP_AT",
    "ANN_DRAIN_VMI_UID",
    "ANN_EXCLUDE_NODE_DRAINING",
    "ANN_MAX_DISRUPTED_WORKERS",
    "ANN_MIRROR_POD",
    "ANN_RESTART_WITHOUT_DRAIN",
    "HELD_ANNOTATIONS",
    "INTENT_ANNOTATIONS",
    "LABEL_CLUSTER_NAME",
    "LABEL_POD_DRAIN",
    "LABEL_ROLE",
    "PROVIDER_ID_PREFIX",
    "ROLE_WORKER",
    "SKIP_DELETED_AFTER_SECONDS",
    "Action",
    "BlockReason",
    "Blocked",
    "ClusterPolicy",
    "Cordon",
    "Done",
    "DrainIntent",
    "DrainSettings",
    "Evict",
    "Held",
    "IntentProblem",
    "Observed",
    "PodPlan",
    "Restart",
    "Role",
    "SkipReason",
    "Step",
    "TenantNode",
    "TenantPod",
    "Uncordon",
    "WaitBoot",
    "WaitEvictions",
    "WorkerIdentity",
    "admit_workers",
    "budget_holders",
    "budget_holders_by_cluster",
    "disrupted_workers",
    "drain_timeout_for",
    "held_of",
    "holds_budget",
    "in_progress_by_cluster",
    "next_step",
    "node_for",
    "parse_annotations",
    "pods_to_evict",
    "worker_role",
]

# kubernetes-sigs/cluster-api api/core/v1beta2/machine_types.go and machinedrainrules_types.go.
ANN_EXCLUDE_NODE_DRAINING = "machine.cluster.x-k8s.io/exclude-node-draining"
LABEL_POD_DRAIN = "cluster.x-k8s.io/drain"
ANN_MIRROR_POD = "kubernetes.io/config.mirror"  # kubernetes/api core/v1 annotation_key_constants.go
# cluster-api internal/controllers/machine/machine_controller.go drainNode: on an unreachable Node, Pods
# whose deletionTimestamp is more than this many seconds old are no longer waited for.
SKIP_DELETED_AFTER_SECONDS = 1

_FINISHED = frozenset({"Succeeded", "Failed"})


class SkipReason(StrEnum):
    DAEMONSET = "daemonset"
    MIRROR = "mirror"
    FINISHED = "finished"
    DELETED_ON_UNREACHABLE_NODE = "deleted-on-unreachable-node"
    DRAIN_LABEL = "drain-label"


@dataclass(frozen=True, slots=True)
class TenantNode:
    name: str
    provider_id: str
    unschedulable: bool = False
    ready: bool | None = True  # the Ready condition; None: Unknown (kubelet unreachable) or absent
    boot_id: str = ""  # status.nodeInfo.bootID
    cordoned_by: str | None = None  # the ANN_CORDONED_BY marker
    control_plane: bool = False  # labelled node-role.kubernetes.io/control-plane: not a worker


@dataclass(frozen=True, slots=True)
class TenantPod:
    namespace: str
    name: str
    node_name: str
    phase: str = "Running"
    controller_kind: str | None = None  # kind of the controller ownerReference
    controller_missing: bool = False  # that controller no longer exists (an orphan: evicted)
    is_mirror: bool = False  # carries ANN_MIRROR_POD (a static Pod)
    deletion_timestamp: dt.datetime | None = None
    has_empty_dir: bool = False
    drain_label: str | None = None  # the LABEL_POD_DRAIN value

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def node_for(provider_id: str, nodes: Iterable[TenantNode]) -> TenantNode | None:
    """The one Node with this providerID; None when there is none or more than one (never a guess)."""
    found = [n for n in nodes if n.provider_id == provider_id]
    return found[0] if len(found) == 1 else None


def disrupted_workers(nodes: Sequence[TenantNode], holders: Iterable[WorkerIdentity],
                      candidate: WorkerIdentity) -> int:
    """The cluster's workers disrupted now, besides `candidate`, as Cluster API's MachineDeployment
    `maxUnavailable` counts unavailable Machines whatever the cause: every worker whose record holds the
    budget (`holders`, with its Node or without), and every other worker Node not Ready or unschedulable
    (a kubelet down, a cordon by anyone). Control-plane Nodes are not workers and never count."""
    counted: set[str] = set()
    disrupted = 0
    for worker in holders:
        if worker.key == candidate.key:
            continue
        disrupted += 1
        if (node := node_for(worker.provider_id, nodes)) is not None:
            counted.add(node.name)
    for node in nodes:
        if node.control_plane or node.name in counted or node.provider_id == candidate.provider_id:
            continue
        if node.ready is not True or node.unschedulable:
            disrupted += 1
    return disrupted


@dataclass(frozen=True, slots=True)
class PodPlan:
    evict: tuple[TenantPod, ...] = ()  # evict now
    terminating: tuple[TenantPod, ...] = ()  # deletionTimestamp set, still on the Node: waited for
    wait_completed: tuple[TenantPod, ...] = ()  # labelled wait-completed: never evicted, waited for
    skipped: tuple[tuple[TenantPod, SkipReason], ...] = ()
    warnings: tuple[tuple[TenantPod, str], ...] = ()  # evicted anyway, as cluster-api warns

    @property
    def remaining(self) -> tuple[TenantPod, ...]:
        return self.evict + self.terminating + self.wait_completed

    @property
    def drained(self) -> bool:
        return not self.remaining


def pods_to_evict(pods: Iterable[TenantPod], node_name: str, *, now: dt.datetime,
                  node_unreachable: bool = False) -> PodPlan:
    """Cluster API's drain filters, in its order (kubernetes-sigs/cluster-api
    internal/controllers/machine/drain/filters.go), with one deviation: finished Pods are skipped, not
    evicted. A restart keeps the Node and its Pod objects, and deleting a finished Job Pod only loses the
    tenant's logs. MachineDrainRules live in the management cluster and are not read."""
    evict: list[TenantPod] = []
    terminating: list[TenantPod] = []
    waiting: list[TenantPod] = []
    skipped: list[tuple[TenantPod, SkipReason]] = []
    warnings: list[tuple[TenantPod, str]] = []
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
        if pod.node_name != node_name:
            continue
        deleted = pod.deletion_timestamp
        label = (pod.drain_label or "").strip().lower()
        if (node_unreachable and deleted is not None
                and int((to_utc(now) - to_utc(deleted)).total_seconds()) > SKIP_DELETED_AFTER_SECONDS):
            skipped.append((pod, SkipReason.DELETED_ON_UNREACHABLE_NODE))
        elif pod.phase in _FINISHED:
            skipped.append((pod, SkipReason.FINISHED))
        elif pod.controller_kind == "DaemonSet" and not pod.controller_missing:
            skipped.append((pod, SkipReason.DAEMONSET))
        elif pod.is_mirror:
            skipped.append((pod, SkipReason.MIRROR))
        elif label == "skip":
            skipped.append((pod, SkipReason.DRAIN_LABEL))
        elif label.replace("-", "", 1) == "waitcompleted":
            waiting.append(pod)
        elif deleted is not None:
            terminating.append(pod)
        else:
            evict.append(pod)
            if pod.controller_kind == "DaemonSet":
                warnings.append((pod, "evicting orphaned DaemonSet-managed Pod"))
            if pod.has_empty_dir:
                warnings.append((pod, "evicting Pod with local storage"))
            if pod.controller_kind is None:
                warnings.append((pod, "evicting Pod that has no controller"))
    return PodPlan(tuple(evict), tuple(terminating), tuple(waiting), tuple(skipped), tuple(warnings))


@dataclass(frozen=True, slots=True)
class Observed:
    """What the shell saw this pass. `node` and `pods` are not read while the tenant is unreachable."""

    revision: str  # the restart decision this pass serves
    needed: bool  # the planner still wants this VM restarted for `revision`
    vmi_uid: str | None  # the VM's current VMI; None: there is none
    vmi_deleting: bool = False
    reachable: bool = True  # the tenant cluster's API answered
    node: TenantNode | None = None  # node_for(worker.provider_id, ...)
    pods: tuple[TenantPod, ...] = ()  # the Pods bound to `node`
    pdb_refused: frozenset[str] = frozenset()  # Pod keys whose last eviction got a 429
    disrupted: int = 0  # disrupted_workers(...): the cluster's other workers down, cordoned or in a cycle


@dataclass(frozen=True, slots=True)
class DrainSettings:
    drain_timeout: dt.timedelta = dt.timedelta(seconds=DRAIN_TIMEOUT_SECONDS)  # see drain_timeout_for
    exclude_draining: bool = False  # the Machine carries ANN_EXCLUDE_NODE_DRAINING
    restart_without_drain: bool = False  # the hoster's opt-in for an unreachable tenant cluster
    boot_timeout: dt.timedelta = dt.timedelta(seconds=WORKER_BOOT_TIMEOUT_SECONDS)
    reissue_after: dt.timedelta = dt.timedelta(seconds=RESTART_REISSUE_SECONDS)  # a restart unseen: reissued
    retry_interval: dt.timedelta = dt.timedelta(seconds=DRAIN_RETRY_SECONDS)  # cluster-api's drainRetryInterval
    max_disrupted: int = 1  # the cluster's limit (ClusterPolicy.max_disrupted)


def drain_timeout_for(machine_seconds: float | None, default: dt.timedelta) -> dt.timedelta:
    """The Machine's nodeDrainTimeout(Seconds); unset or 0, which is unlimited in Cluster API, takes
    licensectl's default instead: an endless drain would hold its cluster's disruption slot forever."""
    return dt.timedelta(seconds=machine_seconds) if machine_seconds and machine_seconds > 0 else default


@dataclass(frozen=True, slots=True)
class Cordon:
    node: str
    intent: DrainIntent


@dataclass(frozen=True, slots=True)
class Evict:
    pods: tuple[TenantPod, ...]
    recheck_at: dt.datetime
    intent: DrainIntent


@dataclass(frozen=True, slots=True)
class WaitEvictions:
    pods: tuple[TenantPod, ...]  # terminating or wait-completed Pods still on the Node
    recheck_at: dt.datetime
    intent: DrainIntent


@dataclass(frozen=True, slots=True)
class Restart:
    vmi_uid: str  # restart only if a fresh read still shows this VMI, not deleting
    intent: DrainIntent


@dataclass(frozen=True, slots=True)
class WaitBoot:
    until: dt.datetime
    intent: DrainIntent


@dataclass(frozen=True, slots=True)
class Uncordon:
    node: str  # patch only if the Node still carries this VM's marker: unschedulable=false, marker removed
    intent: DrainIntent


@dataclass(frozen=True, slots=True)
class Done:
    intent: None = None  # no cycle open: remove the intent annotations


@dataclass(frozen=True, slots=True)
class Blocked:
    reason: BlockReason
    intent: DrainIntent | None  # a BLOCKED intent closes the revision; an open one holds; None: no cycle

    @property
    def closed(self) -> bool:
        return self.intent is not None and self.intent.step is Step.BLOCKED


Action = Cordon | Evict | WaitEvictions | Restart | WaitBoot | Uncordon | Done | Blocked


def _at(intent: DrainIntent, step: Step, now: dt.datetime) -> DrainIntent:
    """`intent` moved to `step`; step_at changes only with the step, so a repeated pass rewrites nothing."""
    return intent if step is intent.step else replace(intent, step=step, step_at=now)


def _ours(worker: WorkerIdentity, seen: Observed) -> bool:
    return seen.reachable and seen.node is not None and seen.node.cordoned_by == worker.key


def _end(intent: DrainIntent, reason: BlockReason | None, worker: WorkerIdentity, seen: Observed,
         now: dt.datetime) -> Action:
    """Close a cycle: uncordon first if the Node carries this VM's marker, then clear or block."""
    if not seen.reachable and intent.cordoned:
        return Blocked(BlockReason.CLUSTER_UNREACHABLE, replace(_at(intent, Step.UNCORDON, now), reason=reason))
    if _ours(worker, seen):
        assert seen.node is not None
        return Uncordon(seen.node.name, replace(_at(intent, Step.UNCORDON, now), reason=reason, cordoned=True))
    if reason is None:
        return Done()
    return Blocked(reason, replace(_at(intent, Step.BLOCKED, now), reason=reason, cordoned=False))


def _restart(intent: DrainIntent, worker: WorkerIdentity, seen: Observed, now: dt.datetime,
             settings: DrainSettings) -> Action:
    """Record the restart with the boot ID and VMI it replaces. A VMI already gone or going (stopped,
    crashed, restarted by someone else) is not restarted again: its replacement is waited for."""
    node = seen.node if seen.reachable else None
    target = replace(intent, boot_id=node.boot_id if node else intent.boot_id,
                     cordoned=_ours(worker, seen) if seen.reachable else intent.cordoned)
    if seen.vmi_uid is None or seen.vmi_deleting:
        waiting = replace(_at(target, Step.WAIT_BOOT, now), vmi_uid="")
        return WaitBoot(waiting.step_at + settings.boot_timeout, waiting)
    target = replace(_at(target, Step.RESTART, now), vmi_uid=seen.vmi_uid)
    return Restart(target.vmi_uid, target)


def _retry_boot(intent: DrainIntent, seen: Observed, now: dt.datetime, settings: DrainSettings) -> Action:
    """The hoster asked to try a worker that did not come back once more: restart its VMI again (or, one
    already gone, wait for its replacement) with a fresh boot window. Its Node must still come back Ready with
    a boot ID other than the one before the first restart; a second BootTimeout closes the cycle again."""
    again = replace(intent, reason=None)
    if seen.vmi_uid is None or seen.vmi_deleting:
        waiting = replace(_at(again, Step.WAIT_BOOT, now), vmi_uid="")
        return WaitBoot(waiting.step_at + settings.boot_timeout, waiting)
    target = replace(_at(again, Step.RESTART, now), vmi_uid=seen.vmi_uid)
    return Restart(target.vmi_uid, target)


def _advance(intent: DrainIntent, worker: WorkerIdentity, seen: Observed, now: dt.datetime,
             settings: DrainSettings) -> Action:
    """Cordon and drain: the steps that can still be undone."""
    if not seen.needed or worker.role is not Role.WORKER:
        return _end(intent, None, worker, seen, now)
    intent = replace(intent, revision=seen.revision)  # a newer decision is served by the same restart
    if not seen.reachable:
        if settings.restart_without_drain:
            return _restart(intent, worker, seen, now, settings)
        return Blocked(BlockReason.CLUSTER_UNREACHABLE, intent)
    node = seen.node
    if node is None:  # gone: nothing is cordoned any more; start over once it is back
        return Blocked(BlockReason.NODE_MISSING, None)
    if settings.exclude_draining:
        return _restart(intent, worker, seen, now, settings)
    if not node.unschedulable:  # cordon, or cordon again as cluster-api does each pass
        return Cordon(node.name, replace(intent, cordoned=True))
    draining = replace(_at(intent, Step.DRAIN, now), cordoned=node.cordoned_by == worker.key)
    plan = pods_to_evict(seen.pods, node.name, now=now, node_unreachable=node.ready is None)
    if plan.drained:
        return _restart(draining, worker, seen, now, settings)
    deadline = intent.started_at + settings.drain_timeout
    if now >= deadline:
        refused = any(p.key in seen.pdb_refused for p in plan.remaining)
        return _end(draining, BlockReason.PDB_BLOCKED if refused else BlockReason.DRAIN_TIMEOUT, worker, seen, now)
    if plan.evict:
        # One eviction round per retry interval (cluster-api's drainRetryInterval), however often the
        # rollout passes: the round's time is on the VM, so a new leader keeps the cadence.
        last = draining.evicted_at
        if last is not None and last <= now < last + settings.retry_interval:
            return WaitEvictions(plan.remaining, min(last + settings.retry_interval, deadline), draining)
        return Evict(plan.evict, min(now + settings.retry_interval, deadline), replace(draining, evicted_at=now))
    return WaitEvictions(plan.terminating + plan.wait_completed, min(now + settings.retry_interval, deadline),
                         draining)


def _start(worker: WorkerIdentity, seen: Observed, now: dt.datetime, settings: DrainSettings) -> Action:
    if worker.role is not Role.WORKER:
        return Blocked(BlockReason.CONTROL_PLANE_MANUAL, None)
    if not seen.needed or seen.vmi_uid is None or seen.vmi_deleting:
        return Done()
    fresh = DrainIntent(Step.CORDON, seen.revision, now, now, cordoned=True)
    if not seen.reachable:
        if settings.restart_without_drain:
            return _restart(replace(fresh, cordoned=False), worker, seen, now, settings)
        return Blocked(BlockReason.CLUSTER_UNREACHABLE, None)
    if seen.node is None:
        return Blocked(BlockReason.NODE_MISSING, None)
    if seen.disrupted >= max(1, settings.max_disrupted):  # a Node down or cordoned counts, whoever did it
        return Blocked(BlockReason.BUDGET_SPENT, None)
    return _advance(replace(fresh, node=seen.node.name), worker, seen, now, settings)


def next_step(intent: DrainIntent | IntentProblem | None, worker: WorkerIdentity, seen: Observed, *,
              now: dt.datetime, settings: DrainSettings) -> Action:
    """The one thing to do for this worker now, from its intent and what is observed alone."""
    now = to_utc(now)  # intents read back are aware: a naive clock would neither compare nor round-trip
    if isinstance(intent, IntentProblem):  # assume the worst: a restart may be done, a cordon may be ours
        unknown = DrainIntent(Step.BLOCKED, seen.revision, now, now, cordoned=True)
        return _end(unknown, BlockReason.INTENT_UNREADABLE, worker, seen, now)
    if intent is None or (intent.step is Step.BLOCKED and intent.revision != seen.revision and not intent.down):
        if _ours(worker, seen):  # a marker no open cycle explains (its record was lost): undo it
            assert seen.node is not None
            lost = DrainIntent(Step.UNCORDON, seen.revision, now, now, node=seen.node.name, cordoned=True)
            return Uncordon(seen.node.name, lost)
        return _start(worker, seen, now, settings)
    if intent.skip_requested:  # given up: closed for its revision, no longer down (handled once: step_at moves)
        return Blocked(BlockReason.SKIPPED, replace(intent, reason=BlockReason.SKIPPED, step_at=now))
    if intent.retry_requested:
        return _retry_boot(intent, seen, now, settings)
    if intent.step in (Step.BLOCKED, Step.UNCORDON):
        return _end(intent, intent.reason, worker, seen, now)
    if intent.step in (Step.CORDON, Step.DRAIN):
        return _advance(intent, worker, seen, now, settings)
    if intent.step is Step.RESTART:
        if seen.vmi_uid == intent.vmi_uid and not seen.vmi_deleting:
            if now < intent.step_at + settings.reissue_after:
                return WaitBoot(intent.step_at + settings.reissue_after, intent)
            return Restart(intent.vmi_uid, replace(intent, step_at=now))
        intent = _at(intent, Step.WAIT_BOOT, now)  # the VMI was replaced: restarted, never again
    if not seen.reachable:
        if not intent.cordoned and settings.restart_without_drain:
            return Done()
        return Blocked(BlockReason.CLUSTER_UNREACHABLE, intent)
    node = seen.node
    if node is not None and node.ready is True and node.boot_id and node.boot_id != intent.boot_id:
        return _end(intent, None, worker, seen, now)
    deadline = intent.step_at + settings.boot_timeout
    if now >= deadline:
        return _end(intent, BlockReason.BOOT_TIMEOUT, worker, seen, now)
    return WaitBoot(deadline, intent)
