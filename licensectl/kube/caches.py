"""Every watch cache one licensectl process keeps, and the per-source Secret caches it adds or drops.

Only slim projections are cached. Secrets are never watched cluster-wide: replicas are selected by
licensectl's label, and each source Secret gets its own field-selected watch, started when a vGPU
class first names it and stopped when none does. Volumes likewise: only the PVCs and CDI DataSources
that carry the vGPU guest driver mark are watched (label-selected); DataVolumes all, slim, because an
unmarked one leads to its golden image (`BootMarkCaches`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from licensectl import config, logs
from licensectl.core import boot_image
from licensectl.core.model import (
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    REVISION_STORE_LABEL,
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
from licensectl.core.ports import CacheView
from licensectl.kube import contract, projections
from licensectl.kube.api import AnyClient, CoreV1Api, CustomObjectsApi
from licensectl.kube.tasks import cancel_and_wait
from licensectl.kube.tenant import KUBECONFIG_SUFFIX
from licensectl.kube.watch import Informer, InformerHooks, InformerOptions, shared_name_key

log = logs.get(__name__)

OnChange = Callable[[str], None]

# CDI, the containerized-data-importer (kubevirt/containerized-data-importer, API cdi.kubevirt.io/v1beta1):
# DataVolumes and the DataSources that name golden images. Optional in a cluster.
CDI_GROUP = "cdi.kubevirt.io"
CDI_VERSION = "v1beta1"
DATA_VOLUME_PLURAL = "datavolumes"
DATA_SOURCE_PLURAL = "datasources"
# Where CDI is not installed its LIST answers 404 for as long as licensectl runs: retry (and log) at
# most every 15 s instead of every 2 s. The cap also applies to a failing watch of an installed CDI;
# its marks are then stale for that long at most, and read as unknown once the informer is unhealthy.
CDI_RETRY_CAP = 15.0
CDI_OPTIONS = InformerOptions(backoff_cap=CDI_RETRY_CAP)


class CacheHealth:
    """When the loops may trust a set of watch caches, decided in one place: for the real caches
    below and for any stand-in that reuses this (the unit tests' in-memory caches), so the two
    cannot come to judge the same state differently."""

    vms: CacheView[Any] | None
    vmis: CacheView[Any] | None

    @property
    def core(self) -> Sequence[CacheView[Any]]:
        """The caches whose completeness every deletion depends on."""
        raise NotImplementedError

    def core_synced(self) -> bool:
        return all(c.synced for c in self.core)

    def core_healthy(self) -> bool:
        return all(c.synced and c.healthy for c in self.core)

    def core_stale_seconds(self) -> float | None:
        """The longest any core cache has not heard from the apiserver (None before they all listed once)."""
        ages = [getattr(c, "stale_seconds", None) for c in self.core]
        known = [a for a in ages if a is not None]
        return max(known) if known and len(known) == len(ages) else None

    def kubevirt_healthy(self) -> bool:
        return all(c is not None and c.synced and c.healthy for c in (self.vms, self.vmis))


class Caches(CacheHealth):
    def __init__(self, api_client: AnyClient, settings: config.Settings, *, on_change: OnChange,
                 hooks: InformerHooks | None = None, with_kubevirt: bool = True) -> None:
        self._core = CoreV1Api(api_client)
        self._custom = CustomObjectsApi(api_client)
        self._on_change = on_change
        self._hooks = hooks
        self._settings = settings

        def changed(kind: str) -> Callable[[Any, Any, Any], None]:
            return lambda _k, _o, _n: on_change(kind)

        mk = functools.partial(Informer, hooks=hooks)
        self.namespaces: Informer[Namespace] = mk(
            "namespaces", self._core.list_namespace, projections.namespace_from, on_change=changed("namespaces"))
        self.classes: Informer[GpuClass] = mk(
            "gpuclasses", contract.gpu_class_lister(self._custom, settings), projections.gpu_class_from,
            on_change=changed("gpuclasses"))
        self.claims: Informer[GpuClaim] = mk(
            "gpuclaims", contract.gpu_claim_lister(self._custom, settings), projections.gpu_claim_from,
            key=shared_name_key, on_change=changed("gpuclaims"))
        self.replicas: Informer[ReplicaSecret] = mk(
            "replicas", self._core.list_secret_for_all_namespaces, projections.replica_secret_from,
            label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}", key=shared_name_key, on_change=changed("replicas"))
        # Revision stores (docs/design.md#safe-rotation): in licensectl's own namespace only.
        self.revision_stores: Informer[RevisionStore] = mk(
            "revisionstores", functools.partial(self._core.list_namespaced_secret, settings.namespace),
            projections.revision_store_from, label_selector=f"{REVISION_STORE_LABEL}=true",
            on_change=changed("revisionstores"))
        self.vms: Informer[Vm] | None = None
        self.vmis: Informer[Vmi] | None = None
        if with_kubevirt:
            # Only VMs and VMIs that ask for a license are held (docs/design.md#decision-cache-relevance):
            # a fleet of ordinary VMs beside the vGPU ones costs next to nothing.
            self.vms = mk("virtualmachines", contract.vm_lister(self._custom), projections.vm_from,
                          on_change=changed("virtualmachines"), keep=projections.vm_relevant)
            self.vmis = mk("virtualmachineinstances", contract.vmi_lister(self._custom), projections.vmi_from,
                           on_change=changed("virtualmachineinstances"), keep=projections.vmi_relevant)
        # The vGPU guest driver marks of boot images, for the admission webhook only (none without it, or
        # with --vgpu-driver-check=off). Not core: their absence never stops a pass or readiness.
        self.boot_marks: BootMarkCaches | None = None
        if settings.webhook_address and settings.vgpu_driver_check != "off":
            self.boot_marks = BootMarkCaches(api_client, self._custom, hooks=hooks)
        self.sources: dict[ObjectRef, Informer[SourceSecret]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._source_tasks: dict[ObjectRef, asyncio.Task[None]] = {}
        # Tenant clusters' kubeconfig Secrets: (namespace, cluster) -> their watch; `on_kubeconfig` is told of
        # a change after the first LIST (never of the LIST itself).
        self.kubeconfigs: dict[tuple[str, str], Informer[str]] = {}
        self._kubeconfig_tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.on_kubeconfig: Callable[[str, str], None] = lambda _ns, _cluster: None

    @property
    def core(self) -> list[Informer[Any]]:
        """The informers whose completeness every deletion depends on."""
        return [self.namespaces, self.classes, self.claims, self.replicas, self.revision_stores]

    @property
    def all(self) -> list[Informer[Any]]:
        extra: list[Informer[Any]] = [i for i in (self.vms, self.vmis) if i is not None]
        marks: list[Informer[Any]] = self.boot_marks.all if self.boot_marks is not None else []
        return self.core + extra + marks + list(self.sources.values())

    def start(self) -> None:
        marks: list[Informer[Any]] = self.boot_marks.all if self.boot_marks is not None else []
        for inf in self.core + [i for i in (self.vms, self.vmis) if i is not None] + marks:
            self._tasks[inf.name] = asyncio.create_task(inf.run(), name=f"informer-{inf.name}")

    async def stop(self) -> None:
        await cancel_and_wait([*self._tasks.values(), *self._source_tasks.values(),
                               *self._kubeconfig_tasks.values()])
        self._tasks.clear()
        self._source_tasks.clear()
        self._kubeconfig_tasks.clear()
        self.kubeconfigs.clear()

    def ensure_sources(self, wanted: Iterable[ObjectRef]) -> None:
        """Start a field-selected watch for every wanted source; stop the ones no class names now."""
        want = set(wanted)
        for ref in want - set(self.sources):
            inf: Informer[SourceSecret] = Informer(
                f"source:{ref}", functools.partial(self._core.list_namespaced_secret, ref.namespace),
                projections.source_secret_from, field_selector=f"metadata.name={ref.name}",
                on_change=lambda _k, _o, _n: self._on_change("source"),
                on_synced=lambda: self._on_change("source"), hooks=self._hooks)
            self.sources[ref] = inf
            self._source_tasks[ref] = asyncio.create_task(inf.run(), name=f"informer-source-{ref}")
            log.info("watching source secret", source=str(ref))
        for ref in set(self.sources) - want:
            self._source_tasks.pop(ref).cancel()
            del self.sources[ref]
            log.info("stopped watching source secret", source=str(ref))

    def ensure_kubeconfigs(self, clusters: Iterable[tuple[str, str]]) -> None:
        """Watch `<cluster>-kubeconfig` by name (field-selected, its resourceVersion only) for each
        (namespace, cluster) given; stop the others."""
        want = set(clusters)
        for ns, cluster in want - set(self.kubeconfigs):
            listed = [False]

            def changed(_k: Any, old: str | None, new: str | None, ns: str = ns, cluster: str = cluster,
                        listed: list[bool] = listed) -> None:
                if listed[0] and new is not None and old != new:
                    self.on_kubeconfig(ns, cluster)

            name = cluster + KUBECONFIG_SUFFIX
            inf: Informer[str] = Informer(
                f"kubeconfig:{ns}/{name}", functools.partial(self._core.list_namespaced_secret, ns),
                projections.secret_version_from, field_selector=f"metadata.name={name}", on_change=changed,
                on_synced=functools.partial(listed.__setitem__, 0, True), hooks=self._hooks)
            self.kubeconfigs[(ns, cluster)] = inf
            self._kubeconfig_tasks[(ns, cluster)] = asyncio.create_task(inf.run(), name=f"informer-{inf.name}")
        for key in set(self.kubeconfigs) - want:
            self._kubeconfig_tasks.pop(key).cancel()
            del self.kubeconfigs[key]

    def source_states(self) -> dict[ObjectRef, SourceSecret | None]:
        """Sources whose cache is synced: the Secret, or None when it is confirmed absent."""
        out: dict[ObjectRef, SourceSecret | None] = {}
        for ref, inf in self.sources.items():
            if not inf.synced:
                continue
            out[ref] = inf.cache.get((ref.namespace, ref.name))
        return out


def _trusted(inf: Informer[Any]) -> Any:
    """The live view of a cache the webhook may decide from, or None (not synced, or its watch down)."""
    return inf.cache if inf.synced and inf.healthy else None


class BootMarkCaches:
    """The watches behind `core.boot_image.Marks`.

    Marked PVCs and DataSources are label-selected (`licensectl.io/vgpu-guest-driver=true`): a cluster
    holds many volumes and few golden images. DataVolumes are all watched, as `DataVolumeRef`s (name,
    mark, source reference: three short strings, the references shared): an unmarked DataVolume is
    resolved to the DataSource it was cloned from, which no label on the DataVolume names. They are
    bounded by the VMs' disks (a VM's dataVolumeTemplates create one per disk), next to the VMs and
    VMIs licensectl already caches. Where CDI is absent the two CDI informers never sync: their marks
    read as unknown, and nothing else waits for them.
    """

    def __init__(self, api_client: AnyClient, custom: CustomObjectsApi, *, hooks: InformerHooks | None) -> None:
        self.pvcs: Informer[boot_image.Marked] = Informer(
            "marked-pvcs", CoreV1Api(api_client).list_persistent_volume_claim_for_all_namespaces,
            projections.boot_mark_from,
            label_selector=boot_image.MARK_SELECTOR, hooks=hooks)
        self.datavolumes: Informer[boot_image.DataVolumeRef] = Informer(
            DATA_VOLUME_PLURAL, functools.partial(custom.list_cluster_custom_object, CDI_GROUP, CDI_VERSION,
                                                  DATA_VOLUME_PLURAL),
            projections.data_volume_from, hooks=hooks, options=CDI_OPTIONS)
        self.datasources: Informer[boot_image.Marked] = Informer(
            "marked-datasources", functools.partial(custom.list_cluster_custom_object, CDI_GROUP, CDI_VERSION,
                                                         DATA_SOURCE_PLURAL),
            projections.boot_mark_from, label_selector=boot_image.MARK_SELECTOR, hooks=hooks,
            options=CDI_OPTIONS)

    @property
    def all(self) -> list[Informer[Any]]:
        return [self.pvcs, self.datavolumes, self.datasources]

    def marks(self, images: tuple[str, ...]) -> boot_image.Marks:
        """Live views (keyed lookups only, also from the webhook's thread), taken afresh per decision."""
        return boot_image.Marks(images=images, pvcs=_trusted(self.pvcs), datavolumes=_trusted(self.datavolumes),
                                datasources=_trusted(self.datasources))
