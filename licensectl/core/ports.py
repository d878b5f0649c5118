"""The seams between the reconcile loops (and the lease) and the cluster, as Protocols.

Every controller and the leader elector depend on these shapes only; the App wires the real
implementations (watch caches, SecretWriter, KubevirtClient, the tenant and Cluster API adapters, the
revision stores, the Lease API, the server clock) and `licensectl_dev.testkit.memory` provides in-memory
ones, so the loops and the lease are unit-tested without a cluster. Each Protocol lists exactly what its
consumer calls; the values that cross a seam are core dataclasses, never wire-format JSON.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from licensectl.core.drain import TenantNode, TenantPod
from licensectl.core.model import (
    GpuClaim,
    GpuClass,
    Namespace,
    ObjectRef,
    ReplicaSecret,
    RevisionStore,
    SourceSecret,
    Vm,
    Vmi,
)
from licensectl.core.preflight import Admission
from licensectl.core.reasons import EventType, Reason
from licensectl.core.replication import ReplicationPlan, SourceRevisions
from licensectl.core.rollout import RolloutPlan
from licensectl.core.rotation import Decision

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
T_co = TypeVar("T_co", covariant=True)


# ---------------------------------------------------------------------------------------------
# Values that cross the seams (the adapters in kube/ produce and consume them)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class InvolvedObject:
    api_version: str
    kind: str
    namespace: str  # "" for cluster-scoped objects
    name: str
    uid: str = ""

    def as_dict(self) -> dict[str, str]:
        d = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            d["namespace"] = self.namespace
        if self.uid:
            d["uid"] = self.uid
        return d


class WriteResult(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"
    UNCHANGED = "unchanged"
    GONE = "gone"  # already absent: nothing to do
    CONFLICT = "conflict"  # a foreign Secret holds the name
    ERROR = "error"
    DRY_RUN = "dry_run"


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretBody:
    """What we want a replica to look like; data never appears in repr."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    data: Mapping[str, bytes]

    def __repr__(self) -> str:
        return f"SecretBody({self.namespace}/{self.name}, keys={sorted(self.data)})"


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservedMeta:
    """Metadata of a replica as the watch cache last saw it (no data)."""

    namespace: str
    name: str
    resource_version: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]

    def as_object(self) -> dict[str, Any]:
        return {"metadata": {"name": self.name, "namespace": self.namespace,
                             "resourceVersion": self.resource_version, "labels": dict(self.labels),
                             "annotations": dict(self.annotations)}}


class RestartResult(StrEnum):
    ISSUED = "issued"
    FALLBACK_DELETE = "fallback_delete"
    NOT_FOUND = "not_found"  # VM gone
    UNSUPPORTED = "unsupported"  # no restart subresource and no fallback allowed
    CONFLICT = "conflict"  # KubeVirt refused (e.g. restart already pending): retried later
    STALE_TARGET = "stale_target"  # the planned VMI is already gone or replaced: nothing to restart
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class MachineSays:
    """What the worker's Machine says about draining it (cluster-api Machine spec and annotations)."""

    drain_timeout: float | None = None
    exclude: bool = False


class ReadFailed(Exception):
    """A read that failed says nothing about the object: never taken as "absent" or "no annotations".
    Carries what a log line may say about the failure (the error's type name, an HTTP status)."""

    def __init__(self, error: str, status: int | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.status = status


class TenantUnreachable(Exception):
    """The tenant cluster's API cannot be used now: no kubeconfig Secret, an unusable one, or no answer.
    The text is fit for an Event (never the kubeconfig or a response body)."""


# ---------------------------------------------------------------------------------------------
# The seams
# ---------------------------------------------------------------------------------------------
class WallClock(Protocol):
    """Wall time for stamping and judging times written to the API (the apiserver's clock in the App)."""

    def __call__(self) -> dt.datetime: ...


class MonotonicClock(Protocol):
    """Seconds on a clock that never jumps: rates, grace periods, lease expiry as observed locally."""

    def __call__(self) -> float: ...


class CacheView(Protocol[T_co]):
    """Read side of one watch cache (kube/watch/informer.py `Informer`)."""

    @property
    def name(self) -> str: ...

    @property
    def synced(self) -> bool:
        """A full LIST has completed at least once."""
        ...

    @property
    def healthy(self) -> bool:
        """Synced, and the cache follows the cluster now (last LIST succeeded, watch up)."""
        ...

    @property
    def cache(self) -> Mapping[Key, T_co]:
        """Live view: take `snapshot()` before awaiting while iterating."""
        ...

    def snapshot(self) -> Mapping[Key, T_co]: ...

    @property
    def generation(self) -> int:
        """Grows with every change of the cache's content: what was derived from it at one generation
        still holds while the generation is the same."""
        ...


class ReplicationCaches(Protocol):
    """What the replication loop reads: the core caches and the per-source Secret caches."""

    @property
    def namespaces(self) -> CacheView[Namespace]: ...

    @property
    def classes(self) -> CacheView[GpuClass]: ...

    @property
    def claims(self) -> CacheView[GpuClaim]: ...

    @property
    def replicas(self) -> CacheView[ReplicaSecret]: ...

    @property
    def all(self) -> Sequence[CacheView[Any]]: ...

    def core_synced(self) -> bool: ...

    def core_healthy(self) -> bool:
        """Deletions depend on this: every core cache complete and following the cluster."""
        ...

    def ensure_sources(self, wanted: Iterable[ObjectRef]) -> None:
        """Watch exactly the source Secrets some vGPU class names now."""
        ...

    def source_states(self) -> Mapping[ObjectRef, SourceSecret | None]:
        """Synced sources only: the Secret, or None when it is confirmed absent."""
        ...


class RolloutCaches(Protocol):
    """What the rollout loop reads: replicas, sources, and KubeVirt's VMs and VMIs."""

    @property
    def replicas(self) -> CacheView[ReplicaSecret]: ...

    @property
    def vms(self) -> CacheView[Vm] | None: ...

    @property
    def vmis(self) -> CacheView[Vmi] | None: ...

    def core_synced(self) -> bool: ...

    def kubevirt_healthy(self) -> bool: ...

    def source_states(self) -> Mapping[ObjectRef, SourceSecret | None]: ...


class ReplicaWriter(Protocol):
    """Replica Secret writes that never touch a Secret licensectl does not own (kube/writer.py)."""

    async def create(self, want: SecretBody) -> WriteResult: ...

    async def update(self, want: SecretBody, observed: ObservedMeta | None) -> WriteResult:
        """Replace if ours and different; `observed` (from the cache) guards the first try by resourceVersion."""
        ...

    async def delete(self, namespace: str, name: str, uid: str) -> WriteResult:
        """Delete exactly the object with this uid, and only if it is ours."""
        ...


class EventSink(Protocol):
    """Kubernetes Events for humans (kube/events.py); never raises."""

    async def emit(self, obj: InvolvedObject, type_: EventType, reason: Reason, message: str) -> None: ...


class KubevirtApi(Protocol):
    """The KubeVirt calls of a rollout (kube/kubevirt.py)."""

    async def annotate_vm(self, *, namespace: str, name: str, resource_version: str,
                          annotations: Mapping[str, str | None]) -> bool:
        """Merge-patch VM annotations guarded by resourceVersion; False when the VM changed or is gone."""
        ...

    async def live_vmi_uid(self, namespace: str, name: str) -> str | None:
        """UID of the VMI running now, read live (not from a cache); None when absent or terminating."""
        ...

    async def restart(self, *, namespace: str, vm: str, vmi_uid: str, run_strategy: str | None) -> RestartResult:
        """Restart the VM's current VMI (the call has no UID precondition: where the plan asks,
        `check_live`, read `live_vmi_uid` first)."""
        ...


class LeaseBackend(Protocol):
    """coordination.k8s.io/v1 Lease reads and guarded writes, as raw JSON objects."""

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease, or None when it does not exist."""
        ...

    async def create(self, namespace: str, body: dict[str, Any]) -> bool:
        """False when another candidate created it first."""
        ...

    async def replace(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        """Update guarded by the body's resourceVersion; False when the Lease changed since it was read."""
        ...


class RotationCaches(Protocol):
    """What the rotation loop reads: revision stores, classes, replicas, VMIs and the sources."""

    @property
    def revision_stores(self) -> CacheView[RevisionStore]: ...

    @property
    def classes(self) -> CacheView[GpuClass]: ...

    @property
    def replicas(self) -> CacheView[ReplicaSecret]: ...

    @property
    def vmis(self) -> CacheView[Vmi] | None: ...

    def core_synced(self) -> bool: ...

    def source_states(self) -> Mapping[ObjectRef, SourceSecret | None]: ...


class RevisionStores(Protocol):
    """The rotation record's home, a Secret per source (kube/rotation_store.py over kube/revision_store.py):
    the layout of the store is the adapter's, the loop sees records and decisions."""

    def by_source(self, stores: Iterable[RevisionStore]) -> dict[ObjectRef, RevisionStore]: ...

    def live_revision(self, source: SourceSecret | None) -> str | None:
        """The revision of the source's content now; None when it holds no usable token."""
        ...

    def rotations(self, stores: Mapping[ObjectRef, RevisionStore],
                  live: Mapping[ObjectRef, SourceSecret | None]) -> Mapping[ObjectRef, SourceRevisions]:
        """Per source with a readable record: the record and the bytes it names."""
        ...

    async def write(self, *, source: ObjectRef, existing: RevisionStore | None, decision: Decision,
                    live: SourceSecret | None) -> bool | None:
        """Create or replace the store (guarded by resourceVersion). True: written; False: the store changed
        since it was read (decide again); None: the store cannot back the decision (nothing written)."""
        ...


class RotationInputs(Protocol):
    """What the rotation reads of the other loops' results (controllers/fleet.py `FleetView`)."""

    def replication_plan(self) -> ReplicationPlan | None: ...

    def rollout_plan(self) -> RolloutPlan | None: ...

    def token_sha(self, namespace: str, vmi: str) -> str | None:
        """The token the VMI's mounted replica holds now."""
        ...


class TenantCluster(Protocol):
    """The handful of tenant-cluster calls a drain makes (kube/tenant.py `TenantApi`). Transport failures
    raise `TenantUnreachable`."""

    async def nodes(self) -> list[TenantNode]: ...

    async def node(self, name: str) -> tuple[TenantNode, str] | None:
        """The Node and its resourceVersion, read afresh; None when it is gone."""
        ...

    async def pods_on(self, node: str) -> tuple[TenantPod, ...]:
        """The Pods bound to `node`, each knowing whether its DaemonSet still exists."""
        ...

    async def set_cordon(self, name: str, *, unschedulable: bool, marker: str | None,
                         resource_version: str) -> bool:
        """Cordon with `marker` in the same write, or uncordon and drop it, guarded by `resource_version`;
        False when the Node changed or is gone."""
        ...

    async def evict(self, namespace: str, name: str) -> int:
        """The Eviction's HTTP status (201 evicted, 429 a PodDisruptionBudget refused, 404 already gone)."""
        ...


class TenantClusters(Protocol):
    """Opens one tenant cluster's API for one pass, closed after it (the kubeconfig is not kept)."""

    def open(self, namespace: str, cluster: str) -> AbstractAsyncContextManager[TenantCluster]:
        """Raises `TenantUnreachable` on entry when the cluster's API cannot be used."""
        ...


class ClusterApi(Protocol):
    """Cluster API's objects in the management cluster, read only (kube/cluster_api.py). Absent objects
    are Cluster API's defaults; a failed read raises `ReadFailed`."""

    async def cluster_annotations(self, namespace: str, cluster: str) -> Mapping[str, str]: ...

    async def machine(self, namespace: str, kubevirt_machine: str) -> MachineSays:
        """What the controller Machine of this KubevirtMachine says about draining it."""
        ...


class WorkerDrain(Protocol):
    """What the rollout hands tenant-cluster workers to, after each plan (controllers/worker_drain.py)."""

    def set_expect(self, expect: Callable[[str, str, str], None]) -> None:
        """Called with (namespace, vm, resourceVersion before) after each VM write the drain makes."""
        ...

    def worker_limits(self) -> dict[str, int]:
        """Per tenant cluster (`namespace/cluster`): how many of its workers may be out at once."""
        ...

    async def reconcile(self, plan: RolloutPlan, vms: Mapping[Key, Vm],
                        vmis: Mapping[Key, Vmi]) -> dt.datetime | None:
        """Hand every worker to its tenant cluster's task (no tenant I/O); when the next pass is due (None:
        on the next event)."""
        ...

    def busy_clusters(self) -> frozenset[str]:
        """Tenant clusters (`namespace/cluster`) whose task has not yet answered the work it was handed."""
        ...

    async def stop(self) -> None:
        """End every tenant cluster's task (leadership lost, shutdown)."""
        ...

    def samples(self, vms: Iterable[Vm]) -> Iterable[Any]:
        """Gauge samples of the drain records on the VMs (licensectl.metrics.GaugeSample)."""
        ...


class VmiDryRun(Protocol):
    """A server-side dry-run create of a VMI through the real admission chain (kube/admission_probe.py)."""

    async def create_vmi(self, namespace: str, body: Mapping[str, Any], *,
                         request_timeout: float) -> Mapping[str, Any]:
        """The object as admission returned it (nothing is stored)."""
        ...


class RestartPreflight(Protocol):
    """Whether the VMI a VM's template makes would be admitted now (kube/preflight.py): a server-side
    dry-run create through every admission webhook and policy. Never raises: no answer is an `Admission`
    too (not admitted, not answered)."""

    async def admits(self, namespace: str, vm: str) -> Admission: ...


class Credentials(Protocol):
    """What a replica carries to let its guests report (controllers/credentials.py): the signing key ring's
    credential per namespace, its key id and revocation epoch, and the CA the guests verify us with."""

    def credential_for(self, namespace: str) -> str: ...

    def bound(self) -> Callable[[str], str]:
        """`credential_for` bound to the current key ring (a pass plans in another thread with it)."""
        ...

    def key_id(self) -> str: ...

    def epoch(self) -> str: ...

    def report_ca(self) -> bytes: ...
