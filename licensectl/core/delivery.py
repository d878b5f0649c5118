"""License delivery into the VM: which replica volumes a VMI must carry, and the patch that adds them.

A Secret reaches a guest only as a disk fixed at VMI start (docs/design.md#kubevirt-secret-disks),
so the admission webhook adds the license volume when the VMI is created, and the rollout's
backstop restarts a running VMI that lacks one. Both ask the same pure question here: for each
GPUClaim the VMI uses, is its class in vGPU mode, is the namespace entitled to that class, and does
the replica exist? Decisions come from cache snapshots (plain mappings): no API call, no clock.

The patch only ever *adds* (docs/design.md#webhook-adds-only): a volume the user wrote is never
removed or renamed, a VMI already carrying the replica gets no second one (reinvocation-safe), and a
VMI that cannot be licensed is admitted as it is, with the reason named. The only other change is
the delivery stamp (docs/design.md#delivery-stamp): licensectl's own annotations naming the replica
revisions (and signing key) the VMI got, so "is this VMI current" compares revisions, not times.

`refusal` is the one rule for "the webhook will not add this volume": the webhook applies it to the
object it is asked about, `delivery_blocker` to a running VMI's projection, so the backstop never
restarts a VM whose new VMI would be refused again (docs/design.md#backstop).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from licensectl.core.model import (
    ANN_CREDENTIAL_KEY,
    ANN_DELIVERED_KEY,
    ANN_DELIVERED_REVISION,
    ANN_DELIVERY_PROBE,
    ANN_DELIVERY_PROBE_ANSWER,
    ANN_GPU_CLAIMS,
    ANN_REVISION,
    GpuClaim,
    GpuClass,
    GpuMode,
    ReplicaSecret,
    Vmi,
)
from licensectl.core.render import REPLICA_PREFIX, replica_name

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
    # The VMI's first license volume must carry serial LICENSECTL (the guest installs the disk with that
    # serial, then that label); another disk or label already using it would be installed instead.
    SERIAL_TAKEN = "serial_taken"
    MALFORMED = "malformed"


# What a running VMI's spec can block delivery with (never a matter of caches or entitlement).
BLOCKING = frozenset({Skip.VOLUME_NAME_TAKEN, Skip.SERIAL_TAKEN, Skip.MALFORMED})


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
    # For the delivery stamp: (replica name, its licensectl.io/revision), (replica name, its credential key).
    revisions: tuple[tuple[str, str], ...] = ()
    keys: tuple[tuple[str, str], ...] = ()
    # (claim name, the class it names) for every claim naming one: a skip names both.
    classes: tuple[tuple[str, str], ...] = ()

    def claim_of(self, class_name: str) -> str:
        """The first claim naming `class_name` (the class name itself if none does)."""
        return next((claim for claim, cls in self.classes if cls == class_name), class_name)


def wanted_replicas(namespace: str, claims: Sequence[str], view: DeliveryView) -> Wanted:
    """For each claim: claim -> class -> vGPU? -> entitled? -> replica exists? Passthrough claims are
    not a licensing matter and are neither wanted nor skipped."""
    out: list[tuple[str, str]] = []
    skipped: list[tuple[str, Skip]] = []
    revisions: list[tuple[str, str]] = []
    keys: list[tuple[str, str]] = []
    classes: list[tuple[str, str]] = []
    for claim_name in claims:
        claim = view.claims.get((namespace, claim_name))
        if claim is None or not claim.class_name:
            skipped.append((claim_name, Skip.CLAIM_NOT_FOUND))
            continue
        classes.append((claim_name, claim.class_name))
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
            if revision := replica.annotations.get(ANN_REVISION):
                revisions.append((name, revision))
            if key := replica.annotations.get(ANN_CREDENTIAL_KEY):
                keys.append((name, key))
    return Wanted(tuple(out), tuple(skipped), tuple(revisions), tuple(keys), tuple(classes))


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
    skipped: tuple[tuple[str, Skip], ...]  # (claim name, reason)
    stamped: bool = False  # the patch sets the delivery stamp (docs/design.md#delivery-stamp)
    classes: tuple[tuple[str, str], ...] = ()  # (claim name, the class it names), as Wanted.classes
    # (claim name, the volume name refused): a volume or disk of the spec already holds it.
    taken: tuple[tuple[str, str], ...] = ()

    def skip_message(self, claim: str, reason: Skip) -> str:
        """A skipped claim in an Event's words: the claim, its class, and what in the spec blocks it."""
        cls = dict(self.classes).get(claim)
        why = reason.value
        if reason in BLOCKING:
            why += ": " + refusal_text(reason, dict(self.taken).get(claim, ""))
        return (f"GPU claim {claim}{f' of GPUClass {cls}' if cls else ''}: no license volume added ({why}); "
                f"the VMI was admitted unchanged")

    @property
    def mutated(self) -> bool:
        """A license volume was added (a stamp alone is not a delivery)."""
        return bool(self.added)


def _list_of_dicts(v: object) -> list[dict[str, Any]] | None:
    """None when the field is absent; [] when it is malformed (nothing to match against)."""
    if v is None:
        return None
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def refusal(volume: str, names: Collection[object], serials: Collection[object], *, first: bool) -> Skip | None:
    """Why the webhook will not add license volume `volume`; None: it will.

    `names`: the volume (and disk) names in use; `serials`: disk serials and secret volume labels in
    use; `first`: the VMI carries no license volume yet and none was added before this one, so this one
    must get serial LICENSECTL. The webhook never renames what the user wrote, so a taken name or
    serial is a refusal, named, not a workaround the guest would not find.
    """
    if volume in names:
        return Skip.VOLUME_NAME_TAKEN
    if first and SERIAL in serials:
        return Skip.SERIAL_TAKEN
    return None


def refusal_text(reason: Skip, volume: str) -> str:
    """What in the spec blocks license volume `volume`, naming it (a refusal's reason in words)."""
    if reason is Skip.VOLUME_NAME_TAKEN:
        return f"the spec already has a volume or disk named {volume}"
    if reason is Skip.SERIAL_TAKEN:
        return f"a disk serial or volume label {SERIAL} is taken"
    return "the VMI spec is malformed"


def plan_delivery(vmi: Mapping[str, Any], wanted: Wanted) -> Delivery:
    """The patch adding a secret volume and a disk for each wanted replica the VMI lacks, and the stamp.

    `optional: true` so that a VMI whose entitlement is revoked before it starts still boots
    (unlicensed, and reported as such). Further volumes get serials and labels no disk uses yet.
    """
    spec = vmi.get("spec")
    domain = spec.get("domain") if isinstance(spec, dict) else None
    malformed = wanted.skipped + tuple((wanted.claim_of(c), Skip.MALFORMED) for c, _ in wanted.replicas)
    if not isinstance(spec, dict) or not isinstance(domain, dict):
        return Delivery((), (), (), malformed, classes=wanted.classes)
    devices = domain.get("devices")
    volumes = _list_of_dicts(spec.get("volumes"))
    disks = _list_of_dicts(devices.get("disks")) if isinstance(devices, dict) else None
    if (spec.get("volumes") is not None and not isinstance(spec.get("volumes"), list)) or (
            devices is not None and not isinstance(devices, dict)) or (
            isinstance(devices, dict) and devices.get("disks") is not None
            and not isinstance(devices.get("disks"), list)):
        return Delivery((), (), (), malformed, classes=wanted.classes)

    mounted = {_secret_name(v) for v in volumes or []}
    names = {v.get("name") for v in volumes or []} | {d.get("name") for d in disks or []}
    serials = {d.get("serial") for d in disks or []}
    labels = {(v.get("secret") or {}).get("volumeLabel") for v in volumes or [] if isinstance(v.get("secret"), dict)}

    present: list[str] = [r for _, r in wanted.replicas if r in mounted]
    added: list[str] = []
    skipped = list(wanted.skipped)
    taken: list[tuple[str, str]] = []
    new_volumes: list[dict[str, Any]] = []
    new_disks: list[dict[str, Any]] = []
    for class_name, replica in wanted.replicas:
        if replica in mounted:
            continue
        name = volume_name(class_name)
        reason = refusal(name, names, serials | labels, first=not present and not added)
        if reason is not None:
            skipped.append((wanted.claim_of(class_name), reason))
            taken.append((wanted.claim_of(class_name), name))
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
    stamp = _stamp_patch(vmi, wanted, [r for _, r in wanted.replicas if r in mounted or r in added])
    return Delivery(tuple(patch + stamp), tuple(added), tuple(present), tuple(skipped), stamped=bool(stamp),
                    classes=wanted.classes, taken=tuple(taken))


# -- the delivery stamp (docs/design.md#delivery-stamp) --------------------------------------------
def render_stamp(pairs: Iterable[tuple[str, str]]) -> str:
    """`<replica>=<revision>` pairs, comma-separated (replica names are DNS names: no `,` or `=`)."""
    return ",".join(f"{name}={revision}" for name, revision in pairs)


def parse_stamp(value: str | None) -> tuple[tuple[str, str], ...]:
    """The pairs of a stamp; malformed entries are dropped (a tenant may have written anything)."""
    out: list[tuple[str, str]] = []
    for item in (value or "").split(","):
        name, sep, revision = item.strip().partition("=")
        name, revision = name.strip(), revision.strip()
        if sep and name and revision and "=" not in revision:
            out.append((name, revision))
    return tuple(out)


def stamp_annotations(wanted: Wanted, delivered: Sequence[str]) -> dict[str, str | None]:
    """The stamp for a VMI that carries `delivered` replicas: revision pairs, and the signing key of the
    first delivered replica that names one (None: remove a stale key stamp). Empty: nothing to stamp."""
    revisions = dict(wanted.revisions)
    pairs = [(r, revisions[r]) for r in delivered if r in revisions]
    if not pairs:
        return {}
    keys = dict(wanted.keys)
    key = next((keys[r] for r in delivered if r in keys), None)
    return {ANN_DELIVERED_REVISION: render_stamp(pairs), ANN_DELIVERED_KEY: key}


def _pointer(key: str) -> str:
    """RFC 6901: `~` and `/` escaped in a JSON pointer segment."""
    return key.replace("~", "~0").replace("/", "~1")


def _stamp_patch(vmi: Mapping[str, Any], wanted: Wanted, delivered: Sequence[str]) -> list[dict[str, Any]]:
    want = stamp_annotations(wanted, delivered)
    if not want:
        return []
    meta = vmi.get("metadata")
    current = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(meta, dict) or (current is not None and not isinstance(current, dict)):
        return []  # nowhere to put it; the rollout falls back to the time rule for this VMI
    if current is None:
        return [{"op": "add", "path": "/metadata/annotations", "value": {k: v for k, v in want.items() if v}}]
    ops: list[dict[str, Any]] = []
    for k, v in want.items():
        if v is None and k in current:
            ops.append({"op": "remove", "path": f"/metadata/annotations/{_pointer(k)}"})
        elif v is not None and current.get(k) != v:
            ops.append({"op": "add", "path": f"/metadata/annotations/{_pointer(k)}", "value": v})
    return ops


# -- what the backstop may restart -----------------------------------------------------------------
def replica_volume_name(replica: str) -> str:
    """The volume name the webhook gives `replica` (`volume_name` of its class).

    The class is the name without REPLICA_PREFIX. A replica name cut to MAX_NAME_LENGTH (a class name
    over 233 characters) does not hold its class: its volume name is then a guess, and a wrong guess
    only means a restart that comes back without the volume, which the rollout retries."""
    cls = replica[len(REPLICA_PREFIX):] if replica.startswith(REPLICA_PREFIX) else replica
    return volume_name(cls)


def delivery_blocker(vmi: Vmi, wanted_replicas: tuple[str, ...]) -> Skip | None:
    """Why a new VMI built from this VMI's spec would not get every wanted replica; None: it would."""
    refused = delivery_refusal(vmi, wanted_replicas)
    return None if refused is None else refused[0]


def delivery_refusal(vmi: Vmi, wanted_replicas: tuple[str, ...]) -> tuple[Skip, str] | None:
    """`delivery_blocker` with the license volume name it refuses (what a message names).

    The same `refusal` as the webhook, over the projection (`volume_names`, `disk_serials`,
    `secret_volumes`), in the webhook's order: the first replica it would refuse names the reason.
    A VMI blocked here is reported, never restarted by the backstop, and never counted as failed."""
    present = set(vmi.secret_volumes)
    names = set(vmi.volume_names)
    first = not any(r in present for r in wanted_replicas)
    for replica in wanted_replicas:
        if replica in present:
            continue
        name = replica_volume_name(replica)
        reason = refusal(name, names, vmi.disk_serials, first=first)
        if reason is not None:
            return reason, name
        names.add(name)
        first = False
    return None


# -- the delivery readiness probe (docs/design.md#delivery-readiness) ------------------------------
PROBE_PREFIX = "licensectl-delivery-probe-"


def probe_vmi(nonce: str) -> dict[str, Any]:
    """The VMI the leader dry-run creates in licensectl's own namespace: valid for KubeVirt (memory
    set), through the webhook configuration's matchConditions (the gpu-claims annotation, empty: no
    claim), and marked as a probe. Nothing is stored (dryRun=All)."""
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"generateName": PROBE_PREFIX,
                         "annotations": {ANN_GPU_CLAIMS: "", ANN_DELIVERY_PROBE: nonce}},
            "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}}


def is_probe(vmi: Mapping[str, Any], *, namespace: str, own_namespace: str, dry_run: bool) -> bool:
    """A probe only as a dry run in licensectl's own namespace: anywhere else the annotation is inert."""
    if not dry_run or not own_namespace or namespace != own_namespace:
        return False
    meta = vmi.get("metadata")
    ann = meta.get("annotations") if isinstance(meta, dict) else None
    return isinstance(ann, dict) and isinstance(ann.get(ANN_DELIVERY_PROBE), str)


def probe_patch(answer: str) -> tuple[dict[str, Any], ...]:
    """The probe's answer: one annotation added (the annotations map exists: it holds the probe mark)."""
    return ({"op": "add", "path": f"/metadata/annotations/{_pointer(ANN_DELIVERY_PROBE_ANSWER)}",
             "value": answer},)


def probe_answered(obj: Mapping[str, Any] | None, nonce: str) -> bool:
    """The dry-run result came back mutated by licensectl's webhook, for this probe."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    return (isinstance(ann, Mapping) and ann.get(ANN_DELIVERY_PROBE) == nonce
            and bool(ann.get(ANN_DELIVERY_PROBE_ANSWER)))


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



# -- the webhook configuration (docs/operations.md#webhook-configuration) --------------------------
CONFIGURATION_MISSING = "missing"
CONFIGURATION_NO_CA_BUNDLE = "no_ca_bundle"
# licensectl may not read or patch it (HTTP 403): its RBAC names another configuration, most often because
# --webhook-configuration names one the installation did not create.
CONFIGURATION_FORBIDDEN = "forbidden"
CONFIGURATION_PROBLEMS = (CONFIGURATION_MISSING, CONFIGURATION_NO_CA_BUNDLE, CONFIGURATION_FORBIDDEN)


def configuration_problem(obj: Mapping[str, Any] | None) -> str | None:
    """What keeps the apiserver from calling licensectl through this webhook configuration: absent, or a
    webhook without a caBundle (the apiserver cannot verify licensectl's certificate; with
    `failurePolicy: Ignore` every VMI is then admitted unchanged). None: nothing visible is wrong."""
    if obj is None:
        return CONFIGURATION_MISSING
    hooks = obj.get("webhooks")
    for hook in hooks if isinstance(hooks, list) else []:
        cc = hook.get("clientConfig") if isinstance(hook, Mapping) else None
        if not isinstance(cc, Mapping) or not cc.get("caBundle"):
            return CONFIGURATION_NO_CA_BUNDLE
    return None
