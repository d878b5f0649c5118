"""The drain shell against the in-memory ports: cordons guarded by the marker, reads that fail are no answer."""

from __future__ import annotations

import datetime as dt

from licensectl import config
from licensectl.controllers.worker_drain import WorkerDrainer
from licensectl.core import drain
from licensectl.core.ports import MachineSays
from licensectl_dev.testkit.memory import MemoryClusterApi, MemoryTenantCluster, MemoryTenantClusters

WORKER = drain.WorkerIdentity.from_vm("t", "kx-md-0", {drain.LABEL_CLUSTER_NAME: "kx",
                                                       drain.LABEL_ROLE: "worker"})


def _drainer(cluster_api: MemoryClusterApi | None = None) -> WorkerDrainer:
    return WorkerDrainer(cluster_api=cluster_api or MemoryClusterApi(), tenants=MemoryTenantClusters(),
                         kubevirt=None, events=None, metrics=None,  # type: ignore[arg-type]
                         settings=config.Settings(), clock=lambda: dt.datetime(2026, 1, 1, tzinfo=dt.UTC))


async def test_an_uncordon_touches_only_a_node_carrying_this_workers_marker() -> None:
    tenant = MemoryTenantCluster([drain.TenantNode("w1", "kubevirt://w1", unschedulable=True, cordoned_by="hoster"),
                                  drain.TenantNode("w2", "kubevirt://w2")])
    d = _drainer()
    await d._patch_node(tenant, "w1", unschedulable=False, marker=None, owner="t/kx-md-0")
    assert tenant.nodes_by_name["w1"][0].unschedulable and ("uncordon", "w1") not in tenant.calls
    await d._patch_node(tenant, "w2", unschedulable=True, marker="t/kx-md-0", owner="t/kx-md-0")
    assert tenant.nodes_by_name["w2"][0].cordoned_by == "t/kx-md-0"
    await d._patch_node(tenant, "w2", unschedulable=False, marker=None, owner="t/kx-md-0")
    node = tenant.nodes_by_name["w2"][0]
    assert not node.unschedulable and node.cordoned_by is None
    await d._patch_node(tenant, "gone", unschedulable=False, marker=None, owner="t/kx-md-0")  # absent: no write


async def test_failed_cluster_api_reads_are_no_answer() -> None:
    assert WORKER is not None
    api = MemoryClusterApi()
    api.machines[("t", "kx-md-0")] = MachineSays(90.0, True)
    d = _drainer(api)
    assert await d._machine(WORKER) == MachineSays(90.0, True)
    api.failing.add(("t", "kx-md-0"))
    assert await d._machine(WORKER) is None
    api.cluster_annotations_by_key[("t", "kx")] = {drain.ANN_MAX_DISRUPTED_WORKERS: "2"}
    assert await d._policy("t", "kx") == drain.ClusterPolicy(2, False)
    api.failing.add(("t", "kx"))
    assert await d._policy("t", "kx") == drain.ClusterPolicy(2, False)  # as last read
    assert await _drainer(api)._policy("t", "kx") is None  # never read: no policy, the cluster waits
