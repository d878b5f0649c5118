"""Projections over realistic API objects and over garbage: they must never raise."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest

from licensectl import model
from licensectl.kube import projections as p

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
