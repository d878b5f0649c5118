"""In-memory implementations of the seams in `licensectl.core.ports`, for unit tests of the reconcile loops
and the lease without a cluster.

They keep the rules the loops rely on, not a whole apiserver: writes are guarded the way the real
writers guard them (resourceVersion, uid, ownership), and what a write changes shows up in the caches
at once (a watch without lag) unless a test holds the caches back to model a lagging watch.
Every call is recorded in order (`calls`/`ops`) so tests can assert what was written and when.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import datetime as dt
import itertools
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from licensectl.core import drain
from licensectl.core.model import (
    ANN_DELIVERY_PROBE_ANSWER,
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
from licensectl.core.ports import (
    InvolvedObject,
    MachineSays,
    ObservedMeta,
    ReadFailed,
    RestartResult,
    SecretBody,
    TenantUnreachable,
    WriteResult,
)
from licensectl.core.reasons import EventType, Reason
from licensectl.core.replication import SourceRevisions
from licensectl.core.rotation import Decision
from licensectl.core.timecodec import to_epoch_us
from licensectl.kube import projections
from licensectl.kube import revision_store as rs
from licensectl.kube.api import ApiException
from licensectl.kube.caches import CacheHealth
from licensectl.kube.writer import is_owned, merged_body

if TYPE_CHECKING:
    from licensectl.core.ports import (
        ClusterApi,
        EventSink,
        KubevirtApi,
        LeaseBackend,
        ReplicationCaches,
        ReplicaWriter,
        RevisionStores,
        RolloutCaches,
        RotationCaches,
        TenantClusters,
        VmiDryRun,
    )

Key = tuple[str, str]
T = TypeVar("T")

EPOCH = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def key_of(obj: Any) -> Key:
    """(namespace, name); cluster-scoped objects (no namespace) under ""."""
    return (getattr(obj, "namespace", "") or "", obj.name)


class ManualClock:
    """Wall and monotonic time that move only when the test says so."""

    def __init__(self, start: dt.datetime = EPOCH, monotonic_start: float = 1000.0) -> None:
        self._wall = start
        self._mono = monotonic_start

    def now(self) -> dt.datetime:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._wall += dt.timedelta(seconds=seconds)
        self._mono += seconds


class MemoryCache(Generic[T]):
    """One watch cache (a `CacheView`): synced and healthy unless the test says otherwise."""

    def __init__(self, name: str, items: Iterable[T] = ()) -> None:
        self.name = name
        self.synced = True
        self.healthy = True
        self._items: dict[Key, T] = {key_of(o): o for o in items}
        self.generation = 0

    @property
    def cache(self) -> Mapping[Key, T]:
        return MappingProxyType(self._items)

    def snapshot(self) -> dict[Key, T]:
        return dict(self._items)

    def put(self, *objs: T) -> None:
        for o in objs:
            self._items[key_of(o)] = o
        self.generation += 1

    def remove(self, key: Key) -> None:
        self._items.pop(key, None)
        self.generation += 1


class MemoryCaches(CacheHealth):
    """The caches both loops read (`ReplicationCaches` and `RolloutCaches`); when they count as synced
    and healthy is decided by the real caches' own `CacheHealth`.

    `source_secrets` is what exists in the cluster; a source is visible to the loop (synced, the
    Secret or None) only once `ensure_sources` asked for it, as with the real per-source watches.
    """

    def __init__(self, *, with_kubevirt: bool = True) -> None:
        self.namespaces: MemoryCache[Namespace] = MemoryCache("namespaces")
        self.classes: MemoryCache[GpuClass] = MemoryCache("gpuclasses")
        self.claims: MemoryCache[GpuClaim] = MemoryCache("gpuclaims")
        self.replicas: MemoryCache[ReplicaSecret] = MemoryCache("replicas")
        self.vms: MemoryCache[Vm] | None = MemoryCache("virtualmachines") if with_kubevirt else None
        self.vmis: MemoryCache[Vmi] | None = MemoryCache("virtualmachineinstances") if with_kubevirt else None
        self.revision_stores: MemoryCache[RevisionStore] = MemoryCache("revisionstores")
        self.source_secrets: dict[ObjectRef, SourceSecret] = {}
        self.watched: set[ObjectRef] = set()

    @property
    def core(self) -> list[MemoryCache[Any]]:
        return [self.namespaces, self.classes, self.claims, self.replicas]

    @property
    def all(self) -> list[MemoryCache[Any]]:
        return self.core + [c for c in (self.vms, self.vmis) if c is not None]

    def ensure_sources(self, wanted: Iterable[ObjectRef]) -> None:
        self.watched = set(wanted)

    def source_states(self) -> dict[ObjectRef, SourceSecret | None]:
        return {ref: self.source_secrets.get(ref) for ref in sorted(self.watched, key=str)}


class MemoryCredentials:
    """The Credentials port with a fixed credential per namespace, no key id, epoch or CA unless given."""

    def __init__(self, credential_for: Callable[[str], str] = lambda _ns: "", *, key_id: str = "",
                 epoch: str = "", report_ca: bytes = b"") -> None:
        self._credential_for = credential_for
        self._key_id, self._epoch, self._report_ca = key_id, epoch, report_ca

    def credential_for(self, namespace: str) -> str:
        return self._credential_for(namespace)

    def bound(self) -> Callable[[str], str]:
        return self._credential_for

    def key_id(self) -> str:
        return self._key_id

    def epoch(self) -> str:
        return self._epoch

    def report_ca(self) -> bytes:
        return self._report_ca


class MemoryEvents:
    """An `EventSink` that keeps every Event."""

    def __init__(self) -> None:
        self.emitted: list[tuple[InvolvedObject, str, str, str]] = []

    async def emit(self, obj: InvolvedObject, type_: EventType, reason: Reason, message: str) -> None:
        self.emitted.append((obj, type_, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, _, reason, _ in self.emitted]


class _Versions:
    """Cluster-wide resourceVersions and uids, like etcd's revision counter."""

    def __init__(self) -> None:
        self._rv = itertools.count(100)
        self._uid = itertools.count(1)

    def rv(self) -> str:
        return str(next(self._rv))

    def uid(self, prefix: str) -> str:
        return f"{prefix}-{next(self._uid):04d}"


class MemoryReplicaWriter:
    """A `ReplicaWriter` over an in-memory Secret store, with SecretWriter's rules: a Secret without
    licensectl's marks is a conflict and never changes; deletes need the observed uid. Owned Secrets
    appear in `caches.replicas` as the replica watch would show them."""

    def __init__(self, caches: MemoryCaches) -> None:
        self.caches = caches
        self.secrets: dict[Key, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str]] = []  # (create|update|delete, namespace, name)
        self.failing: set[Key] = set()  # writes to these raise a 500
        self._versions = _Versions()

    def put_foreign(self, namespace: str, name: str) -> None:
        """A tenant's own Secret under a replica's name."""
        self.secrets[(namespace, name)] = {
            "metadata": {"namespace": namespace, "name": name, "uid": self._versions.uid("foreign"),
                         "resourceVersion": self._versions.rv(), "labels": {"app": "tenant"}},
            "data": {"k": "dGVuYW50"}}

    def _check(self, verb: str, namespace: str, name: str) -> None:
        self.calls.append((verb, namespace, name))
        if (namespace, name) in self.failing:
            raise ApiException(status=500, reason="InternalError")

    def _store(self, key: Key, obj: dict[str, Any], uid: str) -> None:
        obj["metadata"]["uid"] = uid
        obj["metadata"]["resourceVersion"] = self._versions.rv()
        self.secrets[key] = obj
        replica = projections.replica_secret_from(obj)
        if replica is not None and replica.owned:
            self.caches.replicas.put(replica)

    async def create(self, want: SecretBody) -> WriteResult:
        self._check("create", want.namespace, want.name)
        key = (want.namespace, want.name)
        if key in self.secrets:  # AlreadyExists: decided from the object, as SecretWriter does
            return self._update(want)
        self._store(key, merged_body(None, want), self._versions.uid("secret"))
        return WriteResult.CREATED

    async def update(self, want: SecretBody, observed: ObservedMeta | None) -> WriteResult:
        self._check("update", want.namespace, want.name)
        return self._update(want)

    def _update(self, want: SecretBody) -> WriteResult:
        key = (want.namespace, want.name)
        current = self.secrets.get(key)
        if current is None:
            self._store(key, merged_body(None, want), self._versions.uid("secret"))
            return WriteResult.CREATED
        if not is_owned(current["metadata"]):
            return WriteResult.CONFLICT
        body = merged_body(current, want)
        same = (body["data"] == current.get("data") and body["metadata"]["labels"] == current["metadata"]["labels"]
                and body["metadata"]["annotations"] == current["metadata"]["annotations"])
        if same:
            return WriteResult.UNCHANGED
        self._store(key, body, current["metadata"]["uid"])
        return WriteResult.UPDATED

    async def delete(self, namespace: str, name: str, uid: str) -> WriteResult:
        self._check("delete", namespace, name)
        current = self.secrets.get((namespace, name))
        if current is None:
            return WriteResult.GONE
        if not is_owned(current["metadata"]):
            return WriteResult.CONFLICT
        if current["metadata"]["uid"] != uid:
            return WriteResult.GONE
        del self.secrets[(namespace, name)]
        self.caches.replicas.remove((namespace, name))
        return WriteResult.DELETED


class MemoryKubevirt:
    """A `KubevirtApi` over in-memory VMs and VMIs, behaving as KubeVirt does for a rollout.

    `annotate_vm` is a merge patch guarded by resourceVersion; `restart` replaces the running VMI by
    a new one (new uid, started now, Ready unless `come_back_ready` is False), or leaves it running
    when the VM is in `stuck` (a restart that never takes effect); with `calls_lost` it raises
    before reaching KubeVirt (the connection, or the process, died). `live_vmi_uid` reads the truth,
    while the caches follow it only when `lag` is False or on `publish()` (a lagging watch).
    """

    def __init__(self, caches: MemoryCaches, clock: ManualClock) -> None:
        assert caches.vms is not None and caches.vmis is not None
        self._vm_cache = caches.vms
        self._vmi_cache = caches.vmis
        self.clock = clock
        self.vms: dict[Key, Vm] = {}
        self.vmis: dict[Key, Vmi] = {}
        self.ops: list[tuple[str, str, str]] = []  # (annotate|live-get|restart, namespace, vm)
        self.lag = False
        self.come_back_ready = True
        self.stuck: set[Key] = set()
        self.calls_lost = False
        self._versions = _Versions()

    def add(self, namespace: str, name: str, *, secret_volumes: tuple[str, ...], started: dt.datetime,
            run_strategy: str = "Always", annotations: Mapping[str, str] | None = None) -> None:
        """A running VM and its Ready VMI that mounts `secret_volumes`."""
        self.vms[(namespace, name)] = Vm(namespace=namespace, name=name,
                                         run_strategy=run_strategy, annotations=dict(annotations or {}),
                                         resource_version=self._versions.rv())
        self.vmis[(namespace, name)] = self._vmi(namespace, name, secret_volumes, started, ready=True)
        self.publish()

    def _vmi(self, namespace: str, name: str, volumes: tuple[str, ...], started: dt.datetime, *,
             ready: bool) -> Vmi:
        return Vmi(namespace=namespace, name=name, uid=self._versions.uid("vmi"), created_us=to_epoch_us(started),
                   owner_vm=name, phase="Running", ready=ready, running_since_us=to_epoch_us(started),
                   secret_volumes=volumes, firmware_uuid=None)

    def publish(self) -> None:
        """Let the caches catch up with the truth (the watch delivers)."""
        for key in [k for k in self._vm_cache.cache if k not in self.vms]:
            self._vm_cache.remove(key)
        for key in [k for k in self._vmi_cache.cache if k not in self.vmis]:
            self._vmi_cache.remove(key)
        self._vm_cache.put(*self.vms.values())
        self._vmi_cache.put(*self.vmis.values())

    def _changed(self) -> None:
        if not self.lag:
            self.publish()

    async def annotate_vm(self, *, namespace: str, name: str, resource_version: str,
                          annotations: Mapping[str, str | None]) -> bool:
        self.ops.append(("annotate", namespace, name))
        vm = self.vms.get((namespace, name))
        if vm is None or vm.resource_version != resource_version:
            return False
        merged = dict(vm.annotations)
        for k, v in annotations.items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = v
        self.vms[(namespace, name)] = dataclasses.replace(vm, annotations=merged,
                                                          resource_version=self._versions.rv())
        self._changed()
        return True

    async def live_vmi_uid(self, namespace: str, name: str) -> str | None:
        self.ops.append(("live-get", namespace, name))
        vmi = self.vmis.get((namespace, name))
        return vmi.uid if vmi is not None and not vmi.deleting else None

    async def restart(self, *, namespace: str, vm: str, vmi_uid: str, run_strategy: str | None) -> RestartResult:
        if self.calls_lost:
            raise ConnectionResetError("restart call lost")
        self.ops.append(("restart", namespace, vm))
        key = (namespace, vm)
        if key not in self.vms:
            return RestartResult.NOT_FOUND
        old = self.vmis.get(key)
        if key in self.stuck or old is None:
            return RestartResult.ISSUED
        self.vmis[key] = self._vmi(namespace, vm, old.secret_volumes, self.clock.now(), ready=self.come_back_ready)
        self._changed()
        return RestartResult.ISSUED

    def restarted(self) -> list[Key]:
        return [(ns, vm) for op, ns, vm in self.ops if op == "restart"]


class MemoryLeases:
    """A `LeaseBackend`: Leases as raw objects, replace guarded by resourceVersion.

    `down` makes every call fail as an unreachable apiserver would; `writes` records (verb, holder).
    Every call yields to the event loop once, so candidates started together really interleave.
    """

    def __init__(self) -> None:
        self.leases: dict[Key, dict[str, Any]] = {}
        self.writes: list[tuple[str, str]] = []
        self.down = False
        self._versions = _Versions()

    async def _reachable(self) -> None:
        await asyncio.sleep(0)
        if self.down:
            raise OSError("apiserver unreachable")

    def holder(self, namespace: str, name: str) -> str | None:
        obj = self.leases.get((namespace, name))
        return None if obj is None else str(obj["spec"].get("holderIdentity") or "")

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        await self._reachable()
        obj = self.leases.get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    async def create(self, namespace: str, body: dict[str, Any]) -> bool:
        await self._reachable()
        key = (namespace, body["metadata"]["name"])
        if key in self.leases:
            return False
        self._store(key, "create", body)
        return True

    async def replace(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        await self._reachable()
        current = self.leases.get((namespace, name))
        if current is None:
            raise ApiException(status=404, reason="NotFound")
        if (body.get("metadata") or {}).get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return False
        self._store((namespace, name), "replace", body)
        return True

    def _store(self, key: Key, verb: str, body: dict[str, Any]) -> None:
        obj = copy.deepcopy(body)
        obj.setdefault("metadata", {})["resourceVersion"] = self._versions.rv()
        self.leases[key] = obj
        self.writes.append((verb, str(obj["spec"].get("holderIdentity") or "")))



class MemoryTenantCluster:
    """A `TenantCluster`: Nodes with resourceVersions, Pods, and Eviction answers per Pod.

    `unreachable` makes every call raise `TenantUnreachable` with that text; `evictions` answers an
    Eviction by Pod key ("ns/name") with an HTTP status (201 when unset: evicted, and the Pod goes).
    """

    def __init__(self, nodes: Iterable[drain.TenantNode] = (), pods: Iterable[drain.TenantPod] = ()) -> None:
        self._versions = _Versions()
        self.nodes_by_name: dict[str, tuple[drain.TenantNode, str]] = {n.name: (n, self._versions.rv()) for n in nodes}
        self.pods: dict[str, drain.TenantPod] = {p.key: p for p in pods}
        self.evictions: dict[str, int] = {}
        self.unreachable: str | None = None
        self.calls: list[tuple[str, str]] = []

    def _reachable(self, verb: str, what: str) -> None:
        self.calls.append((verb, what))
        if self.unreachable is not None:
            raise TenantUnreachable(self.unreachable)

    async def nodes(self) -> list[drain.TenantNode]:
        self._reachable("list", "nodes")
        return [n for n, _ in self.nodes_by_name.values()]

    async def node(self, name: str) -> tuple[drain.TenantNode, str] | None:
        self._reachable("get", name)
        return self.nodes_by_name.get(name)

    async def pods_on(self, node: str) -> tuple[drain.TenantPod, ...]:
        self._reachable("list", f"pods on {node}")
        return tuple(p for p in self.pods.values() if p.node_name == node)

    async def set_cordon(self, name: str, *, unschedulable: bool, marker: str | None,
                         resource_version: str) -> bool:
        self._reachable("cordon" if unschedulable else "uncordon", name)
        current = self.nodes_by_name.get(name)
        if current is None or current[1] != resource_version:
            return False
        node = dataclasses.replace(current[0], unschedulable=unschedulable, cordoned_by=marker)
        self.nodes_by_name[name] = (node, self._versions.rv())
        return True

    async def evict(self, namespace: str, name: str) -> int:
        key = f"{namespace}/{name}"
        self._reachable("evict", key)
        if key not in self.pods:
            return 404
        status = self.evictions.get(key, 201)
        if status in (200, 201):
            del self.pods[key]
        return status


class MemoryTenantClusters:
    """`TenantClusters`: clusters by (namespace, cluster); one without an entry has no kubeconfig."""

    def __init__(self) -> None:
        self.clusters: dict[Key, MemoryTenantCluster] = {}
        self.opened: list[Key] = []

    @contextlib.asynccontextmanager
    async def open(self, namespace: str, cluster: str) -> AsyncIterator[MemoryTenantCluster]:
        self.opened.append((namespace, cluster))
        tenant = self.clusters.get((namespace, cluster))
        if tenant is None:
            raise TenantUnreachable(f"Secret {namespace}/{cluster}-kubeconfig (Cluster API's kubeconfig of "
                                    f"{cluster}) does not exist")
        yield tenant


class MemoryClusterApi:
    """`ClusterApi`: Cluster annotations and Machine drain settings; keys in `failing` fail to read."""

    def __init__(self) -> None:
        self.cluster_annotations_by_key: dict[Key, dict[str, str]] = {}
        self.machines: dict[Key, MachineSays] = {}  # (namespace, KubevirtMachine) -> what its Machine says
        self.failing: set[Key] = set()

    async def cluster_annotations(self, namespace: str, cluster: str) -> Mapping[str, str]:
        if (namespace, cluster) in self.failing:
            raise ReadFailed("ApiException", 503)
        return dict(self.cluster_annotations_by_key.get((namespace, cluster), {}))

    async def machine(self, namespace: str, kubevirt_machine: str) -> MachineSays:
        if (namespace, kubevirt_machine) in self.failing:
            raise ReadFailed("TimeoutError")
        return self.machines.get((namespace, kubevirt_machine), MachineSays())


class MemoryRevisionStores:
    """`RevisionStores` over `caches.revision_stores`: the store layout is the real one
    (kube/revision_store.py); a write lands in the cache at once unless `conflict` is set."""

    def __init__(self, caches: MemoryCaches, *, namespace: str = "licensectl", token_key: str = "token") -> None:
        self.caches = caches
        self.namespace = namespace
        self.token_key = token_key
        self.conflict = False
        self.written: list[tuple[ObjectRef, Decision]] = []
        self._versions = _Versions()

    def by_source(self, stores: Iterable[RevisionStore]) -> dict[ObjectRef, RevisionStore]:
        return rs.stores_by_source(stores)

    def live_revision(self, source: SourceSecret | None) -> str | None:
        return rs.live_revision(source, self.token_key)

    def rotations(self, stores: Mapping[ObjectRef, RevisionStore],
                  live: Mapping[ObjectRef, SourceSecret | None]) -> Mapping[ObjectRef, SourceRevisions]:
        return rs.source_rotations(stores, live, token_key=self.token_key)

    async def write(self, *, source: ObjectRef, existing: RevisionStore | None, decision: Decision,
                    live: SourceSecret | None) -> bool | None:
        body = rs.store_body(namespace=self.namespace, source=source, existing=existing, decision=decision,
                             live=live, token_key=self.token_key)
        if body is None:
            return None
        if self.conflict:
            return False
        self.written.append((source, decision))
        obj = body.as_object(source)
        obj["metadata"]["resourceVersion"] = self._versions.rv()
        store = projections.revision_store_from(obj)
        assert store is not None
        self.caches.revision_stores.put(store)
        return True


class MemoryVmiDryRun:
    """`VmiDryRun` answered as the apiserver would: `answer` is the webhook's probe answer, or None when
    no webhook mutated the VMI (admitted unchanged); `error` is raised instead when set."""

    def __init__(self, answer: str | None = "licensectl-0") -> None:
        self.answer = answer
        self.error: BaseException | None = None
        self.created: list[tuple[str, Mapping[str, Any]]] = []

    async def create_vmi(self, namespace: str, body: Mapping[str, Any], *,
                         request_timeout: float) -> Mapping[str, Any]:
        self.created.append((namespace, body))
        if self.error is not None:
            raise self.error
        obj = copy.deepcopy(dict(body))
        if self.answer is not None:
            obj["metadata"].setdefault("annotations", {})[ANN_DELIVERY_PROBE_ANSWER] = self.answer
        return obj


if TYPE_CHECKING:  # mypy proves the in-memory seams satisfy the Protocols the loops depend on

    def _conforms(caches: MemoryCaches, writer: MemoryReplicaWriter, events: MemoryEvents,
                  kubevirt: MemoryKubevirt, leases: MemoryLeases,
                  ) -> tuple[ReplicationCaches, RolloutCaches, ReplicaWriter, EventSink, KubevirtApi, LeaseBackend]:
        return caches, caches, writer, events, kubevirt, leases

    def _conforms_too(caches: MemoryCaches, stores: MemoryRevisionStores, tenants: MemoryTenantClusters,
                      cluster_api: MemoryClusterApi, dry_run: MemoryVmiDryRun,
                      ) -> tuple[RotationCaches, RevisionStores, TenantClusters, ClusterApi, VmiDryRun]:
        return caches, stores, tenants, cluster_api, dry_run
