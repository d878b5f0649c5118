"""The tenant adapter's parsing of what it reads: tenant Nodes and Pods."""

from __future__ import annotations

import datetime as dt

from licensectl.core import drain
from licensectl.kube.tenant import tenant_node, tenant_pod


def test_a_node_reads_its_provider_id_cordon_readiness_boot_and_marker() -> None:
    n = tenant_node({"metadata": {"name": "w1", "annotations": {drain.ANN_CORDONED_BY: "t/w1"}},
                     "spec": {"providerID": "kubevirt://w1", "unschedulable": True},
                     "status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                               {"type": "Ready", "status": "True"}],
                                "nodeInfo": {"bootID": "b1"}}})
    assert n == drain.TenantNode("w1", "kubevirt://w1", True, True, "b1", "t/w1")
    unknown = tenant_node({"metadata": {"name": "w2"}, "status": {"conditions": [{"type": "Ready",
                                                                                   "status": "Unknown"}]}})
    assert unknown.ready is None and not unknown.unschedulable and unknown.cordoned_by is None
    assert tenant_node({}).name == ""


def test_a_pod_reads_its_controller_mirror_deletion_storage_and_drain_label() -> None:
    p = tenant_pod({"metadata": {"namespace": "a", "name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z",
                                 "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}],
                                 "annotations": {drain.ANN_MIRROR_POD: "x"},
                                 "labels": {drain.LABEL_POD_DRAIN: "skip"}},
                    "spec": {"nodeName": "w1", "volumes": [{"name": "v", "emptyDir": {}}]},
                    "status": {"phase": "Running"}})
    assert (p.key, p.node_name, p.controller_kind, p.is_mirror, p.has_empty_dir, p.drain_label) == (
        "a/p", "w1", "ReplicaSet", True, True, "skip")
    assert p.deletion_timestamp == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_a_daemonset_pod_is_an_orphan_only_when_its_daemonset_is_gone() -> None:
    obj = {"metadata": {"namespace": "a", "name": "p",
                        "ownerReferences": [{"kind": "DaemonSet", "name": "ds", "controller": True}]},
           "spec": {"nodeName": "w1"}, "status": {"phase": "Running"}}
    assert not tenant_pod(obj).controller_missing
    assert tenant_pod(obj, frozenset({("a", "ds")})).controller_missing
    bare = tenant_pod({"metadata": {"namespace": "a", "name": "q"}, "spec": {}, "status": {}})
    assert bare.controller_kind is None and bare.phase == "Pending"
