"""structlog setup: JSON lines in-cluster, a readable console locally.

Log calls carry names, reasons and revisions only. Token bytes never reach a log call; as a last
line of defence, values under keys that look like secrets are redacted before rendering.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_KEYS = frozenset({"token", "data", "credential", "authorization", "key", "password", "secret_data"})


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for k in list(event):
        if k.lower() in _SECRET_KEYS:
            event[k] = "[redacted]"
    return event


def configure(fmt: str = "console", level: str = "info", stream: Any = None) -> None:
    """Configure structlog (and stdlib logging, which aiohttp and kubernetes-asyncio use)."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    out = stream if stream is not None else sys.stderr
    renderer: Any = (structlog.processors.JSONRenderer() if fmt == "json"
                     else structlog.dev.ConsoleRenderer(colors=out.isatty() if hasattr(out, "isatty") else False))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=out, format="%(levelname)s %(name)s %(message)s",
                        force=True)


def get(name: str) -> Any:
    return structlog.get_logger(name)
