"""The harness itself: a genuine control plane of the pinned version, loopback-only, leak-free."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from licensectl_dev.devcluster.controlplane import K8S_VERSION, ControlPlane
from licensectl_dev.devcluster.kubeapi import wait_deleted, watch_until
from licensectl_dev.devcluster.vm_semantics import firmware_uuid

pytestmark = pytest.mark.cluster


async def test_version_is_the_pinned_release(api_client: ApiClient, control_plane: ControlPlane) -> None:
    info = await client.VersionApi(api_client).get_code()
    print(f"kube-apiserver /version gitVersion={info.git_version} ({control_plane.server})")
    assert info.git_version == K8S_VERSION
    assert control_plane.version == K8S_VERSION


async def test_objects_and_a_vm_whose_vmi_turns_ready(
    api_client: ApiClient, namespace: str, kubevirt: Any, cleanup: Any
) -> None:
    core = client.CoreV1Api(api_client)
    co = client.CustomObjectsApi(api_client)
    await core.create_namespaced_secret(namespace, {
        "metadata": {"name": "nls-token"}, "stringData": {"client_configuration_token.tok": "x"}})
    cls_name = f"vgpu-{uuid.uuid4().hex[:6]}"
    await co.create_cluster_custom_object("gpu.cozystack.io", "v1alpha1", "gpuclasses", {
        "apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": cls_name},
        "spec": {"mode": "bogus-mode", "license": {"secretRef": {"namespace": namespace, "name": "nls-token"},
                                                   "featureType": 1}}})
    cleanup(lambda: co.delete_cluster_custom_object("gpu.cozystack.io", "v1alpha1", "gpuclasses", cls_name))
    stored = await co.get_cluster_custom_object("gpu.cozystack.io", "v1alpha1", "gpuclasses", cls_name)
    assert stored["spec"]["mode"] == "bogus-mode"  # the schema lets invalid modes in for licensectl to report

    vm = await co.create_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachines", {
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "vm1"},
        "spec": {"runStrategy": "Always", "template": {
            "metadata": {"labels": {"app": "gpu-guest"}},
            "spec": {"domain": {"devices": {}}, "volumes": [
                {"name": "license", "secret": {"secretName": "nls-token"}}]}}}})

    seen: list[tuple[str, str | None]] = []

    def ready(typ: str, vmi: dict[str, Any]) -> bool:
        seen.append((typ, (vmi.get("status") or {}).get("phase")))
        conds = (vmi.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    vmi = await watch_until(co.list_namespaced_custom_object, "kubevirt.io", "v1", namespace,
                            "virtualmachineinstances", predicate=ready, wait_seconds=30)
    assert vmi["metadata"]["name"] == "vm1"
    ref = vmi["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("VirtualMachine", vm["metadata"]["uid"], True)
    assert vmi["metadata"]["labels"] == {"app": "gpu-guest"}
    assert vmi["spec"]["volumes"] == [{"name": "license", "secret": {"secretName": "nls-token"}}]
    assert vmi["spec"]["domain"]["firmware"]["uuid"] == firmware_uuid("vm1")
    assert vmi["status"]["phase"] == "Running"
    phases = [p["phase"] for p in vmi["status"]["phaseTransitionTimestamps"]]
    assert phases.index("Scheduling") < phases.index("Running")
    assert ("ADDED", None) in seen or any(p == "Scheduling" for _, p in seen)  # watched it progress
    vm_now = await co.get_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachines", "vm1")
    assert vm_now["spec"]["template"]["spec"]["domain"]["firmware"]["uuid"] == firmware_uuid("vm1")


def _listening_inodes(proto_file: str) -> dict[str, str]:
    """inode -> local address (hex) of LISTEN sockets in /proc/net/tcp{,6}."""
    out: dict[str, str] = {}
    path = Path(proto_file)
    if not path.exists():
        return out
    for line in path.read_text().splitlines()[1:]:
        parts = line.split()
        if parts[3] == "0A":  # TCP_LISTEN
            out[parts[9]] = parts[1]
    return out


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def test_harness_listens_on_loopback_only(control_plane: ControlPlane) -> None:
    v4 = _listening_inodes("/proc/net/tcp")
    v6 = _listening_inodes("/proc/net/tcp6")
    found: list[tuple[str, str]] = []
    for name, pid in control_plane.pids.items():
        for inode in _socket_inodes(pid):
            if inode in v6:
                pytest.fail(f"{name} listens on IPv6 {v6[inode]}")
            if inode in v4:
                found.append((name, v4[inode]))
    assert {n for n, _ in found} == {"etcd", "kube-apiserver", "kube-controller-manager"}
    for name, addr in found:
        ip_hex = addr.split(":")[0]
        assert ip_hex == "0100007F", f"{name} listens on {addr}, not 127.0.0.1"


def test_separate_control_plane_restarts_keep_data_and_stop_leaves_nothing(control_plane: ControlPlane) -> None:
    cp = ControlPlane(bin_dir=control_plane.bin_dir)
    with cp:
        pids = dict(cp.pids)
        work_dir = cp.work_dir
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager"}

        def kubectl(*args: str) -> str:
            r = subprocess.run([str(cp.kubectl), "--kubeconfig", str(cp.kubeconfig_path), *args],
                               capture_output=True, text=True, timeout=60, check=False)
            assert r.returncode == 0, r.stderr
            return r.stdout

        kubectl("create", "namespace", "survives-restarts")
        cp.restart_etcd()
        cp.restart_apiserver()
        assert cp.pids["etcd"] != pids["etcd"]
        assert cp.pids["kube-apiserver"] != pids["kube-apiserver"]
        assert "survives-restarts" in kubectl("get", "namespace", "-o", "name")
        all_pids = set(pids.values()) | set(cp.pids.values())
    assert cp.pids == {}
    for pid in all_pids:
        assert not Path(f"/proc/{pid}").exists(), f"pid {pid} still alive after stop()"
    assert work_dir is not None and not work_dir.exists()


async def test_deleted_namespace_is_finalized_and_owned_objects_are_collected(
    api_client: ApiClient, namespace_factory: Any
) -> None:
    core = client.CoreV1Api(api_client)
    ns = await namespace_factory("gc")
    owner = await core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    await core.create_namespaced_config_map(ns, {"metadata": {"name": "dependent", "ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}]}})
    await core.delete_namespaced_config_map("owner", ns)
    await wait_deleted(core.list_namespaced_config_map, ns, name="dependent", wait_seconds=60)

    await core.delete_namespace(ns)
    await wait_deleted(core.list_namespace, name=ns, wait_seconds=60)
