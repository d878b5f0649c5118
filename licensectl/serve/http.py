"""The internal HTTP listener: /metrics, /livez (alias /healthz), /readyz, /v1/status and /debug/memory.

Tenant traffic never reaches this port: guest reports have their own listener (reports.py), so
a NetworkPolicy can open one to tenants and keep the other for monitoring only. What ready and
live mean is decided in core/readiness.py (docs/design.md#readiness); the body says why not.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST

from licensectl.core.readiness import Readiness
from licensectl.metrics import Metrics, render
from licensectl.serve.memory_report import current_report

# A scrape's text is sent in pieces of this size, each drained before the next (aiohttp drains a write
# over 64 KiB): the transport's buffer holds at most about one piece, not a second copy of the text.
SCRAPE_PIECE = 256 * 1024


async def send_text(request: web.Request, body: bytearray, content_type: str) -> web.StreamResponse:
    """Send `body` and let go of it once it is sent. aiohttp's connection keeps the response a handler
    returned until the next request on that connection, and Prometheus keeps its connection open
    between scrapes: a `web.Response` would hold the last scrape's text (6 MiB at 50,000 VMIs) all
    the while, and beside the next one as it is written. A streamed response holds no body. A scraper
    that goes away mid-text (its scrape timeout) ends the answer quietly, as aiohttp ends a plain one."""
    resp = web.StreamResponse(headers={hdrs.CONTENT_TYPE: content_type})
    resp.content_length = len(body)
    await resp.prepare(request)
    if request.method != hdrs.METH_HEAD:
        view = memoryview(body)
        try:
            for start in range(0, len(view), SCRAPE_PIECE):
                await resp.write(view[start:start + SCRAPE_PIECE])
        except ConnectionError:
            return resp  # aiohttp's own ending of the response meets the closed connection and stops there
    await resp.write_eof()
    return resp


def _answer(r: Readiness) -> web.Response:
    return web.Response(text="ok\n") if r.ready else web.Response(status=503, text=f"{r.reason}\n")


def make_internal_app(metrics: Metrics, *, ready: Callable[[], Readiness], live: Callable[[], Readiness],
                      status: Callable[[], Mapping[str, Any]]) -> web.Application:
    async def metrics_handler(request: web.Request) -> web.StreamResponse:
        return await send_text(request, await render(metrics), CONTENT_TYPE_LATEST)

    async def livez(_: web.Request) -> web.Response:
        return _answer(live())

    async def readyz(_: web.Request) -> web.Response:
        return _answer(ready())

    async def status_handler(_: web.Request) -> web.Response:
        return web.json_response(status())

    async def memory_handler(_: web.Request) -> web.Response:
        rep = await asyncio.to_thread(current_report)
        if rep is None:
            return web.Response(status=404, text="allocation tracing is off: start licensectl with "
                                                 "PYTHONTRACEMALLOC=1 to see where its memory is\n")
        return web.Response(text=rep.text())

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/debug/memory", memory_handler)
    app.router.add_get("/livez", livez)
    app.router.add_get("/healthz", livez)  # the name manifests of earlier releases probe
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/status", status_handler)
    return app


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host.strip("[]") or "0.0.0.0"), int(port)  # noqa: S104 - an explicit ":8080" means all interfaces


async def start_site(app: web.Application, address: str, *,
                     ssl_context: ssl.SSLContext | None = None) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (for cleanup) and the bound port (address may say port 0).

    With `ssl_context` the listener serves HTTPS; reloading that context's certificate in place
    (kube/serving_tls.py) changes what new handshakes present, without restarting the listener.
    """
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    host, port = split_address(address)
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    server: Any = site._server  # the bound socket tells the real port when 0 was asked for
    bound = int(server.sockets[0].getsockname()[1]) if server and server.sockets else port
    return runner, bound

