"""One aiohttp reverse proxy for test and dev harnesses.

Fault proxies, recording proxies, the KubeVirt restart proxy and the reports Service stand-in all
forward HTTP the same way; only what they do around the forwarding differs. Keeping the forwarding
(hop-by-hop header handling, streaming, upstream TLS, serving TLS, shutdown) in one place means a fix
to watch streaming or header handling reaches every harness at once.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from typing import Any, Self

import aiohttp
import structlog
from aiohttp import web

log = structlog.get_logger(__name__)

LOOPBACK = "127.0.0.1"

# Headers a proxy must not forward (RFC 9110 §7.6.1; "trailers" is the RFC 2616 spelling some
# clients still send), plus the ones aiohttp recomputes for the body it actually sends.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})

# Kubernetes objects and LIST pages can be large; aiohttp's 1 MiB default would reject them.
MAX_BODY = 64 * 1024 * 1024

PathLike = str | os.PathLike[str]


def end_to_end(headers: Any) -> list[tuple[str, str]]:
    """The end-to-end headers of a request or response (everything but HOP_BY_HOP), in order."""
    return [(k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP]


class ReverseProxy:
    """HTTP(S) reverse proxy on loopback that forwards every request to `upstream`.

    The base forwards all verbs with the caller's own headers (minus HOP_BY_HOP), streams response
    bodies chunk by chunk (so watches stay open), answers 502 when the upstream cannot be reached
    and 501 to Upgrade requests (exec/port-forward are not proxied).

    Options: `ca_path` verifies an HTTPS upstream against that CA; `tls=(cert, key)` makes the proxy
    itself serve HTTPS (Go clients never send a bearer token over plain HTTP); `port=0` picks a
    free port. Use as `async with Proxy(...) as p:` or call `start()`/`stop()`.

    To subclass, override only the hooks you need; each has a working default:

    - `add_routes(router)`: extra routes (e.g. a subresource the upstream lacks), registered
      before the catch-all forwarder. Handlers may call `self.forward(request)` to fall through.
    - `intercept(request)`: fault injection. Return a response to answer without contacting the
      upstream (a 503 burst, an expired watch), or None to forward.
    - `upstream_url(request)`: where the request goes (default: upstream + raw path). Raise an
      `aiohttp.web.HTTPException` to refuse (e.g. no endpoint to send to).
    - `upstream_headers(request)`: headers sent upstream (default: the end-to-end ones).
    - `respond(request, up)`: turn the upstream response into the client's (default: stream it
      with `self.stream(...)`; `self.buffered(...)` reads it whole). Override to record requests
      or to relay watches line by line.
    - `on_upstream_error(request, exc)`: called before the 502 (e.g. to count failures).

    `sever()` closes every client connection that has a request in flight, the way a load
    balancer or an apiserver restart would; `stop()` does it too so open watches do not hold it.
    """

    def __init__(
        self,
        upstream: str,
        *,
        ca_path: PathLike | None = None,
        tls: tuple[PathLike, PathLike] | None = None,
        port: int = 0,
        name: str = "proxy",
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.ca_path = os.fspath(ca_path) if ca_path is not None else None
        self.tls = tls
        self.port = port
        self.name = name
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._open: set[Any] = set()  # transports of requests in flight

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, upstream={self.upstream!r})"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{LOOPBACK}:{self.port}"

    @property
    def session(self) -> aiohttp.ClientSession:
        """The upstream client session (for subclasses that make their own upstream calls)."""
        if self._session is None:
            raise RuntimeError(f"{self!r} is not started")
        return self._session

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        upstream_ctx = ssl.create_default_context(cafile=self.ca_path)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=upstream_ctx, limit=0),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        app = web.Application(client_max_size=MAX_BODY)
        self.add_routes(app.router)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        server_ctx: ssl.SSLContext | None = None
        if self.tls:
            server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            server_ctx.load_cert_chain(os.fspath(self.tls[0]), os.fspath(self.tls[1]))
        await web.TCPSite(self._runner, LOOPBACK, self.port, ssl_context=server_ctx).start()
        self.port = int(self._runner.addresses[0][1])
        log.debug("proxy started", proxy=self.name, url=self.url, upstream=self.upstream)

    async def stop(self) -> None:
        self.sever()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def sever(self) -> int:
        """Close every client connection with a request in flight; returns how many."""
        n = 0
        for t in list(self._open):
            if not t.is_closing():
                t.close()
                n += 1
        return n

    # -- hooks -----------------------------------------------------------------------------
    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Register routes served by the proxy itself, ahead of the forwarder."""

    async def intercept(self, request: web.Request) -> web.StreamResponse | None:
        """A response to answer with instead of forwarding, or None."""
        return None

    async def upstream_url(self, request: web.Request) -> str:
        return self.upstream + request.raw_path

    def upstream_headers(self, request: web.Request) -> dict[str, str]:
        return dict(end_to_end(request.headers))

    async def respond(self, request: web.Request, up: aiohttp.ClientResponse) -> web.StreamResponse:
        return await self.stream(request, up)

    def on_upstream_error(self, request: web.Request, exc: BaseException) -> None:
        """Called when the upstream cannot be reached or fails mid-response."""

    # -- forwarding ------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            self._open.add(transport)
        try:
            injected = await self.intercept(request)
            if injected is not None:
                return injected
            return await self.forward(request)
        finally:
            if transport is not None:
                self._open.discard(transport)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        """Send `request` upstream and answer with `respond(...)`; 502 if the upstream fails."""
        if request.headers.get("Upgrade"):
            return web.Response(status=501, text="upgrade requests are not proxied")
        body = await request.read()
        url = await self.upstream_url(request)
        try:
            up_cm = self.session.request(request.method, url, headers=self.upstream_headers(request),
                                         data=body or None, allow_redirects=False)
            up = await up_cm.__aenter__()
        except (aiohttp.ClientError, OSError) as e:
            self.on_upstream_error(request, e)
            return web.Response(status=502, text=f"upstream unreachable: {type(e).__name__}")
        try:
            return await self.respond(request, up)
        except (aiohttp.ClientError, OSError) as e:
            self.on_upstream_error(request, e)
            return web.Response(status=502, text=f"upstream failed: {type(e).__name__}")
        finally:
            await up_cm.__aexit__(None, None, None)

    @staticmethod
    async def buffered(up: aiohttp.ClientResponse, body: bytes | None = None) -> web.Response:
        """The upstream response read whole (`body` if the caller already read it)."""
        data = await up.read() if body is None else body
        resp = web.Response(status=up.status, reason=up.reason, body=data)
        for k, v in end_to_end(up.headers):
            resp.headers.add(k, v)
        return resp

    @staticmethod
    async def stream(request: web.Request, up: aiohttp.ClientResponse) -> web.StreamResponse:
        """Relay the upstream response chunk by chunk until either side goes away."""
        resp = web.StreamResponse(status=up.status, reason=up.reason)
        for k, v in end_to_end(up.headers):
            resp.headers.add(k, v)
        await resp.prepare(request)
        # The upstream or the client going away mid-stream (a watch being cancelled) ends it.
        with contextlib.suppress(aiohttp.ClientError, ConnectionResetError):
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
        with contextlib.suppress(aiohttp.ClientError, ConnectionResetError):
            await resp.write_eof()
        return resp
