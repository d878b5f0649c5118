"""The KubeVirt simulator and its restart proxy, against the real apiserver."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.rest import ApiException

from licensectl_dev.devcluster.kubeapi import api_client_from_kubeconfig, watch_until
from licensectl_dev.devcluster.vm_semantics import firmware_uuid

pytestmark = pytest.mark.cluster

KV = ("kubevirt.io", "v1")
RESTART = "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}/restart"


def _ready(vmi: dict[str, Any]) -> bool:
    conds = (vmi.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


async def _make_vm(api: ApiClient, ns: str, name: str, strategy: str = "Always") -> dict[str, Any]:
    co = client.CustomObjectsApi(api)
    vm: dict[str, Any] = await co.create_namespaced_custom_object(*KV, ns, "virtualmachines", {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"runStrategy": strategy, "template": {"metadata": {"labels": {"vm": name}},
                                                       "spec": {"domain": {"devices": {}}}}}})
    return vm


async def _ready_vmi(api: ApiClient, ns: str, name: str, not_uid: str = "") -> dict[str, Any]:
    co = client.CustomObjectsApi(api)
    return await watch_until(
        co.list_namespaced_custom_object, *KV, ns, "virtualmachineinstances",
        field_selector=f"metadata.name={name}", wait_seconds=30,
        predicate=lambda t, o: t != "DELETED" and o["metadata"]["uid"] != not_uid and _ready(o),
    )


async def _restart(api: ApiClient, ns: str, name: str, body: dict[str, Any] | None = None) -> int:
    """PUT the restart subresource with a kubernetes-asyncio client, as a controller would."""
    _, status, _ = await api.call_api(
        RESTART, "PUT", path_params={"namespace": ns, "name": name}, body=body or {},
        header_params={"Content-Type": "application/json", "Accept": "application/json"},
        auth_settings=["BearerToken"], response_types_map={}, _return_http_data_only=False,
    )
    return int(status)


async def _refused_restart_of_ready_vm(admin: ApiClient, caller: ApiClient, ns: str) -> int:
    """Create VM `vm1`, wait for its Ready VMI, and return the HTTP status `caller`'s restart fails with."""
    await _make_vm(admin, ns, "vm1")
    await _ready_vmi(admin, ns, "vm1")
    with pytest.raises(ApiException) as e:
        await _restart(caller, ns, "vm1")
    return int(e.value.status)


async def test_restart_recreates_the_vmi_with_a_new_uid_and_ready(
    api_client: ApiClient, proxied: ApiClient, namespace: str, kubevirt: Any
) -> None:
    await _make_vm(api_client, namespace, "vm1")
    first = await _ready_vmi(api_client, namespace, "vm1")
    uid1 = first["metadata"]["uid"]

    assert await _restart(proxied, namespace, "vm1") == 202
    second = await _ready_vmi(api_client, namespace, "vm1", not_uid=uid1)
    assert second["metadata"]["uid"] != uid1
    assert second["spec"]["domain"]["firmware"]["uuid"] == first["spec"]["domain"]["firmware"]["uuid"] \
        == firmware_uuid("vm1")

    rec = kubevirt.record
    [r] = rec.restarts_for(namespace, "vm1")
    assert (r.status, r.vmi_uid) == (202, uid1)
    assert rec.vmi_uids(namespace, "vm1") == [uid1, second["metadata"]["uid"]]
    assert [e.uid for e in rec.events_for(namespace, "vm1", "deleted")] == [uid1]
    assert rec.max_concurrent_unavailable(namespace) == 1
    # virt-controller trims both change requests once the new VMI runs.
    co = client.CustomObjectsApi(api_client)
    await watch_until(co.list_namespaced_custom_object, *KV, namespace, "virtualmachines",
                      field_selector="metadata.name=vm1", wait_seconds=15,
                      predicate=lambda t, o: not (o.get("status") or {}).get("stateChangeRequests"))


async def test_restart_of_missing_vm_is_404(proxied: ApiClient, namespace: str, kubevirt: Any) -> None:
    with pytest.raises(ApiException) as e:
        await _restart(proxied, namespace, "nope")
    assert e.value.status == 404
    assert kubevirt.record.restarts_for(namespace, "nope", accepted_only=False)[0].status == 404


async def test_restart_semantics_follow_virt_api(
    api_client: ApiClient, namespace: str, kubevirt_factory: Any
) -> None:
    env = await kubevirt_factory(stop_delay=2.0)  # graceful stop keeps the restart pending a while
    api = await api_client_from_kubeconfig(env.kubeconfig_path)
    try:
        await _make_vm(api_client, namespace, "halted", strategy="Halted")
        with pytest.raises(ApiException) as e:
            await _restart(api, namespace, "halted")
        assert e.value.status == 409

        await _make_vm(api_client, namespace, "busy")
        await _ready_vmi(api_client, namespace, "busy")
        with pytest.raises(ApiException) as e:
            await _restart(api, namespace, "busy", {"gracePeriodSeconds": 5})
        assert e.value.status == 400
        assert await _restart(api, namespace, "busy") == 202
        with pytest.raises(ApiException) as e:  # stop/start already underway: upstream answers 500
            await _restart(api, namespace, "busy")
        assert e.value.status == 500
        assert "already underway" in (e.value.body or "")
    finally:
        await api.close()


async def test_standalone_vmi_boots_but_is_never_restarted_or_replaced(
    api_client: ApiClient, proxied: ApiClient, namespace: str, kubevirt: Any
) -> None:
    co = client.CustomObjectsApi(api_client)
    created = await co.create_namespaced_custom_object(*KV, namespace, "virtualmachineinstances", {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "lonely"},
        "spec": {"domain": {"devices": {}}}})
    ready = await _ready_vmi(api_client, namespace, "lonely")
    assert ready["metadata"]["uid"] == created["metadata"]["uid"]
    assert not ready["metadata"].get("ownerReferences")
    with pytest.raises(ApiException) as e:
        await _restart(proxied, namespace, "lonely")
    assert e.value.status == 404
    # Deleting it is final: nothing recreates a VMI that no VM owns.
    await co.delete_namespaced_custom_object(*KV, namespace, "virtualmachineinstances", "lonely")
    await asyncio.sleep(1.0)
    with pytest.raises(ApiException) as e:
        await co.get_namespaced_custom_object(*KV, namespace, "virtualmachineinstances", "lonely")
    assert e.value.status == 404
    assert kubevirt.record.vmi_uids(namespace, "lonely") == [created["metadata"]["uid"]]


async def test_watch_and_writes_pass_through_the_proxy(
    api_client: ApiClient, proxied: ApiClient, namespace: str
) -> None:
    direct, via = client.CoreV1Api(api_client), client.CoreV1Api(proxied)

    async def writer() -> None:
        await asyncio.sleep(0.3)
        await direct.create_namespaced_config_map(namespace, {"metadata": {"name": "late"}, "data": {"k": "v"}})

    task = asyncio.create_task(writer())
    cm = await watch_until(via.list_namespaced_config_map, namespace, wait_seconds=15,
                           predicate=lambda t, o: t == "ADDED" and o["metadata"]["name"] == "late")
    await task
    assert cm["data"] == {"k": "v"}
    await via.patch_namespaced_config_map("late", namespace, {"data": {"k": "v2"}})
    assert (await direct.read_namespaced_config_map("late", namespace)).data == {"k": "v2"}
    await via.delete_namespaced_config_map("late", namespace)
    assert not (await direct.list_namespaced_config_map(namespace, field_selector="metadata.name=late")).items


async def test_restart_disabled_looks_like_a_cluster_without_the_subresource(
    api_client: ApiClient, namespace: str, kubevirt_factory: Any
) -> None:
    env = await kubevirt_factory(restart_enabled=False)
    api = await api_client_from_kubeconfig(env.kubeconfig_path)
    try:
        assert await _refused_restart_of_ready_vm(api_client, api, namespace) == 404
        assert env.record.restarts == []
    finally:
        await api.close()


async def test_restart_needs_rbac_on_the_subresource(
    api_client: ApiClient, namespace: str, kubevirt: Any
) -> None:
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": "ctl"}})
    tr = await core.create_namespaced_service_account_token("ctl", namespace, {"spec": {"expirationSeconds": 600}})
    token = tr.status.token
    path = kubevirt.proxy.kubeconfig_path.with_name("sa-kubeconfig")
    path.write_text(kubevirt.proxy.kubeconfig_for(token))
    sa_api = await api_client_from_kubeconfig(path)
    try:
        assert await _refused_restart_of_ready_vm(api_client, sa_api, namespace) == 403
        await rbac.create_namespaced_role(namespace, {"metadata": {"name": "restart"}, "rules": [{
            "apiGroups": ["subresources.kubevirt.io"], "resources": ["virtualmachines/restart"],
            "verbs": ["update"]}]})
        await rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": "restart"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "restart"},
            "subjects": [{"kind": "ServiceAccount", "name": "ctl", "namespace": namespace}]})
        assert await _restart(sa_api, namespace, "vm1") == 202
    finally:
        await sa_api.close()


async def test_go_clients_work_through_the_proxy(control_plane: Any, namespace: str, kubevirt: Any) -> None:
    """kubectl (client-go) only sends bearer tokens over TLS: the proxy must serve HTTPS."""

    async def kubectl(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            str(control_plane.kubectl), "--kubeconfig", str(kubevirt.kubeconfig_path), *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        return out.decode()

    assert kubevirt.proxy.url.startswith("https://127.0.0.1:")
    assert f"namespace/{namespace}" in await kubectl("get", "namespaces", "-o", "name")
    discovery = json.loads(await kubectl("get", "--raw", "/apis/subresources.kubevirt.io/v1"))
    assert [r["name"] for r in discovery["resources"]] == ["virtualmachines/restart"]
