"""Reading one apiserver answer to a LIST or WATCH: status, JSON body, Retry-After, release.

A failed answer becomes `wire.failure`'s Gone or ApiError, carrying a code and a Status reason only:
neither an exception nor a log line ever holds a response body (Secrets!).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import structlog

from licensectl.kube import jsoncodec
from licensectl.kube.watch import wire
from licensectl.kube.watch.backoff import parse_retry_after

log = structlog.get_logger(__name__)


async def list_body(resp: Any) -> dict[str, Any]:
    """The decoded body of a LIST page; a failed or undecodable answer raises. Releases `resp`."""
    try:
        status = int(getattr(resp, "status", 0) or 0)
        doc = loads(await resp.read())
        if not 200 <= status <= 299:
            raise wire.failure(status, doc or {}, retry_after_header(resp))
        if doc is None:
            raise wire.ApiError(status, "UndecodableListBody")
        return doc
    finally:
        close(resp)


async def check_watch_opened(resp: Any) -> None:
    """Raise what a watch answered instead of a stream (its Status, read up to 64 KiB); the caller
    releases `resp`."""
    status = int(getattr(resp, "status", 0) or 0)
    if status != 200:
        doc = loads(await resp.content.read(64 * 1024)) or {}
        raise wire.failure(status, doc, retry_after_header(resp))


async def lines(resp: Any, max_line: int) -> AsyncIterator[bytes]:
    """The lines of a watch stream until the server ends it; a line over `max_line` bytes raises
    wire.LineTooLong."""
    splitter = wire.LineSplitter(max_line)
    while True:
        chunk = await resp.content.readany()
        if not chunk:
            tail = splitter.finish()
            if tail is not None:
                yield tail
            return
        for line in splitter.feed(chunk):
            yield line


def loads(raw: bytes | None) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        doc = jsoncodec.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def retry_after_header(resp: Any) -> float | None:
    headers = getattr(resp, "headers", None)
    value = headers.get("Retry-After") if headers is not None else None
    return parse_retry_after(value if isinstance(value, str) else None)


def close(resp: Any) -> None:
    release = getattr(resp, "close", None)
    if callable(release):
        try:
            release()
        except Exception as e:
            log.debug("informer.close_failed", error=type(e).__name__)


def describe(e: BaseException | None) -> str:
    """Exception type and, for our own API errors, code + Status reason; never a response body."""
    if e is None:
        return ""
    if isinstance(e, wire.ApiError):
        return f"ApiError({e.code} {e.reason})"
    status = getattr(e, "status", None)
    if isinstance(status, int):
        return f"{type(e).__name__}({status})"
    return type(e).__name__
