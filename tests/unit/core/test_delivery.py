"""License delivery decisions (pure): which volumes a VMI must carry, and the patch adding them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from licensectl.core.delivery import SERIAL, DeliveryView, Skip, Wanted, plan_delivery, volume_name, wanted_replicas
from licensectl.core.model import (
    ANN_CLASS,
    ANN_GPU_CLAIMS,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    GpuClaim,
    GpuClass,
    ObjectRef,
    ReplicaSecret,
)
from licensectl.core.render import replica_name
from licensectl.kube.projections import vmi_from, vmi_gpu_claims

SRC = ObjectRef("src", "nls")


def apply_patch(doc: dict[str, Any], patch: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    """RFC 6902 `add`, and `remove` of a stamp annotation (all the webhook emits): enough to check the
    result, strict on paths. `add` over an existing member only for licensectl's own annotations."""
    out = copy.deepcopy(doc)
    for op in patch:
        assert op["op"] in ("add", "remove")
        *parents, last = [seg.replace("~1", "/").replace("~0", "~") for seg in op["path"].lstrip("/").split("/")]
        cur: Any = out
        for p in parents:
            cur = cur[p]
        if op["op"] == "remove":
            assert parents == ["metadata", "annotations"] and last.startswith("licensectl.io/delivered-")
            del cur[last]
        elif parents == ["metadata", "annotations"] and last.startswith("licensectl.io/"):
            cur[last] = op["value"]
        elif last == "-":
            assert isinstance(cur, list)
            cur.append(copy.deepcopy(op["value"]))
        else:
            assert isinstance(cur, dict) and last not in cur, f"add over an existing member: {op['path']}"
            cur[last] = copy.deepcopy(op["value"])
    return out


def replica(ns: str, cls: str, *, owned: bool = True) -> ReplicaSecret:
    labels = {MANAGED_BY_LABEL: MANAGED_BY_VALUE} if owned else {}
    return ReplicaSecret(ns, replica_name(cls), "u", "1", labels=labels, annotations={ANN_CLASS: cls} if owned else {})


def view(*, entitled: tuple[tuple[str, str], ...] = (("t1", "vws"), ("t1", "vcs")),
         replicas: tuple[ReplicaSecret, ...] | None = None, claims: tuple[GpuClaim, ...] | None = None) -> DeliveryView:
    classes = {("", "vws"): GpuClass("vws", "c1", "vgpu", SRC, 2), ("", "vcs"): GpuClass("vcs", "c2", "vgpu", SRC, 4),
               ("", "pt"): GpuClass("pt", "c3", "passthrough", None, None)}
    claims = claims if claims is not None else (GpuClaim("t1", "gpu", "vws"), GpuClaim("t1", "compute", "vcs"),
                                                GpuClaim("t1", "pass", "pt"), GpuClaim("t2", "gpu", "vws"))
    reps = replicas if replicas is not None else (replica("t1", "vws"), replica("t1", "vcs"))
    return DeliveryView(claims={(c.namespace, c.name): c for c in claims}, classes=classes,
                        entitled={k: SRC for k in entitled}, replicas={(r.namespace, r.name): r for r in reps})


def vmi(*claims: str, volumes: list[dict[str, Any]] | None = None, disks: list[dict[str, Any]] | None = None,
        annotation: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"domain": {"devices": {"disks": [{"name": "root", "disk": {}}, *(disks or [])]}},
                            "volumes": [{"name": "root", "containerDisk": {"image": "x"}}, *(volumes or [])]}
    if claims:
        spec["domain"]["devices"]["gpus"] = [{"name": f"g{i}", "claimName": f"c{i}"} for i in range(len(claims))]
        spec["resourceClaims"] = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    meta: dict[str, Any] = {"name": "v", "namespace": "t1", "creationTimestamp": "2026-01-01T00:00:00Z"}
    if annotation is not None:
        meta["annotations"] = {ANN_GPU_CLAIMS: annotation}
    return {"metadata": meta, "spec": spec}


# -- how a VMI names its claims ---------------------------------------------------------------------
def test_claims_from_dra_shape_in_device_order_then_annotation() -> None:
    obj = vmi("b", "a", annotation=" c, a ,,")
    assert vmi_gpu_claims(obj) == ("b", "a", "c")
    assert vmi_from(obj) is not None and vmi_from(obj).gpu_claims == ("b", "a", "c")  # type: ignore[union-attr]


def test_claims_template_name_and_unresolvable_entries() -> None:
    obj = vmi()
    obj["spec"]["domain"]["devices"]["gpus"] = [{"name": "g0", "claimName": "x"}, {"name": "g1"},
                                               {"name": "g2", "claimName": "missing"}, "junk"]
    obj["spec"]["resourceClaims"] = [{"name": "x", "resourceClaimTemplateName": "tmpl"}, {"name": "y"}, 7]
    assert vmi_gpu_claims(obj) == ("tmpl",)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                    max_leaves=20))
def test_claims_never_raise_on_garbage(junk: Any) -> None:
    for obj in (junk, {"spec": junk}, {"spec": {"domain": {"devices": {"gpus": junk}}, "resourceClaims": junk}}):
        assert isinstance(vmi_gpu_claims(obj), tuple)


# -- which volumes are wanted -----------------------------------------------------------------------
def test_wanted_follows_claim_class_mode_entitlement_and_replica() -> None:
    w = wanted_replicas("t1", ["gpu", "compute", "pass", "nope"], view())
    assert w.replicas == (("vws", replica_name("vws")), ("vcs", replica_name("vcs")))
    assert w.skipped == (("nope", Skip.CLAIM_NOT_FOUND),)


@pytest.mark.parametrize(("kw", "ns", "reason"), [
    ({"entitled": ()}, "t1", Skip.NOT_ENTITLED),
    ({}, "t2", Skip.NOT_ENTITLED),
    ({"replicas": ()}, "t1", Skip.REPLICA_MISSING),
    ({"replicas": (replica("t1", "vws", owned=False),)}, "t1", Skip.REPLICA_MISSING),
    ({"claims": (GpuClaim("t1", "gpu", "ghost"),)}, "t1", Skip.CLASS_NOT_FOUND),
    ({"claims": (GpuClaim("t1", "gpu", None),)}, "t1", Skip.CLAIM_NOT_FOUND),
])
def test_each_reason_a_claim_gets_no_volume(kw: dict[str, Any], ns: str, reason: Skip) -> None:
    w = wanted_replicas(ns, ["gpu"], view(**kw))
    assert w.replicas == () and w.skipped == (("gpu", reason),)


def test_two_claims_of_one_class_want_one_volume() -> None:
    v = view(claims=(GpuClaim("t1", "a", "vws"), GpuClaim("t1", "b", "vws")))
    assert wanted_replicas("t1", ["a", "b"], v).replicas == (("vws", replica_name("vws")),)


# -- the patch --------------------------------------------------------------------------------------
def test_patch_appends_volume_and_disk_and_keeps_everything_else() -> None:
    obj = vmi("gpu")
    d = plan_delivery(obj, wanted_replicas("t1", ["gpu"], view()))
    out = apply_patch(obj, d.patch)
    assert d.added == (replica_name("vws"),) and d.mutated
    assert out["spec"]["volumes"][0] == obj["spec"]["volumes"][0]
    assert out["spec"]["volumes"][1] == {"name": "licensectl-vws", "secret": {
        "secretName": replica_name("vws"), "volumeLabel": SERIAL, "optional": True}}
    assert out["spec"]["domain"]["devices"]["disks"][1] == {"name": "licensectl-vws", "serial": SERIAL,
                                                            "disk": {"bus": "virtio"}}
    # Reinvocation: the patched VMI is returned unchanged.
    again = plan_delivery(out, wanted_replicas("t1", ["gpu"], view()))
    assert again.patch == () and again.present == (replica_name("vws"),)


def test_patch_creates_missing_arrays() -> None:
    obj = {"metadata": {}, "spec": {"domain": {}}}
    out = apply_patch(obj, plan_delivery(obj, Wanted((("vws", "r"),), ())).patch)
    assert out["spec"]["volumes"][0]["secret"]["secretName"] == "r"
    assert out["spec"]["domain"]["devices"]["disks"][0]["serial"] == SERIAL


def test_hand_written_volume_of_the_replica_is_left_alone() -> None:
    own = {"name": "mine", "secret": {"secretName": replica_name("vws")}}
    obj = vmi("gpu", volumes=[own])
    d = plan_delivery(obj, wanted_replicas("t1", ["gpu"], view()))
    assert d.patch == () and d.present == (replica_name("vws"),)


def test_taken_serial_and_names_are_refused_never_overwritten() -> None:
    # The first license volume must get serial LICENSECTL (the guest installs that disk): a user disk
    # holding it is a refusal, named; a taken volume name too.
    obj = vmi("gpu", "compute", disks=[{"name": "x", "serial": SERIAL}],
              volumes=[{"name": "licensectl-vcs", "emptyDisk": {}}])
    d = plan_delivery(obj, wanted_replicas("t1", ["gpu", "compute"], view()))
    assert d.patch == () and d.added == ()
    # Each refusal names the claim (not its class), and its message the claim, the class and what is taken.
    assert d.skipped == (("gpu", Skip.SERIAL_TAKEN), ("compute", Skip.VOLUME_NAME_TAKEN))
    assert d.skip_message("compute", Skip.VOLUME_NAME_TAKEN) == (
        "GPU claim compute of GPUClass vcs: no license volume added (volume_name_taken: the spec already has a "
        "volume or disk named licensectl-vcs); the VMI was admitted unchanged")
    assert d.skip_message("gpu", Skip.SERIAL_TAKEN) == (
        "GPU claim gpu of GPUClass vws: no license volume added (serial_taken: a disk serial or volume label "
        "LICENSECTL is taken); the VMI was admitted unchanged")


def test_a_skip_before_the_patch_names_the_claim_and_the_class_it_names() -> None:
    d = plan_delivery(vmi("gpu"), wanted_replicas("t1", ["gpu"], view(entitled=())))
    assert d.skip_message("gpu", Skip.NOT_ENTITLED) == (
        "GPU claim gpu of GPUClass vws: no license volume added (not_entitled); the VMI was admitted unchanged")
    d = plan_delivery(vmi("nope"), wanted_replicas("t1", ["nope"], view()))
    assert d.skip_message("nope", Skip.CLAIM_NOT_FOUND).startswith("GPU claim nope: no license volume added")


def test_serials_and_labels_in_use_are_skipped_once_a_license_volume_is_there() -> None:
    own = {"name": "mine", "secret": {"secretName": replica_name("vws"), "volumeLabel": SERIAL}}
    obj = vmi("gpu", "compute", volumes=[own], disks=[{"name": "mine", "serial": SERIAL}])
    d = plan_delivery(obj, wanted_replicas("t1", ["gpu", "compute"], view()))
    out = apply_patch(obj, d.patch)
    added = [v for v in out["spec"]["volumes"] if "secret" in v][1:]
    assert [v["secret"]["volumeLabel"] for v in added] == [f"{SERIAL}-2"]
    assert d.skipped == () and d.present == (replica_name("vws"),)


@pytest.mark.parametrize("spec", [None, [], {"domain": "x"}, {"domain": {"devices": []}},
                                  {"domain": {}, "volumes": {}}, {"domain": {"devices": {"disks": "x"}}}])
def test_malformed_vmi_is_admitted_unchanged_with_a_reason(spec: Any) -> None:
    d = plan_delivery({"spec": spec}, Wanted((("vws", "r"),), (), classes=(("gpu", "vws"),)))
    assert d.patch == () and d.skipped == (("gpu", Skip.MALFORMED),)
    assert "GPU claim gpu of GPUClass vws" in d.skip_message("gpu", Skip.MALFORMED)


def test_volume_names_are_dns_labels() -> None:
    assert volume_name("vws") == "licensectl-vws"
    for cls in ("a.b", "x" * 60, "UPPER"):
        name = volume_name(cls)
        assert len(name) <= 63 and name.startswith("licensectl-") and "." not in name


@given(st.lists(st.sampled_from(["gpu", "compute", "pass", "nope"]), max_size=5),
       st.lists(st.sampled_from([SERIAL, f"{SERIAL}-2", "licensectl-vws", "other"]), max_size=4))
def test_patch_only_adds_and_is_idempotent(claims: list[str], used: list[str]) -> None:
    obj = vmi(*claims, disks=[{"name": f"d{i}", "serial": s} for i, s in enumerate(used)],
              volumes=[{"name": u, "emptyDisk": {}} for u in used if u.startswith("licensectl-")])
    w = wanted_replicas("t1", claims, view())
    d = plan_delivery(obj, w)
    out = apply_patch(obj, d.patch)
    # Nothing the user wrote changes; only appended entries are new.
    n_vol, n_disk = len(obj["spec"]["volumes"]), len(obj["spec"]["domain"]["devices"]["disks"])
    assert out["spec"]["volumes"][:n_vol] == obj["spec"]["volumes"]
    assert out["spec"]["domain"]["devices"]["disks"][:n_disk] == obj["spec"]["domain"]["devices"]["disks"]
    serials = [x.get("serial") for x in out["spec"]["domain"]["devices"]["disks"][n_disk:]]
    assert len(set(serials)) == len(serials) and not set(serials) & set(used)
    assert plan_delivery(out, w).patch == ()


def test_wanted_volumes_only_for_running_vmis_with_wanted_replicas() -> None:
    import datetime as dt

    from licensectl.core.delivery import wanted_volumes
    from licensectl.core.model import Vmi
    from licensectl.core.timecodec import to_epoch_us

    def v(name: str, *, claims: tuple[str, ...] = ("gpu",), phase: str = "Running", deleting: bool = False) -> Vmi:
        return Vmi("t1", name, name, to_epoch_us(dt.datetime(2026, 1, 1, tzinfo=dt.UTC)), name, phase, True, None, (),
                   None, deleting=deleting, gpu_claims=claims)

    got = wanted_volumes([v("a"), v("b", phase="Scheduling"), v("c", deleting=True), v("d", claims=()),
                          v("e", claims=("pass",)), v("f", claims=("gpu", "compute"))], view())
    assert got == {("t1", "a"): (replica_name("vws"),), ("t1", "f"): (replica_name("vws"), replica_name("vcs"))}
