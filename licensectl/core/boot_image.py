"""Which volume a VMI boots from, and whether the hoster marked that image as carrying the vGPU guest driver.

Whether an image carries the NVIDIA vGPU guest driver is a property of the image, so one rule marks it for
plain VMs and tenant-cluster workers alike (docs/design.md#boot-image-mark): the label
`licensectl.io/vgpu-guest-driver: "true"` on the PersistentVolumeClaim, the CDI DataVolume or the CDI
DataSource a VM boots from, or, for a containerDisk (an image reference, which has no labels), a match
in the hoster's allowlist `--vgpu-driver-images`. A vGPU VMI booted from an image without the driver gets
a GPU that does not work; the guest probe can only report that after boot (`driver_missing`), admission
can say it before.

Pure: `boot_volume` reads a VMI spec, `judge` decides from `Marks`, plain data the shell observed.
`judge` only makes keyed lookups (`get`, `in`) in those mappings: the webhook thread hands it live
cache views, which it may read that way and no other (licensectl/kube/watch/__init__.py).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from licensectl.core.delivery import DeliveryView
from licensectl.core.model import DOMAIN, GpuMode

MARK_LABEL = f"{DOMAIN}/vgpu-guest-driver"
MARK_VALUE = "true"
MARK_SELECTOR = f"{MARK_LABEL}={MARK_VALUE}"
IMAGES_FLAG = "--vgpu-driver-images"
# AdmissionResponse.warnings: "Limit warnings to 120 characters if possible"; longer ones may be cut.
WARNING_LIMIT = 120
DATA_SOURCE_KIND = "DataSource"  # the only kind CDI accepts in a DataVolume's spec.sourceRef
_GLOB = frozenset("*?[")
_NO_PVCS = "PersistentVolumeClaims are not observed yet"
_NO_CDI = "are not observed (CDI is absent, or not synced yet)"
# Volume sources that are never an operating-system image: config drives and scratch disks.
_NOT_IMAGES = ("secret", "configMap", "serviceAccount", "downwardAPI", "downwardMetrics", "cloudInitNoCloud",
               "cloudInitConfigDrive", "sysprep", "emptyDisk", "hostDisk", "memoryDump")

Key = tuple[str, str]  # (namespace, name), as the informers key objects


class Source(StrEnum):
    """Where a boot volume's content comes from (the KubeVirt volume source field)."""

    CONTAINER_DISK = "containerDisk"
    PVC = "persistentVolumeClaim"
    EPHEMERAL = "ephemeral"  # ephemeral.persistentVolumeClaim: the PVC is read, writes go to a scratch overlay
    DATA_VOLUME = "dataVolume"


class Verdict(StrEnum):
    """What the check found (a bounded metric label set)."""

    MARKED = "marked"
    UNMARKED = "unmarked"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class BootVolume:
    """The volume behind the boot disk. `source` None: a volume of another kind (`other`), not an image."""

    namespace: str
    disk: str
    source: Source | None
    ref: str  # the containerDisk image, or the PVC / DataVolume name
    other: str = ""


@dataclass(frozen=True, slots=True)
class NoBootVolume:
    """No boot volume could be named; `why` says what was found instead."""

    why: str


@dataclass(frozen=True, slots=True)
class Marked:
    """A PVC or DataSource carrying the mark: the shell caches only those (label-selected)."""

    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class DataVolumeRef:
    """What a DataVolume tells about its golden image: its own mark and where its content is cloned from."""

    namespace: str
    name: str
    marked: bool
    data_source: Key | None = None  # spec.sourceRef of kind DataSource
    source_pvc: Key | None = None  # spec.source.pvc


@dataclass(frozen=True, slots=True)
class Marks:
    """What the shell observed. A mapping is None when it cannot be trusted (its cache has not synced,
    or the resource does not exist in the cluster, as CDI's may not): its marks are then unknown."""

    images: tuple[str, ...] = ()  # --vgpu-driver-images patterns
    pvcs: Mapping[Key, object] | None = None  # marked PVCs
    datavolumes: Mapping[Key, DataVolumeRef] | None = None  # every DataVolume, slim
    datasources: Mapping[Key, object] | None = None  # marked DataSources


@dataclass(frozen=True, slots=True)
class Judgement:
    """The verdict on one VMI's boot image. `subject` names the boot volume (short, for the client's
    warning); `detail` says what was looked at and why it decided (for the Event and the denial)."""

    verdict: Verdict
    subject: str
    detail: str
    by_allowlist: bool = False  # a containerDisk: decided by --vgpu-driver-images, not by a label


# -- reading the VMI ------------------------------------------------------------------------------
def _dict(v: object) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _named(items: object) -> list[Mapping[str, Any]]:
    return [x for x in items if isinstance(x, Mapping) and isinstance(x.get("name"), str)] \
        if isinstance(items, list) else []


def _order(device: Mapping[str, Any]) -> int | None:
    order = device.get("bootOrder")
    return order if isinstance(order, int) and not isinstance(order, bool) and order > 0 else None


def boot_volume(namespace: str, vmi: Mapping[str, Any]) -> BootVolume | NoBootVolume:
    """The boot disk and its volume, as KubeVirt orders boot devices (kubevirt.io/api core/v1 `Disk.BootOrder`):
    the lowest `bootOrder` among disks and interfaces wins, and a disk without one is not tried when any
    device has one; without any, the first disk of `spec.domain.devices.disks`."""
    spec = _dict(vmi.get("spec"))
    devices = _dict(_dict(spec.get("domain")).get("devices"))
    disks = _named(devices.get("disks"))
    ordered_disks = sorted((o, i) for i, d in enumerate(disks) if (o := _order(d)) is not None)
    nics = _named(devices.get("interfaces"))
    ordered_nics = sorted((o, str(n["name"])) for n in nics if (o := _order(n)) is not None)
    if ordered_nics and (not ordered_disks or ordered_nics[0][0] < ordered_disks[0][0]):
        return NoBootVolume(f"it boots from the network (interface {ordered_nics[0][1]})")
    if ordered_disks:
        disk = disks[ordered_disks[0][1]]
    elif disks:
        disk = disks[0]
    else:
        return NoBootVolume("it has no disk")
    name = str(disk["name"])
    volume = next((v for v in _named(spec.get("volumes")) if v["name"] == name), None)
    if volume is None:
        return NoBootVolume(f"its boot disk {name} has no volume")
    image = _dict(volume.get("containerDisk")).get("image")
    if isinstance(image, str) and image:
        return BootVolume(namespace, name, Source.CONTAINER_DISK, image)
    for source, claim in ((Source.PVC, _dict(volume.get("persistentVolumeClaim")).get("claimName")),
                          (Source.EPHEMERAL, _dict(_dict(volume.get("ephemeral")).get("persistentVolumeClaim"))
                           .get("claimName")),
                          (Source.DATA_VOLUME, _dict(volume.get("dataVolume")).get("name"))):
        if isinstance(claim, str) and claim:
            return BootVolume(namespace, name, source, claim)
    other = next((k for k in volume if k != "name"), "")
    if other in _NOT_IMAGES:
        return BootVolume(namespace, name, None, "", other=other)
    return NoBootVolume(f"its boot volume {name} names no image ({other or 'no source'})")


# -- the allowlist --------------------------------------------------------------------------------
def parse_image_patterns(text: str) -> tuple[str, ...]:
    """`--vgpu-driver-images`: comma-separated image references, prefixes or globs."""
    out: list[str] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if any(c.isspace() for c in entry):
            raise ValueError(f"an image pattern has no spaces: {entry!r}")
        if entry not in out:
            out.append(entry)
    return tuple(out)


def image_allowed(image: str, patterns: Sequence[str]) -> bool:
    """A glob (with *, ? or [) matches the whole reference (`*` crosses `/`, as in fnmatch). Any other
    entry is a prefix that ends at a boundary: `registry.example.com/vgpu/` and
    `registry.example.com/vgpu/ubuntu` (then `:tag` or `@digest` may follow) match
    `registry.example.com/vgpu/ubuntu:24.04`; `registry.example.com/vgpu/ubuntu` does not match
    `registry.example.com/vgpu/ubuntu-nodriver`. References are compared as written, not normalized."""
    for p in patterns:
        if _GLOB.intersection(p):
            if fnmatch.fnmatchcase(image, p):
                return True
        elif image == p or (image.startswith(p) and (p[-1] in "/:@" or image[len(p)] in "/:@")):
            return True
    return False


# -- which VMIs are checked -----------------------------------------------------------------------
def uses_vgpu(namespace: str, claims: Sequence[str], view: DeliveryView) -> bool:
    """Whether any claim resolves to a class in vGPU mode. The guest driver matters for every vGPU,
    licensed or not; a passthrough GPU needs the regular driver, which this mark does not speak of."""
    for claim_name in claims:
        claim = view.claims.get((namespace, claim_name))
        gpu_class = view.classes.get(("", claim.class_name)) if claim is not None and claim.class_name else None
        if gpu_class is not None and gpu_class.mode == GpuMode.VGPU.value:
            return True
    return False


# -- the verdict ----------------------------------------------------------------------------------
def _q(kind: str, name: str) -> str:
    return f'{kind} "{name}"'


def _looked_up(marks: Mapping[Key, object] | None, key: Key) -> Verdict:
    if marks is None:
        return Verdict.UNKNOWN
    return Verdict.MARKED if key in marks else Verdict.UNMARKED


def judge(boot: BootVolume | NoBootVolume, marks: Marks) -> Judgement:
    """marked: the boot image carries the mark (on any object of its chain); unmarked: every object of the
    chain was seen without it; unknown: a link could not be seen (a cache not synced, CDI absent, a
    DataVolume not created yet) or there is no image to judge."""
    if isinstance(boot, NoBootVolume):
        return Judgement(Verdict.UNKNOWN, "", f"no boot image to check: {boot.why}")
    if boot.source is None:
        return Judgement(Verdict.UNKNOWN, _q("disk", boot.disk),
                         f"the boot disk {boot.disk} is a {boot.other} volume, not an operating-system image")
    ns = boot.namespace
    if boot.source is Source.CONTAINER_DISK:
        subject = _q("image", boot.ref)
        if image_allowed(boot.ref, marks.images):
            return Judgement(Verdict.MARKED, subject, f"containerDisk {subject} matches {IMAGES_FLAG}", True)
        return Judgement(Verdict.UNMARKED, subject, f"containerDisk {subject} is not in {IMAGES_FLAG}", True)
    if boot.source in (Source.PVC, Source.EPHEMERAL):
        subject = _q("PVC", boot.ref)
        verdict = _looked_up(marks.pvcs, (ns, boot.ref))
        why = {Verdict.MARKED: f"{subject} is marked", Verdict.UNMARKED: f"no mark on {subject}",
               Verdict.UNKNOWN: f"{subject}: {_NO_PVCS}"}[verdict]
        return Judgement(verdict, subject, why)
    return _judge_data_volume(ns, boot.ref, marks)


def _judge_data_volume(ns: str, name: str, marks: Marks) -> Judgement:
    """A DataVolume is marked itself, or its PVC (same name) is, or the golden image it was cloned from:
    the DataSource of `spec.sourceRef`, or the PVC of `spec.source.pvc`."""
    subject = _q("DataVolume", name)
    links: list[tuple[Verdict, str, str]] = []  # (verdict, what was looked at, why it is unknown)
    dvs = marks.datavolumes
    dv = dvs.get((ns, name)) if dvs is not None else None
    if dvs is None:
        links.append((Verdict.UNKNOWN, subject, f"CDI DataVolumes {_NO_CDI}"))
    elif dv is None:
        links.append((Verdict.UNKNOWN, subject, "no such DataVolume (not created yet, or deleted)"))
    else:
        links.append((Verdict.MARKED if dv.marked else Verdict.UNMARKED, subject, ""))
    links.append((_looked_up(marks.pvcs, (ns, name)), _q("PVC", name), _NO_PVCS))
    if dv is not None and dv.data_source is not None:
        links.append((_looked_up(marks.datasources, dv.data_source), _q("DataSource", "/".join(dv.data_source)),
                      f"CDI DataSources {_NO_CDI}"))
    if dv is not None and dv.source_pvc is not None:
        links.append((_looked_up(marks.pvcs, dv.source_pvc), "source " + _q("PVC", "/".join(dv.source_pvc)),
                      _NO_PVCS))
    for verdict, what, _ in links:
        if verdict is Verdict.MARKED:
            where = what if what == subject else f"{subject}: {what}"
            return Judgement(verdict, subject, f"{where} is marked")
    for verdict, _, why in links:
        if verdict is Verdict.UNKNOWN:
            return Judgement(verdict, subject, f"{subject}: {why}")
    return Judgement(Verdict.UNMARKED, subject, "no mark on " + ", ".join(what for _, what, _ in links))


# -- what the client, the Event and a denial say --------------------------------------------------
def _fit(template: str, name: str, limit: int = WARNING_LIMIT) -> str:
    """`template` with `{}` replaced by `name`, shortened in the middle so the whole fits `limit`."""
    room = limit - (len(template) - 2)
    if len(name) > room:
        keep = max(room - 3, 2)
        name = name[: (keep + 1) // 2] + "..." + name[len(name) - keep // 2:]
    return template.format(name)[:limit]


def warning(j: Judgement) -> str | None:
    """The AdmissionResponse warning (kubectl prints it as `Warning: ...`), at most 120 characters."""
    if j.verdict is Verdict.MARKED:
        return None
    if j.verdict is Verdict.UNKNOWN:
        if not j.subject:
            return "licensectl found no boot image to check for the vGPU guest driver mark"
        return _fit("licensectl could not check boot {} for the vGPU guest driver mark", j.subject)
    if j.by_allowlist:
        return _fit("boot {} is not in " + IMAGES_FLAG + ": a vGPU needs its guest driver", j.subject)
    return _fit("boot {} lacks label " + MARK_SELECTOR + ": a vGPU needs its guest driver", j.subject)


def _how_to_mark(j: Judgement) -> str:
    if j.by_allowlist:
        return f"add the image to {IMAGES_FLAG} once it carries the driver"
    return (f'label the PVC, DataVolume or DataSource of the image {MARK_LABEL}: "{MARK_VALUE}" once it '
            "carries the driver")


def event_message(j: Judgement, *, enforced: bool = False) -> str:
    """The Warning Event on the VMI: what was found, the consequence, what to do."""
    if j.verdict is Verdict.UNKNOWN:
        return (f"licensectl could not check whether the boot image carries the NVIDIA vGPU guest driver "
                f"({j.detail}); the VMI was admitted")
    outcome = "creation denied (--vgpu-driver-check=enforce)" if enforced else "the VMI was admitted"
    return (f"The boot image is not marked as carrying the NVIDIA vGPU guest driver ({j.detail}): without the "
            f"driver the vGPU does not work; {_how_to_mark(j)}. {outcome}")


def denial(j: Judgement) -> str:
    """The enforce webhook's refusal, as the client reads it after `admission webhook ... denied the request:`."""
    return (f"licensectl: the boot image is not marked as carrying the NVIDIA vGPU guest driver ({j.detail}); "
            f"{_how_to_mark(j)}")
