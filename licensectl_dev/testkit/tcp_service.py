"""A ClusterIP Service with kube-proxy in front of it, for the dev cluster's loopback processes.

The apiserver calls licensectl's webhook through the `licensectl-webhook` Service, whose endpoints
are the replicas whose readiness probe passes. A webhook configuration registered with a loopback
URL (licensectl_dev.devcluster.webhook) pointing at this proxy instead of one controller's port gets
the same behaviour: TLS passes through untouched (the apiserver verifies the controller's own
certificate against the configuration's caBundle), each connection goes to one ready endpoint,
round-robin, and with no ready endpoint the connection is refused at once, as kube-proxy rejects
traffic to a Service without endpoints. Tests decide when an endpoint is ready (`set_endpoints`),
e.g. a few seconds after a restarted controller's caches synced.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from licensectl_dev.testkit.proxy import LOOPBACK

CHUNK = 64 * 1024


class TcpService:
    """Loopback TCP proxy to a set of ready endpoint ports (L4: TLS is end to end)."""

    def __init__(self, name: str = "service") -> None:
        self.name = name
        self.port = 0
        self._endpoints: tuple[int, ...] = ()
        self._rr = itertools.count()
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._open: dict[asyncio.Task[None], int] = {}  # forwarding connection -> its endpoint port
        self.refused = 0  # connections that found no ready endpoint
        self.forwarded = 0

    def set_endpoints(self, ports: list[int] | tuple[int, ...]) -> None:
        """The ready endpoints from now on. Connections to an endpoint that left are cut, as they are
        when its pod goes away (a client's pooled keep-alive connection must not outlive it)."""
        self._endpoints = tuple(ports)
        for task, port in list(self._open.items()):
            if port not in self._endpoints:
                task.cancel()

    @property
    def endpoints(self) -> tuple[int, ...]:
        return self._endpoints

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, LOOPBACK, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for t in list(self._conns):
            t.cancel()
        for t in list(self._conns):
            with contextlib.suppress(BaseException):
                await t

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            if task is not None:
                self._conns.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ports = self._endpoints
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        if ports:
            port = ports[next(self._rr) % len(ports)]
            with contextlib.suppress(OSError):
                upstream = await asyncio.open_connection(LOOPBACK, port)
        if upstream is None:
            self.refused += 1
            writer.transport.abort()  # a reset, not a clean close: what a rejected connection looks like
            return
        self.forwarded += 1
        up_reader, up_writer = upstream
        task = asyncio.current_task()
        if task is not None:
            self._open[task] = port
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except asyncio.CancelledError:
            writer.transport.abort()
        finally:
            if task is not None:
                self._open.pop(task, None)
            for w in (writer, up_writer):
                w.close()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError, ConnectionError):
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()
    with contextlib.suppress(OSError, RuntimeError):
        if dst.can_write_eof():
            dst.write_eof()
