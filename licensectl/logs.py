"""structlog setup: JSON lines in-cluster, a readable console locally; and how a failure is logged.

Log calls carry names, reasons and revisions only. Token bytes never reach a log call; as a last
line of defence, values under keys that look like secrets are redacted before rendering, and so are
long opaque runs (a token, a key) in an exception's text.

A caught failure is logged with its type, its message and, rate-limited, its traceback
(`failure_fields`, `TracebackLimit`): a bare `error=KeyError` says nothing about where, and a traceback
every 30 s of a stuck loop says nothing more after the first.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable, MutableMapping
from types import TracebackType
from typing import Any

import structlog

_SECRET_KEYS = frozenset({"token", "data", "credential", "authorization", "key", "password", "secret_data"})

# A run of base64 (or base64url) characters long enough to be a token or key material. Redacted only
# when it mixes upper case, lower case and digits: Kubernetes names, paths and hex digests do not.
_OPAQUE_RUN = re.compile(r"[A-Za-z0-9+/_-]{40,}=*")
REDACTED = "[redacted]"

# How long a message may run in a log line, and how often one loop's same failure gets its traceback.
MESSAGE_LIMIT = 300
TRACEBACK_EVERY_SECONDS = 300.0


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for k in list(event):
        if k.lower() in _SECRET_KEYS:
            event[k] = REDACTED
    return event


def _opaque(run: str) -> bool:
    return any(c.isupper() for c in run) and any(c.islower() for c in run) and any(c.isdigit() for c in run)


def scrub(text: str) -> str:
    """`text` with every long opaque run (what a token or a key looks like) replaced by [redacted]."""
    return _OPAQUE_RUN.sub(lambda m: REDACTED if _opaque(m.group(0)) else m.group(0), text)


def _scrub_exception(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """After `format_exc_info`: the rendered traceback ends with the exception's own text."""
    exc = event.get("exception")
    if isinstance(exc, str):
        event["exception"] = scrub(exc)
    return event


def configure(fmt: str = "console", level: str = "info", stream: Any = None) -> None:
    """Configure structlog (and stdlib logging, which aiohttp and kubernetes-asyncio use).

    An `exc_info` is rendered by `format_exc_info` into an `exception` string for both formats (a JSON
    field, or the lines under a console entry): the standard library's traceback, which shows code
    lines and never local variables, scrubbed like a message."""
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
            _scrub_exception,
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


def error_message(e: BaseException) -> str:
    """What a log line may say of `e` beside its type: its text, scrubbed, at most MESSAGE_LIMIT characters.

    An exception that carries a response body (kubernetes-asyncio's ApiException, whose text includes
    it) is told by status and reason only: the answer to a Secret call may echo the Secret. licensectl's
    own ApiException carries no body."""
    if getattr(e, "body", None) is not None:
        text = f"({getattr(e, 'status', '')}) {getattr(e, 'reason', '') or ''}".strip()
    else:
        text = str(e)
    text = scrub(text)
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT - 1] + "…"


def _origin(tb: TracebackType | None) -> tuple[str, int] | None:
    """Where an exception was raised: the innermost frame of its traceback."""
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return (tb.tb_frame.f_code.co_filename, tb.tb_lineno)


class TracebackLimit:
    """Whose failures get their traceback logged: the first of each distinct error in a scope (a loop),
    then at most one every `every` seconds. Distinct means another type or another place it was raised,
    so a message that changes from pass to pass (a count, a name) is still the same failure.

    The one-line error is for the caller to log every time; this only decides about the traceback."""

    def __init__(self, every: float = TRACEBACK_EVERY_SECONDS, *, clock: Callable[[], float] = time.monotonic,
                 max_kept: int = 256) -> None:
        self.every = every
        self._clock = clock
        self._max_kept = max_kept
        self._last: dict[tuple[str, str, tuple[str, int] | None], float] = {}

    def due(self, scope: str, e: BaseException) -> bool:
        """Whether this failure's traceback is logged now (and, if so, counted as logged)."""
        now = self._clock()
        key = (scope, f"{type(e).__module__}.{type(e).__qualname__}", _origin(e.__traceback__))
        last = self._last.get(key)
        if last is not None and now - last < self.every:
            return False
        if len(self._last) >= self._max_kept:  # forget what is past its window; bounded however many errors
            self._last = {k: t for k, t in self._last.items() if now - t < self.every}
        self._last[key] = now
        return True


def failure_fields(e: BaseException, *, traceback: bool = True) -> dict[str, Any]:
    """The fields of a failure's log line: `error` (the type, as always), `message`, and with
    `traceback` an `exc_info` that the renderer turns into the traceback."""
    fields: dict[str, Any] = {"error": type(e).__name__, "message": error_message(e)}
    if traceback:
        fields["exc_info"] = e
    return fields
