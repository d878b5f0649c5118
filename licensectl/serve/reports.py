"""The tenant-facing report endpoint: `POST /v1/reports` (wire format in docs/guest.md).

A thin shell around the pure parts: headers and credential first (cheap), then a bounded,
time-limited body read, then `guest_report.parse_report` and `evaluate`. Every request ends in
exactly one result reason passed to `on_result` (a metric label) and, when rejected, a JSON
`{"error": reason, "message": ...}` that never echoes the credential or report content.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import structlog
from aiohttp import web

from licensectl.core.credentials import KeyRing
from licensectl.core.guest_report import (
    DEFAULT_LIMITS,
    REASONS,
    TOO_LARGE,
    GuestState,
    ReportError,
    ReportLimits,
    evaluate,
    parse_report,
)

log = structlog.get_logger(__name__)

REPORTS_PATH: Final = "/v1/reports"
NAMESPACE_HEADER: Final = "X-Licensectl-Namespace"

ACCEPTED: Final = "accepted"
NOT_READY: Final = "not_ready"
RATE_LIMITED: Final = "rate_limited"
BAD_REQUEST: Final = "bad_request"
BAD_CONTENT_TYPE: Final = "bad_content_type"
UNAUTHORIZED: Final = "unauthorized"
TIMEOUT: Final = "timeout"
UNKNOWN_UUID: Final = "unknown_uuid"
CLOCK_SKEW: Final = "clock_skew"
REPLAY: Final = "replay"
INTERNAL: Final = "internal"
# Every value on_result can receive: pre-declare metric label values from this.
RESULTS: Final = frozenset({ACCEPTED, NOT_READY, RATE_LIMITED, BAD_REQUEST, BAD_CONTENT_TYPE, UNAUTHORIZED,
                            TIMEOUT, UNKNOWN_UUID, CLOCK_SKEW, REPLAY, INTERNAL} | REASONS)

_STATUS: Final = {
    NOT_READY: 503, RATE_LIMITED: 429, BAD_REQUEST: 400, BAD_CONTENT_TYPE: 415, UNAUTHORIZED: 401,
    TIMEOUT: 408, UNKNOWN_UUID: 403, CLOCK_SKEW: 422, REPLAY: 409, INTERNAL: 500, TOO_LARGE: 413,
}
_ACCEPTED_BODY: Final = b'{"result": "accepted"}'  # what web.json_response({"result": ACCEPTED}) wrote
# What the probe sends; any other spelling is parsed by aiohttp and checked as before.
_PROBE_CONTENT_TYPE: Final = "text/plain; charset=utf-8"
_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_BEARER = re.compile(r"Bearer ([A-Za-z0-9_-]{16,128})")


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """A token bucket as a value: `take` returns the next bucket, time is passed in (seconds)."""

    rate: float
    burst: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        return cls(rate=rate, burst=burst, tokens=burst, updated=now)

    def refill(self, now: float) -> TokenBucket:
        elapsed = max(0.0, now - self.updated)  # a clock stepping back never adds tokens
        tokens = min(self.burst, self.tokens + elapsed * self.rate)
        # The constructor, not dataclasses.replace: this runs twice per report (global + namespace).
        return TokenBucket(self.rate, self.burst, tokens, max(now, self.updated))

    def take(self, now: float, cost: float = 1.0) -> tuple[TokenBucket, bool]:
        # `refill` inlined: one bucket built per take, not two (this runs twice per report).
        tokens = min(self.burst, self.tokens + max(0.0, now - self.updated) * self.rate)
        updated = max(now, self.updated)
        if tokens >= cost:
            return TokenBucket(self.rate, self.burst, tokens - cost, updated), True
        return TokenBucket(self.rate, self.burst, tokens, updated), False

    def retry_after(self, cost: float = 1.0) -> float:
        """Seconds until `cost` tokens are available (inf when the rate is zero)."""
        if self.tokens >= cost:
            return 0.0
        return float("inf") if self.rate <= 0 else (cost - self.tokens) / self.rate


@dataclass(frozen=True, slots=True)
class EndpointLimits:
    """Bounds of the endpoint. Rates are reports per second; a guest reports about once a minute."""

    report: ReportLimits = DEFAULT_LIMITS
    namespace_rate: float = 5.0
    namespace_burst: float = 60.0
    global_rate: float = 100.0
    global_burst: float = 1000.0
    # A guest clock outside now ± window is refused, so a future clock cannot poison replay state.
    clock_window: dt.timedelta = dt.timedelta(hours=1)
    read_timeout_seconds: float = 10.0
    max_tracked: int = 100_000  # bound on per-namespace buckets and per-VMI replay entries


@dataclass
class _State:
    """Mutable shell state: buckets and the last accepted guest clock per VMI (both LRU-bounded)."""

    limits: EndpointLimits
    global_bucket: TokenBucket | None = None
    buckets: OrderedDict[str, TokenBucket] = field(default_factory=OrderedDict)
    last_clock: OrderedDict[tuple[str, str], dt.datetime] = field(default_factory=OrderedDict)

    def take_global(self, now: float) -> tuple[bool, float]:
        b = self.global_bucket or TokenBucket.full(self.limits.global_rate, self.limits.global_burst, now)
        self.global_bucket, ok = b.take(now)
        return ok, self.global_bucket.retry_after()

    def take_namespace(self, namespace: str, now: float) -> tuple[bool, float]:
        b = self.buckets.pop(namespace, None) or TokenBucket.full(
            self.limits.namespace_rate, self.limits.namespace_burst, now)
        b, ok = b.take(now)
        self.buckets[namespace] = b
        while len(self.buckets) > self.limits.max_tracked:
            self.buckets.popitem(last=False)
        return ok, b.retry_after()

    def remember(self, key: tuple[str, str], clock: dt.datetime) -> None:
        self.last_clock.pop(key, None)
        self.last_clock[key] = clock
        while len(self.last_clock) > self.limits.max_tracked:
            self.last_clock.popitem(last=False)


class _Reject(Exception):
    def __init__(self, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.headers = headers or {}


def _status(reason: str) -> int:
    return _STATUS.get(reason, 400)


async def _read_body(request: web.Request, limit: int, read_seconds: float) -> bytes:
    """Read at most `limit` bytes, refusing early: Content-Length first, then while streaming."""
    if request.content_length is not None and request.content_length > limit:
        raise _Reject(TOO_LARGE, f"body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    content = request.content
    if content.is_eof():
        # The whole body arrived with the headers (a report is a few KiB): take what is buffered,
        # no timer and no chunk iterator. The bound still applies.
        while not content.at_eof():
            chunk = content.read_nowait(-1)
            size += len(chunk)
            if size > limit:
                raise _Reject(TOO_LARGE, f"body exceeds {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    try:
        async with asyncio.timeout(read_seconds):
            async for chunk in request.content.iter_chunked(64 * 1024):
                size += len(chunk)
                if size > limit:
                    raise _Reject(TOO_LARGE, f"body exceeds {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise _Reject(TIMEOUT, "body not received in time") from None
    return b"".join(chunks)


def make_reports_app(
    *,
    keyring_provider: Callable[[], KeyRing | None],
    uuid_known: Callable[[str, str], str | None],
    token_sha_for: Callable[[str, str], str | None],
    on_report: Callable[[str, str, GuestState], None],
    on_result: Callable[[str], None],
    limits: EndpointLimits | None = None,
    clock: Callable[[], dt.datetime],
) -> web.Application:
    """The aiohttp app serving `POST /v1/reports`.

    keyring_provider: the signing keys, or None while this replica cannot verify (503 not_ready).
    uuid_known(namespace, smbios_uuid): name of the VMI with that firmware UUID there, or None.
    token_sha_for(namespace, vmi): SHA-256 (hex) of the token the VMI's replica currently holds.
    on_report(namespace, vmi, state): called once per accepted report.
    on_result(reason): called exactly once per request with its result (one of RESULTS).
    """
    lim = limits or EndpointLimits()
    state = _State(limits=lim)

    async def handle(request: web.Request) -> web.Response:
        ctx: dict[str, str] = {}
        try:
            await _accept(request, ctx)
        except _Reject as r:
            on_result(r.reason)
            log.info("guest report rejected", reason=r.reason, namespace=ctx.get("namespace"),
                     vmi=ctx.get("vmi"), remote=request.remote)
            return web.json_response({"error": r.reason, "message": r.message},
                                     status=_status(r.reason), headers=r.headers)
        except Exception:
            on_result(INTERNAL)
            log.exception("guest report failed", namespace=ctx.get("namespace"), vmi=ctx.get("vmi"))
            return web.json_response({"error": INTERNAL, "message": "internal error"}, status=500)
        on_result(ACCEPTED)  # counted, not logged: a log call per report costs more than the metric
        return web.Response(body=_ACCEPTED_BODY, status=202, content_type="application/json", charset="utf-8")

    async def _accept(request: web.Request, ctx: dict[str, str]) -> tuple[str, str, GuestState]:
        now = clock()
        ring = keyring_provider()
        if ring is None:
            raise _Reject(NOT_READY, "not ready to verify reports", {"Retry-After": "10"})
        ok, wait = state.take_global(now.timestamp())
        if not ok:
            raise _Reject(RATE_LIMITED, "too many reports", {"Retry-After": str(max(1, round(wait)))})

        namespace = request.headers.get(NAMESPACE_HEADER, "")
        if not _NAMESPACE.fullmatch(namespace):
            raise _Reject(BAD_REQUEST, f"missing or malformed {NAMESPACE_HEADER} header")
        if request.headers.get("Content-Type") != _PROBE_CONTENT_TYPE and (
                request.content_type != "text/plain" or (request.charset or "utf-8").lower() != "utf-8"):
            raise _Reject(BAD_CONTENT_TYPE, "Content-Type must be text/plain (UTF-8)")
        auth = _BEARER.fullmatch(request.headers.get("Authorization", ""))
        if auth is None or not ring.verify(namespace, auth.group(1)):
            raise _Reject(UNAUTHORIZED, "missing or invalid credential for this namespace",
                          {"WWW-Authenticate": 'Bearer realm="licensectl"'})
        ctx["namespace"] = namespace
        ok, wait = state.take_namespace(namespace, now.timestamp())
        if not ok:
            raise _Reject(RATE_LIMITED, "too many reports for this namespace",
                          {"Retry-After": str(max(1, round(wait)))})

        body = await _read_body(request, lim.report.max_body_bytes, lim.read_timeout_seconds)
        try:
            report = parse_report(body, lim.report)
        except ReportError as e:
            raise _Reject(e.reason, e.message) from None

        vmi = uuid_known(namespace, report.uuid)
        if vmi is None:
            raise _Reject(UNKNOWN_UUID, "no VMI with this SMBIOS UUID in this namespace")
        ctx["vmi"] = vmi
        if abs(report.clock - now) > lim.clock_window:
            raise _Reject(CLOCK_SKEW, "guest clock is too far from the controller's clock")
        key = (namespace, vmi)
        last = state.last_clock.get(key)
        if last is not None and report.clock <= last:
            raise _Reject(REPLAY, "not newer than the last accepted report of this VMI")

        guest = evaluate(report, current_token_sha256=token_sha_for(namespace, vmi), now=now)
        on_report(namespace, vmi, guest)
        state.remember(key, report.clock)
        return namespace, vmi, guest

    app = web.Application(client_max_size=lim.report.max_body_bytes + 1)
    app.router.add_post(REPORTS_PATH, handle)
    return app
