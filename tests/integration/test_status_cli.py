"""`licensectl status` and `rollout status` read the running controller's own /v1/status.

A real controller process serves guests reported by the real probe script; the CLI (a real
`python -m licensectl` process) must show exactly the guest states the controller exports on
/metrics. Three ways to reach it: `--url` (a port-forward), the API server's service proxy, and the
offline fallback when neither answers, labelled as such. The API server proxies only to endpoints
that are Pods with that IP, and never to loopback: for that part the controller listens on all
interfaces and a Pod object whose status carries this machine's non-loopback address stands in for
its pod (nothing runs it; no kubelet here).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, DiscoveryV1Api, RbacAuthorizationV1Api

from licensectl.cli.status_fetch import STATUS_SERVICE, STATUS_SERVICE_PORT
from licensectl.cli.status_offline import WatchedCluster
from licensectl.config import Settings
from licensectl.core.render import replica_name
from licensectl.kube.client import make_api_client, request_tracing
from licensectl.kube.server_clock import ServerClock
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster import webhook as webhook_registration
from licensectl_dev.devcluster.controlplane import ControlPlane, free_port, render_kubeconfig
from licensectl_dev.devcluster.guest_sim import GuestProfile, SimulatedGuest
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.metrics_text import parse_metrics
from licensectl_dev.testkit.process import run_licensectl

from ..conftest import KubevirtEnv
from .support import eventually, make_world, read_secret

pytestmark = pytest.mark.asyncio(loop_scope="session")

PROFILES = {"good": GuestProfile.licensed(), "bad": GuestProfile.unlicensed()}


def host_address() -> str | None:
    """This machine's address on a non-loopback interface (the route a UDP socket would take)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: connect() on UDP only picks the route
        except OSError:
            return None
        addr = str(s.getsockname()[0])
    return None if addr.startswith("127.") else addr


async def cli(kubeconfig: Path, namespace: str, root: str, *argv: str) -> tuple[int, str, str]:
    r = await run_licensectl(*argv, kubeconfig=kubeconfig, env={
        "LICENSECTL_NAMESPACE": namespace, "LICENSECTL_ROOT_TENANT": root})
    return r.code, r.out, r.err


def guest_states_from_metrics(text: str, namespace: str) -> dict[str, str]:
    """vmi -> the state whose licensectl_guest_license_state series is 1."""
    return {ls["vmi"]: ls["state"] for ls in parse_metrics(text).labels_of("licensectl_guest_license_state", 1.0)
            if ls.get("namespace") == namespace}


def guest_states_from_status(doc: dict[str, Any], namespace: str) -> dict[str, str]:
    return {g["vmi"]: g["state"] for g in (doc.get("guests") or {}).get("list", []) if g["namespace"] == namespace}


class Rig:
    def __init__(self, api: ApiClient, kv: KubevirtEnv, w: Any, tenant: str, controller: ControllerProcess) -> None:
        self.api, self.kv, self.w, self.tenant, self.controller = api, kv, w, tenant, controller

    async def cli(self, *argv: str) -> tuple[int, str, str]:
        return await cli(self.kv.kubeconfig_path, self.w.controller_ns, self.w.root_name, *argv)

    async def metrics_states(self) -> dict[str, str]:
        got = await self.controller.get("/metrics")
        assert got is not None and got[0] == 200
        return guest_states_from_metrics(got[1], self.tenant)


@pytest_asyncio.fixture(loop_scope="session")
async def rig(api_client: ApiClient, kubevirt: KubevirtEnv, namespace_factory: Any, cleanup: Any,
              tmp_path: Path) -> AsyncIterator[Rig]:
    w = await make_world(api_client, namespace_factory, cleanup)
    tenant = (await w.tenant())["metadata"]["name"]
    await fleet.create_claim(api_client, tenant, "gpu", class_name=w.cls)
    port = free_port()
    # All interfaces, so the API server's service proxy can reach it on the host address too.
    c = ControllerProcess(kubevirt.kubeconfig_path, w.controller_ns, log_dir=tmp_path, metrics_port=port,
                          settings={"log_level": "info", "settle_seconds": 0, "root_tenant": w.root_name},
                          args=["--metrics-address", f"0.0.0.0:{port}"], webhook_api=api_client)
    await c.start()
    guests: list[SimulatedGuest] = []
    try:
        await c.wait_ready()
        await eventually(lambda: read_secret(api_client, tenant, replica_name(w.cls)), what="replica")
        await asyncio.sleep(1.1)
        await webhook_registration.wait_delivery(api_client, namespace=tenant, claim="gpu")
        for name in PROFILES:  # no license volume in the VM: the webhook adds it
            await fleet.create_vm(api_client, tenant, name, gpu_claims=["gpu"])
        for name, profile in PROFILES.items():
            g = SimulatedGuest(tenant, name, profile)
            guests.append(g)

            async def booted(g: SimulatedGuest = g) -> bool:
                try:
                    return await g.boot(api_client, report_url=c.reports_url) == 0 and await g.probe() == 0
                except ApiException as e:  # the simulator has not created the VMI yet
                    if e.status != 404:
                        raise
                    return False

            await eventually(booted, timeout=60, what=f"{name} booted and probed")
        r = Rig(api_client, kubevirt, w, tenant, c)
        await eventually(lambda: _both(r), timeout=60, what="both guests on /metrics")
        yield r
    finally:
        for g in guests:
            g.cleanup()
        await c.close()


async def _both(r: Rig) -> bool:
    return set(await r.metrics_states()) == set(PROFILES)


async def test_status_through_a_port_forward_url_matches_metrics(rig: Rig) -> None:
    code, out, err = await rig.cli("status", "-o", "json", "--url", f"http://127.0.0.1:{rig.controller.metrics_port}")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["from"] == "controller" and doc["controller"]["leader"] is True
    want = await rig.metrics_states()
    assert want == {"good": "licensed", "bad": "unlicensed"}
    assert guest_states_from_status(doc, rig.tenant) == want
    # The table says where it came from and lists the same guests.
    code, out, _ = await rig.cli("status", "--url", f"http://127.0.0.1:{rig.controller.metrics_port}")
    assert code == 0 and out.startswith("FROM CONTROLLER ")
    for vmi, state in want.items():
        assert any(line.split()[:3] == [rig.tenant, vmi, state] for line in out.splitlines()), out


async def test_without_a_reachable_controller_the_offline_view_is_labelled(rig: Rig) -> None:
    # No Service in this namespace: the proxy answers 404, the CLI recomputes and says so.
    code, out, err = await rig.cli("status", "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["from"] == "offline" and doc["guests"] is None
    assert f"no Service {rig.w.controller_ns}/{STATUS_SERVICE}" in doc["offline_reason"]
    assert doc["replicas"]["in_sync"] >= 1
    assert doc["partial"] is True and doc["rotation_records_read"] is True
    code, out, _ = await rig.cli("status")
    assert code == 0 and out.startswith("OFFLINE, PARTIAL VIEW")
    # It says how to reach the controller, and that the shipped NetworkPolicy blocks the proxy route.
    assert "services/proxy" in out and "NetworkPolic" in out and "port-forward" in out
    code, out, err = await rig.cli("rollout", "status")
    assert code == 0, out + err
    assert "OFFLINE, PARTIAL VIEW" in err
    # An explicit --url that does not answer is an error, not a silent fallback.
    url = f"http://127.0.0.1:{free_port()}"
    code, _, err = await rig.cli("status", "--url", url)
    assert code == 1 and err == (f"licensectl status: nothing answers at {url} (Connection refused); is the "
                                 f"port-forward running and the URL right?\n"), err


async def test_status_through_the_api_service_proxy_matches_metrics(rig: Rig) -> None:
    await _stand_in_service(rig)
    code, out, err = await rig.cli("status", "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["from"] == "controller", doc.get("offline_reason")
    want = await rig.metrics_states()
    assert guest_states_from_status(doc, rig.tenant) == want
    code, out, err = await rig.cli("rollout", "status")
    assert code == 0, out + err
    assert "OFFLINE" not in err


async def _stand_in_service(rig: Rig) -> None:
    addr = host_address()
    assert addr is not None, "this machine has no non-loopback IPv4 address for the service proxy"
    ns = rig.w.controller_ns
    core = CoreV1Api(rig.api)
    # No kubelet runs pods here: a Pod object whose status carries this machine's address stands in
    # for the controller's pod (the API server proxies only to endpoints that are Pods with that IP),
    # behind a selector-less Service with hand-written Endpoints.
    pod = "licensectl-0"
    with contextlib.suppress(ApiException):  # no service-account controller runs here
        await core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    await core.create_namespaced_pod(ns, {"metadata": {"name": pod}, "spec": {
        "automountServiceAccountToken": False,
        "containers": [{"name": "licensectl", "image": "licensectl:test"}]}})
    await core.patch_namespaced_pod_status(pod, ns, {"status": {
        "phase": "Running", "podIP": addr, "podIPs": [{"ip": addr}],
        "conditions": [{"type": "Ready", "status": "True"}]}})
    await core.create_namespaced_service(ns, {"metadata": {"name": STATUS_SERVICE}, "spec": {
        "ports": [{"name": STATUS_SERVICE_PORT, "port": 8080, "targetPort": rig.controller.metrics_port}]}})
    await core.create_namespaced_endpoints(ns, {"metadata": {"name": STATUS_SERVICE}, "subsets": [{
        "addresses": [{"ip": addr, "targetRef": {"kind": "Pod", "namespace": ns, "name": pod}}],
        "ports": [{"name": STATUS_SERVICE_PORT, "port": rig.controller.metrics_port}]}]})
    await DiscoveryV1Api(rig.api).create_namespaced_endpoint_slice(ns, {
        "metadata": {"name": f"{STATUS_SERVICE}-1", "labels": {"kubernetes.io/service-name": STATUS_SERVICE}},
        "addressType": "IPv4", "endpoints": [{"addresses": [addr], "conditions": {"ready": True},
                                              "targetRef": {"kind": "Pod", "namespace": ns, "name": pod}}],
        "ports": [{"name": STATUS_SERVICE_PORT, "port": rig.controller.metrics_port, "protocol": "TCP"}]})


async def test_a_hoster_needs_get_on_services_proxy(rig: Rig, control_plane: ControlPlane, tmp_path: Path) -> None:
    """Without RBAC the CLI says which permission is missing; `get` on services/proxy for the
    Service is all it takes to read the controller's view (docs/operations.md#status-from-the-controller)."""
    await _stand_in_service(rig)
    ns = rig.w.controller_ns
    core = CoreV1Api(rig.api)
    await core.create_namespaced_service_account(ns, {"metadata": {"name": "hoster"}})
    token = (await core.create_namespaced_service_account_token(
        "hoster", ns, {"spec": {"expirationSeconds": 600}})).status.token
    kubeconfig = tmp_path / "hoster.kubeconfig"
    kubeconfig.write_text(render_kubeconfig(control_plane.server, control_plane.ca_pem, token=token, user="hoster"))
    code, _, err = await cli(kubeconfig, ns, rig.w.root_name, "status", "-o", "json")
    assert code == 1
    assert f"may not get services/proxy in {ns}" in err
    assert "offline recomputation failed too: forbidden (HTTP 403)" in err

    # The proxied object's name is "<service>:<port>", which is what resourceNames must list.
    rbac = RbacAuthorizationV1Api(rig.api)
    await rbac.create_namespaced_role(ns, {"metadata": {"name": "licensectl-status"}, "rules": [{
        "apiGroups": [""], "resources": ["services/proxy"],
        "resourceNames": [f"{STATUS_SERVICE}:{STATUS_SERVICE_PORT}"], "verbs": ["get"]}]})
    await rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": "licensectl-status"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "licensectl-status"},
        "subjects": [{"kind": "ServiceAccount", "name": "hoster", "namespace": ns}]})

    async def allowed() -> dict[str, Any] | None:
        code, out, err = await cli(kubeconfig, ns, rig.w.root_name, "status", "-o", "json")
        last_err[:] = [err]
        return json.loads(out) if code == 0 else None

    last_err = [""]

    try:
        doc = await eventually(allowed, timeout=30, what="status with get on services/proxy")
    except TimeoutError as e:
        raise AssertionError(last_err[0]) from e
    assert doc["from"] == "controller"
    assert guest_states_from_status(doc, rig.tenant) == await rig.metrics_states()


async def test_the_offline_watch_lists_once_then_follows_watch_events(rig: Rig) -> None:
    """`rollout status --watch` without a controller: no re-list per tick, changes arrive by watch."""
    verbs: list[str] = []
    settings = Settings(kubeconfig=str(rig.kv.kubeconfig_path), namespace=rig.w.controller_ns,
                        root_tenant=rig.w.root_name)
    clock = ServerClock()
    api = await make_api_client(settings, trace_configs=[
        request_tracing(on_request=lambda verb, _code: verbs.append(verb), clock=clock)])
    watched = WatchedCluster(api, settings, clock.now)
    src = f"{rig.w.source_ns}/{rig.w.source[1]}"
    try:
        await watched.start()
        assert watched.rollouts()[src]["affected"] == len(PROFILES)
        lists = verbs.count("GET")
        await fleet.create_vm(rig.api, rig.tenant, "late", gpu_claims=["gpu"])
        for _ in range(40):  # 40 ticks of the watch loop, faster than WATCH_INTERVAL
            if watched.rollouts()[src]["affected"] == len(PROFILES) + 1:
                break
            await asyncio.sleep(0.25)
        assert watched.rollouts()[src]["affected"] == len(PROFILES) + 1
        assert verbs.count("GET") == lists, "the watch re-listed"
    finally:
        await watched.stop()
        await api.close()
