"""reports: the POST /v1/reports shell, driven through a real aiohttp server with an injected clock."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from licensectl.core.credentials import Holders, KeyRing, derive_credential
from licensectl.core.guest_report import (
    SECTION_GRIDD_LOG,
    SECTION_SMI_XML,
    GuestState,
    LicenseState,
    ReportLimits,
    evaluate,
    parse_report,
    render_report,
)
from licensectl.serve.reports import RESULTS, EndpointLimits, TokenBucket, make_reports_app

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"
XML = (FIXTURES / "smi-qx-licensed-l40s-2q-trimmed.xml").read_text()
LOG = (FIXTURES / "gridd-log-acquired-cls.txt").read_text()
K1 = bytes(range(32))
K2 = bytes(range(100, 132))
NS = "tenant-foo"
OTHER = "tenant-bar"
UUID = "5d307ca9-b3ef-428d-8be6-5b4c7e0ac3c2"
TOKEN = b"header.payload.signature"
TOKEN_SHA = hashlib.sha256(TOKEN).hexdigest()
T0 = dt.datetime(2026, 5, 1, 12, 0, 0, tzinfo=dt.UTC)


@dataclass
class Harness:
    ring: KeyRing | None = field(default_factory=lambda: KeyRing(current=K1))
    now: dt.datetime = T0
    known: dict[tuple[str, str], str] = field(default_factory=lambda: {(NS, UUID): "vm-1", (OTHER, UUID): "vm-9"})
    reports: list[tuple[str, str, GuestState]] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    fail_on_report: bool = False

    def on_report(self, ns: str, vmi: str, state: GuestState) -> None:
        if self.fail_on_report:
            raise RuntimeError("sink down")
        self.reports.append((ns, vmi, state))


def body(clock: dt.datetime = T0, uuid: str = UUID, xml: str = XML) -> bytes:
    return render_report(uuid=uuid, hostname="vm-1", clock=int(clock.timestamp()), token_sha256=TOKEN_SHA,
                         probe_version="1.0", sections=[(SECTION_SMI_XML, xml), (SECTION_GRIDD_LOG, LOG)])


def headers(ns: str = NS, cred: str | None = None, key: bytes = K1) -> dict[str, str]:
    return {"Authorization": f"Bearer {cred if cred is not None else derive_credential(key, ns)}",
            "X-Licensectl-Namespace": ns, "Content-Type": "text/plain; charset=utf-8"}


@pytest.fixture
async def make_client() -> AsyncIterator[Any]:
    clients: list[TestClient[Any, Any]] = []

    async def make(h: Harness, limits: EndpointLimits | None = None) -> TestClient[Any, Any]:
        app = make_reports_app(
            keyring_provider=lambda: h.ring,
            uuid_known=lambda ns, uuid: h.known.get((ns, uuid)),
            token_sha_for=lambda ns, vmi: TOKEN_SHA if vmi == "vm-1" else None,
            on_report=h.on_report,
            on_result=h.results.append,
            limits=limits,
            clock=lambda: h.now,
        )
        client: TestClient[Any, Any] = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for c in clients:
        await c.close()


async def post(client: TestClient[Any, Any], data: Any, hdrs: dict[str, str]) -> tuple[int, dict[str, Any], str]:
    resp = await client.post("/v1/reports", data=data, headers=hdrs)
    text = await resp.text()
    return resp.status, (await resp.json() if text else {}), text


async def test_accepted(make_client: Any) -> None:
    h = Harness()
    c = await make_client(h)
    status, js, _ = await post(c, body(), headers())
    assert (status, js) == (202, {"result": "accepted"})
    assert h.results == ["accepted"]
    ((ns, vmi, st),) = h.reports
    assert (ns, vmi, st.state, st.product, st.token_current, st.reported_at) == (
        NS, "vm-1", LicenseState.LICENSED, "NVIDIA RTX Virtual Workstation", True, T0)
    assert st.expiry == dt.datetime(2026, 7, 7, 16, 1, 44, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("hdrs", "status", "reason"),
    [
        (headers(cred="A" * 43), 401, "unauthorized"),  # forged
        (headers(cred=derive_credential(K1, OTHER)), 401, "unauthorized"),  # another namespace's credential
        (headers(key=K2), 401, "unauthorized"),  # right shape, unknown key
        ({**headers(), "Authorization": ""}, 401, "unauthorized"),
        ({**headers(), "Authorization": "Basic dXNlcjpwYXNz"}, 401, "unauthorized"),
        ({**headers(), "X-Licensectl-Namespace": "Tenant_Foo"}, 400, "bad_request"),
        ({k: v for k, v in headers().items() if k != "X-Licensectl-Namespace"}, 400, "bad_request"),
        ({**headers(), "Content-Type": "application/json"}, 415, "bad_content_type"),
        ({**headers(), "Content-Type": "text/plain; charset=latin-1"}, 415, "bad_content_type"),
    ],
)
async def test_header_rejections(make_client: Any, hdrs: dict[str, str], status: int, reason: str) -> None:
    h = Harness()
    c = await make_client(h)
    got, js, text = await post(c, body(), hdrs)
    assert (got, js["error"], h.results, h.reports) == (status, reason, [reason], [])
    assert derive_credential(K1, NS) not in text and "A" * 43 not in text


@pytest.mark.parametrize("ctype", ["text/plain; charset=utf-8", "text/plain", "text/plain;charset=UTF-8",
                                   'text/plain; charset="utf-8"'])
async def test_plain_text_utf8_in_any_spelling_is_accepted(make_client: Any, ctype: str) -> None:
    h = Harness()
    c = await make_client(h)
    assert (await post(c, body(), {**headers(), "Content-Type": ctype}))[0] == 202


async def test_unauthorized_says_bearer(make_client: Any) -> None:
    c = await make_client(Harness())
    resp = await c.post("/v1/reports", data=body(), headers=headers(cred="A" * 43))
    assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")


async def test_unknown_uuid(make_client: Any) -> None:
    h = Harness()
    c = await make_client(h)
    status, js, _ = await post(c, body(uuid="00000000-0000-0000-0000-000000000001"), headers())
    assert (status, js["error"], h.results) == (403, "unknown_uuid", ["unknown_uuid"])


async def test_uuid_of_other_namespace_vmi_is_unknown_here(make_client: Any) -> None:
    h = Harness(known={(OTHER, UUID): "vm-9"})
    c = await make_client(h)
    status, js, _ = await post(c, body(), headers(NS))
    assert (status, js["error"]) == (403, "unknown_uuid")


@pytest.mark.parametrize(
    ("payload", "status", "reason"),
    [
        (body(xml='<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/shadow">]><nvidia_smi_log>&e;</nvidia_smi_log>'),
         400, "xml_forbidden"),
        (b"\x89PNG\r\n\x1a\n garbage", 400, "bad_encoding"),
        (b"GET / HTTP/1.1\nHost: x\n", 400, "bad_format"),
        (body()[:200], 400, "bad_format"),
        (body(xml="<nvidia_smi_log><gpu>"), 400, "bad_xml"),
    ],
    ids=["xxe", "binary", "garbage", "truncated", "bad-xml"],
)
async def test_body_rejections(make_client: Any, payload: bytes, status: int, reason: str) -> None:
    h = Harness()
    c = await make_client(h)
    got, js, text = await post(c, payload, headers())
    assert (got, js["error"], h.results, h.reports) == (status, reason, [reason], [])
    assert "shadow" not in text


async def test_oversized_with_content_length(make_client: Any) -> None:
    h = Harness()
    c = await make_client(h, EndpointLimits(report=ReportLimits(max_body_bytes=4096)))
    status, js, _ = await post(c, body() + b"x" * 10_000, headers())
    assert (status, js["error"], h.results) == (413, "too_large", ["too_large"])


async def test_oversized_streamed_without_content_length(make_client: Any) -> None:
    h = Harness()
    # The read timeout is far longer than the test: only a check while streaming can answer 413.
    limits = EndpointLimits(report=ReportLimits(max_body_bytes=4096), read_timeout_seconds=30)
    c = await make_client(h, limits)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * 8192
        await asyncio.sleep(30)  # the rest never comes
        yield b"x"

    async with asyncio.timeout(10):
        resp = await c.post("/v1/reports", data=chunks(), headers=headers())
    assert resp.status == 413 and (await resp.json())["error"] == "too_large"
    assert h.results == ["too_large"]


async def test_slow_body_times_out(make_client: Any) -> None:
    h = Harness()
    c = await make_client(h, EndpointLimits(read_timeout_seconds=0.2))

    async def slow() -> AsyncIterator[bytes]:
        yield b"licensectl-report: 1\n"
        await asyncio.sleep(1.0)
        yield b"--- end\n"

    resp = await c.post("/v1/reports", data=slow(), headers=headers())
    assert resp.status == 408 and (await resp.json())["error"] == "timeout"
    assert h.results == ["timeout"]


async def test_replay_and_older_clock_rejected(make_client: Any) -> None:
    h = Harness()
    c = await make_client(h)
    assert (await post(c, body(T0), headers()))[0] == 202
    status, js, _ = await post(c, body(T0), headers())
    assert (status, js["error"]) == (409, "replay")
    status, js, _ = await post(c, body(T0 - dt.timedelta(seconds=60)), headers())
    assert (status, js["error"]) == (409, "replay")
    h.now = T0 + dt.timedelta(seconds=60)
    assert (await post(c, body(h.now), headers()))[0] == 202
    assert h.results == ["accepted", "replay", "replay", "accepted"]
    assert len(h.reports) == 2


async def test_repeated_sections_give_what_a_fresh_parse_gives(make_client: Any) -> None:
    """A report repeating the previous one's sections: each report's state is exactly that of
    parsing and evaluating it alone (the guest clock places yearless log times)."""
    h = Harness()
    c = await make_client(h)
    # Most of a year apart: the yearless syslog time of the log lands in the next year, same section text.
    clocks = [T0, T0 + dt.timedelta(seconds=60), T0 + dt.timedelta(days=340)]
    for clock in clocks:
        h.now = clock
        assert (await post(c, body(clock), headers()))[0] == 202
    assert [st for _, _, st in h.reports] == [
        evaluate(parse_report(body(t)), current_token_sha256=TOKEN_SHA, now=t) for t in clocks]
    assert h.reports[0][2].last_event_at != h.reports[2][2].last_event_at


async def test_replay_state_is_per_vmi(make_client: Any) -> None:
    h = Harness()
    c = await make_client(h)
    assert (await post(c, body(T0), headers(NS)))[0] == 202
    assert (await post(c, body(T0), headers(OTHER)))[0] == 202  # same UUID, other namespace's VMI


@pytest.mark.parametrize("offset", [dt.timedelta(hours=2), -dt.timedelta(hours=2)])
async def test_guest_clock_far_off_rejected(make_client: Any, offset: dt.timedelta) -> None:
    h = Harness()
    c = await make_client(h)
    status, js, _ = await post(c, body(T0 + offset), headers())
    assert (status, js["error"], h.reports) == (422, "clock_skew", [])


async def test_small_skew_is_accepted_and_reported(make_client: Any) -> None:
    h = Harness()
    c = await make_client(h)
    assert (await post(c, body(T0 - dt.timedelta(minutes=5)), headers()))[0] == 202
    assert h.reports[0][2].clock_skew_seconds == -300.0


async def test_namespace_rate_limit(make_client: Any) -> None:
    h = Harness()
    c = await make_client(h, EndpointLimits(namespace_rate=0.1, namespace_burst=3))
    codes = []
    for i in range(5):
        h.now = T0 + dt.timedelta(milliseconds=i)
        resp = await c.post("/v1/reports", data=body(T0 + dt.timedelta(seconds=i)), headers=headers())
        codes.append(resp.status)
        if resp.status == 429:
            assert int(resp.headers["Retry-After"]) >= 1
    assert codes == [202, 202, 202, 429, 429]
    # Another namespace has its own bucket.
    assert (await post(c, body(T0), headers(OTHER)))[0] == 202
    # Tokens come back with time.
    h.now = T0 + dt.timedelta(seconds=11)
    assert (await post(c, body(T0 + dt.timedelta(seconds=10)), headers()))[0] == 202
    assert h.results.count("rate_limited") == 2


async def test_forged_requests_do_not_drain_a_namespace_bucket(make_client: Any) -> None:
    h = Harness()
    c = await make_client(h, EndpointLimits(namespace_rate=0.001, namespace_burst=2))
    for _ in range(5):
        assert (await post(c, body(), headers(cred="A" * 43)))[0] == 401
    assert (await post(c, body(), headers()))[0] == 202


async def test_global_rate_limit(make_client: Any) -> None:
    h = Harness()
    c = await make_client(h, EndpointLimits(global_rate=0.001, global_burst=2))
    assert (await post(c, body(T0), headers(NS)))[0] == 202
    assert (await post(c, body(T0), headers(OTHER)))[0] == 202
    status, js, _ = await post(c, body(T0 + dt.timedelta(seconds=1)), headers(NS))
    assert (status, js["error"]) == (429, "rate_limited")


async def test_not_ready_without_keys(make_client: Any) -> None:
    h = Harness(ring=None)
    c = await make_client(h)
    status, js, _ = await post(c, body(), headers())
    assert (status, js["error"], h.results) == (503, "not_ready", ["not_ready"])


async def test_older_key_accepted_while_in_the_ring_then_rejected(make_client: Any) -> None:
    """No timer: an older key verifies for as long as the ring keeps it (docs/design.md#key-ring)."""
    h = Harness(ring=KeyRing(current=K1).rotate(K2, T0, Holders()))
    c = await make_client(h)
    old = headers(key=K1)
    h.now = T0 + dt.timedelta(days=60)
    assert (await post(c, body(h.now), old))[0] == 202
    assert h.ring is not None
    h.ring = h.ring.prune(Holders(), h.now)  # no running VMI holds it any more
    status, js, _ = await post(c, body(h.now + dt.timedelta(seconds=1)), old)
    assert (status, js["error"]) == (401, "unauthorized")
    assert (await post(c, body(h.now + dt.timedelta(seconds=2)), headers(key=K2)))[0] == 202


async def test_sink_failure_is_internal_error(make_client: Any) -> None:
    h = Harness(fail_on_report=True)
    c = await make_client(h)
    status, js, text = await post(c, body(), headers())
    assert (status, js["error"], h.results) == (500, "internal", ["internal"])
    assert "sink down" not in text


def test_every_status_reason_is_declared() -> None:
    assert {"accepted", "unauthorized", "unknown_uuid", "too_large", "rate_limited", "bad_format",
            "xml_forbidden", "replay", "not_ready", "clock_skew", "timeout"} <= RESULTS


# ---------------------------------------------------------------------------------------------
# TokenBucket (pure)
# ---------------------------------------------------------------------------------------------


def test_token_bucket_burst_then_refill() -> None:
    b = TokenBucket.full(rate=2.0, burst=3.0, now=100.0)
    oks = []
    for _ in range(4):
        b, ok = b.take(100.0)
        oks.append(ok)
    assert oks == [True, True, True, False]
    assert b.retry_after() == pytest.approx(0.5)
    b, ok = b.take(100.5)
    assert ok
    b, ok = b.take(100.5)
    assert not ok
    b = b.refill(1000.0)
    assert b.tokens == 3.0  # capped at burst


def test_token_bucket_clock_step_back_adds_nothing() -> None:
    b = TokenBucket.full(rate=1.0, burst=1.0, now=100.0)
    b, _ = b.take(100.0)
    b, ok = b.take(50.0)
    assert not ok and b.updated == 100.0
    b, ok = b.take(101.0)
    assert ok


def test_token_bucket_zero_rate() -> None:
    b = TokenBucket.full(rate=0.0, burst=1.0, now=0.0)
    b, _ = b.take(0.0)
    assert b.retry_after() == float("inf")
