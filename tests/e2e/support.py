"""End-to-end helpers: licensectl as real `python -m licensectl run` processes, plus the cluster
pieces a dev control plane lacks (the leader-selecting reports Service, a recording API proxy).

Processes run in their own process groups (licensectl_dev.testkit.process) and are ended as groups.
Their output goes to a log file per process; the tests read it only for structured lifecycle lines
and never print it (tokens must not reach test output, and licensectl never logs them anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, ApiException, CoordinationV1Api, CoreV1Api, CustomObjectsApi

from licensectl.app import LEADER_LABEL
from licensectl.core.model import ANN_RESTART_RESULT, ANN_RESTART_REVISION
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster import webhook as webhook_registration
from licensectl_dev.devcluster.controlplane import LOOPBACK, ControlPlane, free_port, render_kubeconfig
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.process import ManagedProcess
from licensectl_dev.testkit.proxy import ReverseProxy
from licensectl_dev.testkit.world import World, build_world

from ..conftest import KubevirtEnv


# -- controller processes --------------------------------------------------------------------------
async def start_controller(name: str, kubeconfig: Path, namespace: str, log_dir: Path,
                           wrapper: Sequence[str] = (), extra_env: Mapping[str, str] | None = None,
                           webhook_api: ApiClient | None = None, webhook_ca: bool = True,
                           **settings: Any) -> ControllerProcess:
    """`python -m licensectl run` with JSON logs at info; `settings` are Settings field names -> values.
    With `webhook_api` (an admin client) its admission webhook is registered on the apiserver.
    The rotation is one step (no canary, 100%) with the `ready` done gate unless `settings` say
    otherwise: these tests are about the rollout engine, HA and upgrades, and their guests do not
    re-boot on a restart; tests/e2e/test_rotation_kill.py runs the safe rotation with re-booting guests."""
    base = {"log_level": "info", "settle_seconds": 0, "canary": "0", "rollout_steps": "100%", "done_gate": "ready"}
    c = ControllerProcess(kubeconfig, namespace, log_dir=log_dir, name=name, wrapper=wrapper, extra_env=extra_env,
                          settings={**base, **settings}, webhook_api=webhook_api,
                          webhook_ca=webhook_ca)
    await c.start()
    return c


@contextlib.asynccontextmanager
async def controllers() -> AsyncIterator[list[ControllerProcess]]:
    """Collects started controllers and ends any still running at the end (SIGKILL to the group)."""
    started: list[ControllerProcess] = []
    try:
        yield started
    finally:
        for c in started:
            await c.kill()
            await c.close()


# -- pods standing in for the Deployment's replicas ------------------------------------------------
def pod_body(name: str, namespace: str, service_account: str | None = None) -> dict[str, Any]:
    """A Pod that passes the `restricted` Pod Security level (manifests/base/namespace.yaml enforces
    it). Nothing runs it (no kubelet): it exists so the leader can label itself."""
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "licensectl", "image": "licensectl:e2e",
                        "securityContext": {"allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]}}}],
    }
    if service_account:
        spec["serviceAccountName"] = service_account
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "licensectl",
                                    "app.kubernetes.io/component": "controller"}},
            "spec": spec}


async def create_pod(api: ApiClient, name: str, namespace: str, service_account: str | None = None) -> None:
    """Create the Pod. ServiceAccount admission rejects a pod whose account does not exist, and the
    dev control plane's controller-manager may not have made `default` yet: make it if missing."""
    core = CoreV1Api(api)
    try:
        await core.create_namespaced_service_account(namespace, {
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": service_account or "default", "namespace": namespace}})
    except ApiException as e:
        if e.status != 409:
            raise
    await core.create_namespaced_pod(namespace, pod_body(name, namespace, service_account))


async def leader_pods(api: ApiClient, namespace: str) -> list[str]:
    pods = await CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"{LEADER_LABEL}=true")
    return sorted(p.metadata.name for p in pods.items)


# -- the reports Service ---------------------------------------------------------------------------
class ReportsService(ReverseProxy):
    """What the `licensectl-reports` Service + kube-proxy do for guest reports: send each request
    to a pod selected by `licensectl.io/leader=true` (manifests/base/services.yaml). No kubelet
    runs here, so pods have no IPs: `endpoints` maps pod name to its controller; a dead process is
    left out, as the kubelet's failing readiness probe would take it out of the Endpoints."""

    def __init__(self, api: ApiClient, namespace: str) -> None:
        super().__init__(f"http://{LOOPBACK}", name="reports-service")
        self.api = api
        self.namespace = namespace
        self.endpoints: dict[str, ControllerProcess] = {}

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/v1/reports"

    async def upstream_url(self, request: web.Request) -> str:
        ports = [self.endpoints[p].reports_port for p in await leader_pods(self.api, self.namespace)
                 if p in self.endpoints and self.endpoints[p].alive()]
        if not ports:
            raise web.HTTPServiceUnavailable(text="no endpoints")
        return f"http://{LOOPBACK}:{ports[0]}{request.raw_path}"

    async def respond(self, request: web.Request, up: aiohttp.ClientResponse) -> web.StreamResponse:
        return await self.buffered(up)


# -- a recording API proxy -------------------------------------------------------------------------
@dataclass(frozen=True)
class ApiRequest:
    """The authorization attributes the apiserver derives from one request (RequestInfoFactory in
    kubernetes staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go)."""

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    status: int
    cause: str = ""  # for errors: the Status' first cause type, else its reason
    started: float = 0.0  # time.monotonic() when the request arrived
    finished: float = 0.0  # ... and when its response (or watch stream) ended


_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


def request_attributes(method: str, path: str, query: Mapping[str, list[str]], status: int = 0) -> ApiRequest | None:
    """None for non-resource requests (discovery, /version, /healthz), as the apiserver does."""
    parts = [p for p in path.strip("/").split("/") if p]
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return None
    group = ""
    rest = parts[1:]
    if parts[0] == "apis":
        if len(rest) < 3:
            return None
        group, rest = rest[0], rest[1:]
    rest = rest[1:]  # version
    verb = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete"}.get(method.upper(), "")
    if rest and rest[0] in ("watch", "proxy"):
        verb, rest = rest[0], rest[1:]
    namespace = ""
    if rest and rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) >= 2 else ""
    subresource = rest[2] if len(rest) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        w = (query.get("watch") or [None])[0]
        verb = "list" if w is None or w.lower() in ("false", "0") else "watch"
    if not name and verb == "delete":
        verb = "deletecollection"
    return ApiRequest(verb, group, resource, subresource, namespace, name, status)


def _cause(body: bytes | None) -> str:
    """A Status' first cause (e.g. NamespaceTerminating: a create in a namespace being
    deleted is refused with 403 whatever the RBAC says), else its reason."""
    if not body:
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(status, dict):
        return ""
    causes = (status.get("details") or {}).get("causes") or []
    if causes and isinstance(causes[0], dict) and causes[0].get("reason"):
        return str(causes[0]["reason"])  # StatusCause.Type is serialized as "reason"
    return str(status.get("reason") or "")


class RecordingProxy(ReverseProxy):
    """Plain-HTTP reverse proxy on loopback in front of an HTTPS upstream (the apiserver or the
    KubeVirt restart proxy). Forwards the caller's own Authorization header, records the
    authorization attributes of every request, and can `sever()` open connections (watches) the
    way a load balancer or apiserver restart would."""

    def __init__(self, upstream: str, ca_path: Path) -> None:
        super().__init__(upstream, ca_path=ca_path, name="recording")
        self.requests: list[ApiRequest] = []

    def kubeconfig(self, token: str) -> str:
        return render_kubeconfig(self.url, None, token=token, name="licensectl-e2e")

    async def respond(self, request: web.Request, up: aiohttp.ClientResponse) -> web.StreamResponse:
        url = urlsplit(request.raw_path)
        started = time.monotonic()
        info = request_attributes(request.method, url.path, parse_qs(url.query), up.status)
        error_body: bytes | None = None
        if up.status >= 400:
            error_body = await up.read()
        index = len(self.requests)  # no await between this and the append
        if info is not None:
            info = dataclasses.replace(info, started=started, cause=_cause(error_body))
            self.requests.append(info)
        try:
            if error_body is not None:
                return await self.buffered(up, error_body)
            return await self.stream(request, up)
        finally:
            if info is not None:
                self.requests[index] = dataclasses.replace(info, finished=time.monotonic())


# -- Prometheus ------------------------------------------------------------------------------------
@dataclass
class Prometheus:
    """A real Prometheus server process (its own process group)."""

    process: ManagedProcess
    port: int

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def get(self, path: str, **params: str) -> Any:
        async with aiohttp.ClientSession() as http, http.get(self.url + path, params=params) as r:
            doc = await r.json()
            if r.status != 200 or doc.get("status") != "success":
                raise AssertionError(f"GET {path} {params}: HTTP {r.status} {doc}")
            return doc["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        data = await self.get("/api/v1/query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    async def stop(self) -> None:
        await self.process.stop(grace=15)


async def start_prometheus(binary: str, config_path: Path, data_dir: Path) -> Prometheus:
    port = free_port()
    process = ManagedProcess(
        [binary, f"--config.file={config_path}", f"--storage.tsdb.path={data_dir}",
         f"--web.listen-address={LOOPBACK}:{port}", "--storage.tsdb.retention.time=1h"],
        log_path=data_dir.parent / "prometheus.log", name="prometheus")
    process.start()
    prom = Prometheus(process, port)

    async def ready() -> bool:
        if not process.alive():
            raise AssertionError(f"prometheus exited {process.returncode}: {process.log_tail()}")
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with aiohttp.ClientSession() as http, http.get(f"{prom.url}/-/ready") as r:
                return r.status == 200
        return False

    try:
        await eventually(ready, timeout=30, interval=0.2, what="prometheus ready")
    except BaseException:
        await prom.stop()
        raise
    return prom


# -- a hoster fleet --------------------------------------------------------------------------------
class Fleet(World):
    """Cozystack-shaped tenants under a fresh root, one vGPU class and its source Secret."""

    async def revision(self) -> str | None:
        """The one revision every tenant's replica carries (None while they differ or are missing)."""
        revs = {await self.replica_revision(ns) for ns in self.tenants}
        return revs.pop() if len(revs) == 1 else None

    async def vm_annotations(self, ns: str, name: str) -> dict[str, str]:
        vm = await CustomObjectsApi(self.api).get_namespaced_custom_object(
            "kubevirt.io", "v1", ns, "virtualmachines", name)
        ann: dict[str, str] = vm["metadata"].get("annotations") or {}
        return ann

    async def ready(self, ns: str, name: str) -> bool:
        try:
            vmi = await CustomObjectsApi(self.api).get_namespaced_custom_object(
                "kubevirt.io", "v1", ns, "virtualmachineinstances", name)
        except ApiException:
            return False
        conds = (vmi.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

    async def boot(self, per_tenant: int, *, hand_written: bool = False, **vm_kw: Any) -> list[tuple[str, str]]:
        """Replicas first (a VMI cannot start before its Secret exists), then the VMs, all Ready.

        VMs name their GPU claim and the admission webhook adds the license volume; `hand_written`
        mounts the replica in the VM itself instead (what a version without the webhook needed)."""
        await eventually(self.revision, timeout=30, what="replicas in every tenant")
        if not hand_written:
            for ns in self.tenants:
                await webhook_registration.wait_delivery(self.api, namespace=ns, claim="gpu")
        # Revision timestamps have one-second resolution: boot a moment after they were written.
        await asyncio.sleep(1.1)
        vms = []
        for ns in self.tenants:
            for i in range(per_tenant):
                if hand_written:
                    await fleet.create_vm(self.api, ns, f"vm{i}", license_secret=self.replica, **vm_kw)
                else:
                    await fleet.create_vm(self.api, ns, f"vm{i}", gpu_claims=["gpu"], **vm_kw)
                vms.append((ns, f"vm{i}"))
        for ns, name in vms:
            await eventually(lambda ns=ns, name=name: self.ready(ns, name), timeout=30, what=f"{ns}/{name} ready")
        # Likewise a rotation comes a moment after the fleet is up: the revision time is stamped from the
        # controller's estimate of the apiserver clock, to the second, so a VMI that turned Running in the
        # rotation's own second may be judged started after it (docs/design.md#decision-stale-rule).
        await asyncio.sleep(1.1)
        return vms

    async def all_done(self, vms: list[tuple[str, str]], revision: str) -> bool:
        for ns, name in vms:
            ann = await self.vm_annotations(ns, name)
            if ann.get(ANN_RESTART_REVISION) != revision or ann.get(ANN_RESTART_RESULT) != "done":
                return False
        return all([await self.ready(ns, name) for ns, name in vms])


async def make_fleet(api: ApiClient, namespace_factory: Any, cleanup: Any, *, tenants: int = 3,
                     controller_ns: str | None = None) -> Fleet:
    """A fleet of `tenants` tenants with one GPUClaim each; `controller_ns` overrides where the controller runs."""
    fl = await build_world(api, world_type=Fleet, make_namespace=namespace_factory, cleanup=cleanup, token_days=100)
    if controller_ns is not None:
        fl.controller_ns = controller_ns
    for _ in range(tenants):
        await fl.tenant(claim=True)
    return fl


# -- two controller pods with leader election -------------------------------------------------------
MUTATING = ("create", "update", "patch", "delete", "deletecollection")
REPORT_INTERVAL = 3.0


async def lease_holder(api: ApiClient, ns: str) -> str | None:
    lease = await CoordinationV1Api(api).read_namespaced_lease("licensectl", ns)
    holder: str | None = lease.spec.holder_identity
    return holder


class Rig:
    """A fleet, the simulator, one recording proxy per controller pod, and the reports Service."""

    def __init__(self, api: ApiClient, cp: ControlPlane, kv: KubevirtEnv, fl: Fleet, tmp: Path) -> None:
        self.api, self.cp, self.kv, self.fleet, self.tmp = api, cp, kv, fl, tmp
        self.proxies: dict[str, RecordingProxy] = {}
        self.service = ReportsService(api, fl.controller_ns)

    async def start(self) -> None:
        for pod in ("licensectl-a", "licensectl-b"):
            await create_pod(self.api, pod, self.fleet.controller_ns)
            proxy = RecordingProxy(self.kv.proxy.url, self.cp.ca_path)
            await proxy.start()
            self.proxies[pod] = proxy
        await self.service.start()

    async def stop(self) -> None:
        await self.service.stop()
        for p in self.proxies.values():
            await p.stop()

    async def controller(self, started: list[ControllerProcess], pod: str, *, register_webhook: bool = True,
                         **lease: Any) -> ControllerProcess:
        """`register_webhook=False`: no configuration of its own (the test registers one in front of the
        webhook Service, as the shipped topology has)."""
        kubeconfig = self.tmp / f"{pod}-{len(started)}.kubeconfig"
        kubeconfig.write_text(self.proxies[pod].kubeconfig(self.cp.admin_token))
        kubeconfig.chmod(0o600)
        c = await start_controller(
            f"{pod}-{len(started)}", kubeconfig, self.fleet.controller_ns, self.tmp, pod_name=pod,
            leader_elect=True, root_tenant=self.fleet.root_name, report_url=self.service.url,
            reports_plain_http=True,  # ReportsService is a plain HTTP proxy (TLS: test_serving_tls.py)
            max_unavailable="1", max_per_namespace=1, restart_timeout_seconds=60,
            report_interval_seconds=REPORT_INTERVAL, webhook_api=self.fleet.api if register_webhook else None, **lease)
        started.append(c)
        self.service.endpoints[pod] = c
        return c

    async def leader_and_standby(self, started: list[ControllerProcess], **lease: Any) -> tuple[
            ControllerProcess, ControllerProcess, list[tuple[str, str]]]:
        """licensectl-a leading, licensectl-b a warm standby, and two VMs per tenant booted."""
        a = await self.controller(started, "licensectl-a", **lease)
        await a.wait_metric("licensectl_leader", 1)
        b = await self.controller(started, "licensectl-b", **lease)
        vms = await self.fleet.boot(per_tenant=2)
        await b.wait_metric("licensectl_ready", 1)
        return a, b, vms

    def writes_by(self, pod: str, since: float = 0.0) -> list[Any]:
        return [r for r in self.proxies[pod].requests if r.verb in MUTATING and r.started >= since]

    def accepted_restarts(self) -> int:
        return len([r for r in self.kv.record.restarts if r.status == 202])


def assert_each_restarted_once(kv: KubevirtEnv, vms: list[tuple[str, str]]) -> None:
    counts = {f"{ns}/{name}": len(kv.record.restarts_for(ns, name)) for ns, name in vms}
    assert counts == dict.fromkeys(counts, 1), counts
