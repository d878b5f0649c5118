"""Fault-injection machinery: the controller as a process, a TCP proxy, an HTTP fault proxy, clocks.

Everything here is test infrastructure, used by tests/faults/scenarios.py:

- `ControllerProcess`: `python -m licensectl run ...` with JSON logs in a file (every line can be
  scanned afterwards), ready-wait on /readyz, SIGTERM, SIGKILL, restart.
- `TcpProxy`: a loopback TCP relay that can `cut()` every connection, `stall()` and `slow()` traffic.
  TLS passes through untouched, so it can sit in front of the apiserver or the KubeVirt proxy.
- `FaultProxy`: a plain-HTTP reverse proxy (aiohttp) in front of an HTTPS upstream that answers
  bursts of 429/500/503, fails LIST pages that carry a `continue` token, forces small pages, and
  ends watches with an ERROR event of code 410 (what an apiserver sends after etcd compaction).
- `JumpClock`: an injectable clock for in-process `App(settings, clock=...)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import datetime as dt
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
from aiohttp import web
from kubernetes_asyncio.client import ApiClient
from prometheus_client.parser import text_string_to_metric_families

from licensectl.devcluster.controlplane import ControlPlane, free_port, render_kubeconfig
from licensectl.devcluster.kubeapi import api_client_from_kubeconfig, install_crds
from licensectl.devcluster.simulator import KubevirtSimulator, RestartProxy, SimulatorRecord

REPO_ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"


# ---------------------------------------------------------------------------------------------
# Settings -> command line
# ---------------------------------------------------------------------------------------------
def settings_args(**settings: Any) -> list[str]:
    """`max_unavailable="2"` -> ["--max-unavailable", "2"]; booleans become true/false."""
    out: list[str] = []
    for k, v in settings.items():
        out.append("--" + k.replace("_", "-"))
        out.append(str(v).lower() if isinstance(v, bool) else str(v))
    return out


def write_kubeconfig(directory: Path, name: str, server: str, ca_pem: bytes | None, token: str) -> Path:
    """A kubeconfig for `server` with a bearer token (CA only for https servers)."""
    path = directory / f"{name}.kubeconfig"
    path.write_text(render_kubeconfig(server, ca_pem if server.startswith("https") else None, token=token,
                                      name=name))
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------------------------------------
# Metrics text
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scrape:
    """One /metrics scrape: (name, labels) -> value."""

    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float]

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples named `name` whose labels include `labels` (0 when none)."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def has(self, name: str, **labels: str) -> bool:
        want = set(labels.items())
        return any(n == name and want <= ls for (n, ls) in self.samples)


def parse_scrape(text: str) -> Scrape:
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return Scrape(samples)


# ---------------------------------------------------------------------------------------------
# The controller as a process
# ---------------------------------------------------------------------------------------------
def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """PR_SET_PDEATHSIG(SIGKILL): a crashed test run never leaves a controller behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


class ControllerProcess:
    """`python -m licensectl run` against a kubeconfig, restartable, with all output in one log file.

    Every incarnation appends to the same log file, so `log_lines()` covers the whole scenario.
    Every body read from its HTTP listeners through `get()` is kept in `http_bodies` for the
    secrecy check.
    """

    def __init__(self, kubeconfig: Path, namespace: str, *, log_dir: Path, args: Sequence[str] = (),
                 name: str = "controller") -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.name = name
        self.args = list(args)
        self.metrics_port = free_port()
        self.reports_port = free_port()
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.incarnations = 0
        self.kills = 0
        self.http_bodies: list[tuple[str, str]] = []
        self._log: IO[bytes] | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def cmd(self) -> list[str]:
        return [sys.executable, "-m", "licensectl", "run", "--kubeconfig", str(self.kubeconfig),
                "--namespace", self.namespace, "--metrics-address", f"{LOOPBACK}:{self.metrics_port}",
                "--reports-address", f"{LOOPBACK}:{self.reports_port}", "--log-format", "json", *self.args]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def start(self) -> None:
        if self.alive():
            raise RuntimeError(f"{self.name} already running")
        if self._log is None:
            self._log = self.log_path.open("ab")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,  # noqa: ASYNC220
                                     env=env, cwd=REPO_ROOT, preexec_fn=_die_with_parent)
        self.incarnations += 1
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def get(self, path: str) -> tuple[int, str] | None:
        """GET on the internal listener; None while it does not answer."""
        assert self._session is not None
        try:
            async with self._session.get(f"http://{LOOPBACK}:{self.metrics_port}{path}") as r:
                text = await r.text()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None
        self.http_bodies.append((f"{self.name}{path}", text))
        return r.status, text

    async def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode if self.proc else '?'}):\n"
                                   f"{self.log_tail()}")
            got = await self.get("/readyz")
            if got is not None and got[0] == 200:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready within {timeout}s:\n{self.log_tail()}")
            await asyncio.sleep(0.1)

    async def scrape(self) -> Scrape | None:
        got = await self.get("/metrics")
        if got is None or got[0] != 200:
            return None
        return parse_scrape(got[1])

    async def status(self) -> dict[str, Any] | None:
        got = await self.get("/v1/status")
        if got is None or got[0] != 200:
            return None
        doc: dict[str, Any] = json.loads(got[1])
        return doc

    def sigterm(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    async def sigkill(self) -> None:
        """Kill -9 and reap: nothing runs after this, no graceful anything."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait)
            self.kills += 1

    async def stop(self, grace: float = 40.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace`; returns the exit code of the last incarnation."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        return self.proc.returncode if self.proc is not None else None

    async def restart(self) -> None:
        await self.sigkill()
        await self.start()

    async def close(self) -> None:
        await self.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_lines(self) -> list[str]:
        if not self.log_path.exists():
            return []
        return self.log_path.read_text(errors="replace").splitlines()

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_lines()[-lines:])

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log records (non-JSON lines, e.g. a traceback, are returned as {"raw": line})."""
        out: list[dict[str, Any]] = []
        for line in self.log_lines():
            try:
                doc = json.loads(line)
            except ValueError:
                doc = {"raw": line}
            out.append(doc if isinstance(doc, dict) else {"raw": line})
        return out


# ---------------------------------------------------------------------------------------------
# TCP proxy: cut, stall, slow
# ---------------------------------------------------------------------------------------------
class TcpProxy:
    """Loopback TCP relay to `upstream_port`; TLS goes through it untouched."""

    def __init__(self, upstream_port: int, upstream_host: str = LOOPBACK) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.latency = 0.0
        self.cuts = 0
        self._server: asyncio.AbstractServer | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._refusing = False

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, LOOPBACK, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def url(self, scheme: str = "https") -> str:
        return f"{scheme}://{LOOPBACK}:{self.port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    def cut(self) -> int:
        """Abort every open connection (both directions, RST); returns how many were cut."""
        n = len(self._conns)
        for a, b in list(self._conns):
            for w in (a, b):
                with contextlib.suppress(Exception):
                    w.transport.abort()
        self._conns.clear()
        self.cuts += 1
        return n

    def stall(self, seconds: float) -> None:
        """Hold every byte (connections stay open) for `seconds`."""
        self._flowing.clear()
        asyncio.get_running_loop().call_later(seconds, self._flowing.set)

    def slow(self, latency: float) -> None:
        """Delay every chunk by `latency` seconds (0 restores full speed)."""
        self.latency = latency

    def refuse(self, on: bool = True) -> None:
        """While on, new connections are closed at once (as if nothing listened)."""
        self._refusing = on

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._conns.add(pair)
        t1 = asyncio.create_task(self._pipe(reader, up_writer, pair))
        t2 = asyncio.create_task(self._pipe(up_reader, writer, pair))
        for t in (t1, t2):
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await self._flowing.wait()
                if self.latency:
                    await asyncio.sleep(self.latency)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._conns.discard(pair)
            for w in pair:
                with contextlib.suppress(Exception):
                    w.close()


# ---------------------------------------------------------------------------------------------
# HTTP fault proxy
# ---------------------------------------------------------------------------------------------
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                         "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length"})
GONE_EVENT = json.dumps({"type": "ERROR", "object": {
    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
    "message": "too old resource version", "reason": "Expired", "code": 410}}).encode() + b"\n"


def status_body(code: int) -> dict[str, Any]:
    reason = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 410: "Expired"}.get(
        code, "InternalError")
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f"injected fault {code}", "reason": reason, "code": code}


@dataclass
class Burst:
    status: int
    remaining: int
    methods: frozenset[str] | None = None
    path_contains: str | None = None
    include_watches: bool = True
    until: float = float("inf")  # time.monotonic() after which the burst is over

    def matches(self, request: web.Request, is_watch: bool) -> bool:
        if time.monotonic() >= self.until or (is_watch and not self.include_watches):
            return False
        if self.methods is not None and request.method not in self.methods:
            return False
        return self.path_contains is None or self.path_contains in request.path


@dataclass(eq=False)
class _Stream:
    action: asyncio.Event = field(default_factory=asyncio.Event)
    kind: str = ""  # expire | cut


class FaultProxy:
    """Plain-HTTP front for an HTTPS apiserver-like upstream, with injectable HTTP-level faults."""

    def __init__(self, upstream: str, ca_path: str | os.PathLike[str], *, page_limit: int | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self._ca_path = os.fspath(ca_path)
        self.page_limit = page_limit
        self.port = 0
        self.stats: Counter[str] = Counter()
        self._bursts: list[Burst] = []
        self._fail_continue = 0  # < 0: forever
        self._continue_status = 500
        self._expire_next = 0
        self._streams: set[_Stream] = set()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def start(self) -> None:
        ctx = ssl.create_default_context(cafile=self._ca_path)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=0),
                                              auto_decompress=False,
                                              timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, LOOPBACK, 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        self.cut_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- fault controls --------------------------------------------------------------------
    def burst(self, status: int, n: int, *, methods: Sequence[str] | None = None, path_contains: str | None = None,
              include_watches: bool = True, seconds: float | None = None) -> None:
        """Answer the next `n` matching requests (within `seconds`, if given) with `status`."""
        until = time.monotonic() + seconds if seconds is not None else float("inf")
        self._bursts.append(Burst(status, n, frozenset(methods) if methods else None, path_contains,
                                  include_watches, until))

    def fail_continue(self, n: int | None = None, status: int = 500) -> None:
        """Fail the next `n` LIST requests that carry a continue token (None: until heal())."""
        self._fail_continue = -1 if n is None else n
        self._continue_status = status

    def expire_watches(self) -> int:
        """End every open watch with an ERROR event, code 410 (forces a relist); returns how many."""
        return self._signal_streams("expire")

    def expire_next_watches(self, n: int) -> None:
        """Answer the next `n` watch requests with an immediate ERROR 410 event."""
        self._expire_next = n

    def cut_watches(self) -> int:
        return self._signal_streams("cut")

    def heal(self) -> None:
        self._bursts.clear()
        self._fail_continue = 0
        self._expire_next = 0

    def _signal_streams(self, kind: str) -> int:
        n = 0
        for s in list(self._streams):
            if not s.action.is_set():
                s.kind = kind
                s.action.set()
                n += 1
        return n

    # -- request path ----------------------------------------------------------------------
    def _injected(self, request: web.Request, is_watch: bool) -> web.Response | None:
        q = request.rel_url.query
        if not is_watch and request.method == "GET" and q.get("continue") and self._fail_continue != 0:
            if self._fail_continue > 0:
                self._fail_continue -= 1
            self.stats[f"continue_{self._continue_status}"] += 1
            return web.json_response(status_body(self._continue_status), status=self._continue_status)
        for b in self._bursts:
            if b.remaining > 0 and b.matches(request, is_watch):
                b.remaining -= 1
                self.stats[f"burst_{b.status}"] += 1
                headers = {"Retry-After": "1"} if b.status in (429, 503) else {}
                return web.json_response(status_body(b.status), status=b.status, headers=headers)
        now = time.monotonic()
        self._bursts = [b for b in self._bursts if b.remaining > 0 and now < b.until]
        return None

    def _upstream_path(self, request: web.Request, is_watch: bool) -> str:
        rel = request.rel_url
        if self.page_limit and not is_watch and request.method == "GET" and "limit" in rel.query:
            rel = rel.update_query({"limit": str(self.page_limit)})
            self.stats["limit_rewritten"] += 1
        return str(rel)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        self.stats["requests"] += 1
        is_watch = request.rel_url.query.get("watch", "").lower() in ("true", "1")
        injected = self._injected(request, is_watch)
        if injected is not None:
            return injected
        if is_watch and self._expire_next > 0:
            self._expire_next -= 1
            self.stats["watch_expired"] += 1
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(GONE_EVENT)
            await resp.write_eof()
            return resp
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        try:
            up_cm = self._session.request(request.method, self.upstream + self._upstream_path(request, is_watch),
                                          headers=headers, data=body or None, allow_redirects=False)
            up = await up_cm.__aenter__()
        except (aiohttp.ClientError, OSError) as e:
            self.stats["upstream_error"] += 1
            raise web.HTTPBadGateway(text=type(e).__name__) from None
        try:
            out_headers = [(k, v) for k, v in up.headers.items() if k.lower() not in _HOP_BY_HOP]
            if not is_watch or up.status != 200:
                data = await up.read()
                resp = web.Response(status=up.status, reason=up.reason, body=data)
                for k, v in out_headers:
                    resp.headers.add(k, v)
                return resp
            return await self._stream(request, up, out_headers)
        except (aiohttp.ClientError, OSError):
            self.stats["upstream_error"] += 1
            raise web.HTTPBadGateway(text="upstream failed") from None
        finally:
            await up_cm.__aexit__(None, None, None)

    async def _stream(self, request: web.Request, up: aiohttp.ClientResponse,
                      headers: list[tuple[str, str]]) -> web.StreamResponse:
        """Relay a watch line by line, so an injected event never lands inside another one."""
        resp = web.StreamResponse(status=up.status, reason=up.reason)
        for k, v in headers:
            resp.headers.add(k, v)
        await resp.prepare(request)
        stream = _Stream()
        self._streams.add(stream)
        buf = b""
        try:
            while True:
                read = asyncio.ensure_future(up.content.readany())
                signal_wait = asyncio.ensure_future(stream.action.wait())
                done, _ = await asyncio.wait({read, signal_wait}, return_when=asyncio.FIRST_COMPLETED)
                if signal_wait in done:
                    read.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await read
                    if stream.kind == "expire":
                        self.stats["watch_expired"] += 1
                        await resp.write(GONE_EVENT)
                        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionError):
                            await resp.write_eof()
                    else:
                        self.stats["watch_cut"] += 1
                        if request.transport is not None:
                            request.transport.abort()
                    return resp
                signal_wait.cancel()
                chunk = read.result()
                if not chunk:
                    break
                buf += chunk
                cut = buf.rfind(b"\n")
                if cut >= 0:
                    await resp.write(buf[:cut + 1])
                    buf = buf[cut + 1:]
            if buf:
                await resp.write(buf)
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionError):
                await resp.write_eof()
        except (aiohttp.ClientPayloadError, ConnectionResetError, aiohttp.ClientConnectionError):
            pass
        finally:
            self._streams.discard(stream)
        return resp


# ---------------------------------------------------------------------------------------------
# Clock for in-process pieces
# ---------------------------------------------------------------------------------------------
class JumpClock:
    """Wall clock plus an offset that a scenario can step forward or back (an NTP step)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self.jumps: list[float] = []

    def __call__(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.offset)

    def jump(self, seconds: float) -> None:
        self.offset += seconds
        self.jumps.append(seconds)


# ---------------------------------------------------------------------------------------------
# Cluster pieces
# ---------------------------------------------------------------------------------------------
@dataclass
class KubevirtRig:
    """The KubeVirt simulator (cluster-wide: one at a time) and its restart proxy."""

    simulator: KubevirtSimulator
    proxy: RestartProxy

    @property
    def record(self) -> SimulatorRecord:
        return self.simulator.record

    async def stop(self) -> None:
        await self.proxy.stop()
        await self.simulator.stop()


async def start_kubevirt(api: ApiClient, cp: ControlPlane, *, ready_delay: float = 0.2,
                         stop_delay: float = 0.0) -> KubevirtRig:
    sim = KubevirtSimulator(api, ready_delay=ready_delay, stop_delay=stop_delay)
    await sim.start()
    proxy = RestartProxy(sim, upstream=cp.server, ca_path=cp.ca_path, token=cp.admin_token,
                         tls=cp.issue_serving_cert("kubevirt-proxy"))
    await proxy.start()
    return KubevirtRig(sim, proxy)


@contextlib.asynccontextmanager
async def admin_client(cp: ControlPlane) -> AsyncIterator[ApiClient]:
    """An admin ApiClient with the project's CRDs installed (standalone runs; pytest has a fixture)."""
    api = await api_client_from_kubeconfig(cp.kubeconfig_path)
    await install_crds(api)
    try:
        yield api
    finally:
        await api.close()


@contextlib.contextmanager
def scratch_dir(prefix: str = "licensectl-faults-") -> Any:
    d = tempfile.TemporaryDirectory(prefix=prefix)
    try:
        yield Path(d.name)
    finally:
        d.cleanup()


async def poll(check: Callable[[], Any], *, timeout: float, interval: float = 0.25, what: str = "condition") -> Any:
    """Await `check()` (sync or async) until truthy; TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        res = check()
        last = await res if asyncio.iscoroutine(res) else res
        if last:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r:.200})")
        await asyncio.sleep(interval)


def replace_settings(base: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    out = dict(base)
    out.update(kw)
    return out


__all__ = [
    "Burst", "ControllerProcess", "FaultProxy", "JumpClock", "KubevirtRig", "Scrape", "TcpProxy", "admin_client",
    "parse_scrape", "poll", "replace_settings", "scratch_dir", "settings_args", "start_kubevirt",
    "write_kubeconfig",
]
