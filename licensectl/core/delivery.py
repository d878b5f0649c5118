"""License delivery into the VM: which replica volumes a VMI must carry, and the patch that adds them.

A Secret reaches a guest only as a disk fixed at VMI start (docs/design.md#kubevirt-secret-disks),
so the admission webhook adds the license volume when the VMI is created, and the rollout's
backstop restarts a running VMI that lacks one. Both ask the same pure question here: for each
GPUClaim the VMI uses, is its class in vGPU mode, is the namespace entitled to that class, and does
the replica exist? Decisions come from cache snapshots (plain mappings): no API call, no clock.

The patch only ever *adds* (docs/design.md#webhook-adds-only): a volume the user wrote is never
removed or renamed, a VMI already carrying the replica is returned unchanged (reinvocation-safe),
and a VMI that cannot be licensed is admitted as it is, with the reason named.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from licensectl.core.model import GpuClaim, GpuClass, GpuMode, ReplicaSecret, Vmi
from licensectl.core.render import replica_name

# docs/guest.md: the scripts look for this serial, then this label. Further volumes (a VMI with
# claims of several classes) get LICENSECTL-2, LICENSECTL-3, ...
SERIAL = "LICENSECTL"
VOLUME_PREFIX = "licensectl-"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MAX_LABEL = 63


class Skip(StrEnum):
    """Why a GPU claim of a VMI gets no license volume (a bounded metric label set)."""

    CLAIM_NOT_FOUND = "claim_not_found"
    CLASS_NOT_FOUND = "class_not_found"
    NOT_ENTITLED = "not_entitled"
    REPLICA_MISSING = "replica_missing"
    VOLUME_NAME_TAKEN = "volume_name_taken"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class DeliveryView:
    """Read-only views of the controller's caches, keyed as the informers key them."""

    claims: Mapping[tuple[str, str], GpuClaim]  # (namespace, name)
    classes: Mapping[tuple[str, str], GpuClass]  # ("", name)
    entitled: Mapping[tuple[str, str], object]  # (namespace, class) -> source, from the replication plan
    replicas: Mapping[tuple[str, str], ReplicaSecret]  # (namespace, replica name)


@dataclass(frozen=True, slots=True)
class Wanted:
    """The license volumes a VMI must carry, and why any of its vGPU claims gets none."""

    replicas: tuple[tuple[str, str], ...]  # (class name, replica Secret name), in claim order
    skipped: tuple[tuple[str, Skip], ...]  # (claim name, reason)


def wanted_replicas(namespace: str, claims: Sequence[str], view: DeliveryView) -> Wanted:
    """For each claim: claim -> class -> vGPU? -> entitled? -> replica exists? Passthrough claims are
    not a licensing matter and are neither wanted nor skipped."""
    out: list[tuple[str, str]] = []
    skipped: list[tuple[str, Skip]] = []
    for claim_name in claims:
        claim = view.claims.get((namespace, claim_name))
        if claim is None or not claim.class_name:
            skipped.append((claim_name, Skip.CLAIM_NOT_FOUND))
            continue
        gpu_class = view.classes.get(("", claim.class_name))
        if gpu_class is None:
            skipped.append((claim_name, Skip.CLASS_NOT_FOUND))
            continue
        if gpu_class.mode != GpuMode.VGPU.value:
            continue
        if (namespace, gpu_class.name) not in view.entitled:
            skipped.append((claim_name, Skip.NOT_ENTITLED))
            continue
        name = replica_name(gpu_class.name)
        replica = view.replicas.get((namespace, name))
        if replica is None or not replica.owned:
            skipped.append((claim_name, Skip.REPLICA_MISSING))
            continue
        if (gpu_class.name, name) not in out:
            out.append((gpu_class.name, name))
    return Wanted(tuple(out), tuple(skipped))


def wanted_volumes(vmis: Iterable[Vmi], view: DeliveryView) -> dict[tuple[str, str], tuple[str, ...]]:
    """Running VMIs with GPU claims -> the replica volumes they must carry: the backstop's input.

    Only Running VMIs: one still starting may yet be admitted with its volume; one shutting down
    is going anyway."""
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for v in vmis:
        if v.gpu_claims and v.phase == "Running" and not v.deleting:
            wanted = wanted_replicas(v.namespace, v.gpu_claims, view)
            if wanted.replicas:
                out[(v.namespace, v.name)] = tuple(r for _, r in wanted.replicas)
    return out


def volume_name(class_name: str) -> str:
    """`licensectl-<class>` when that is a DNS label (volume and disk names must be), else a hash."""
    name = VOLUME_PREFIX + class_name
    if len(name) <= _MAX_LABEL and _DNS_LABEL.match(name):
        return name
    return VOLUME_PREFIX + hashlib.sha256(class_name.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Delivery:
    """What the webhook answers: JSONPatch operations (empty: admit unchanged) and the reasons."""

    patch: tuple[dict[str, Any], ...]
    added: tuple[str, ...]  # replica names whose volume the patch adds
    present: tuple[str, ...]  # replica names the VMI already carries
    skipped: tuple[tuple[str, Skip], ...]

    @property
    def mutated(self) -> bool:
        return bool(self.patch)


def _list_of_dicts(v: object) -> list[dict[str, Any]] | None:
    """None when the field is absent; [] when it is malformed (nothing to match against)."""
    if v is None:
        return None
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def plan_delivery(vmi: Mapping[str, Any], wanted: Wanted) -> Delivery:
    """The patch adding a secret volume and a disk for each wanted replica the VMI lacks.

    `optional: true` so that a VMI whose entitlement is revoked before it starts still boots
    (unlicensed, and reported as such). Serials and labels skip values the user already uses.
    """
    spec = vmi.get("spec")
    domain = spec.get("domain") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(domain, dict):
        return Delivery((), (), (), wanted.skipped + tuple((c, Skip.MALFORMED) for c, _ in wanted.replicas))
    devices = domain.get("devices")
    volumes = _list_of_dicts(spec.get("volumes"))
    disks = _list_of_dicts(devices.get("disks")) if isinstance(devices, dict) else None
    if (spec.get("volumes") is not None and not isinstance(spec.get("volumes"), list)) or (
            devices is not None and not isinstance(devices, dict)) or (
            isinstance(devices, dict) and devices.get("disks") is not None
            and not isinstance(devices.get("disks"), list)):
        return Delivery((), (), (), wanted.skipped + tuple((c, Skip.MALFORMED) for c, _ in wanted.replicas))

    mounted = {_secret_name(v) for v in volumes or []}
    names = {v.get("name") for v in volumes or []} | {d.get("name") for d in disks or []}
    serials = {d.get("serial") for d in disks or []}
    labels = {(v.get("secret") or {}).get("volumeLabel") for v in volumes or [] if isinstance(v.get("secret"), dict)}

    present: list[str] = []
    added: list[str] = []
    skipped = list(wanted.skipped)
    new_volumes: list[dict[str, Any]] = []
    new_disks: list[dict[str, Any]] = []
    for class_name, replica in wanted.replicas:
        if replica in mounted:
            present.append(replica)
            continue
        name = volume_name(class_name)
        if name in names:
            skipped.append((class_name, Skip.VOLUME_NAME_TAKEN))
            continue
        serial = _free_serial(serials | labels)
        serials.add(serial)
        names.add(name)
        new_volumes.append({"name": name, "secret": {"secretName": replica, "volumeLabel": serial,
                                                     "optional": True}})
        new_disks.append({"name": name, "serial": serial, "disk": {"bus": "virtio"}})
        added.append(replica)

    patch: list[dict[str, Any]] = []
    if new_volumes:
        patch += _append("/spec/volumes", volumes, new_volumes)
        if devices is None:
            patch.append({"op": "add", "path": "/spec/domain/devices", "value": {"disks": new_disks}})
        else:
            patch += _append("/spec/domain/devices/disks", disks, new_disks)
    return Delivery(tuple(patch), tuple(added), tuple(present), tuple(skipped))


def _secret_name(volume: Mapping[str, Any]) -> str | None:
    secret = volume.get("secret")
    name = secret.get("secretName") if isinstance(secret, dict) else None
    return name if isinstance(name, str) else None


def _free_serial(used: set[Any]) -> str:
    if SERIAL not in used:
        return SERIAL
    n = 2
    while f"{SERIAL}-{n}" in used:
        n += 1
    return f"{SERIAL}-{n}"


def _append(path: str, existing: list[dict[str, Any]] | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """RFC 6902: create the array when absent, else append to its end ("-")."""
    if existing is None:
        return [{"op": "add", "path": path, "value": items}]
    return [{"op": "add", "path": f"{path}/-", "value": item} for item in items]
