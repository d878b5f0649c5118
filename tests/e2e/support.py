"""End-to-end helpers: licensectl as real `python -m licensectl run` processes, plus the cluster
pieces a dev control plane lacks (the leader-selecting reports Service, a recording API proxy).

Processes are always ended by their own PID. Their output goes to a log file per process; the tests
read it only for structured lifecycle lines and never print it (tokens must not reach test output,
and licensectl never logs them anyway).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, CustomObjectsApi
from prometheus_client.parser import text_string_to_metric_families

from licensectl.app import LEADER_LABEL
from licensectl.devcluster import fleet
from licensectl.devcluster.controlplane import LOOPBACK, free_port, render_kubeconfig
from licensectl.model import ANN_RESTART_RESULT, ANN_RESTART_REVISION, ANN_REVISION
from licensectl.render import replica_name

from ..integration.support import eventually, make_world

REPO = Path(__file__).resolve().parents[2]

# Headers a proxy must not forward (RFC 9110 §7.6.1) plus the ones aiohttp recomputes.
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                         "trailer", "transfer-encoding", "upgrade", "host", "content-length"})


# -- metrics ---------------------------------------------------------------------------------------
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_metrics(text: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the series of `name` matching `labels` (0 when none: an unlabelled-yet counter)."""
    return sum(v for (n, lbls), v in samples.items()
               if n == name and all(dict(lbls).get(k) == want for k, want in labels.items()))


# -- controller processes --------------------------------------------------------------------------
@dataclass
class Controller:
    """One `licensectl run` process on loopback ports chosen up front."""

    name: str
    proc: asyncio.subprocess.Process
    metrics_port: int
    reports_port: int
    log_path: Path
    returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.metrics_port}/metrics"

    @property
    def reports_url(self) -> str:
        return f"http://{LOOPBACK}:{self.reports_port}/v1/reports"

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def scrape(self) -> Samples:
        async with aiohttp.ClientSession() as http, http.get(self.metrics_url) as r:
            r.raise_for_status()
            return parse_metrics(await r.text())

    async def try_scrape(self) -> Samples | None:
        try:
            return await self.scrape()
        except (aiohttp.ClientError, OSError):
            return None

    def log_events(self) -> list[dict[str, Any]]:
        """The JSON log lines (event + keys) the process wrote so far."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    out.append(doc)
        return out

    def log_tail(self, lines: int = 30) -> str:
        """Last log lines, for assertion messages (licensectl never logs token bytes)."""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    async def kill(self) -> None:
        """SIGKILL: a crash. No graceful stop, the Lease stays held until it expires."""
        if self.alive:
            os.kill(self.pid, signal.SIGKILL)
        self.returncode = await self.proc.wait()

    async def terminate(self, timeout: float = 40.0) -> int:
        """SIGTERM (what the kubelet sends) and wait for the exit code."""
        if self.alive:
            os.kill(self.pid, signal.SIGTERM)
        try:
            self.returncode = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            await self.kill()
            raise AssertionError(f"{self.name} did not exit within {timeout}s of SIGTERM") from None
        return self.returncode


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


async def start_controller(name: str, kubeconfig: Path, namespace: str, log_dir: Path,
                           wrapper: Sequence[str] = (), extra_env: Mapping[str, str] | None = None,
                           **settings: Any) -> Controller:
    """`python -m licensectl run` with JSON logs; `settings` are Settings field names -> values."""
    metrics_port, reports_port = free_port(), free_port()
    args: dict[str, Any] = {"kubeconfig": str(kubeconfig), "namespace": namespace, "log_format": "json",
                            "log_level": "info", "metrics_address": f"{LOOPBACK}:{metrics_port}",
                            "reports_address": f"{LOOPBACK}:{reports_port}", "settle_seconds": 0}
    args.update(settings)
    argv = [*wrapper, sys.executable, "-m", "licensectl", "run"]
    for k, v in args.items():
        argv += [_flag(k), str(v).lower() if isinstance(v, bool) else str(v)]
    # Only flags configure it: no LICENSECTL_* or in-cluster variables leak in from the test runner.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LICENSECTL_", "KUBERNETES_SERVICE_")) and k != "KUBECONFIG"}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra_env or {})
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(*argv, cwd=REPO, env=env, stdout=out, stderr=out,
                                                    stdin=asyncio.subprocess.DEVNULL)
    return Controller(name, proc, metrics_port, reports_port, log_path)


@contextlib.asynccontextmanager
async def controllers() -> AsyncIterator[list[Controller]]:
    """Collects started controllers and SIGKILLs any still running at the end (by PID)."""
    started: list[Controller] = []
    try:
        yield started
    finally:
        for c in started:
            if c.alive:
                await c.kill()


async def wait_metric(c: Controller, name: str, want: float, timeout: float = 30.0, **labels: str) -> Samples:
    """Poll c's /metrics until the (summed) series equals `want`."""
    deadline = time.monotonic() + timeout
    last: float | None = None
    while time.monotonic() < deadline:
        s = await c.try_scrape()
        if s is not None:
            last = value(s, name, **labels)
            if last == want:
                return s
        if not c.alive:
            raise AssertionError(f"{c.name} exited ({c.proc.returncode}) waiting for {name}:\n{c.log_tail()}")
        await asyncio.sleep(0.1)
    raise AssertionError(f"{c.name}: {name}{labels} = {last}, wanted {want}")


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
class ReportsService:
    """What the `licensectl-reports` Service + kube-proxy do for guest reports: send each request
    to a pod selected by `licensectl.io/leader=true` (manifests/base/services.yaml). No kubelet
    runs here, so pods have no IPs: `endpoints` maps pod name to its controller; a dead process is
    left out, as the kubelet's failing readiness probe would take it out of the Endpoints."""

    def __init__(self, api: ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.endpoints: dict[str, Controller] = {}
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/v1/reports"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, LOOPBACK, self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        endpoints = [self.endpoints[p].reports_port for p in await leader_pods(self.api, self.namespace)
                     if p in self.endpoints and self.endpoints[p].alive]
        if not endpoints:
            return web.Response(status=503, text="no endpoints")
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        try:
            async with aiohttp.ClientSession() as http, http.request(
                    request.method, f"http://{LOOPBACK}:{endpoints[0]}{request.raw_path}", data=body,
                    headers=headers) as up:
                return web.Response(status=up.status, body=await up.read(),
                                    content_type=up.content_type or "text/plain")
        except aiohttp.ClientError:
            return web.Response(status=502, text="endpoint unreachable")


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


class RecordingProxy:
    """Plain-HTTP reverse proxy on loopback in front of an HTTPS upstream (the apiserver or the
    KubeVirt restart proxy). Forwards the caller's own Authorization header, records the
    authorization attributes of every request, and can sever open connections (watches) the way
    a load balancer or apiserver restart would."""

    def __init__(self, upstream: str, ca_path: Path) -> None:
        self.upstream = upstream.rstrip("/")
        self._ca_path = ca_path
        self.requests: list[ApiRequest] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._open: set[asyncio.Transport] = set()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def kubeconfig(self, token: str) -> str:
        return render_kubeconfig(self.url, None, token=token, name="licensectl-e2e")

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(self._ca_path)), limit=0),
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, LOOPBACK, self.port).start()

    async def stop(self) -> None:
        self.sever()  # open watches would otherwise hold the shutdown
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def sever(self) -> int:
        """Close every client connection with a request in flight (long-running watches)."""
        n = 0
        for t in list(self._open):
            if not t.is_closing():
                t.close()
                n += 1
        return n

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        transport = request.transport
        if transport is not None:
            self._open.add(transport)  # type: ignore[arg-type]
        try:
            return await self._relay(request)
        finally:
            if transport is not None:
                self._open.discard(transport)  # type: ignore[arg-type]

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        url = urlsplit(request.raw_path)
        started = time.monotonic()
        async with self._session.request(request.method, self.upstream + request.raw_path, headers=headers,
                                         data=body or None, allow_redirects=False) as up:
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
                    return web.Response(status=up.status, body=error_body, headers={
                        k: v for k, v in up.headers.items() if k.lower() not in _HOP_BY_HOP})
                return await self._stream(request, up)
            finally:
                if info is not None:
                    self.requests[index] = dataclasses.replace(info, finished=time.monotonic())

    async def _stream(self, request: web.Request, up: aiohttp.ClientResponse) -> web.StreamResponse:
        resp = web.StreamResponse(status=up.status, reason=up.reason)
        for k, v in up.headers.items():
            if k.lower() not in _HOP_BY_HOP:
                resp.headers.add(k, v)
        await resp.prepare(request)
        with contextlib.suppress(aiohttp.ClientError, ConnectionResetError):
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
        with contextlib.suppress(aiohttp.ClientError, ConnectionResetError):
            await resp.write_eof()
        return resp


# -- Prometheus ------------------------------------------------------------------------------------
@dataclass
class Prometheus:
    """A real Prometheus server process (ended by PID)."""

    proc: asyncio.subprocess.Process
    port: int
    log_path: Path

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
        if self.proc.returncode is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                os.kill(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()


async def start_prometheus(binary: str, config_path: Path, data_dir: Path) -> Prometheus:
    port = free_port()
    log_path = data_dir.parent / "prometheus.log"
    with log_path.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            binary, f"--config.file={config_path}", f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address={LOOPBACK}:{port}", "--storage.tsdb.retention.time=1h",
            stdout=out, stderr=out, stdin=asyncio.subprocess.DEVNULL)
    prom = Prometheus(proc, port, log_path)
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as http:
        while True:
            if proc.returncode is not None:
                raise AssertionError(f"prometheus exited {proc.returncode}: {log_path.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(f"{prom.url}/-/ready") as r:
                    if r.status == 200:
                        return prom
            if time.monotonic() > deadline:
                await prom.stop()
                raise AssertionError("prometheus not ready within 30s")
            await asyncio.sleep(0.2)


# -- a hoster fleet --------------------------------------------------------------------------------
@dataclass
class Fleet:
    """Cozystack-shaped tenants under a fresh root, one vGPU class and its source Secret."""

    api: ApiClient
    controller_ns: str
    source_ns: str
    root_name: str
    root: dict[str, Any]
    cls: str
    tenants: list[str]
    source_name: str = "nls-token"

    @property
    def replica(self) -> str:
        return replica_name(self.cls)

    async def replica_revision(self, ns: str) -> str | None:
        try:
            s = await CoreV1Api(self.api).read_namespaced_secret(self.replica, ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        rev: str | None = (s.metadata.annotations or {}).get(ANN_REVISION)
        return rev

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

    async def boot(self, per_tenant: int, **vm_kw: Any) -> list[tuple[str, str]]:
        """Replicas first (a VMI cannot start before its Secret exists), then the VMs, all Ready."""
        await eventually(self.revision, timeout=30, what="replicas in every tenant")
        # Revision timestamps have one-second resolution: boot a moment after they were written.
        await asyncio.sleep(1.1)
        vms = []
        for ns in self.tenants:
            for i in range(per_tenant):
                await fleet.create_vm(self.api, ns, f"vm{i}", license_secret=self.replica, **vm_kw)
                vms.append((ns, f"vm{i}"))
        for ns, name in vms:
            await eventually(lambda ns=ns, name=name: self.ready(ns, name), timeout=30, what=f"{ns}/{name} ready")
        return vms

    async def rotate(self, n: int) -> None:
        """The hoster replaces the token in the source Secret (a new revision)."""
        token = fleet.fake_token(int(time.time()) + 86400 * 200, extra={"rotation": n})
        await CoreV1Api(self.api).patch_namespaced_secret(self.source_name, self.source_ns, {"data": {
            "client_configuration_token.tok": base64.b64encode(token).decode()}})

    async def all_done(self, vms: list[tuple[str, str]], revision: str) -> bool:
        for ns, name in vms:
            ann = await self.vm_annotations(ns, name)
            if ann.get(ANN_RESTART_REVISION) != revision or ann.get(ANN_RESTART_RESULT) != "done":
                return False
        return all([await self.ready(ns, name) for ns, name in vms])


async def make_fleet(api: ApiClient, namespace_factory: Any, cleanup: Any, *, tenants: int = 3,
                     controller_ns: str | None = None) -> Fleet:
    w = await make_world(api, namespace_factory, cleanup, token_days=100)
    ctl = controller_ns or w.controller_ns
    names = []
    for _ in range(tenants):
        names.append((await w.tenant())["metadata"]["name"])
        await fleet.create_claim(api, names[-1], "gpu", w.cls)
    return Fleet(api, ctl, w.source_ns, w.root_name, w.root, w.cls, names)
