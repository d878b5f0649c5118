"""The Windows guest agent (guest/windows): its Go unit tests, and the real .exe end to end under Wine.

Under Wine (a private copy of a cached prefix): the license volume is an ISO 9660 image built as
KubeVirt builds a Secret volume (xorrisofs, a volume label, Joliet and Rock Ridge); nvidia-smi.exe is
a tiny program printing a recorded XML, in System32 where current drivers put it; the NVIDIA display
container is a dummy service registered with `sc create` that logs a Windows-format license line at
each start; the registry is read back with `reg query`; reports go to licensectl's report endpoint on
loopback. The guest runs at UTC+05:30, so its log's local times only land right if the agent's
offset is applied. Wine, MinGW (for the ProcessPrng shim), xorrisofs and Go missing: the tests error.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from licensectl.core.credentials import KeyRing, derive_credential
from licensectl.core.guest_report import GriddEventKind, GuestState, LicenseState
from licensectl.serve.reports import EndpointLimits, make_reports_app
from licensectl_dev.devcluster.gotools import WINDOWS_AGENT_DIR, ensure_tool
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.wine import Wine

pytestmark = [pytest.mark.cluster, pytest.mark.tools]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia"
XML_FIXTURE = FIXTURES / "smi-qx-licensed-l40s-2q-trimmed.xml"
KEY = bytes(range(32))
NS = "tenant-win"
UUID = "7c1e3a52-0d4b-4f7e-9a61-2b8f5d3c9e10"
TOKEN_1 = b"eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjE4MDAwMDAwMDB9.d2luZG93cy10b2tlbi1vbmU\n"
TOKEN_2 = b"eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjE5MDAwMDAwMDB9.d2luZG93cy10b2tlbi10d28\n"
SERVICE = "NVDisplay.ContainerLocalSystem"
GRID_KEY = r"HKLM\SOFTWARE\NVIDIA Corporation\Global\GridLicensing"
DRIVER_KEY = r"HKLM\SYSTEM\CurrentControlSet\Services\nvlddmkm\Global\GridLicensing"
TOKEN_DIR = ("Program Files", "NVIDIA Corporation", "vGPU Licensing", "ClientConfigToken")
LOG_DIR = ("users", "Public", "Documents", "NvidiaLogging")
LOG_NAME = "Log.NVDisplay.Container.exe.log"
GUEST_TZ = "Asia/Kolkata"  # UTC+05:30 all year


def go() -> str:
    found = shutil.which("go")
    assert found, "the Go toolchain (`go`) is needed to build and test the Windows agent"
    return found


def test_go_unit_tests_pass_and_the_windows_code_compiles() -> None:
    """`go test ./...` (every parser and decision, on Linux) and `go vet` for windows/amd64."""
    base = {**os.environ, "CGO_ENABLED": "0"}
    for extra, argv in (({}, ["vet", "./..."]), ({"GOOS": "windows", "GOARCH": "amd64"}, ["vet", "./..."]),
                        ({}, ["test", "./..."])):
        res = subprocess.run([go(), *argv], cwd=WINDOWS_AGENT_DIR, env={**base, **extra}, capture_output=True,
                             text=True, timeout=300, check=False)
        assert res.returncode == 0, f"go {' '.join(argv)} {extra}:\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
    unformatted = subprocess.run([Path(go()).with_name("gofmt"), "-l", "."], cwd=WINDOWS_AGENT_DIR,
                                 capture_output=True, text=True, timeout=60, check=True).stdout
    assert unformatted == "", f"not gofmt-formatted: {unformatted}"


@dataclass
class Licensectl:
    """The licensectl side: the real report endpoint, the VMI's current token, what it accepted."""

    url: str
    current_token: list[bytes]
    reports: list[GuestState] = field(default_factory=list)


@pytest.fixture
async def licensectl() -> AsyncIterator[Licensectl]:
    ring = KeyRing(current=KEY)
    current = [TOKEN_1]
    reports: list[GuestState] = []
    app = make_reports_app(
        keyring_provider=lambda: ring,
        uuid_known=lambda ns, uuid: "win-vm" if (ns, uuid) == (NS, UUID) else None,
        token_sha_for=lambda ns, vmi: hashlib.sha256(current[0]).hexdigest(),
        on_report=lambda ns, vmi, st: reports.append(st),
        on_result=lambda result: None,
        limits=EndpointLimits(),
        clock=lambda: dt.datetime.now(dt.UTC),
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield Licensectl(f"http://127.0.0.1:{server.port}/v1/reports", current, reports)
    finally:
        await server.close()


def license_volume(dest: Path, token: bytes, url: str, feature_type: int = 1) -> Path:
    """The replica Secret as KubeVirt presents it: an ISO 9660 image, label LICENSECTL, Joliet + Rock Ridge."""
    xorrisofs = shutil.which("xorrisofs")
    assert xorrisofs, "xorrisofs is needed (Debian package xorriso; scripts/install-system-deps installs it)"
    src = dest.with_suffix(".d")
    src.mkdir()
    files = {"client_configuration_token.tok": token, "gridd.conf": f"FeatureType={feature_type}\n".encode(),
             "report-url": url.encode(), "report-namespace": NS.encode(),
             "report-credential": derive_credential(KEY, NS).encode()}
    for name, data in files.items():
        (src / name).write_bytes(data)
    subprocess.run([xorrisofs, "-quiet", "-output", str(dest), "-volid", "LICENSECTL", "-joliet", "-rock", str(src)],
                   check=True, timeout=60, capture_output=True)
    return dest


async def next_second() -> None:
    """The guest clock is the report's replay guard (whole seconds): let it move past the last report."""
    await asyncio.sleep(1.05 - time.time() % 1)


@dataclass
class Guest:
    """A Windows guest under Wine with the fakes in place."""

    wine: Wine
    starts: Path  # one line per start of the dummy display container

    async def agent(self, *argv: str) -> str:
        res = await self.wine.run(str(self.wine.drive_c("licensectl", "licensectl-agent.exe")), *argv)
        combined = res.out + res.err
        assert res.rc == 0, f"licensectl-agent {argv[0]} exited {res.rc}:\n{combined}"
        for secret in (TOKEN_1, TOKEN_2, derive_credential(KEY, NS).encode()):
            assert secret.strip().decode() not in combined
        return combined

    async def once(self, volume: Path) -> str:
        await next_second()
        return await self.agent("once", "--disk", Wine.windows_path(volume), "--disk-wait", "0s", "--uuid", UUID)

    async def reg(self, key: str) -> str:
        res = await self.wine.run("reg", "query", key, "/v", "FeatureType")
        return res.out if res.rc == 0 else ""

    def tokens(self) -> dict[str, bytes]:
        d = self.wine.drive_c(*TOKEN_DIR)
        return {p.name: p.read_bytes() for p in sorted(d.iterdir())} if d.is_dir() else {}

    def start_count(self) -> int:
        return len(self.starts.read_text().splitlines()) if self.starts.exists() else 0


@pytest.fixture
async def guest(tmp_path: Path) -> AsyncIterator[Guest]:
    tools = {n: await asyncio.to_thread(ensure_tool, n, log=lambda _: None)
             for n in ("licensectl-agent", "fake-nvidia-smi", "fake-display-container")}
    wine = await asyncio.to_thread(Wine.create, tmp_path / "prefix", {"TZ": GUEST_TZ})
    try:
        wine.drive_c("licensectl").mkdir()
        shutil.copy2(tools["licensectl-agent"], wine.drive_c("licensectl", "licensectl-agent.exe"))
        system32 = wine.drive_c("windows", "system32")
        shutil.copy2(tools["fake-nvidia-smi"], system32 / "nvidia-smi.exe")
        shutil.copy2(XML_FIXTURE, system32 / "nvidia-smi.xml")
        fake = wine.drive_c("fake")
        fake.mkdir()
        shutil.copy2(tools["fake-display-container"], fake / "fake-display-container.exe")
        wine.drive_c(*LOG_DIR).mkdir(parents=True, exist_ok=True)
        log = "C:\\" + "\\".join((*LOG_DIR, LOG_NAME))
        for argv in (("sc", "create", SERVICE, "binpath=", f"C:\\fake\\fake-display-container.exe {log}"),
                     ("sc", "start", SERVICE),
                     # The driver's key exists with a FeatureType of its own, which uninstall must give back.
                     ("reg", "add", DRIVER_KEY, "/v", "FeatureType", "/t", "REG_DWORD", "/d", "0", "/f")):
            res = await wine.run(*argv)
            assert res.rc == 0, f"{argv}: {res.out}{res.err}"
        yield Guest(wine, fake / "starts.log")
    finally:
        await asyncio.to_thread(wine.stop)


def expected_state(now: dt.datetime) -> LicenseState:
    """The recorded XML's own expiry (Licensed, Expiry: 2026-7-7 16:1:44 GMT) decides."""
    expiry = dt.datetime(2026, 7, 7, 16, 1, 44, tzinfo=dt.UTC)
    return LicenseState.LICENSED if now < expiry else LicenseState.EXPIRED


async def test_agent_under_wine_installs_reports_and_follows_a_rotation(
        guest: Guest, licensectl: Licensectl, tmp_path: Path) -> None:
    vol_1 = license_volume(tmp_path / "license-1.iso", TOKEN_1, licensectl.url)
    assert guest.start_count() == 1

    # First boot: token, FeatureType under both keys, one restart, one report.
    await guest.once(vol_1)
    name_1 = "licensectl_" + hashlib.sha256(TOKEN_1).hexdigest()[:16] + ".tok"
    assert guest.tokens() == {name_1: TOKEN_1}
    for key in (GRID_KEY, DRIVER_KEY):
        assert "REG_DWORD    0x1" in await guest.reg(key), key
    assert guest.start_count() == 2
    now = dt.datetime.now(dt.UTC)
    [first] = licensectl.reports
    assert first.uuid == UUID
    assert first.state is expected_state(now)
    assert first.product == "NVIDIA RTX Virtual Workstation"
    assert first.token_current and first.token_sha256 == hashlib.sha256(TOKEN_1).hexdigest()
    # The dummy container logged "License acquired" in UTC+05:30 local time: right only with the offset.
    assert first.last_event is GriddEventKind.ACQUIRED
    assert first.last_event_at is not None and abs((now - first.last_event_at).total_seconds()) < 120

    # Same volume again: nothing changes, nothing restarts, the report still goes out.
    await guest.once(vol_1)
    assert guest.tokens() == {name_1: TOKEN_1}
    assert guest.start_count() == 2
    assert len(licensectl.reports) == 2 and licensectl.reports[-1].token_current

    # Rotation: licensectl's replica has a new token, the restarted VMI a new volume.
    licensectl.current_token[0] = TOKEN_2
    vol_2 = license_volume(tmp_path / "license-2.iso", TOKEN_2, licensectl.url)
    await guest.once(vol_2)
    name_2 = "licensectl_" + hashlib.sha256(TOKEN_2).hexdigest()[:16] + ".tok"
    assert guest.tokens() == {name_2: TOKEN_2}
    assert guest.start_count() == 3
    rotated = licensectl.reports[-1]
    assert rotated.token_current and rotated.token_sha256 == hashlib.sha256(TOKEN_2).hexdigest()

    # As a service: `install` registers it (automatic start), the service manager runs its first pass.
    # Wine's service manager starts automatic services whenever it starts itself, as at a boot: the
    # service may be running before `sc start` asks for it.
    await next_second()
    await guest.agent("install", "--disk", Wine.windows_path(vol_2), "--uuid", UUID, "--interval", "1h")
    await guest.wine.run("sc", "start", "licensectl-agent")
    assert "RUNNING" in (await guest.wine.run("sc", "query", "licensectl-agent")).out
    await eventually(lambda: len(licensectl.reports) == 4, timeout=30, what="the service's first report")
    assert licensectl.reports[-1].token_current
    assert guest.start_count() == 3  # nothing changed since the last pass

    # Uninstall: service gone, its token gone, FeatureType as it was (absent; 0 under the driver's key).
    await guest.agent("uninstall")
    assert (await guest.wine.run("sc", "query", "licensectl-agent")).rc != 0
    assert guest.tokens() == {}
    assert await guest.reg(GRID_KEY) == ""
    assert "REG_DWORD    0x0" in await guest.reg(DRIVER_KEY)
    assert guest.start_count() == 4
