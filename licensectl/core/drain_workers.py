"""Which VMs are tenant-cluster machines, and how many workers of one tenant cluster may be disrupted at
once. Separate from `drain`, which takes one worker through its cycle: this is the identity the planner
and the shell share, and the per-cluster budget across workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from licensectl.core.drain_intent import DrainIntent, IntentProblem, parse_annotations
from licensectl.core.model import DOMAIN, LABEL_CAPI_CLUSTER_NAME, LABEL_CAPI_ROLE, LABEL_KUBEVIRT_MACHINE

# Upstream names. VM labels: kubernetes-sigs/cluster-api-provider-kubevirt pkg/kubevirt/utils.go and
# api/v1alpha1/kubevirtcluster_types.go; providerID: pkg/kubevirt/machine.go GenerateProviderID.
# licensectl's policy names, on the management cluster's CAPI Cluster object.
ANN_MAX_DISRUPTED_WORKERS = f"{DOMAIN}/max-disrupted-workers"
ANN_RESTART_WITHOUT_DRAIN = f"{DOMAIN}/restart-without-drain"
LABEL_CLUSTER_NAME = LABEL_CAPI_CLUSTER_NAME
LABEL_ROLE = LABEL_CAPI_ROLE
PROVIDER_ID_PREFIX = "kubevirt://"
ROLE_WORKER = "worker"  # kubernetes-sigs/kind pkg/cluster/constants: "worker" / "control-plane"


class Role(StrEnum):
    WORKER = "worker"
    CONTROL_PLANE = "control-plane"  # also any other role value: never restarted automatically
    NONE = "none"  # not a CAPK machine


def worker_role(labels: Mapping[str, str]) -> Role:
    """A VM without the CAPK cluster label is no machine; any role but `worker` is treated as control plane."""
    if not labels.get(LABEL_CLUSTER_NAME):
        return Role.NONE
    return Role.WORKER if labels.get(LABEL_ROLE) == ROLE_WORKER else Role.CONTROL_PLANE


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """A CAPK machine VM. `machine` is the KubevirtMachine name, which the Node's providerID carries
    (the VM is named after the assigned hostname when there is one)."""

    namespace: str
    vm: str
    cluster: str
    role: Role
    machine: str

    @classmethod
    def from_vm(cls, namespace: str, name: str, labels: Mapping[str, str]) -> WorkerIdentity | None:
        role = worker_role(labels)
        if role is Role.NONE:
            return None
        return cls(namespace, name, labels[LABEL_CLUSTER_NAME], role, labels.get(LABEL_KUBEVIRT_MACHINE) or name)

    @property
    def key(self) -> str:
        """The Node marker's value: which VM's cycle cordoned the Node."""
        return f"{self.namespace}/{self.vm}"

    @property
    def cluster_key(self) -> str:
        return f"{self.namespace}/{self.cluster}"

    @property
    def provider_id(self) -> str:
        return PROVIDER_ID_PREFIX + self.machine


def holds_budget(intent: DrainIntent | IntentProblem | None) -> bool:
    """The record counts against its cluster's limit: an open cycle, a worker restarted whose Node is not
    back (`BootTimeout`), or an unreadable record (its Node may be cordoned, its VMI restarted)."""
    return isinstance(intent, IntentProblem) or (intent is not None and intent.holds_budget)


def in_progress_by_cluster(
        intents: Iterable[tuple[WorkerIdentity, DrainIntent | IntentProblem | None]]) -> dict[str, int]:
    """Disrupted workers per cluster, from their records alone (`holds_budget`)."""
    counts: dict[str, int] = {}
    for worker, intent in intents:
        if holds_budget(intent):
            counts[worker.cluster_key] = counts.get(worker.cluster_key, 0) + 1
    return counts


def budget_holders_by_cluster(vms: Iterable[tuple[str, str, Mapping[str, str], Mapping[str, str]]]
                              ) -> dict[str, tuple[WorkerIdentity, ...]]:
    """Per cluster key, the workers whose records hold its budget, from (namespace, name, labels,
    annotations) of every VM: what a new leader reads back. One pass over the records for all clusters."""
    out: dict[str, list[WorkerIdentity]] = {}
    for ns, name, labels, ann in vms:
        worker = WorkerIdentity.from_vm(ns, name, labels)
        if worker is not None and holds_budget(parse_annotations(ann)):
            out.setdefault(worker.cluster_key, []).append(worker)
    return {key: tuple(sorted(workers, key=lambda w: w.key)) for key, workers in out.items()}


def budget_holders(vms: Iterable[tuple[str, str, Mapping[str, str], Mapping[str, str]]],
                   cluster_key: str) -> tuple[WorkerIdentity, ...]:
    """The workers of `cluster_key` whose records hold its budget."""
    return budget_holders_by_cluster(vms).get(cluster_key, ())


def admit_workers(candidates: Iterable[WorkerIdentity], in_progress: Mapping[str, int], *,
                  limits: Mapping[str, int] | None = None, default_limit: int = 1) -> tuple[WorkerIdentity, ...]:
    """Workers (without an open cycle, in priority order) that may start one now: at most the cluster's
    limit disrupted at a time, open cycles included. Control-plane machines are never admitted."""
    used = dict(in_progress)
    taken: set[str] = set()
    admitted: list[WorkerIdentity] = []
    for worker in candidates:
        if worker.role is not Role.WORKER or worker.key in taken:
            continue
        taken.add(worker.key)
        limit = max(1, (limits or {}).get(worker.cluster_key, default_limit))
        if used.get(worker.cluster_key, 0) < limit:
            used[worker.cluster_key] = used.get(worker.cluster_key, 0) + 1
            admitted.append(worker)
    return tuple(admitted)


@dataclass(frozen=True, slots=True)
class ClusterPolicy:
    """The hoster's annotations on the CAPI Cluster object."""

    max_disrupted: int = 1
    restart_without_drain: bool = False

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> ClusterPolicy:
        """Total: a limit that is not a whole number from 1 to 1000 counts as 1."""
        raw, opt = annotations.get(ANN_MAX_DISRUPTED_WORKERS), annotations.get(ANN_RESTART_WITHOUT_DRAIN)
        text = raw.strip() if isinstance(raw, str) else ""
        limit = int(text) if text.isascii() and text.isdigit() and 1 <= int(text) <= 1000 else 1
        return cls(limit, isinstance(opt, str) and opt.strip().lower() == "true")
