"""`FleetView`: the questions the listeners, the metrics and the loops ask of the fleet as a whole.

Which replica a VMI mounts and the token it holds, which VMIs expect guest reports and when they
started, which signing keys running VMIs may hold, what admission would deliver: each answer joins
the watch caches with the replication plan, and most are asked far more often than they change (every
scrape, every report, every admission). So they live here, named, and the costly ones are derived once
per cache generation: keyed by the cache objects too, so a replaced cache never passes for the one it
replaced. The loops exchange their results through this view (`RotationInputs`), not through the App.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, cast

from licensectl import config
from licensectl.controllers.delivery_probe import DeliveryProbe
from licensectl.controllers.replication_loop import ReplicationController
from licensectl.controllers.rollout_loop import RolloutController
from licensectl.controllers.rotation import RotationController
from licensectl.controllers.settings import tenant_settings
from licensectl.core import boot_image, credentials
from licensectl.core.delivery import Delivery, DeliveryView, plan_delivery, wanted_replicas, wanted_volumes
from licensectl.core.entitlement import customer_tenant
from licensectl.core.model import ANN_REVISION, ObjectRef, Vmi
from licensectl.core.render import RenderedLicense
from licensectl.core.replication import ReplicationPlan, SourceRevisions
from licensectl.core.rollout import RolloutPlan
from licensectl.kube import projections
from licensectl.kube.caches import Caches

Key = tuple[str, str]


class FleetView:
    """Built before the loops (they take its named methods), given them with `attach` once they exist."""

    def __init__(self, caches: Caches, settings: config.Settings) -> None:
        self.caches = caches
        self.settings = settings
        self._driver_images = boot_image.parse_image_patterns(settings.vgpu_driver_images)
        self.replication: ReplicationController | None = None
        self.rollout: RolloutController | None = None
        self.rotation: RotationController | None = None
        self.delivery_probe: DeliveryProbe | None = None
        self._uuid_index: dict[Key, str] | None = None
        # Derived from the VMI (and replica) caches once per cache generation (vmi_starts, affected_vmis).
        self._starts: tuple[tuple[object, int], Mapping[Key, dt.datetime | None]] | None = None
        self._affected: tuple[tuple[object, int, object, int], tuple[Key, ...]] | None = None
        self._holders: tuple[tuple[object, int, object, int], credentials.Holders] | None = None

    def attach(self, *, replication: ReplicationController, rollout: RolloutController,
               rotation: RotationController, delivery_probe: DeliveryProbe | None) -> None:
        self.replication = replication
        self.rollout = rollout
        self.rotation = rotation
        self.delivery_probe = delivery_probe

    def vmis_changed(self) -> None:
        """The VMI cache moved: the firmware UUID index is rebuilt on its next use."""
        self._uuid_index = None

    # -- the loops' results, for each other (core.ports.RotationInputs) ----------------------------
    def replication_plan(self) -> ReplicationPlan | None:
        return self.replication.status.plan if self.replication is not None else None

    def rollout_plan(self) -> RolloutPlan | None:
        return self.rollout.plan if self.rollout is not None else None

    def rotations(self) -> Mapping[ObjectRef, SourceRevisions] | None:
        """What replication renders from; the revision stores are a core cache, synced before any pass."""
        return self.rotation.rotations() if self.rotation is not None else None

    # -- admission ----------------------------------------------------------------------------------
    def delivery_view(self) -> DeliveryView | None:
        """The caches the webhook and the backstop decide from; None until they can decide."""
        plan = self.replication_plan()
        if not self.caches.core_synced() or plan is None or plan.entitlement is None:
            return None
        return DeliveryView(claims=self.caches.claims.cache, classes=self.caches.classes.cache,
                            entitled=plan.entitlement.entitled, replicas=self.caches.replicas.cache)

    def wanted_volumes(self, vmis: Sequence[Vmi]) -> dict[Key, tuple[str, ...]]:
        view = self.delivery_view()
        # Caches incomplete: no backstop decision, never a restart from a partial view.
        return {} if view is None else wanted_volumes(vmis, view)

    def admit(self, namespace: str, vmi: Mapping[str, Any]) -> Delivery | None:
        view = self.delivery_view()
        if view is None:
            return None
        return plan_delivery(vmi, wanted_replicas(namespace, projections.vmi_gpu_claims(vmi), view))

    def delivery_ready(self) -> bool:
        """The rollout's gate for restarts: evidence that admission delivers (True without a webhook)."""
        return self.delivery_probe is None or self.delivery_probe.ready()

    def check_boot(self, namespace: str, vmi: Mapping[str, Any]) -> boot_image.Judgement | None:
        """The boot image of a vGPU VMI against the marks (webhook thread: keyed cache lookups only)."""
        view = self.delivery_view()
        marks = self.caches.boot_marks
        if view is None or marks is None:
            return None
        if not boot_image.uses_vgpu(namespace, projections.vmi_gpu_claims(vmi), view):
            return None
        return boot_image.judge(boot_image.boot_volume(namespace, vmi), marks.marks(self._driver_images))

    def check_vm_boot(self, namespace: str, vm: Mapping[str, Any]) -> boot_image.Judgement | None:
        """`check_boot` of the VMI a VirtualMachine starts: its template, with the DataVolumes its
        dataVolumeTemplates will create (not there yet at its creation) known from the templates."""
        view = self.delivery_view()
        marks = self.caches.boot_marks
        template = projections.vm_template(vm)
        if view is None or marks is None:
            return None
        if not boot_image.uses_vgpu(namespace, projections.vmi_gpu_claims(template), view):
            return None
        seen = marks.marks(self._driver_images)
        planned = projections.vm_data_volume_templates(namespace, vm)
        if planned:
            live = seen.datavolumes
            # ChainMap reads the live view by key only (`judge` only calls get), never iterates it.
            overlay = planned if live is None else ChainMap(planned, cast(Any, live))
            seen = dataclasses.replace(seen, datavolumes=overlay)
        return boot_image.judge(boot_image.boot_volume(namespace, template), seen)

    # -- keys and reports ---------------------------------------------------------------------------
    def key_holders(self) -> credentials.Holders:
        """Which signing keys running VMIs may hold, from the VMI and replica caches (docs/design.md#key-ring)."""
        vmis = self.caches.vmis
        if vmis is None or not (vmis.synced and vmis.healthy) or not self.caches.replicas.synced:
            return credentials.holders_from(None)
        replica_cache = self.caches.replicas
        gen = (vmis, vmis.generation, replica_cache, replica_cache.generation)
        if self._holders is None or self._holders[0] != gen:  # once per cache generation, not per pass
            self._holders = (gen, credentials.holders_from(credentials.vmi_keys(vmis.cache.values(),
                                                                                 replica_cache.cache)))
        return self._holders[1]

    def uuid_known(self, namespace: str, uuid: str) -> str | None:
        if self._uuid_index is None:
            vmis = self.caches.vmis
            index: dict[Key, str] = {}
            if vmis is not None:
                for v in vmis.cache.values():
                    if v.firmware_uuid:
                        index[(v.namespace, v.firmware_uuid.lower())] = v.name
            self._uuid_index = index
        return self._uuid_index.get((namespace, uuid.lower()))

    def mounted_license(self, namespace: str, vmi: str) -> RenderedLicense | None:
        """The rendered license of the replica a VMI mounts: what its guest must hold."""
        plan = self.replication_plan()
        v = self.caches.vmis.cache.get((namespace, vmi)) if self.caches.vmis else None
        if plan is None or v is None:
            return None
        for secret_name in v.secret_volumes:
            r = self.caches.replicas.cache.get((namespace, secret_name))
            if r is not None and r.owned:
                # By the revision the replica carries: stable or candidate (docs/design.md#safe-rotation).
                lic = plan.by_revision.get(r.annotations.get(ANN_REVISION, ""))
                if lic is not None:
                    return lic
        return None

    def token_sha(self, namespace: str, vmi: str) -> str | None:
        lic = self.mounted_license(namespace, vmi)
        return None if lic is None else lic.token_sha256

    def feature_type(self, namespace: str, vmi: str) -> int | None:
        lic = self.mounted_license(namespace, vmi)
        return None if lic is None else lic.feature_type

    # -- guests -------------------------------------------------------------------------------------
    def vmi_starts(self) -> Mapping[Key, dt.datetime | None]:
        """When each cached VMI started (running since, else created): a new guest's patience counts from it.
        Derived once per VMI cache generation: a scrape reads it, and most scrapes see no VMI change."""
        vmis = self.caches.vmis
        if vmis is None:
            return {}
        gen = (vmis, vmis.generation)
        if self._starts is None or self._starts[0] != gen:
            # Keyed by the cache's own key tuples ((namespace, name)): held, not copied.
            self._starts = (gen, MappingProxyType(
                {k: v.running_since or v.created for k, v in vmis.cache.items()}))
        return self._starts[1]

    def affected_vmis(self) -> tuple[Key, ...]:
        """VMIs that mount a licensectl replica: the guests we expect reports from. Derived once per
        generation of the VMI and replica caches (a scrape and the guest pruning read it)."""
        vmis = self.caches.vmis
        if vmis is None:
            return ()
        replica_cache = self.caches.replicas
        gen = (vmis, vmis.generation, replica_cache, replica_cache.generation)
        if self._affected is None or self._affected[0] != gen:
            replicas = self.caches.replicas.cache
            self._affected = (gen, tuple(k for k, v in vmis.cache.items()
                                         if any((v.namespace, s) in replicas for s in v.secret_volumes)))
        return self._affected[1]

    def tenant_of(self) -> Callable[[str], str]:
        """Namespace -> its customer tenant, from the namespace cache (entitlement.customer_tenant)."""
        namespaces = {k[1]: v for k, v in self.caches.namespaces.cache.items()}
        settings = tenant_settings(self.settings)
        return lambda ns: customer_tenant(ns, namespaces, settings)
