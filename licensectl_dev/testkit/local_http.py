"""Serve an aiohttp app on a free loopback port for the length of a test: a stand-in apiserver."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

from aiohttp import web


@contextlib.asynccontextmanager
async def serve(app: web.Application, host: str = "127.0.0.1", *,
                ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """Yield the app's base URL (`http://host:port`, https with `ssl_context`); the site is torn down
    on exit, also on errors."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, ssl_context=ssl_context)
    await site.start()
    try:
        yield f"{'https' if ssl_context else 'http'}://{host}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
