"""core/boot_image.py: which volume a VMI boots from, and the vGPU guest driver mark on its image.

Every rule with plain values: the boot order (disks and interfaces), each volume source, the allowlist,
the DataVolume -> DataSource / PVC chain, and what "unknown" means (a cache not trusted, CDI absent);
then the texts, above all the 120-character warning limit, and the keyed-lookups-only promise the
webhook thread depends on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from licensectl.core import boot_image as bi
from licensectl.core.boot_image import BootVolume, DataVolumeRef, Judgement, Marks, NoBootVolume, Source, Verdict
from licensectl.core.delivery import DeliveryView
from licensectl.core.model import GpuClaim, GpuClass

NS = "tenant-a"


def vmi(*disks: dict[str, Any], volumes: list[dict[str, Any]] | None = None,
        interfaces: list[dict[str, Any]] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"disks": list(disks)}
    if interfaces is not None:
        devices["interfaces"] = interfaces
    meta: dict[str, Any] = {"name": "v"}
    if labels:
        meta["labels"] = labels
    return {"metadata": meta, "spec": {"domain": {"devices": devices}, "volumes": volumes or []}}


def disk(name: str, order: object = None, **kw: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "disk": {"bus": "virtio"}, **kw}
    if order is not None:
        d["bootOrder"] = order
    return d


def pvc(name: str, claim: str) -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}


def dv(name: str, target: str) -> dict[str, Any]:
    return {"name": name, "dataVolume": {"name": target}}


def cd(name: str, image: str) -> dict[str, Any]:
    return {"name": name, "containerDisk": {"image": image}}


CLOUD_INIT = {"name": "cloudinit", "cloudInitNoCloud": {"userData": "#cloud-config"}}


# -- which volume boots ---------------------------------------------------------------------------
def test_without_boot_order_the_first_disk_boots() -> None:
    spec = vmi(disk("root"), disk("data"), disk("cloudinit"),
               volumes=[CLOUD_INIT, pvc("data", "data-pvc"), pvc("root", "golden")])
    assert bi.boot_volume(NS, spec) == BootVolume(NS, "root", Source.PVC, "golden")


def test_the_lowest_boot_order_wins_and_disks_without_one_are_not_tried() -> None:
    spec = vmi(disk("cloudinit"), disk("data", order=2), disk("root", order=1),
               volumes=[CLOUD_INIT, pvc("data", "data-pvc"), pvc("root", "golden")])
    assert bi.boot_volume(NS, spec) == BootVolume(NS, "root", Source.PVC, "golden")
    # The first disk has no boot order while another has one: it is not tried.
    spec = vmi(disk("first"), disk("second", order=5), volumes=[pvc("first", "a"), pvc("second", "b")])
    assert bi.boot_volume(NS, spec) == BootVolume(NS, "second", Source.PVC, "b")


@pytest.mark.parametrize("bad", [0, -1, True, "1", 1.5, None])
def test_a_boot_order_that_is_no_positive_integer_is_ignored(bad: object) -> None:
    spec = vmi(disk("first", order=bad), disk("second"), volumes=[pvc("first", "a"), pvc("second", "b")])
    assert bi.boot_volume(NS, spec) == BootVolume(NS, "first", Source.PVC, "a")


def test_an_interface_with_the_lowest_boot_order_boots_from_the_network() -> None:
    spec = vmi(disk("root", order=2), volumes=[pvc("root", "golden")],
               interfaces=[{"name": "default", "masquerade": {}, "bootOrder": 1}])
    assert bi.boot_volume(NS, spec) == NoBootVolume("it boots from the network (interface default)")
    # Only an interface has a boot order: disks without one are not tried.
    spec = vmi(disk("root"), volumes=[pvc("root", "golden")], interfaces=[{"name": "pxe", "bootOrder": 3}])
    assert isinstance(bi.boot_volume(NS, spec), NoBootVolume)
    # A disk before the interface boots.
    spec = vmi(disk("root", order=1), volumes=[pvc("root", "golden")], interfaces=[{"name": "pxe", "bootOrder": 2}])
    assert bi.boot_volume(NS, spec) == BootVolume(NS, "root", Source.PVC, "golden")


@pytest.mark.parametrize(("volume", "expected"), [
    (cd("root", "registry.example.com/vgpu/ubuntu:24.04"),
     BootVolume(NS, "root", Source.CONTAINER_DISK, "registry.example.com/vgpu/ubuntu:24.04")),
    (pvc("root", "golden"), BootVolume(NS, "root", Source.PVC, "golden")),
    ({"name": "root", "ephemeral": {"persistentVolumeClaim": {"claimName": "golden", "readOnly": True}}},
     BootVolume(NS, "root", Source.EPHEMERAL, "golden")),
    (dv("root", "vm-root"), BootVolume(NS, "root", Source.DATA_VOLUME, "vm-root")),
    ({"name": "root", "secret": {"secretName": "x"}}, BootVolume(NS, "root", None, "", other="secret")),
    ({"name": "root", "emptyDisk": {"capacity": "1Gi"}}, BootVolume(NS, "root", None, "", other="emptyDisk")),
    ({"name": "root", "cloudInitNoCloud": {}}, BootVolume(NS, "root", None, "", other="cloudInitNoCloud")),
    ({"name": "root", "somethingNew": {}}, NoBootVolume("its boot volume root names no image (somethingNew)")),
    ({"name": "root"}, NoBootVolume("its boot volume root names no image (no source)")),
    ({"name": "root", "containerDisk": {}}, NoBootVolume("its boot volume root names no image (containerDisk)")),
    ({"name": "root", "persistentVolumeClaim": {"claimName": ""}},
     NoBootVolume("its boot volume root names no image (persistentVolumeClaim)")),
], ids=lambda v: str(v)[:60])
def test_each_volume_source(volume: dict[str, Any], expected: BootVolume | NoBootVolume) -> None:
    assert bi.boot_volume(NS, vmi(disk("root"), volumes=[volume])) == expected


def test_a_cdrom_boots_like_a_disk() -> None:
    spec = vmi({"name": "iso", "cdrom": {"bus": "sata"}, "bootOrder": 1}, disk("root", order=2),
               volumes=[pvc("iso", "installer"), pvc("root", "blank")])
    assert bi.boot_volume(NS, spec) == BootVolume(NS, "iso", Source.PVC, "installer")


@pytest.mark.parametrize("spec", [
    {}, {"spec": None}, {"spec": {"domain": "x"}}, {"spec": {"domain": {"devices": {"disks": "x"}}}},
    {"spec": {"domain": {"devices": {"disks": [{"bootOrder": 1}, 7]}}}},
    vmi(),
], ids=str)
def test_no_disk(spec: dict[str, Any]) -> None:
    assert bi.boot_volume(NS, spec) == NoBootVolume("it has no disk")


def test_a_boot_disk_without_its_volume() -> None:
    spec = vmi(disk("root"), volumes=[pvc("other", "x"), "junk"])  # type: ignore[list-item]
    assert bi.boot_volume(NS, spec) == NoBootVolume("its boot disk root has no volume")
    spec["spec"]["volumes"] = "junk"
    assert bi.boot_volume(NS, spec) == NoBootVolume("its boot disk root has no volume")


def test_licensectls_own_license_disk_never_becomes_the_boot_disk() -> None:
    """The webhook appends its license disk last, without a boot order: judged before or after the
    patch, a VMI boots from the same volume."""
    from licensectl.core.delivery import Wanted, plan_delivery

    spec = vmi(disk("root"), volumes=[pvc("root", "golden")])
    before = bi.boot_volume(NS, spec)
    delivery = plan_delivery(spec, Wanted(replicas=(("a100", "nvidia-vgpu-license-a100"),), skipped=()))
    patched = {**spec, "spec": {**spec["spec"], "volumes": [*spec["spec"]["volumes"], delivery.patch[0]["value"]],
                                "domain": {"devices": {"disks": [*spec["spec"]["domain"]["devices"]["disks"],
                                                                 delivery.patch[1]["value"]]}}}}
    assert bi.boot_volume(NS, patched) == before


# -- the allowlist --------------------------------------------------------------------------------
@pytest.mark.parametrize(("image", "patterns", "allowed"), [
    ("registry.example.com/vgpu/ubuntu:24.04", ["registry.example.com/vgpu/"], True),
    ("registry.example.com/vgpu/ubuntu:24.04", ["registry.example.com/vgpu"], True),
    ("registry.example.com/vgpu/ubuntu:24.04", ["registry.example.com/vgpu/ubuntu"], True),
    ("registry.example.com/vgpu/ubuntu@sha256:abc", ["registry.example.com/vgpu/ubuntu"], True),
    ("registry.example.com/vgpu/ubuntu:24.04", ["registry.example.com/vgpu/ubuntu:24.04"], True),
    ("registry.example.com/vgpu/ubuntu:24.04", ["registry.example.com/vgpu/ubuntu:"], True),
    ("registry.example.com/vgpu/ubuntu-nodriver:1", ["registry.example.com/vgpu/ubuntu"], False),
    ("registry.example.com/vgpu-evil/ubuntu:1", ["registry.example.com/vgpu"], False),
    ("registry.example.com/vgpu/ubuntu:24.04", ["registry.example.com/vgpu/ubuntu:24.04.1"], False),
    ("registry.example.com/vgpu/ubuntu:24.04", [], False),
    ("registry.example.com/vgpu/ubuntu:24.04", ["*/vgpu/*"], True),
    ("registry.example.com/vgpu/ubuntu:24.04", ["registry.example.com/*:24.04"], True),
    ("registry.example.com/vgpu/ubuntu:24.04", ["registry.example.com/*:22.04"], False),
    ("registry.example.com/vgpu/ubuntu:24.04", ["registry.example.com/vgpu/ubuntu:2?.04"], True),
    ("registry.example.com/vgpu/ubuntu:24.04", ["other.example/", "registry.example.com/vgpu/[tu]buntu*"], True),
    ("Registry.example.com/vgpu/ubuntu:24.04", ["registry.example.com/vgpu/"], False),  # as written
    ("ubuntu", ["docker.io/library/ubuntu"], False),  # no normalization
])
def test_image_allowed(image: str, patterns: list[str], allowed: bool) -> None:
    assert bi.image_allowed(image, patterns) is allowed


def test_parse_image_patterns() -> None:
    assert bi.parse_image_patterns("") == ()
    assert bi.parse_image_patterns(" a/ , ,b:*,a/ ,") == ("a/", "b:*")
    with pytest.raises(ValueError, match="no spaces"):
        bi.parse_image_patterns("registry.example.com/a b")


# -- the verdict ----------------------------------------------------------------------------------
MARKED_PVCS = {(NS, "golden"): bi.Marked(NS, "golden"), ("os-images", "rhel9"): bi.Marked("os-images", "rhel9")}
MARKED_DATASOURCES = {("os-images", "ubuntu"): bi.Marked("os-images", "ubuntu")}
DATAVOLUMES = {
    (NS, "marked"): DataVolumeRef(NS, "marked", marked=True),
    (NS, "golden"): DataVolumeRef(NS, "golden", marked=False),  # its PVC "golden" carries the mark
    (NS, "from-ubuntu"): DataVolumeRef(NS, "from-ubuntu", False, data_source=("os-images", "ubuntu")),
    (NS, "from-windows"): DataVolumeRef(NS, "from-windows", False, data_source=("os-images", "windows")),
    (NS, "clone-rhel9"): DataVolumeRef(NS, "clone-rhel9", False, source_pvc=("os-images", "rhel9")),
    (NS, "clone-other"): DataVolumeRef(NS, "clone-other", False, source_pvc=("os-images", "other")),
    (NS, "imported"): DataVolumeRef(NS, "imported", False),
}
ALL = Marks(images=("registry.example.com/vgpu/",), pvcs=MARKED_PVCS, datavolumes=DATAVOLUMES,
            datasources=MARKED_DATASOURCES)


def judged(volume: BootVolume | NoBootVolume, marks: Marks = ALL) -> Judgement:
    return bi.judge(volume, marks)


def boot(source: Source, ref: str, namespace: str = NS) -> BootVolume:
    return BootVolume(namespace, "root", source, ref)


@pytest.mark.parametrize(("volume", "verdict"), [
    (boot(Source.CONTAINER_DISK, "registry.example.com/vgpu/ubuntu:24.04"), Verdict.MARKED),
    (boot(Source.CONTAINER_DISK, "quay.io/containerdisks/ubuntu:24.04"), Verdict.UNMARKED),
    (boot(Source.PVC, "golden"), Verdict.MARKED),
    (boot(Source.EPHEMERAL, "golden"), Verdict.MARKED),
    (boot(Source.PVC, "plain"), Verdict.UNMARKED),
    (boot(Source.PVC, "golden", namespace="tenant-b"), Verdict.UNMARKED),  # a mark is per namespace
    (boot(Source.DATA_VOLUME, "marked"), Verdict.MARKED),
    (boot(Source.DATA_VOLUME, "golden"), Verdict.MARKED),
    (boot(Source.DATA_VOLUME, "from-ubuntu"), Verdict.MARKED),
    (boot(Source.DATA_VOLUME, "from-windows"), Verdict.UNMARKED),
    (boot(Source.DATA_VOLUME, "clone-rhel9"), Verdict.MARKED),
    (boot(Source.DATA_VOLUME, "clone-other"), Verdict.UNMARKED),
    (boot(Source.DATA_VOLUME, "imported"), Verdict.UNMARKED),
    (boot(Source.DATA_VOLUME, "not-created-yet"), Verdict.UNKNOWN),
    (BootVolume(NS, "root", None, "", other="secret"), Verdict.UNKNOWN),
    (NoBootVolume("it has no disk"), Verdict.UNKNOWN),
], ids=lambda v: v.ref if isinstance(v, BootVolume) else str(v))
def test_judge_with_every_cache_trusted(volume: BootVolume | NoBootVolume, verdict: Verdict) -> None:
    assert judged(volume).verdict is verdict


def test_the_detail_names_the_chain() -> None:
    assert judged(boot(Source.DATA_VOLUME, "from-ubuntu")).detail == (
        'DataVolume "from-ubuntu": DataSource "os-images/ubuntu" is marked')
    assert judged(boot(Source.DATA_VOLUME, "marked")).detail == 'DataVolume "marked" is marked'
    assert judged(boot(Source.DATA_VOLUME, "golden")).detail == 'DataVolume "golden": PVC "golden" is marked'
    assert judged(boot(Source.DATA_VOLUME, "from-windows")).detail == (
        'no mark on DataVolume "from-windows", PVC "from-windows", DataSource "os-images/windows"')
    assert judged(boot(Source.DATA_VOLUME, "clone-other")).detail == (
        'no mark on DataVolume "clone-other", PVC "clone-other", source PVC "os-images/other"')
    assert judged(boot(Source.PVC, "plain")).detail == 'no mark on PVC "plain"'
    assert judged(boot(Source.CONTAINER_DISK, "quay.io/x:1")).detail == (
        'containerDisk image "quay.io/x:1" is not in --vgpu-driver-images')
    assert judged(boot(Source.DATA_VOLUME, "not-created-yet")).detail == (
        'DataVolume "not-created-yet": no such DataVolume (not created yet, or deleted)')


def test_untrusted_caches_make_unknown_never_unmarked() -> None:
    no_pvcs = Marks(images=(), pvcs=None, datavolumes=DATAVOLUMES, datasources=MARKED_DATASOURCES)
    assert judged(boot(Source.PVC, "plain"), no_pvcs).verdict is Verdict.UNKNOWN
    assert judged(boot(Source.EPHEMERAL, "golden"), no_pvcs).verdict is Verdict.UNKNOWN
    # A DataVolume whose own mark decides needs no PVC cache.
    assert judged(boot(Source.DATA_VOLUME, "marked"), no_pvcs).verdict is Verdict.MARKED
    assert judged(boot(Source.DATA_VOLUME, "from-ubuntu"), no_pvcs).verdict is Verdict.MARKED
    assert judged(boot(Source.DATA_VOLUME, "imported"), no_pvcs).verdict is Verdict.UNKNOWN
    assert judged(boot(Source.DATA_VOLUME, "clone-rhel9"), no_pvcs).verdict is Verdict.UNKNOWN
    # containerDisks need no cache at all.
    assert judged(boot(Source.CONTAINER_DISK, "quay.io/x:1"), Marks()).verdict is Verdict.UNMARKED


def test_without_cdi_datavolume_marks_are_unknown() -> None:
    """CDI absent (its informers never sync): a DataVolume's own mark and its DataSource cannot be seen."""
    no_cdi = Marks(images=(), pvcs=MARKED_PVCS, datavolumes=None, datasources=None)
    j = judged(boot(Source.DATA_VOLUME, "imported"), no_cdi)
    assert j.verdict is Verdict.UNKNOWN
    assert "CDI DataVolumes are not observed" in j.detail
    # ...unless its PVC (same name) carries the mark, which needs no CDI.
    assert judged(boot(Source.DATA_VOLUME, "golden"), no_cdi).verdict is Verdict.MARKED
    # DataVolumes seen, DataSources not: the DataSource link is unknown.
    no_ds = Marks(images=(), pvcs=MARKED_PVCS, datavolumes=DATAVOLUMES, datasources=None)
    j = judged(boot(Source.DATA_VOLUME, "from-windows"), no_ds)
    assert j.verdict is Verdict.UNKNOWN and "CDI DataSources are not observed" in j.detail
    assert judged(boot(Source.DATA_VOLUME, "imported"), no_ds).verdict is Verdict.UNMARKED


class KeyedOnly(Mapping[tuple[str, str], Any]):
    """A live cache view as the webhook thread may use it: `get` and `in`, never iteration."""

    def __init__(self, data: Mapping[tuple[str, str], Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: tuple[str, str]) -> Any:
        return self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[tuple[str, str]]:
        raise AssertionError("a live cache view must not be iterated on the webhook thread")

    def __len__(self) -> int:
        raise AssertionError("a live cache view must not be sized on the webhook thread")


def test_judge_makes_keyed_lookups_only() -> None:
    keyed = Marks(images=ALL.images, pvcs=KeyedOnly(MARKED_PVCS), datavolumes=KeyedOnly(DATAVOLUMES),
                  datasources=KeyedOnly(MARKED_DATASOURCES))
    for key in [*DATAVOLUMES, (NS, "missing")]:
        assert judged(boot(Source.DATA_VOLUME, key[1]), keyed) == judged(boot(Source.DATA_VOLUME, key[1]))
    assert judged(boot(Source.PVC, "golden"), keyed).verdict is Verdict.MARKED


def test_a_capk_worker_is_judged_like_any_vm() -> None:
    """Cluster API's KubeVirt provider creates worker VMIs from a VM template with its labels and
    appends a cloud-init disk; the boot image rule does not look at who created the VMI."""
    labels = {"cluster.x-k8s.io/cluster-name": "tenant-k8s", "cluster.x-k8s.io/role": "worker"}
    worker = vmi(disk("rootdisk"), disk("cloudinitdisk"),
                 volumes=[dv("rootdisk", "from-windows"), {"name": "cloudinitdisk", "cloudInitNoCloud": {}}],
                 labels=labels)
    plain = vmi(disk("rootdisk"), volumes=[dv("rootdisk", "from-windows")])
    assert bi.judge(bi.boot_volume(NS, worker), ALL) == bi.judge(bi.boot_volume(NS, plain), ALL)
    assert bi.judge(bi.boot_volume(NS, worker), ALL).verdict is Verdict.UNMARKED


# -- which VMIs are checked -----------------------------------------------------------------------
def test_uses_vgpu() -> None:
    view = DeliveryView(
        claims={(NS, "vgpu"): GpuClaim(NS, "vgpu", "a100-4c"), (NS, "pt"): GpuClaim(NS, "pt", "a100-pt"),
                (NS, "dangling"): GpuClaim(NS, "dangling", "nope"), (NS, "unset"): GpuClaim(NS, "unset", None)},
        classes={("", "a100-4c"): GpuClass("a100-4c", "u1", "vgpu", None, 1),
                 ("", "a100-pt"): GpuClass("a100-pt", "u2", "passthrough", None, None)},
        entitled={}, replicas={})
    assert bi.uses_vgpu(NS, ["vgpu"], view)
    assert bi.uses_vgpu(NS, ["pt", "vgpu"], view)
    assert not bi.uses_vgpu(NS, ["pt"], view)
    assert not bi.uses_vgpu(NS, ["dangling", "unset", "missing"], view)
    assert not bi.uses_vgpu("tenant-b", ["vgpu"], view)
    assert not bi.uses_vgpu(NS, [], view)


# -- texts ----------------------------------------------------------------------------------------
def test_warnings_fit_120_characters_and_say_what_to_do() -> None:
    long_name = "golden-" + "x" * 240
    cases = [
        judged(boot(Source.PVC, "plain")),
        judged(boot(Source.PVC, long_name)),
        judged(boot(Source.DATA_VOLUME, long_name)),
        judged(boot(Source.CONTAINER_DISK, "quay.io/containerdisks/ubuntu:24.04")),
        judged(boot(Source.CONTAINER_DISK, "registry.example.com/" + "a/" * 120 + "image:1")),
        judged(boot(Source.PVC, long_name), Marks()),
        judged(BootVolume(NS, "d" * 63, None, "", other="secret")),
        judged(NoBootVolume("it has no disk")),
    ]
    for j in cases:
        text = bi.warning(j)
        assert text is not None and len(text) <= bi.WARNING_LIMIT, text
        assert text.isascii()
    assert bi.warning(cases[0]) == (
        'boot PVC "plain" lacks label licensectl.io/vgpu-guest-driver=true: a vGPU needs its guest driver')
    assert bi.warning(cases[3]) == ('boot image "quay.io/containerdisks/ubuntu:24.04" is not in '
                                    "--vgpu-driver-images: a vGPU needs its guest driver")
    shortened = bi.warning(cases[1])
    assert shortened is not None and '"golden-xx' in shortened and '..."' not in shortened and "..." in shortened
    assert bi.warning(cases[5]) is not None and bi.warning(cases[5]).startswith(  # type: ignore[union-attr]
        "licensectl could not check boot PVC")
    assert bi.warning(judged(boot(Source.PVC, "golden"))) is None


def test_event_and_denial_messages() -> None:
    j = judged(boot(Source.DATA_VOLUME, "from-windows"))
    msg = bi.event_message(j)
    assert 'DataSource "os-images/windows"' in msg and 'licensectl.io/vgpu-guest-driver: "true"' in msg
    assert msg.endswith("the VMI was admitted")
    assert bi.event_message(j, enforced=True).endswith("creation denied (--vgpu-driver-check=enforce)")
    denial = bi.denial(j)
    assert denial.startswith("licensectl: the boot image is not marked") and "DataVolume" in denial
    image = judged(boot(Source.CONTAINER_DISK, "quay.io/x:1"))
    assert "add the image to --vgpu-driver-images" in bi.denial(image)
    unknown = bi.event_message(judged(NoBootVolume("it has no disk")))
    assert "could not check" in unknown and "it has no disk" in unknown
