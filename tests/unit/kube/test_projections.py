"""Projections over realistic API objects and over garbage: they must never raise."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from licensectl.core import model
from licensectl.kube import projections as p
from licensectl.kube.watch import object_key, shared_name_key

UTC = dt.UTC


def b64(v: bytes) -> str:
    return base64.b64encode(v).decode()


NAMESPACE = {
    "apiVersion": "v1",
    "kind": "Namespace",
    "metadata": {
        "name": "tenant-foo-bar",
        "uid": "ns-uid-bar",
        "resourceVersion": "17",
        "labels": {"tenant.cozystack.io/tenant-root": "", "tenant.cozystack.io/tenant-foo": "",
                   "gpu.cozystack.io/vgpu": "true", "weird": 5},
        "ownerReferences": [
            {"apiVersion": "apps.cozystack.io/v1alpha1", "kind": "Tenant", "name": "bar", "uid": "t-1",
             "controller": False},
            {"apiVersion": "v1", "kind": "Namespace", "name": "tenant-foo", "uid": "ns-uid-foo",
             "controller": True, "blockOwnerDeletion": True},
        ],
    },
    "spec": {"finalizers": ["kubernetes"]},
    "status": {"phase": "Active"},
}

GPU_CLASS = {
    "apiVersion": "gpu.cozystack.io/v1alpha1",
    "kind": "GPUClass",
    "metadata": {"name": "l40s-vws", "uid": "c-1", "resourceVersion": "5"},
    "spec": {"mode": "vgpu", "license": {"secretRef": {"namespace": "licensing", "name": "nls-token"},
                                         "featureType": 1}},
}

SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "nls-token", "namespace": "licensing", "uid": "s-1", "resourceVersion": "99",
                 "annotations": {model.ANN_ROLLOUT_PAUSED: "true"},
                 "labels": {model.MANAGED_BY_LABEL: model.MANAGED_BY_VALUE}},
    "type": "Opaque",
    "data": {"client_configuration_token.tok": b64(b"eyJhbGciOi.payload.sig"), "gridd.conf": b64(b"FeatureType=1\n")},
}

VMI = {
    "apiVersion": "kubevirt.io/v1",
    "kind": "VirtualMachineInstance",
    "metadata": {
        "name": "vm1", "namespace": "tenant-foo", "uid": "vmi-1", "resourceVersion": "300",
        "creationTimestamp": "2024-05-01T10:00:00Z",
        "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "vm1",
                             "uid": "vm-1", "controller": True, "blockOwnerDeletion": True}],
    },
    "spec": {
        "domain": {"firmware": {"uuid": "5d307ca9-b3ef-428c-8861-06e72d69f223"}, "devices": {}},
        "volumes": [
            {"name": "rootdisk", "containerDisk": {"image": "quay.io/x/y"}},
            {"name": "license", "secret": {"secretName": "licensectl-l40s-vws", "volumeLabel": "NVLICENSE"}},
            {"name": "cloudinit", "cloudInitNoCloud": {"secretRef": {"name": "ci"}}},
        ],
    },
    "status": {
        "phase": "Running",
        "conditions": [{"type": "LiveMigratable", "status": "False"}, {"type": "Ready", "status": "True"}],
        "phaseTransitionTimestamps": [
            {"phase": "Pending", "phaseTransitionTimestamp": "2024-05-01T10:00:00Z"},
            {"phase": "Scheduled", "phaseTransitionTimestamp": "2024-05-01T10:00:05Z"},
            {"phase": "Running", "phaseTransitionTimestamp": "2024-05-01T10:00:20Z"},
        ],
    },
}


def test_namespace_realistic() -> None:
    ns = p.namespace_from(NAMESPACE)
    assert ns is not None
    assert (ns.name, ns.uid, ns.owner_name, ns.owner_uid, ns.terminating) == (
        "tenant-foo-bar", "ns-uid-bar", "tenant-foo", "ns-uid-foo", False)
    assert ns.labels["gpu.cozystack.io/vgpu"] == "true"
    assert "weird" not in ns.labels  # non-string label values are dropped


def test_namespace_owner_requires_controller_and_kind() -> None:
    obj: dict[str, Any] = {"metadata": {"name": "x", "ownerReferences": [
        {"apiVersion": "v1", "kind": "Namespace", "name": "p", "uid": "u"},  # not controller
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "q", "uid": "u2", "controller": True},
    ]}}
    ns = p.namespace_from(obj)
    assert ns is not None and ns.owner_name is None and ns.owner_uid is None


@pytest.mark.parametrize("obj", [
    {"metadata": {"name": "x", "deletionTimestamp": "2024-01-01T00:00:00Z"}},
    {"metadata": {"name": "x"}, "status": {"phase": "Terminating"}},
])
def test_namespace_terminating(obj: dict[str, Any]) -> None:
    ns = p.namespace_from(obj)
    assert ns is not None and ns.terminating


def test_gpu_class_realistic() -> None:
    c = p.gpu_class_from(GPU_CLASS)
    assert c == model.GpuClass("l40s-vws", "c-1", "vgpu", model.ObjectRef("licensing", "nls-token"), 1)


def test_gpu_class_partial_ref_and_raw_feature_type() -> None:
    c = p.gpu_class_from({"metadata": {"name": "c"}, "spec": {"mode": 7, "license": {
        "secretRef": {"name": "only-name"}, "featureType": [1, 2]}}})
    assert c is not None
    assert c.mode is None and c.secret_ref is None
    assert c.feature_type == "<list>"  # non-scalar kept as an invalid marker for render to reject
    c2 = p.gpu_class_from({"metadata": {"name": "c"}, "spec": {"license": {"featureType": "4"}}})
    assert c2 is not None and c2.feature_type == "4"


def test_gpu_class_profile_raw_and_the_accept_annotation() -> None:
    """spec.profile stays raw for core.profiles to judge; the accept annotation is read, other ones are not kept."""
    obj = {**GPU_CLASS, "metadata": {**GPU_CLASS["metadata"], "annotations": {
        model.ANN_ACCEPT_LICENSE_CHANGE: "licensing/nls-token:4", "other": "x"}},
        "spec": {**GPU_CLASS["spec"], "profile": "NVIDIA L40S-2Q"}}
    c = p.gpu_class_from(obj)
    assert c is not None and c.profile == "NVIDIA L40S-2Q"
    assert c.accept_license_change == "licensing/nls-token:4"
    assert p.gpu_class_from({"metadata": {"name": "c", "annotations": {model.ANN_ACCEPT_LICENSE_CHANGE: 4}},
                             "spec": {"profile": {"a": 1}}}) == model.GpuClass("c", "", None, None, None, "<dict>")


def test_gpu_claim() -> None:
    assert p.gpu_claim_from({"metadata": {"name": "a", "namespace": "t"}, "spec": {"className": "k"}}) == \
        model.GpuClaim("t", "a", "k")
    assert p.gpu_claim_from({"metadata": {"name": "a", "namespace": "t"}, "spec": "nope"}) == \
        model.GpuClaim("t", "a", None)
    assert p.gpu_claim_from({"metadata": {"name": "a"}}) is None  # a claim must be namespaced


def test_source_secret_decodes_and_hides_bytes() -> None:
    s = p.source_secret_from(SECRET)
    assert s is not None
    assert s.data["client_configuration_token.tok"] == b"eyJhbGciOi.payload.sig"
    assert s.resource_version == "99" and s.uid == "s-1"
    assert s.annotations[model.ANN_ROLLOUT_PAUSED] == "true"
    assert "payload" not in repr(s)


def test_source_secret_drops_undecodable_keys() -> None:
    obj = {"metadata": {"name": "n", "namespace": "ns"}, "data": {"good": b64(b"x"), "bad": "%%%", "num": 3}}
    s = p.source_secret_from(obj)
    assert s is not None and dict(s.data) == {"good": b"x"}


def test_replica_secret_keeps_the_data_digest() -> None:
    r = p.replica_secret_from(SECRET)
    assert r is not None
    expected = model.data_digest({"client_configuration_token.tok": b"eyJhbGciOi.payload.sig",
                                   "gridd.conf": b"FeatureType=1\n"})
    assert r.data_digest == expected
    assert r.labels[model.MANAGED_BY_LABEL] == model.MANAGED_BY_VALUE
    other = p.replica_secret_from({**SECRET, "data": {"gridd.conf": b64(b"FeatureType=4\n")}})
    assert other is not None and other.data_digest != expected


def test_vmi_realistic() -> None:
    v = p.vmi_from(VMI)
    assert v is not None
    assert v.owner_vm == "vm1" and v.ready and v.phase == "Running" and not v.deleting
    assert v.created == dt.datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
    assert v.running_since == dt.datetime(2024, 5, 1, 10, 0, 20, tzinfo=UTC)
    assert v.secret_volumes == ("licensectl-l40s-vws",)
    assert v.firmware_uuid == "5d307ca9-b3ef-428c-8861-06e72d69f223"


def test_vmi_owner_must_be_kubevirt_controller() -> None:
    obj = {**VMI, "metadata": {**VMI["metadata"], "ownerReferences": [  # type: ignore[dict-item]
        {"apiVersion": "example.com/v1", "kind": "VirtualMachine", "name": "imposter", "controller": True},
        {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "notctl", "controller": False}]}}
    v = p.vmi_from(obj)
    assert v is not None and v.owner_vm is None


def test_vmi_not_ready_and_deleting() -> None:
    obj = {**VMI, "metadata": {**VMI["metadata"],  # type: ignore[dict-item]
                               "deletionTimestamp": "2024-05-01T11:00:00Z"},
           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}}
    v = p.vmi_from(obj)
    assert v is not None and v.deleting and not v.ready and v.running_since is None


def test_vmi_without_creation_time_is_invisible() -> None:
    assert p.vmi_from({"metadata": {"name": "a", "namespace": "b", "creationTimestamp": "yesterday"}}) is None


@pytest.mark.parametrize(("spec", "expected"), [
    ({"runStrategy": "RerunOnFailure"}, "RerunOnFailure"),
    ({"running": True}, "Always"),
    ({"running": False}, "Halted"),
    ({}, "Halted"),
    ({"running": True, "runStrategy": "Always"}, None),  # mutually exclusive in KubeVirt
    ({"running": "yes"}, None),
    ({"runStrategy": 3}, None),
])
def test_vm_run_strategy(spec: dict[str, Any], expected: str | None) -> None:
    vm = p.vm_from({"metadata": {"name": "v", "namespace": "n", "resourceVersion": "4",
                                 "annotations": {model.ANN_RESTART_REVISION: "r1"}}, "spec": spec})
    assert vm is not None
    assert vm.run_strategy == expected
    assert vm.resource_version == "4" and vm.annotations[model.ANN_RESTART_REVISION] == "r1"


GARBAGE: list[Any] = [
    None, 0, "string", [], [1, 2], {}, {"metadata": None}, {"metadata": []}, {"metadata": {"name": 5}},
    {"metadata": {"name": "x", "namespace": "y", "labels": [], "annotations": "a", "ownerReferences": {},
                  "creationTimestamp": "2024-05-01T10:00:00Z"},
     "spec": [], "status": "x", "data": []},
    {"metadata": {"name": "x", "namespace": "y", "ownerReferences": [None, 1, {"kind": None}],
                  "creationTimestamp": "2024-05-01T10:00:00Z"},
     "spec": {"volumes": [None, {"secret": None}, {"secret": {"secretName": 4}}], "domain": {"firmware": 1},
              "license": "x", "mode": None},
     "status": {"conditions": "x", "phaseTransitionTimestamps": [None, {"phase": "Running",
                                                                       "phaseTransitionTimestamp": "bad"}]},
     "data": {"k": None}},
]

PROJECTIONS = [p.namespace_from, p.gpu_class_from, p.gpu_claim_from, p.source_secret_from,
               p.replica_secret_from, p.vmi_from, p.vm_from]


@pytest.mark.parametrize("fn", PROJECTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("obj", GARBAGE)
def test_garbage_never_raises(fn: Any, obj: Any) -> None:
    out = fn(obj)
    # Without a usable name nothing is projected; with one, a projection with empty fields comes out.
    name = obj.get("metadata", {}).get("name") if isinstance(obj, dict) and isinstance(
        obj.get("metadata"), dict) else None
    if not isinstance(name, str):
        assert out is None


def test_garbage_named_object_projects_with_empty_fields() -> None:
    obj = GARBAGE[-1]
    v = p.vmi_from(obj)
    assert v is not None
    assert v.secret_volumes == () and v.firmware_uuid is None and v.running_since is None
    assert v.owner_vm is None and not v.ready and v.phase == ""
    c = p.gpu_class_from(obj)
    assert c is not None and c.mode is None and c.secret_ref is None and c.feature_type is None


# --- sharing: what many cached objects repeat is held once, and never changes a value ------------
def decoded(obj: Any) -> Any:
    """A fresh decode, as each LIST page and watch event is: it shares no string with another."""
    return json.loads(json.dumps(obj))


def renamed(obj: dict[str, Any], **meta: Any) -> Any:
    return decoded({**obj, "metadata": {**obj["metadata"], **meta}})


def test_a_namespace_string_is_one_object_across_keys_and_caches() -> None:
    a, b = renamed(VMI, name="vm1"), renamed(VMI, name="vm2")
    va, vb = p.vmi_from(a), p.vmi_from(b)
    ns = p.namespace_from(decoded({"metadata": {"name": "tenant-foo"}}))
    assert va is not None and vb is not None and ns is not None
    assert va.namespace == "tenant-foo"
    assert va.namespace is vb.namespace is ns.name
    assert object_key(a)[0] is va.namespace and object_key(b)[0] is va.namespace
    assert object_key(decoded({"metadata": {"name": "tenant-foo"}}))[1] is ns.name  # cluster-scoped: the name


def test_replica_and_claim_names_and_maps_are_shared_with_their_keys() -> None:
    objs = [renamed(SECRET, namespace=f"t{i}") for i in range(2)]
    r0, r1 = (p.replica_secret_from(o) for o in objs)
    assert r0 is not None and r1 is not None
    assert r0.name is r1.name and shared_name_key(objs[0])[1] is r0.name and shared_name_key(objs[1])[1] is r0.name
    assert r0.labels is r1.labels and r0.annotations is r1.annotations  # equal maps: one object
    edited = p.replica_secret_from(renamed(SECRET, annotations={model.ANN_CLASS: "other"}))
    assert edited is not None and dict(edited.annotations) == {model.ANN_CLASS: "other"}
    claims = [decoded({"metadata": {"name": "gpu", "namespace": f"t{i}"}, "spec": {"className": "vws"}})
              for i in range(2)]
    c0, c1 = (p.gpu_claim_from(o) for o in claims)
    assert c0 is not None and c1 is not None
    assert c0.name is c1.name is shared_name_key(claims[1])[1] and c0.class_name is c1.class_name


def test_unique_names_stay_unshared_in_object_keys() -> None:
    """VM and VMI names are mostly unique: interning them would cost the intern table an entry each."""
    key = object_key(renamed(VMI, name="vm-" + "x" * 20))
    assert key[1] == "vm-" + "x" * 20 and key[1] is not object_key(renamed(VMI, name="vm-" + "x" * 20))[1]


def test_vmi_owner_is_its_name_and_volumes_are_shared() -> None:
    a, b = p.vmi_from(renamed(VMI, name="vm1")), p.vmi_from(renamed(VMI, namespace="other"))
    assert a is not None and b is not None
    assert a.owner_vm is a.name
    assert a.secret_volumes is b.secret_volumes and a.phase is b.phase


def test_vm_keeps_only_licensectl_annotations() -> None:
    ann = {"kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 2000 + "}",
           "kubevirt.io/latest-observed-api-version": "v1", model.ANN_RESTART_REVISION: "r1",
           model.ANN_RESTART_VMI_UID: "u1", model.ANN_RESTART_POLICY: "manual",
           "licensectl.io": "no prefix", "licensectl.io.example.com/x": "another domain", "x/licensectl.io/y": "no"}
    vm = p.vm_from(decoded({"metadata": {"name": "v", "namespace": "n", "annotations": ann}}))
    assert vm is not None
    assert dict(vm.annotations) == {model.ANN_RESTART_REVISION: "r1", model.ANN_RESTART_VMI_UID: "u1",
                                    model.ANN_RESTART_POLICY: "manual"}
    plain = p.vm_from(decoded({"metadata": {"name": "v", "namespace": "n", "annotations": {"a": "b"}}}))
    assert plain is not None and plain.annotations is model.EMPTY


def test_vm_restart_times_that_are_equal_are_one_string() -> None:
    at = "2026-01-02T03:04:05.000006Z"
    vm = p.vm_from(decoded({"metadata": {"name": "v", "namespace": "n", "annotations": {
        model.ANN_RESTART_ISSUED_AT: at, model.ANN_RESTART_ATTEMPTED_AT: at}}}))
    assert vm is not None and vm.annotations[model.ANN_RESTART_ISSUED_AT] == at
    assert vm.annotations[model.ANN_RESTART_ISSUED_AT] is vm.annotations[model.ANN_RESTART_ATTEMPTED_AT]


def test_namespace_label_values_are_shared() -> None:
    labels = {"kubernetes.io/metadata.name": "tenant-x", "gpu.cozystack.io/vgpu": "true",
              "tenant.cozystack.io/tenant-x": ""}
    a = p.namespace_from(decoded({"metadata": {"name": "tenant-x", "labels": labels}}))
    b = p.namespace_from(decoded({"metadata": {"name": "tenant-y", "labels": {"gpu.cozystack.io/vgpu": "true"}}}))
    assert a is not None and b is not None
    assert a.labels == labels and a.labels["kubernetes.io/metadata.name"] is a.name
    assert a.labels["gpu.cozystack.io/vgpu"] is b.labels["gpu.cozystack.io/vgpu"]


_words = st.text(max_size=12)
_maps = st.dictionaries(st.one_of(_words, st.sampled_from([model.ANN_RESTART_REVISION, model.ANN_RESTART_RESULT,
                                                              "kubernetes.io/metadata.name"])), _words, max_size=6)


@given(_maps, st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12))
def test_sharing_never_changes_a_value(m: dict[str, str], name: str, ns: str) -> None:
    obj = decoded({"metadata": {"name": name, "namespace": ns, "labels": m, "annotations": m,
                                "creationTimestamp": "2024-05-01T10:00:00Z",
                                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                                     "name": name, "controller": True}]},
                   "spec": {"className": name, "volumes": [{"secret": {"secretName": v}} for v in m.values() if v]},
                   "status": {"phase": name}})
    n, r, vm, vmi = p.namespace_from(obj), p.replica_secret_from(obj), p.vm_from(obj), p.vmi_from(obj)
    claim = p.gpu_claim_from(obj)
    assert n is not None and r is not None and vm is not None and vmi is not None and claim is not None
    assert (n.name, dict(n.labels)) == (name, m)
    assert (r.namespace, r.name, dict(r.labels), dict(r.annotations)) == (ns, name, m, m)
    assert dict(vm.annotations) == {k: v for k, v in m.items() if k.startswith(model.DOMAIN + "/")}
    assert (vmi.namespace, vmi.name, vmi.owner_vm, vmi.phase) == (ns, name, name, name)
    assert vmi.secret_volumes == tuple(v for v in m.values() if v)
    assert (claim.namespace, claim.name, claim.class_name) == (ns, name, name)
    assert object_key(obj) == shared_name_key(obj) == (ns, name)


REPLICA_VOLUME = {"name": "license", "secret": {"secretName": "nvidia-vgpu-license-l40s"}}
DRA = {"resourceClaims": [{"name": "gpu", "resourceClaimName": "l40s"}],
       "domain": {"devices": {"gpus": [{"name": "g", "claimName": "gpu"}]}}}


@pytest.mark.parametrize(("spec", "annotations", "held"), [
    ({}, {}, False),                                                          # an ordinary VM
    ({"volumes": [{"name": "c", "secret": {"secretName": "cloud-init"}}]}, {}, False),  # another Secret
    ({"volumes": [REPLICA_VOLUME]}, {}, True),                                # mounts a replica
    (DRA, {}, True),                                                          # names a GPU claim
    ({"resourceClaims": [{"name": "gpu"}]}, {}, True),                        # a claim not readable yet
    ({"domain": {"devices": {"gpus": [{"name": "g", "deviceName": "nvidia.com/L40S"}]}}}, {}, True),
    ({}, {model.ANN_GPU_CLAIMS: "l40s"}, True),                               # claims by annotation
    ({}, {model.ANN_DELIVERED_REVISION: "x"}, True),                          # stamped by the webhook
    ({}, {"example.com/licensectl.io": "x", "kubevirt.io/x": "y"}, False),    # others' annotations
])
def test_only_vmis_and_vms_that_ask_for_a_license_are_held(spec: dict[str, Any], annotations: dict[str, str],
                                                            held: bool) -> None:
    meta = {"name": "v", "namespace": "n", "annotations": annotations}
    assert p.vmi_relevant({"metadata": meta, "spec": spec}) is held
    # A VM asks through its template (the VMI it will create) ...
    vm = {"metadata": {"name": "v", "namespace": "n"},
          "spec": {"template": {"metadata": {"annotations": annotations}, "spec": spec}}}
    assert p.vm_relevant(vm) is held


def test_a_vm_is_held_for_its_own_marks_whatever_its_template() -> None:
    plain = {"metadata": {"name": "v", "namespace": "n"}, "spec": {"template": {"spec": {}}}}
    assert not p.vm_relevant(plain)
    # ... or by licensectl's intent / drain annotations (they outlive the VMI) and as a tenant-cluster worker.
    assert p.vm_relevant({**plain, "metadata": {"name": "v", "annotations": {model.ANN_RESTART_REVISION: "r"}}})
    for label in model.CAPK_LABELS:
        assert p.vm_relevant({**plain, "metadata": {"name": "v", "labels": {label: "x"}}})


@pytest.mark.parametrize("obj", GARBAGE)
def test_relevance_never_raises_on_garbage(obj: Any) -> None:
    for fn in (p.vmi_relevant, p.vm_relevant):
        assert fn(obj) in (True, False)
