"""The simulated Windows guests: their reports, sent the Windows agent's way (os, UTC offset, the
recorded Windows-format log in local time), are accepted by the real report endpoint and read like a
Linux guest's: licensed, the token current (also after a rotation), the log's event at the right
instant; and each Windows twin (licensed, unlicensed "No pool features found", driver missing) gives the
state its Linux twin -- the real probe script -- gives."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from licensectl.core.credentials import KeyRing, derive_credential
from licensectl.core.guest_report import GriddEventKind, GuestState, LicenseState, parse_report
from licensectl.core.model import KEY_TOKEN
from licensectl.serve.reports import EndpointLimits, make_reports_app
from licensectl_dev.devcluster.guest_sim import (
    FIXTURES,
    WINDOWS_LICENSED_LOG,
    WINDOWS_NO_POOL_LOG,
    GuestProfile,
    SimulatedGuest,
    windows_report,
)

KEY = bytes(range(32))
NS = "tenant-acme-render"
UUID = "7c1e3a52-0d4b-4f7e-9a61-2b8f5d3c9e10"
TWIN_UUID = "0b6f2d8e-3c4a-4e1f-8d7b-5a9c1e2f3d40"
VMIS = {UUID: "win1", TWIN_UUID: "linux1"}
TOKENS = (b"eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjE4MDAwMDAwMDB9.b25l\n",
          b"eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjE5MDAwMDAwMDB9.dHdv\n")


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[str, list[bytes], list[GuestState]]]:
    current = [TOKENS[0]]
    reports: list[GuestState] = []
    ring = KeyRing(current=KEY)
    app = make_reports_app(
        keyring_provider=lambda: ring,
        uuid_known=lambda ns, uuid: VMIS.get(uuid) if ns == NS else None,
        token_sha_for=lambda ns, vmi: hashlib.sha256(current[0]).hexdigest(),
        on_report=lambda ns, vmi, st: reports.append(st), on_result=lambda r: None,
        limits=EndpointLimits(), clock=lambda: dt.datetime.now(dt.UTC))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}/v1/reports", current, reports
    finally:
        await server.close()


def license_secret(token: bytes, url: str) -> dict[str, Any]:
    files = {KEY_TOKEN: token, "gridd.conf": b"FeatureType=2\n", "report-url": url.encode(),
             "report-namespace": NS.encode(), "report-credential": derive_credential(KEY, NS).encode()}
    return {"metadata": {"name": "license"}, "data": {k: base64.b64encode(v).decode() for k, v in files.items()}}


async def test_a_simulated_windows_guest_reports_like_the_agent(
        endpoint: tuple[str, list[bytes], list[GuestState]]) -> None:
    url, current, reports = endpoint
    vmi = {"metadata": {"namespace": NS, "name": "win1"}, "spec": {"domain": {"firmware": {"uuid": UUID}}}}
    guest = SimulatedGuest(NS, "win1", GuestProfile.windows_licensed())
    try:
        for i, token in enumerate(TOKENS):
            current[0] = token
            assert await guest.install(vmi, license_secret(token, url)) == 0, guest.last_stderr
            assert await guest.probe() == 0, guest.last_stderr
            st = reports[-1]
            assert len(reports) == i + 1
            assert st.state is LicenseState.LICENSED and st.hostname == "win1"
            assert st.token_current and st.token_sha256 == hashlib.sha256(token).hexdigest()
            # The recorded log's last line, `Tue Dec 20 05:59:20 2022:<1>:License renewed ...`, logged in
            # the guest's UTC+01:00: placed right only with the offset applied.
            assert st.last_event is GriddEventKind.RENEWED
            assert st.last_event_at == dt.datetime(2022, 12, 20, 4, 59, 20, tzinfo=dt.UTC)
    finally:
        guest.cleanup()


def vmi_body(name: str, uuid: str) -> dict[str, Any]:
    return {"metadata": {"namespace": NS, "name": name}, "spec": {"domain": {"firmware": {"uuid": uuid}}}}


# Linux twins logging what the recorded Windows logs hold (their journals derived from those logs); a
# fixed expiry (a renewing lease would differ between the twins' probes).
EXPIRY = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(days=1)


@pytest.mark.parametrize("linux", [dataclasses.replace(GuestProfile.expiring(EXPIRY), gridd_log=WINDOWS_LICENSED_LOG),
                                   GuestProfile.unlicensed_no_pool(), GuestProfile.driver_missing()],
                         ids=lambda p: p.name)
async def test_a_windows_twin_reads_as_its_linux_twin(
        endpoint: tuple[str, list[bytes], list[GuestState]], linux: GuestProfile) -> None:
    url, current, reports = endpoint
    guests = {"linux1": SimulatedGuest(NS, "linux1", linux), "win1": SimulatedGuest(NS, "win1", linux.on_windows())}
    try:
        states = {}
        for name, uuid in (("linux1", TWIN_UUID), ("win1", UUID)):
            g = guests[name]
            assert await g.install(vmi_body(name, uuid), license_secret(current[0], url)) == 0, g.last_stderr
            assert await g.probe() == 0, g.last_stderr
            states[name] = reports[-1]
        fields = ("state", "product", "expiry", "driver_version", "gpu_count", "grace", "token_current",
                  "last_event", "last_event_at", "reason")
        assert {f: getattr(states["win1"], f) for f in fields} == {f: getattr(states["linux1"], f) for f in fields}
        expected = {"expiring": LicenseState.LICENSED, "unlicensed-no-pool": LicenseState.UNLICENSED,
                    "driver-missing": LicenseState.DRIVER_MISSING}
        assert states["win1"].state is expected[linux.name]
        assert states["win1"].reason == ("acquire_failed" if linux.name == "unlicensed-no-pool" else None)
        assert (states["win1"].last_event_at is None) == (linux.name == "driver-missing")
    finally:
        for g in guests.values():
            g.cleanup()


def test_the_windows_report_is_the_agents_format() -> None:
    """The envelope of guest/windows/internal/agent/report.go: format 2, `os: windows`, the offset, the
    text form when `-q -x` fails, the log's last 50 non-empty lines as recorded (CRLF or not)."""
    log = (FIXTURES / WINDOWS_NO_POOL_LOG).read_text()
    text = (FIXTURES / "smi-q-unlicensed-vcs.txt").read_text()
    body = windows_report(uuid=UUID, hostname="WIN-1 (desk)", clock=1_800_000_000, token_sha256=None, smi_xml=None,
                          smi_text=text, driver=True, log=(log * 20).replace("\n", "\r\n\r\n"),
                          utc_offset=dt.timedelta(hours=-3, minutes=-30))
    head, _, rest = body.decode().partition("--- nvidia-smi-text\n")
    assert head == (f"licensectl-report: 2\nuuid: {UUID}\nhostname: WIN-1desk\nclock: 1800000000\n"
                    "token-sha256: none\nprobe-version: 1.0.0\nnvidia-smi: ok\nos: windows\nutc-offset: -03:30\n")
    smi, _, rest = rest.partition("--- gridd-log\n")
    assert smi == text
    log_lines = log.splitlines()
    assert rest == "\n".join((log_lines * 20)[-50:]) + "\n--- end\n"
    report = parse_report(body)
    assert report.guest_os == "windows" and len(report.events) == 50
    assert all(e.kind is GriddEventKind.FAILED for e in report.events)
    missing = windows_report(uuid=UUID, hostname="w", clock=1, token_sha256=None, smi_xml=None, smi_text=text,
                             driver=False, log=None, utc_offset=dt.timedelta(0))
    assert b"nvidia-smi: missing\nos: windows\nutc-offset: +00:00\n--- end\n" in missing
