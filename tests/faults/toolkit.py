"""Fault-injection machinery: a TCP proxy, an HTTP fault proxy, clocks, the KubeVirt rig.

Everything here is test infrastructure, used by tests/faults/scenarios.py:

- The controller process, polling and /metrics parsing come from licensectl_dev.testkit.
- `TcpProxy`: a loopback TCP relay that can `cut()` every connection, `stall()` and `slow()` traffic.
  TLS passes through untouched, so it can sit in front of the apiserver or the KubeVirt proxy.
- `FaultProxy`: a plain-HTTP reverse proxy (licensectl_dev.testkit.proxy) in front of an HTTPS upstream that answers
  bursts of 429/500/503, fails LIST pages that carry a `continue` token, forces small pages, and
  ends watches with an ERROR event of code 410 (what an apiserver sends after etcd compaction).
- `JumpClock`: an injectable clock for in-process `App(settings, clock=...)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from kubernetes_asyncio.client import ApiClient

from licensectl_dev.devcluster.controlplane import ControlPlane, render_kubeconfig
from licensectl_dev.devcluster.kubeapi import api_client_from_kubeconfig, install_crds
from licensectl_dev.devcluster.ledger import SimulatorRecord
from licensectl_dev.devcluster.virt_api import RestartProxy
from licensectl_dev.devcluster.virt_controller import KubevirtSimulator
from licensectl_dev.testkit.proxy import LOOPBACK, ReverseProxy, end_to_end


# ---------------------------------------------------------------------------------------------
# Kubeconfigs
# ---------------------------------------------------------------------------------------------
def write_kubeconfig(directory: Path, name: str, server: str, ca_pem: bytes | None, token: str) -> Path:
    """A kubeconfig for `server` with a bearer token (CA only for https servers)."""
    path = directory / f"{name}.kubeconfig"
    path.write_text(render_kubeconfig(server, ca_pem if server.startswith("https") else None, token=token,
                                      name=name))
    path.chmod(0o600)
    return path


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


class FaultProxy(ReverseProxy):
    """Plain-HTTP front for an HTTPS apiserver-like upstream, with injectable HTTP-level faults."""

    def __init__(self, upstream: str, ca_path: str | os.PathLike[str], *, page_limit: int | None = None) -> None:
        super().__init__(upstream, ca_path=ca_path, name="fault")
        self.page_limit = page_limit
        self.stats: Counter[str] = Counter()
        self._bursts: list[Burst] = []
        self._fail_continue = 0  # < 0: forever
        self._continue_status = 500
        self._expire_next = 0
        self._streams: set[_Stream] = set()

    async def stop(self) -> None:
        self.cut_watches()
        await super().stop()

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
    @staticmethod
    def _is_watch(request: web.Request) -> bool:
        return request.rel_url.query.get("watch", "").lower() in ("true", "1")

    async def intercept(self, request: web.Request) -> web.StreamResponse | None:
        self.stats["requests"] += 1
        is_watch = self._is_watch(request)
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
        if is_watch and self._expire_next > 0:
            self._expire_next -= 1
            self.stats["watch_expired"] += 1
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(GONE_EVENT)
            await resp.write_eof()
            return resp
        return None

    async def upstream_url(self, request: web.Request) -> str:
        rel = request.rel_url
        if self.page_limit and not self._is_watch(request) and request.method == "GET" and "limit" in rel.query:
            rel = rel.update_query({"limit": str(self.page_limit)})
            self.stats["limit_rewritten"] += 1
        return self.upstream + str(rel)

    def on_upstream_error(self, request: web.Request, exc: BaseException) -> None:
        self.stats["upstream_error"] += 1

    async def respond(self, request: web.Request, up: aiohttp.ClientResponse) -> web.StreamResponse:
        if not self._is_watch(request) or up.status != 200:
            return await self.buffered(up)
        return await self._stream(request, up, end_to_end(up.headers))

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


def replace_settings(base: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
    out = dict(base)
    out.update(kw)
    return out


__all__ = [
    "Burst", "FaultProxy", "JumpClock", "KubevirtRig", "TcpProxy", "admin_client", "replace_settings", "scratch_dir",
    "start_kubevirt", "write_kubeconfig",
]


# What a failed scenario's report shows of the controllers' logs: the decisions, not the chatter.
STORY_EVENTS = frozenset({"licensectl started", "signal received, shutting down", "leadership changed",
                          "rotation decision", "restart", "event", "delivery readiness changed"})
STORY_KEYS = ("identity", "leader", "namespace", "vm", "phase", "wave", "judged", "result", "reason", "message",
              "error", "status")


def controller_story(workdir: Path, limit: int = 120) -> list[str]:
    """The controllers' decisions and warnings from every JSON log under `workdir`, in time order:
    what a failed scenario's report needs to be read without the logs (they contain no token bytes --
    the secrecy invariant scans them)."""
    rows: list[tuple[str, str]] = []
    for path in sorted(workdir.rglob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            event, level = str(rec.get("event", "")), str(rec.get("level", ""))
            if event not in STORY_EVENTS and level not in ("warning", "error", "critical"):
                continue
            detail = " ".join(f"{k}={str(rec[k])[:160]}" for k in STORY_KEYS if rec.get(k) not in (None, ""))
            rows.append((str(rec.get("timestamp", "")), f"{str(rec.get('timestamp', ''))[11:23]} {path.stem} "
                                                        f"{level[:4]} {event}: {detail}"))
    rows.sort()
    return [text for _ts, text in rows[-limit:]]
