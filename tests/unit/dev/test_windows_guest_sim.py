"""The demo's simulated Windows guest: its reports, sent the Windows agent's way (os, UTC offset,
Windows-format log in local time), are accepted by the real report endpoint and read like a Linux
guest's: licensed, the token current (also after a rotation), the log's event at the right instant."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from licensectl.core.credentials import KeyRing, derive_credential
from licensectl.core.guest_report import GriddEventKind, GuestState, LicenseState
from licensectl.core.model import KEY_TOKEN
from licensectl.serve.reports import EndpointLimits, make_reports_app
from licensectl_dev.devcluster.guest_sim import GuestProfile, SimulatedGuest

KEY = bytes(range(32))
NS = "tenant-acme-render"
UUID = "7c1e3a52-0d4b-4f7e-9a61-2b8f5d3c9e10"
TOKENS = (b"eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjE4MDAwMDAwMDB9.b25l\n",
          b"eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjE5MDAwMDAwMDB9.dHdv\n")


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[str, list[bytes], list[GuestState]]]:
    current = [TOKENS[0]]
    reports: list[GuestState] = []
    ring = KeyRing(current=KEY)
    app = make_reports_app(
        keyring_provider=lambda: ring,
        uuid_known=lambda ns, uuid: "win1" if (ns, uuid) == (NS, UUID) else None,
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
            # Logged one minute ago in UTC+01:00 local time: placed right only with the offset applied.
            assert st.last_event is GriddEventKind.ACQUIRED and st.last_event_at is not None
            ago = (dt.datetime.now(dt.UTC) - st.last_event_at).total_seconds()
            assert 55 <= ago <= 70, ago
    finally:
        guest.cleanup()
