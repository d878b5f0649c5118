"""/metrics over HTTP: the text arrives whole, and the server lets go of it once it is sent."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import struct
import tracemalloc
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientSession, TCPConnector
from aiohttp.test_utils import TestServer
from prometheus_client import CONTENT_TYPE_LATEST

from licensectl.core.readiness import Readiness
from licensectl.metrics import GaugeSample, Metrics, render
from licensectl.serve.http import SCRAPE_PIECE, make_internal_app

pytestmark = pytest.mark.asyncio

SERIES = 20_000  # about 2 MiB of text: several pieces, and large beside what a scrape leaves behind


def _fleet(n: int) -> list[GaugeSample]:
    return [GaugeSample("guest_license_state", (("namespace", f"tenant-{i % 500}"), ("vmi", f"vm-{i}"),
                                                ("tenant", f"tenant-{i % 500}"), ("state", "unknown")), 1.0)
            for i in range(n)]


@contextlib.asynccontextmanager
async def _serving(series: int) -> AsyncIterator[tuple[Metrics, TestServer]]:
    """The internal listener on loopback, its /metrics `series` guest series long."""
    ok = Readiness(True, "ok")
    m = Metrics()
    samples = _fleet(series)
    m.snapshots.add(lambda: samples)
    server = TestServer(make_internal_app(m, ready=lambda: ok, live=lambda: ok, status=dict))
    await server.start_server()
    try:
        yield m, server
    finally:
        await server.close()


@pytest.fixture
async def served() -> AsyncIterator[tuple[Metrics, TestServer]]:
    async with _serving(SERIES) as pair:
        yield pair


async def test_a_scrape_gets_the_whole_text_with_its_length(served: tuple[Metrics, TestServer]) -> None:
    m, server = served
    expected = bytes(await render(m))
    assert len(expected) > 4 * SCRAPE_PIECE
    async with ClientSession() as s, s.get(server.make_url("/metrics")) as r:
        assert r.status == 200
        assert r.headers["Content-Type"] == CONTENT_TYPE_LATEST
        assert int(r.headers["Content-Length"]) == len(expected)
        assert await r.read() == expected


async def test_a_head_request_gets_no_body_and_the_connection_serves_the_next_scrape(
        served: tuple[Metrics, TestServer]) -> None:
    _, server = served
    async with ClientSession(connector=TCPConnector(limit=1)) as s:
        async with s.head(server.make_url("/metrics")) as r:
            assert r.status == 200 and await r.read() == b""
        async with s.get(server.make_url("/metrics")) as r:  # the same kept-alive connection
            body = await r.read()
            assert r.status == 200 and body.endswith(b"\n") and b'vmi="vm-19999"' in body


async def test_the_server_holds_no_scrape_text_between_scrapes(served: tuple[Metrics, TestServer]) -> None:
    """Prometheus keeps its connection open between scrapes; a response kept with it would keep the
    last text (6 MiB at 50,000 VMIs) until the next scrape, and beside the next one."""
    m, server = served
    text_bytes = len(await render(m))
    async with ClientSession(connector=TCPConnector(limit=1)) as s:
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(2):
                async with s.get(server.make_url("/metrics")) as r:
                    assert len(await r.read()) == text_bytes
                del r  # the client's copy: what is left is the server's
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert held < text_bytes / 4, f"{held:,} bytes held after the scrapes, the text is {text_bytes:,}"


async def test_a_scraper_gone_mid_text_is_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    """A Prometheus scrape timeout closes the connection while the text is being sent: nothing to log
    as an error (aiohttp logs a handler's exception as one, with its traceback)."""
    async with _serving(5 * SERIES) as (_, server):  # ~11 MiB: more than the two sockets' buffers take
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (server.host, server.port))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        await reader.readexactly(64 * 1024)  # the text has started
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # a reset, as a scraper's timeout leaves it
        await asyncio.sleep(1.0)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, [r.getMessage() for r in errors]
        # The server goes on serving.
        async with ClientSession() as s, s.get(server.make_url("/readyz")) as r:
            assert r.status == 200
