"""A CAPK tenant cluster on the dev cluster: real tenant control plane + scheduler, simulated kubelets.

Worker VMs in the management cluster become Nodes of the tenant cluster (TenantNodeAgent), a
Deployment guarded by a PodDisruptionBudget runs on them, the Eviction API honours the budget, and a
VMI restart reboots the Node (Ready Unknown, then Ready with a new boot ID and its Pods back).
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.rest import ApiException

from licensectl_dev.devcluster.fleet import create_vm
from licensectl_dev.devcluster.tenant_cluster import (
    CLUSTER_NAME_LABEL,
    MACHINE_NAME_LABEL,
    ROLE_LABEL,
    api_client_from_kubeconfig_secret,
)
from licensectl_dev.devcluster.tenant_nodes import TAINT_UNREACHABLE
from licensectl_dev.testkit.poll import eventually

pytestmark = pytest.mark.cluster

CLUSTER = "tenant-k8s"
APP_NS = "shop"
RESTART = "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}/restart"
# Worker VM name -> the KubevirtMachine name CAPK labels it with (None: VM name is the machine name).
WORKERS = {"w0": f"{CLUSTER}-md-0-abc", "w1": f"{CLUSTER}-md-0-def", "w2": None}


def _cond(obj: Any, typ: str) -> str | None:
    for c in (obj.status.conditions or []) if obj.status else []:
        if c.type == typ:
            return str(c.status)
    return None


def _ready_pods(pods: list[Any]) -> list[Any]:
    return [p for p in pods if p.metadata.deletion_timestamp is None and _cond(p, "Ready") == "True"]


async def _vmi_uid(api: ApiClient, ns: str, name: str) -> str:
    co: Any = client.CustomObjectsApi(api)
    vmi = await co.get_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances", name)
    return str(vmi["metadata"]["uid"])


async def _evict(core: Any, pod: Any) -> None:
    await core.create_namespaced_pod_eviction(pod.metadata.name, APP_NS, body={
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": pod.metadata.name, "namespace": APP_NS}})


@pytest_asyncio.fixture(loop_scope="session")
async def kubevirt(kubevirt_factory: Any) -> Any:
    # A 2 s graceful guest stop keeps the restarted worker down long enough to observe it.
    return await kubevirt_factory(ready_delay=0.2, stop_delay=2.0)


async def test_tenant_workers_become_nodes_honour_pdb_and_reboot(
    api_client: ApiClient, namespace: str, kubevirt: Any, proxied: ApiClient, tenant_cluster_factory: Any,
) -> None:
    env = await tenant_cluster_factory(namespace, CLUSTER, kubevirt=kubevirt)
    for vm, machine in WORKERS.items():
        labels = {CLUSTER_NAME_LABEL: CLUSTER, ROLE_LABEL: "worker"}
        if machine:
            labels[MACHINE_NAME_LABEL] = machine
        await create_vm(api_client, namespace, vm, labels=labels)

    # The published `<cluster>-kubeconfig` Secret reaches the tenant cluster, as a CAPI-aware controller would.
    tenant = await api_client_from_kubeconfig_secret(api_client, namespace, CLUSTER)
    try:
        core: Any = client.CoreV1Api(tenant)

        async def nodes_ready() -> dict[str, Any] | None:
            nodes = {n.metadata.name: n for n in (await core.list_node()).items}
            ok = set(WORKERS) <= set(nodes) and all(
                _cond(nodes[w], "Ready") == "True" and not nodes[w].spec.taints for w in WORKERS)
            return nodes if ok else None

        nodes = await eventually(nodes_ready, timeout=30, what="three Ready worker Nodes without taints")
        for vm, machine in WORKERS.items():
            n = nodes[vm]
            assert n.spec.provider_id == f"kubevirt://{machine or vm}"
            assert n.metadata.labels["kubernetes.io/hostname"] == vm
            assert "node-role.kubernetes.io/control-plane" not in n.metadata.labels
            assert n.status.node_info.boot_id == await _vmi_uid(api_client, namespace, vm)
            assert n.status.allocatable["pods"] == "110"

        # A Deployment (one replica per Node) guarded by a PDB with maxUnavailable 1.
        await core.create_namespace({"metadata": {"name": APP_NS}})

        async def default_sa() -> list[Any]:
            return list((await core.list_namespaced_service_account(APP_NS)).items)

        await eventually(default_sa, timeout=30, what="the default ServiceAccount (serviceaccount-controller)")
        labels = {"app": "web"}
        await client.AppsV1Api(tenant).create_namespaced_deployment(APP_NS, {
            "metadata": {"name": "web"},
            "spec": {"replicas": 3, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "web", "image": "registry.example/web:1"}],
                         "topologySpreadConstraints": [{
                             "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                             "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": labels}}]}}}})
        policy: Any = client.PolicyV1Api(tenant)
        await policy.create_namespaced_pod_disruption_budget(APP_NS, {
            "metadata": {"name": "web"}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}})

        async def web_pods() -> list[Any]:
            return list((await core.list_namespaced_pod(APP_NS, label_selector="app=web")).items)

        async def pdb_allows(n: int) -> bool:
            pdb = await policy.read_namespaced_pod_disruption_budget("web", APP_NS)
            st = pdb.status
            return bool(st and st.observed_generation == pdb.metadata.generation and st.disruptions_allowed == n
                        and st.current_healthy == 3)

        async def three_ready() -> list[Any] | None:
            ready = _ready_pods(await web_pods())
            return ready if len(ready) == 3 else None

        pods = await eventually(three_ready, timeout=60, what="three Ready web Pods")
        assert sorted(p.spec.node_name for p in pods) == sorted(WORKERS)  # spread by kube-scheduler
        assert all(p.status.phase == "Running" and p.status.pod_ip for p in pods)
        assert all(p.status.container_statuses[0].ready for p in pods)
        await eventually(lambda: pdb_allows(1), timeout=30, what="PDB allowing one disruption")

        # The first eviction is allowed; a second one right away is refused: the budget is spent.
        first, second, third = pods
        await _evict(core, first)
        with pytest.raises(ApiException) as refused:
            await _evict(core, second)
        assert refused.value.status == 429

        # The kubelet (agent) finishes the evicted Pod; its replacement runs; the budget is back.
        async def replaced() -> list[Any] | None:
            ready = _ready_pods(await web_pods())
            uids = {p.metadata.uid for p in ready}
            ok = len(ready) == 3 and first.metadata.uid not in uids and await pdb_allows(1)
            return ready if ok else None

        pods = await eventually(replaced, timeout=60, what="a Ready replacement and the PDB allowing one again")
        assert any(d[2] == first.metadata.name for d in env.agent.record.pod_deletions)
        await _evict(core, second)

        # Rebooting a worker: restart its VMI through KubeVirt's restart subresource.
        await eventually(three_ready, timeout=60, what="three Ready web Pods after the second eviction")
        victim = third.spec.node_name
        old_boot = await _vmi_uid(api_client, namespace, victim)
        _, status, _ = await proxied.call_api(
            RESTART, "PUT", path_params={"namespace": namespace, "name": victim}, body={},
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            auth_settings=["BearerToken"], response_types_map={}, _return_http_data_only=False)
        assert status == 202

        async def node_down() -> bool:
            node = await core.read_node(victim)
            on_node = [p for p in await web_pods() if p.spec.node_name == victim]
            taints = {(t.key, t.effect) for t in node.spec.taints or []}
            return (_cond(node, "Ready") == "Unknown" and bool(on_node)
                    and all(_cond(p, "Ready") == "False" for p in on_node)
                    and taints == {(TAINT_UNREACHABLE, "NoSchedule"), (TAINT_UNREACHABLE, "NoExecute")})

        await eventually(node_down, timeout=30, interval=0.05, what=f"{victim} Ready=Unknown, its Pods not Ready")

        async def node_back() -> Any:
            node = await core.read_node(victim)
            boot = node.status.node_info.boot_id
            return node if _cond(node, "Ready") == "True" and boot != old_boot and not node.spec.taints else None

        node = await eventually(node_back, timeout=30, what=f"{victim} Ready again with a new boot ID")
        assert node.status.node_info.boot_id == await _vmi_uid(api_client, namespace, victim)
        assert env.agent.record.ready_states(victim)[-3:] == ["True", "Unknown", "True"]
        assert env.agent.record.boot_ids[victim] == [old_boot, node.status.node_info.boot_id]

        # The same Pod objects run again on the rebooted Node, their containers restarted once.
        async def pods_back() -> list[Any] | None:
            on_node = [p for p in _ready_pods(await web_pods()) if p.spec.node_name == victim]
            return on_node or None

        back = await eventually(pods_back, timeout=30, what=f"web Pods Ready again on {victim}")
        assert third.metadata.uid in {p.metadata.uid for p in back}
        assert [p.status.container_statuses[0].restart_count for p in back] == [1] * len(back)
    finally:
        await tenant.close()
