"""Pure parts of the dev-cluster harness: ports, kubeconfigs, cache paths, KubeVirt semantics."""

from __future__ import annotations

import asyncio
import base64
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.controlplane import (
    BINARIES,
    ETCD_VERSION,
    K8S_VERSION,
    BuildError,
    binaries_dir,
    build_commands,
    cache_root,
    ensure_binaries,
    free_port,
    render_kubeconfig,
)
from licensectl_dev.devcluster.kubeapi import load_crd_manifests
from licensectl_dev.devcluster.ledger import Interval, SimulatorRecord
from licensectl_dev.devcluster.virt_controller import WatchedKind
from licensectl_dev.devcluster.vm_semantics import (
    change_request_patch,
    firmware_uuid,
    run_strategy,
    trim_first_request_needed,
    vmi_from_vm,
)
from tests.unit.kube.test_watch_unit import FakeApi, FakeResp, ev, obj, page


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))  # would raise if still taken
        assert s.getsockname() == ("127.0.0.1", port)


def test_free_port_does_not_repeat_immediately() -> None:
    assert len({free_port() for _ in range(20)}) > 1


def test_render_kubeconfig_with_token_round_trips() -> None:
    ca = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    doc = yaml.safe_load(render_kubeconfig("https://127.0.0.1:6443", ca, token="s3cr3t", namespace="ns1"))
    assert doc["kind"] == "Config"
    ctx_name = doc["current-context"]
    ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
    user = next(u["user"] for u in doc["users"] if u["name"] == ctx["user"])
    assert cluster["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["certificate-authority-data"]) == ca
    assert user == {"token": "s3cr3t"}
    assert ctx["namespace"] == "ns1"


def test_render_kubeconfig_with_client_cert() -> None:
    doc = yaml.safe_load(render_kubeconfig("https://127.0.0.1:1", "CA", client_cert_pem="CERT", client_key_pem=b"KEY"))
    user = doc["users"][0]["user"]
    assert base64.b64decode(user["client-certificate-data"]) == b"CERT"
    assert base64.b64decode(user["client-key-data"]) == b"KEY"
    assert "token" not in user


def test_render_kubeconfig_without_ca_or_credential() -> None:
    doc = yaml.safe_load(render_kubeconfig("http://127.0.0.1:2", None, token="t"))
    assert "certificate-authority-data" not in doc["clusters"][0]["cluster"]
    with pytest.raises(ValueError):
        render_kubeconfig("https://127.0.0.1:1", "CA")


def test_cache_dir_honours_licensectl_cache_dir() -> None:
    env = {"LICENSECTL_CACHE_DIR": "/x/cache", "XDG_CACHE_HOME": "/y", "HOME": "/home/u"}
    assert cache_root(env) == Path("/x/cache")
    assert binaries_dir(env) == Path(f"/x/cache/controlplane/k8s-{K8S_VERSION}-etcd-{ETCD_VERSION}/bin")


def test_cache_dir_falls_back_to_xdg_then_home() -> None:
    assert cache_root({"XDG_CACHE_HOME": "/y", "HOME": "/home/u"}) == Path("/y/licensectl")
    assert cache_root({"HOME": "/home/u"}) == Path("/home/u/.cache/licensectl")
    assert cache_root({"LICENSECTL_CACHE_DIR": "", "HOME": "/home/u"}) == Path("/home/u/.cache/licensectl")


def test_build_commands_stamp_the_pinned_version_and_write_into_out_dir(tmp_path: Path) -> None:
    cmds = build_commands(tmp_path)
    etcd_cwd, etcd_argv = cmds[0]
    kube_cwd, kube_argv = cmds[1]
    assert etcd_cwd.name == "etcd" and etcd_argv[-1] == "go.etcd.io/etcd/server/v3"
    assert str(tmp_path / "etcd") in etcd_argv
    ldflags = kube_argv[kube_argv.index("-ldflags") + 1]
    assert f"k8s.io/component-base/version.gitVersion={K8S_VERSION}" in ldflags
    assert f"k8s.io/client-go/pkg/version.gitVersion={K8S_VERSION}" in ldflags
    assert kube_argv[kube_argv.index("-o") + 1].startswith(str(tmp_path))
    assert {"k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kubectl"} <= set(kube_argv)
    assert "-trimpath" in kube_argv and "-trimpath" in etcd_argv
    assert (kube_cwd / "go.mod").is_file() and (etcd_cwd / "go.mod").is_file()


def test_crds_status_subresource_and_gpu_mode_is_free_text() -> None:
    crds = {d["metadata"]["name"]: d for d in load_crd_manifests()}
    assert set(crds) == {"virtualmachines.kubevirt.io", "virtualmachineinstances.kubevirt.io",
                         "gpuclasses.gpu.cozystack.io", "gpuclaims.gpu.cozystack.io",
                         "datavolumes.cdi.kubevirt.io", "datasources.cdi.kubevirt.io",
                         "clusters.cluster.x-k8s.io", "machines.cluster.x-k8s.io",
                         "kubevirtmachines.infrastructure.cluster.x-k8s.io"}
    for n in ("virtualmachines.kubevirt.io", "virtualmachineinstances.kubevirt.io"):
        v = crds[n]["spec"]["versions"][0]
        assert v["subresources"] == {"status": {}}
        assert v["served"] and v["storage"]
    assert crds["gpuclasses.gpu.cozystack.io"]["spec"]["scope"] == "Cluster"
    assert crds["gpuclaims.gpu.cozystack.io"]["spec"]["scope"] == "Namespaced"
    mode = crds["gpuclasses.gpu.cozystack.io"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]["properties"]["mode"]
    assert mode["type"] == "string" and "enum" not in mode


# --- KubeVirt semantics ---------------------------------------------------------------------
def test_firmware_uuid_is_stable_per_vm_name_and_sha1_based() -> None:
    a = firmware_uuid("vm-a")
    assert a == firmware_uuid("vm-a") != firmware_uuid("vm-b")
    assert uuid.UUID(a).version == 5


def test_vmi_from_vm_is_the_template_owned_by_its_vm_with_the_firmware_uuid_filled_in() -> None:
    vm = fleet.vm_body("t1", "vm0", license_secret="replica", annotations={"on-the-vm": "only"})
    vm["metadata"] |= {"uid": "uid-1", "generation": 2}
    vm["spec"]["template"]["metadata"]["annotations"] = {"from": "template"}
    vmi = vmi_from_vm(vm)
    assert vmi["apiVersion"] == "kubevirt.io/v1" and vmi["kind"] == "VirtualMachineInstance"
    assert vmi["metadata"] == {
        "name": "vm0", "namespace": "t1", "labels": {"kubevirt.io/vm": "vm0"},
        "annotations": {"from": "template", "kubevirt.io/vm-generation": "2"},
        "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "vm0",
                             "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]}
    assert vmi["spec"]["domain"]["firmware"] == {"uuid": firmware_uuid("vm0")}
    assert vmi["spec"]["volumes"] == vm["spec"]["template"]["spec"]["volumes"]
    assert "firmware" not in vm["spec"]["template"]["spec"]["domain"]  # the VM's template is left alone
    assert vmi_from_vm(vm, finalizers=["stop"])["metadata"]["finalizers"] == ["stop"]


def test_run_strategy_prefers_run_strategy_then_legacy_running() -> None:
    assert run_strategy({"spec": {"runStrategy": "Manual", "running": True}}) == "Manual"
    assert run_strategy({"spec": {"running": True}}) == "Always"
    assert run_strategy({"spec": {"running": False}}) == "Halted"
    assert run_strategy({"spec": {}}) == "Halted"


def _vmi(uid: str, **status: object) -> dict[str, object]:
    return {"metadata": {"uid": uid}, "status": dict(status)}


def test_restart_patch_adds_stop_and_start_guarded_by_test() -> None:
    vm = {"status": {"ready": True}}
    ops = change_request_patch(vm, [{"action": "Stop", "uid": "u1"}, {"action": "Start"}])
    assert ops[0] == {"op": "test", "path": "/status/stateChangeRequests", "value": None}
    assert ops[1]["op"] == "add" and ops[1]["value"][0] == {"action": "Stop", "uid": "u1"}


def test_restart_patch_on_empty_status_adds_status() -> None:
    ops = change_request_patch({}, [{"action": "Start"}])
    assert ops == [{"op": "add", "path": "/status", "value": {"stateChangeRequests": [{"action": "Start"}]}}]


def test_restart_patch_refuses_when_a_request_is_pending() -> None:
    vm = {"status": {"stateChangeRequests": [{"action": "Stop", "uid": "u1"}, {"action": "Start"}]}}
    with pytest.raises(ValueError, match="already underway"):
        change_request_patch(vm, [{"action": "Stop", "uid": "u1"}, {"action": "Start"}])
    # A lone stop request replaces pending ones (upstream's special case).
    ops = change_request_patch(vm, [{"action": "Stop", "uid": "u2"}])
    assert ops[-1]["op"] == "replace"


def test_trim_first_request() -> None:
    stop_then_start = {"status": {"stateChangeRequests": [{"action": "Stop", "uid": "u1"}, {"action": "Start"}]}}
    assert not trim_first_request_needed(stop_then_start, _vmi("u1", phase="Running"))
    assert trim_first_request_needed(stop_then_start, None)
    assert trim_first_request_needed(stop_then_start, _vmi("u2"))
    start = {"status": {"stateChangeRequests": [{"action": "Start"}]}}
    assert not trim_first_request_needed(start, None)
    assert trim_first_request_needed(start, _vmi("u2", phase="Scheduling"))
    assert not trim_first_request_needed(start, _vmi("u2", phase="Failed"))
    assert not trim_first_request_needed({"status": {}}, None)


def test_max_concurrent_unavailable_sweeps_intervals() -> None:
    r = SimulatorRecord()
    r.unavailable = [
        Interval("a", "vm1", 0.0, 2.0),
        Interval("a", "vm2", 1.0, 3.0),
        Interval("b", "vm3", 2.0, 4.0),  # starts when vm1 ends: not concurrent with it
        Interval("b", "vm4", 5.0, None),  # still open
    ]
    assert r.max_concurrent_unavailable() == 2
    assert r.max_concurrent_unavailable("a") == 2
    assert r.max_concurrent_unavailable("b") == 1
    assert SimulatorRecord().max_concurrent_unavailable() == 0


def test_first_boot_is_not_unavailability_but_loss_of_ready_is() -> None:
    r = SimulatorRecord()
    r.vm_down("ns", "vm", 1.0)  # never Ready before: a first boot
    assert r.unavailable == []
    r.vm_up("ns", "vm", 2.0)
    r.vm_down("ns", "vm", 3.0)
    r.vm_down("ns", "vm", 3.5)  # already down: same interval
    assert r.currently_unavailable() == [("ns", "vm")]
    r.vm_up("ns", "vm", 4.0)
    assert [(i.start, i.end) for i in r.unavailable] == [(3.0, 4.0)]


def test_a_deleted_vm_closes_its_interval_and_is_no_longer_tracked() -> None:
    r = SimulatorRecord()
    r.vm_up("ns", "vm", 1.0)
    r.vm_down("ns", "vm", 2.0)
    r.vm_gone("ns", "vm", 2.5)
    r.vm_down("ns", "vm", 3.0)  # e.g. its VMI garbage-collected afterwards
    assert [(i.start, i.end) for i in r.unavailable] == [(2.0, 2.5)]
    assert r.currently_unavailable() == []


async def test_watched_kind_turns_informer_changes_into_kubevirt_style_events() -> None:
    """The simulator reacts to ADDED/MODIFIED/DELETED like virt-controller's handlers; a DELETED
    carries the last object seen (its UID and ownerReferences), and `store` follows every change."""
    api = FakeApi()
    api.list_round([page([obj("a", "1"), obj("b", "2")], "10")])
    api.watches.append(FakeResp(200, [ev("MODIFIED", obj("a", "11", spec={"v": 2})),
                                      ev("DELETED", obj("b", "12"))], hang=api.release))
    seen: list[tuple[str, str, str]] = []
    all_four = asyncio.Event()

    def on_event(typ: str, o: dict[str, Any]) -> None:
        seen.append((typ, o["metadata"]["name"], o["metadata"]["resourceVersion"]))
        if len(seen) == 4:
            all_four.set()

    kind = WatchedKind("things", api, on_event)
    kind.start()
    try:
        await kind.wait_synced(2)
        await asyncio.wait_for(all_four.wait(), 3)
    finally:
        await kind.stop()
    assert seen == [("ADDED", "a", "1"), ("ADDED", "b", "2"), ("MODIFIED", "a", "11"), ("DELETED", "b", "2")]
    assert list(kind.store) == [("n", "a")] and kind.store[("n", "a")]["spec"] == {"v": 2}


def test_ensure_binaries_reports_a_cache_hit(tmp_path: Path) -> None:
    env = {"LICENSECTL_CACHE_DIR": str(tmp_path), "PATH": str(tmp_path / "nothing")}
    bin_dir = binaries_dir(env)
    bin_dir.mkdir(parents=True)
    for b in BINARIES:
        (bin_dir / b).write_text("#!/bin/sh\n")
        (bin_dir / b).chmod(0o755)
    lines: list[str] = []
    assert ensure_binaries(log=lines.append, env=env) == bin_dir
    assert lines == [f"control plane: cache hit {bin_dir}"]


def test_ensure_binaries_without_go_is_a_clear_error(tmp_path: Path) -> None:
    env = {"LICENSECTL_CACHE_DIR": str(tmp_path), "PATH": str(tmp_path / "nothing")}
    with pytest.raises(BuildError, match=r"`go`\) is not on PATH"):
        ensure_binaries(log=lambda _m: None, env=env)
    assert not binaries_dir(env).exists()
