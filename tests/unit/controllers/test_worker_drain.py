"""The drain shell's parsing of what it reads: Machine durations, tenant Nodes and Pods."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from licensectl import config
from licensectl.controllers.worker_drain import MachineSays, WorkerDrainer, go_duration_seconds, tenant_node, tenant_pod
from licensectl.core import drain
from licensectl.kube.api import ApiException, KubeClient


@pytest.mark.parametrize(("text", "seconds"), [
    ("10m0s", 600.0), ("1h", 3600.0), ("90s", 90.0), ("1h2m3s", 3723.0), ("1.5s", 1.5), ("500ms", 0.5),
    ("0s", 0.0), (" 20s ", 20.0),
])
def test_machine_drain_timeouts_read_as_metav1_durations(text: str, seconds: float) -> None:
    assert go_duration_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [None, "", "10", "ten minutes", "10m junk", "-5s", 600, "5x"])
def test_an_unreadable_duration_is_none_and_licensectl_s_default_applies(text: object) -> None:
    assert go_duration_seconds(text) is None


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


class _CustomObjects:
    """Answers the drainer's GETs from `objects`; a value that is an exception is raised instead."""

    def __init__(self, objects: dict[tuple[str, str], Any]) -> None:
        self.objects = objects

    async def get_namespaced_custom_object(self, _group: str, _version: str, _ns: str, plural: str,
                                           name: str) -> dict[str, Any]:
        got = self.objects.get((plural, name), ApiException(status=404))
        if isinstance(got, BaseException):
            raise got
        return dict(got)


def _drainer(objects: dict[tuple[str, str], Any]) -> WorkerDrainer:
    """A drainer whose management-cluster reads come from `objects` (its client never connects)."""
    unused = KubeClient(host="https://unused.invalid", session=None)  # type: ignore[arg-type]
    d = WorkerDrainer(mgmt=unused, kubevirt=None, events=None, metrics=None,  # type: ignore[arg-type]
                      settings=config.Settings(), clock=lambda: dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    d._custom = _CustomObjects(objects)
    return d


WORKER = drain.WorkerIdentity.from_vm("t", "kx-md-0", {drain.LABEL_CLUSTER_NAME: "kx",
                                                       drain.LABEL_ROLE: "worker"})
OWNED = {"metadata": {"ownerReferences": [{"kind": "Machine", "name": "m", "controller": True}]}}


async def test_a_failed_machine_read_is_no_answer_never_an_unexcluded_machine() -> None:
    assert WORKER is not None
    excluded = {"metadata": {"annotations": {drain.ANN_EXCLUDE_NODE_DRAINING: ""}}, "spec": {"nodeDrainTimeout": "90s"}}
    assert await _drainer({("kubevirtmachines", "kx-md-0"): OWNED, ("machines", "m"): excluded})._machine(
        WORKER) == MachineSays(90.0, True)
    for failing in (ApiException(status=500), TimeoutError()):
        assert await _drainer({("kubevirtmachines", "kx-md-0"): OWNED, ("machines", "m"): failing})._machine(
            WORKER) is None
        assert await _drainer({("kubevirtmachines", "kx-md-0"): failing})._machine(WORKER) is None
    # Absent is an answer: no KubevirtMachine, or no Machine, means Cluster API's defaults.
    assert await _drainer({})._machine(WORKER) == MachineSays()
    assert await _drainer({("kubevirtmachines", "kx-md-0"): OWNED})._machine(WORKER) == MachineSays()


async def test_a_failed_cluster_read_keeps_the_policy_last_read_or_gives_none() -> None:
    d = _drainer({("clusters", "kx"): ApiException(status=503)})
    assert await d._policy("t", "kx") is None
    d._custom = _CustomObjects({("clusters", "kx"): {"metadata": {"annotations": {
        drain.ANN_MAX_DISRUPTED_WORKERS: "3"}}}})
    assert (await d._policy("t", "kx")) == drain.ClusterPolicy(3, False)
    d._custom = _CustomObjects({("clusters", "kx"): ApiException(status=500)})
    assert (await d._policy("t", "kx")) == drain.ClusterPolicy(3, False)
    assert d.worker_limits() == {"t/kx": 3}
