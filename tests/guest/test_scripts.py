"""The guest scripts, run for real under dash and busybox sh against a fake guest filesystem.

Every test runs the shipped scripts (licensectl/guest/) with LICENSECTL_ROOT pointing at a temp
dir, fake `nvidia-smi` / `systemctl` / `journalctl` / `mount` on PATH, and a real local
`make_reports_app` server receiving the probe's POST. The busybox variant puts only busybox applets
(plus curl when a test wants it) on PATH, like a musl/Alpine guest. A missing shell FAILS the test.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import os
import re
import shutil
import ssl
import stat
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from licensectl.core import certs
from licensectl.core.credentials import KeyRing, derive_credential
from licensectl.core.guest_report import GriddEventKind, GuestState, LicenseState
from licensectl.serve.http import start_site
from licensectl.serve.reports import EndpointLimits, make_reports_app

GUEST = Path(__file__).resolve().parents[2] / "licensectl" / "guest"
INSTALL = GUEST / "licensectl-install.sh"
PROBE = GUEST / "licensectl-probe.sh"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia"
XML_FIXTURE = FIXTURES / "smi-qx-licensed-l40s-2q-trimmed.xml"
TEXT_FIXTURE = FIXTURES / "smi-q-unlicensed-restricted-vcs.txt"
SYSLOG_FIXTURE = FIXTURES / "gridd-log-acquired-cls.txt"

KEY = bytes(range(32))
NS = "tenant-foo"
CREDENTIAL = derive_credential(KEY, NS)
UUID = "5d307ca9-b3ef-428d-8be6-5b4c7e0ac3c2"
TOKEN = b"eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjE4MDAwMDAwMDB9.c2lnbmF0dXJlLXRlc3Qtb25seQ\n"
TOKEN_SHA = hashlib.sha256(TOKEN).hexdigest()
GRIDD_CONF = b"FeatureType=1\n"
SHELLS = ("dash", "busybox")
UNIT = "nvidia-gridd.service"


def shell_argv(shell: str) -> list[str]:
    exe = shutil.which(shell)
    if exe is None:
        pytest.fail(f"{shell} is not installed: the guest scripts must be tested under it (apt-get install {shell})")
    return [exe] if shell == "dash" else [exe, "sh"]


def test_both_shells_are_installed() -> None:
    assert shutil.which("dash") and shutil.which("busybox"), "install dash and busybox to test the guest scripts"


@pytest.fixture(scope="session")
def busybox_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PATH directory holding only busybox applets (an Alpine-like userland), without wget."""
    exe = shutil.which("busybox")
    if exe is None:
        pytest.fail("busybox is not installed")
    d = tmp_path_factory.mktemp("busybox-bin")
    import subprocess
    applets = subprocess.run([exe, "--list"], check=True, capture_output=True, text=True).stdout.split()
    for a in applets:
        if a not in ("wget", "[", "[["):
            (d / a).symlink_to(exe)
    (d / "[").symlink_to(exe)
    return d


def write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@dataclass
class Guest:
    """A fake guest: root filesystem, license disk contents, fake tools and their call logs."""

    tmp: Path
    shell: str
    busybox_bin: Path
    root: Path = field(init=False)
    disk: Path = field(init=False)
    fakebin: Path = field(init=False)
    calls: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root = self.tmp / "root"
        self.disk = self.tmp / "disk"
        self.fakebin = self.tmp / "fakebin"
        self.calls = self.tmp / "calls"
        for d in (self.root, self.disk, self.fakebin, self.calls, self.tmp / "tmp"):
            d.mkdir(parents=True, exist_ok=True)
        (self.root / "sys/class/dmi/id").mkdir(parents=True)
        (self.root / "sys/class/dmi/id/product_uuid").write_text(UUID.upper() + "\n")
        write_exe(self.fakebin / "systemctl",
                  f'#!/bin/sh\necho "$*" >> "{self.calls}/systemctl"\nexit "${{FAKE_SYSTEMCTL_RC:-0}}"\n')
        write_exe(self.fakebin / "nvidia-smi", f"""#!/bin/sh
echo "$*" >> "{self.calls}/nvidia-smi"
case "$*" in
"-q -x") [ -n "${{FAKE_SMI_XML_FAIL:-}}" ] && exit 9; cat "{XML_FIXTURE}" ;;
"-q") cat "${{FAKE_SMI_TEXT:-{TEXT_FIXTURE}}}" ;;
*) exit 2 ;;
esac
""")
        # Derived from gridd-log-acquired-cls.txt: its lines as `journalctl -o short-iso --utc` prints them.
        journal = self.tmp / "journal.txt"
        journal.write_text("".join(
            f"2026-04-02T{line[7:15]}+00:00{line[15:]}\n"
            for line in SYSLOG_FIXTURE.read_text().splitlines() if "nvidia-gridd[" in line))
        write_exe(self.fakebin / "journalctl",
                  f'#!/bin/sh\necho "$*" >> "{self.calls}/journalctl"\ncat "{journal}"\n')
        write_exe(self.fakebin / "fake-mount", f"""#!/bin/sh
echo "$*" >> "{self.calls}/mount"
[ -n "${{FAKE_MOUNT_FAIL:-}}" ] && exit 32
for last; do :; done
dev=""; prev=""
for a; do [ "$a" = "$last" ] && dev="$prev"; prev="$a"; done
cp "$dev"/* "$last"/
""")
        write_exe(self.fakebin / "fake-umount", f'#!/bin/sh\necho "$*" >> "{self.calls}/umount"\n'
                                                '[ -d "$1" ] && rm -f "$1"/*\nexit 0\n')
        self.write_disk()

    def write_disk(self, token: bytes = TOKEN, conf: bytes = GRIDD_CONF, url: str = "http://127.0.0.1:9/v1/reports",
                   namespace: str = NS, credential: str = CREDENTIAL) -> None:
        files = {"client_configuration_token.tok": token, "gridd.conf": conf, "report-url": url.encode(),
                 "report-namespace": namespace.encode(), "report-credential": credential.encode()}
        for name, data in files.items():
            (self.disk / name).write_bytes(data)

    def path_value(self, *, curl: bool = True, wget: bool = False) -> str:
        if self.shell == "dash":
            return f"{self.fakebin}:/usr/local/bin:/usr/bin:/bin"
        extra = self.tmp / "extra-bin"
        extra.mkdir(exist_ok=True)
        for tool, wanted, target in (("curl", curl, shutil.which("curl")), ("wget", wget, shutil.which("busybox"))):
            link = extra / tool
            if link.is_symlink():
                link.unlink()
            if wanted and target:
                link.symlink_to(target)
        return f"{self.fakebin}:{extra}:{self.busybox_bin}"

    def env(self, **overrides: str) -> dict[str, str]:
        overrides = dict(overrides)
        env = {
            "PATH": overrides.pop("PATH", None) or self.path_value(),
            "HOME": str(self.tmp),
            "TMPDIR": str(self.tmp / "tmp"),
            "LICENSECTL_ROOT": str(self.root),
            "LICENSECTL_ENV_FILE": str(self.tmp / "no-such-env-file"),
            "LICENSECTL_DISK_DIR": str(self.disk),
            "LICENSECTL_DISK_WAIT": "0",
            "JOURNALCTL": str(self.fakebin / "journalctl"),
            "LICENSECTL_BACKOFF": "0",
        }
        env.update(overrides)
        return env

    def systemctl_calls(self) -> list[str]:
        f = self.calls / "systemctl"
        return f.read_text().splitlines() if f.exists() else []

    def calls_of(self, tool: str) -> list[str]:
        f = self.calls / tool
        return f.read_text().splitlines() if f.exists() else []


@dataclass
class Result:
    rc: int
    out: str
    err: str

    def assert_no_secret(self) -> None:
        assert CREDENTIAL not in self.out + self.err
        assert TOKEN.decode().strip() not in self.out + self.err


async def run(guest: Guest, script: Path, env: dict[str, str]) -> Result:
    proc = await asyncio.create_subprocess_exec(
        *shell_argv(guest.shell), str(script), env=env, cwd=guest.tmp,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


@pytest.fixture(params=SHELLS)
def guest(request: pytest.FixtureRequest, tmp_path: Path, busybox_bin: Path) -> Iterator[Guest]:
    shell_argv(request.param)
    yield Guest(tmp_path, request.param, busybox_bin)


@dataclass
class Sink:
    """The licensectl side: a real report endpoint and what it saw."""

    url: str
    reports: list[tuple[str, str, GuestState]]
    results: list[str]
    ready: list[bool]


@pytest.fixture
async def sink() -> AsyncIterator[Sink]:
    reports: list[tuple[str, str, GuestState]] = []
    results: list[str] = []
    ready = [True]
    ring = KeyRing(current=KEY)
    app = make_reports_app(
        keyring_provider=lambda: ring if ready[0] else None,
        uuid_known=lambda ns, uuid: "vm-1" if (ns, uuid) == (NS, UUID) else None,
        token_sha_for=lambda ns, vmi: TOKEN_SHA,
        on_report=lambda ns, vmi, st: reports.append((ns, vmi, st)),
        on_result=results.append,
        limits=EndpointLimits(),
        clock=lambda: dt.datetime.now(dt.UTC),
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield Sink(f"http://127.0.0.1:{server.port}/v1/reports", reports, results, ready)
    finally:
        await server.close()


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


# ---------------------------------------------------------------------------------------------
# licensectl-install
# ---------------------------------------------------------------------------------------------


async def test_install_then_idempotent(guest: Guest) -> None:
    tokdir = guest.root / "etc/nvidia/ClientConfigToken"
    tokdir.mkdir(parents=True)
    (tokdir / "licensectl_0123456789abcdef.tok").write_bytes(b"old token")
    (tokdir / "client_configuration_token_01-02-2026-10-00-00.tok").write_bytes(b"foreign")
    (tokdir / "client_configuration_token_01-02-2026-10-00-00.tok").chmod(0o600)

    r = await run(guest, INSTALL, guest.env())
    assert r.rc == 0, r.err
    r.assert_no_secret()
    installed = tokdir / f"licensectl_{TOKEN_SHA[:16]}.tok"
    assert installed.read_bytes() == TOKEN and mode(installed) == 0o744
    assert not (tokdir / "licensectl_0123456789abcdef.tok").exists()
    foreign = tokdir / "client_configuration_token_01-02-2026-10-00-00.tok"
    assert foreign.read_bytes() == b"foreign" and mode(foreign) == 0o600
    assert sorted(p.name for p in tokdir.iterdir()) == sorted([installed.name, foreign.name])  # no temp files
    conf = guest.root / "etc/nvidia/gridd.conf"
    assert conf.read_bytes() == GRIDD_CONF and mode(conf) == 0o644
    state = guest.root / "etc/licensectl"
    assert mode(state) == 0o700
    for name in ("report-url", "report-namespace", "report-credential"):
        assert (state / name).read_bytes() == (guest.disk / name).read_bytes() and mode(state / name) == 0o600
    assert guest.systemctl_calls() == [f"--no-block restart {UNIT}"]
    assert "foreign token" in r.err

    inode = installed.stat().st_ino, conf.stat().st_ino
    r2 = await run(guest, INSTALL, guest.env())
    assert r2.rc == 0, r2.err
    r2.assert_no_secret()
    assert guest.systemctl_calls() == [f"--no-block restart {UNIT}"]  # no second restart
    assert (installed.stat().st_ino, conf.stat().st_ino) == inode
    assert "unchanged" in r2.err


async def test_install_rotation_replaces_own_token_only(guest: Guest) -> None:
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    new = b"eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjE5MDAwMDAwMDB9.bmV3LXNpZ25hdHVyZQ\n"
    guest.write_disk(token=new)
    r = await run(guest, INSTALL, guest.env())
    assert r.rc == 0, r.err
    tokdir = guest.root / "etc/nvidia/ClientConfigToken"
    assert [p.name for p in tokdir.iterdir()] == [f"licensectl_{hashlib.sha256(new).hexdigest()[:16]}.tok"]
    assert guest.systemctl_calls() == [f"--no-block restart {UNIT}"] * 2


async def test_install_mode_repair_is_not_a_change(guest: Guest) -> None:
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    installed = guest.root / f"etc/nvidia/ClientConfigToken/licensectl_{TOKEN_SHA[:16]}.tok"
    installed.chmod(0o600)
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    assert mode(installed) == 0o744 and len(guest.systemctl_calls()) == 1


@pytest.mark.parametrize("link", ["by-label/LICENSECTL", "by-id/virtio-LICENSECTL"])
async def test_install_finds_and_mounts_the_disk(guest: Guest, link: str) -> None:
    dev = guest.tmp / "dev/disk"
    (dev / link).parent.mkdir(parents=True)
    (dev / link).symlink_to(guest.disk)  # stands in for the block device; fake-mount copies from it
    env = guest.env(LICENSECTL_DEV_DIR=str(dev), LICENSECTL_MOUNT=str(guest.fakebin / "fake-mount"),
                    LICENSECTL_UMOUNT=str(guest.fakebin / "fake-umount"))
    del env["LICENSECTL_DISK_DIR"]
    r = await run(guest, INSTALL, env)
    assert r.rc == 0, r.err
    mnt = guest.root / "run/licensectl/disk"
    assert guest.calls_of("mount") == [f"-t iso9660 -o ro,nodev,nosuid,noexec {dev / link} {mnt}"]
    assert guest.calls_of("umount")[-1] == str(mnt)
    assert (guest.root / f"etc/nvidia/ClientConfigToken/licensectl_{TOKEN_SHA[:16]}.tok").read_bytes() == TOKEN
    assert mode(guest.root / "run/licensectl") == 0o700


async def test_install_exit_codes(guest: Guest) -> None:
    no_disk = guest.env(LICENSECTL_DEV_DIR=str(guest.tmp / "nodev"))
    del no_disk["LICENSECTL_DISK_DIR"]
    assert (await run(guest, INSTALL, no_disk)).rc == 2

    dev = guest.tmp / "dev/disk/by-label"
    dev.mkdir(parents=True)
    (dev / "LICENSECTL").symlink_to(guest.disk)
    failing = guest.env(LICENSECTL_DEV_DIR=str(dev.parent), LICENSECTL_MOUNT=str(guest.fakebin / "fake-mount"),
                        LICENSECTL_UMOUNT=str(guest.fakebin / "fake-umount"), FAKE_MOUNT_FAIL="1")
    del failing["LICENSECTL_DISK_DIR"]
    assert (await run(guest, INSTALL, failing)).rc == 3

    guest.write_disk(conf=b"")
    r = await run(guest, INSTALL, guest.env())
    assert r.rc == 4 and "gridd.conf" in r.err
    (guest.disk / "client_configuration_token.tok").unlink()
    assert (await run(guest, INSTALL, guest.env())).rc == 4
    guest.write_disk(token=b"x" * 70000)
    assert (await run(guest, INSTALL, guest.env())).rc == 4
    assert guest.systemctl_calls() == []

    guest.write_disk()
    r = await run(guest, INSTALL, guest.env(FAKE_SYSTEMCTL_RC="1"))
    assert r.rc == 6
    r.assert_no_secret()
    assert (guest.root / f"etc/nvidia/ClientConfigToken/licensectl_{TOKEN_SHA[:16]}.tok").exists()


async def test_install_removes_report_settings_absent_from_disk(guest: Guest) -> None:
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    (guest.disk / "report-credential").unlink()
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    assert not (guest.root / "etc/licensectl/report-credential").exists()
    assert len(guest.systemctl_calls()) == 1  # report settings never restart gridd


# ---------------------------------------------------------------------------------------------
# licensectl-probe
# ---------------------------------------------------------------------------------------------


def expected_xml_state(now: dt.datetime) -> LicenseState:
    expiry = dt.datetime(2026, 7, 7, 16, 1, 44, tzinfo=dt.UTC)
    return LicenseState.LICENSED if now < expiry else LicenseState.EXPIRED


async def installed(guest: Guest, sink: Sink) -> None:
    guest.write_disk(url=sink.url)
    r = await run(guest, INSTALL, guest.env())
    assert r.rc == 0, r.err


async def test_probe_reports_with_curl(guest: Guest, sink: Sink) -> None:
    await installed(guest, sink)
    r = await run(guest, PROBE, guest.env())
    assert r.rc == 0, r.err
    assert "via curl" in r.err
    r.assert_no_secret()
    assert sink.results == ["accepted"]
    ((ns, vmi, st),) = sink.reports
    assert (ns, vmi, st.uuid, st.product, st.driver_version, st.gpu_count, st.token_sha256, st.token_current) == (
        NS, "vm-1", UUID, "NVIDIA RTX Virtual Workstation", "580.105.08", 1, TOKEN_SHA, True)
    assert st.expiry == dt.datetime(2026, 7, 7, 16, 1, 44, tzinfo=dt.UTC)
    assert st.state is expected_xml_state(st.reported_at)
    assert (st.last_event, st.last_event_at) == (GriddEventKind.ACQUIRED, dt.datetime(2026, 4, 2, 19, 11, 16,
                                                                                      tzinfo=dt.UTC))
    assert abs(st.clock_skew_seconds) < 30
    assert guest.calls_of("nvidia-smi") == ["-q -x"]
    assert guest.calls_of("journalctl") == [f"-u {UNIT} -n 50 --no-pager -q -o short-iso --utc"]


async def test_probe_falls_back_to_text_and_syslog(guest: Guest, sink: Sink) -> None:
    await installed(guest, sink)
    (guest.root / "var/log").mkdir(parents=True)
    (guest.root / "var/log/syslog").write_text("Apr 02 19:11:10 vgpudoc kernel: unrelated\n"
                                               + SYSLOG_FIXTURE.read_text())
    env = guest.env(FAKE_SMI_XML_FAIL="1", JOURNALCTL=str(guest.tmp / "no-journalctl"))
    r = await run(guest, PROBE, env)
    assert r.rc == 0, r.err
    ((_, _, st),) = sink.reports
    assert (st.state, st.product, st.gpu_count) == (LicenseState.RESTRICTED, "NVIDIA Virtual Compute Server", 1)
    assert st.last_event is GriddEventKind.ACQUIRED
    assert guest.calls_of("nvidia-smi") == ["-q -x", "-q"]


async def test_probe_reports_driver_missing(guest: Guest, sink: Sink) -> None:
    """An image without the guest driver: no nvidia-smi anywhere on PATH is reported as such."""
    await installed(guest, sink)
    (guest.fakebin / "nvidia-smi").unlink()
    r = await run(guest, PROBE, guest.env())
    assert r.rc == 0, r.err
    assert "not found" in r.err and "driver missing" in r.err
    ((_, _, st),) = sink.reports
    assert (st.state, st.gpu_count, st.product, st.token_current) == (LicenseState.DRIVER_MISSING, 0, None, True)


async def test_probe_smi_failing_is_not_driver_missing(guest: Guest, sink: Sink) -> None:
    await installed(guest, sink)
    env = guest.env(FAKE_SMI_XML_FAIL="1", FAKE_SMI_TEXT=str(guest.tmp / "no-such-output"))
    r = await run(guest, PROBE, env)
    assert r.rc == 0, r.err
    assert "nvidia-smi failed" in r.err
    ((_, _, st),) = sink.reports
    assert (st.state, st.gpu_count) == (LicenseState.UNKNOWN, 0)
    assert guest.calls_of("nvidia-smi") == ["-q -x", "-q"]


def busybox_wget_path(guest: Guest) -> str:
    """A PATH with busybox's wget and no curl, for either shell."""
    if guest.shell != "dash":
        return guest.path_value(curl=False, wget=True)
    # dash with busybox's userland (wget, no curl) on PATH.
    (guest.tmp / "wget-bin").mkdir(exist_ok=True)
    busybox = shutil.which("busybox")
    assert busybox
    if not (guest.tmp / "wget-bin/wget").is_symlink():
        (guest.tmp / "wget-bin/wget").symlink_to(busybox)
    return f"{guest.fakebin}:{guest.tmp / 'wget-bin'}:{guest.busybox_bin}"


async def test_probe_with_busybox_wget(guest: Guest, sink: Sink) -> None:
    await installed(guest, sink)
    r = await run(guest, PROBE, guest.env(PATH=busybox_wget_path(guest)))
    assert r.rc == 0, r.err
    assert "via wget" in r.err
    assert sink.results == ["accepted"]
    ((_, _, st),) = sink.reports
    assert st.product == "NVIDIA RTX Virtual Workstation" and st.token_current
    assert CREDENTIAL not in r.out + r.err


async def test_probe_retries_until_ready(guest: Guest, sink: Sink) -> None:
    await installed(guest, sink)
    sink.ready[0] = False
    loop = asyncio.get_running_loop()
    loop.call_later(0.5, lambda: sink.ready.__setitem__(0, True))
    r = await run(guest, PROBE, guest.env(LICENSECTL_BACKOFF="1", LICENSECTL_ATTEMPTS="4"))
    assert r.rc == 0, r.err
    assert sink.results[0] == "not_ready" and sink.results[-1] == "accepted"
    assert "attempt 1 failed (HTTP 503 not_ready)" in r.err


async def test_probe_refused_is_permanent(guest: Guest, sink: Sink) -> None:
    await installed(guest, sink)
    (guest.root / "sys/class/dmi/id/product_uuid").write_text("00000000-0000-0000-0000-000000000001\n")
    r = await run(guest, PROBE, guest.env())
    assert r.rc == 4 and "unknown_uuid" in r.err
    assert sink.results == ["unknown_uuid"]  # not retried
    r.assert_no_secret()


async def test_probe_wrong_credential_refused(guest: Guest, sink: Sink) -> None:
    guest.write_disk(url=sink.url, credential=derive_credential(KEY, "tenant-bar"))
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    r = await run(guest, PROBE, guest.env())
    assert r.rc == 4 and "unauthorized" in r.err
    assert derive_credential(KEY, "tenant-bar") not in r.out + r.err


async def test_probe_gives_up_when_unreachable(guest: Guest, unused_port: Callable[[], int]) -> None:
    guest.write_disk(url=f"http://127.0.0.1:{unused_port()}/v1/reports")
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    r = await run(guest, PROBE, guest.env(LICENSECTL_ATTEMPTS="2", LICENSECTL_DEADLINE="20"))
    assert r.rc == 5 and "giving up after 2 attempt(s)" in r.err
    # curl's own reason is in the log line, not just "HTTP 000".
    assert re.search(r"attempt 1 failed \(HTTP 000; curl: \(7\) .*(refused|connect)", r.err), r.err
    r.assert_no_secret()


async def test_probe_with_wget_prints_its_error_when_unreachable(guest: Guest,
                                                                 unused_port: Callable[[], int]) -> None:
    guest.write_disk(url=f"http://127.0.0.1:{unused_port()}/v1/reports")
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    r = await run(guest, PROBE, guest.env(PATH=busybox_wget_path(guest), LICENSECTL_ATTEMPTS="1",
                                          LICENSECTL_DEADLINE="20"))
    assert r.rc == 5, r.err
    line = next(x for x in r.err.splitlines() if "attempt 1 failed" in x)
    assert re.search(r"\(HTTP 000; .*(refused|connect)", line, re.IGNORECASE), line
    assert CREDENTIAL not in r.err  # wget carries it on its command line; never in the log


async def test_probe_client_error_is_bounded_and_masks_credentials(guest: Guest) -> None:
    """Whatever the client prints, the log line holds one bounded line and no credential-like value."""
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    noisy = guest.tmp / "noisy-bin"
    noisy.mkdir()
    write_exe(noisy / "curl", f"""#!/bin/sh
cat >/dev/null
printf '%s\\n' '  some header line' 'curl: (35) handshake said: Authorization: Bearer {CREDENTIAL} {"x" * 400}' >&2
printf '000'
exit 35
""")
    r = await run(guest, PROBE, guest.env(PATH=f"{noisy}:{guest.env()['PATH']}", LICENSECTL_ATTEMPTS="1"))
    assert r.rc == 5, r.err
    line = next(x for x in r.err.splitlines() if "attempt 1 failed" in x)
    assert "curl: (35) handshake said: Authorization: Bearer ***" in line
    assert CREDENTIAL not in line and "header line" not in line
    assert len(line) < 300
    r.assert_no_secret()


async def test_probe_not_configured_and_no_client(guest: Guest) -> None:
    r = await run(guest, PROBE, guest.env())
    assert r.rc == 2
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    bare = guest.tmp / "bare-bin"
    bare.mkdir()
    busybox = shutil.which("busybox")
    assert busybox
    for tool in ("tr", "cat", "mktemp", "rm", "uname", "cut", "date"):
        (bare / tool).symlink_to(busybox)
    r = await run(guest, PROBE, guest.env(PATH=f"{guest.fakebin}:{bare}"))
    assert r.rc == 3 and "neither curl nor wget" in r.err


@pytest.fixture
def unused_port() -> Callable[[], int]:
    import socket

    def pick() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    return pick


# ---------------------------------------------------------------------------------------------
# Shipped files
# ---------------------------------------------------------------------------------------------


def test_scripts_are_executable_and_posix_sh() -> None:
    for script in (INSTALL, PROBE):
        assert os.access(script, os.X_OK)
        assert script.read_text().startswith("#!/bin/sh\n")


def unit_settings(name: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (GUEST / name).read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out.setdefault(k, []).append(v)
    return out


def test_units() -> None:
    install = unit_settings("licensectl-install.service")
    assert install["Before"] == [UNIT] and install["Type"] == ["oneshot"]
    assert "nvidia-gridd.service" in install["WantedBy"][0]
    probe = unit_settings("licensectl-probe.service")
    assert "Before" not in probe and "WantedBy" not in probe  # started only by its timer
    timer = unit_settings("licensectl-probe.timer")
    assert timer["OnUnitActiveSec"] == ["60s"] and "RandomizedDelaySec" in timer
    assert timer["WantedBy"] == ["timers.target"] and "Before" not in timer


# ---------------------------------------------------------------------------------------------
# HTTPS: the CA from the license disk (docs/guest.md)
# ---------------------------------------------------------------------------------------------
@dataclass
class TlsSink:
    sink: Sink
    ca: certs.KeyPair


def _server_context(ca: certs.KeyPair, tmp: Path) -> ssl.SSLContext:
    leaf = certs.new_leaf(ca, ["127.0.0.1", "localhost"], now=dt.datetime.now(dt.UTC))
    (tmp / "tls.crt").write_bytes(leaf.cert_pem)
    (tmp / "tls.key").write_bytes(leaf.key_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
    return ctx


@pytest.fixture
async def tls_sink(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TlsSink]:
    reports: list[tuple[str, str, GuestState]] = []
    results: list[str] = []
    ring = KeyRing(current=KEY)
    app = make_reports_app(
        keyring_provider=lambda: ring,
        uuid_known=lambda ns, uuid: "vm-1" if (ns, uuid) == (NS, UUID) else None,
        token_sha_for=lambda ns, vmi: TOKEN_SHA,
        on_report=lambda ns, vmi, st: reports.append((ns, vmi, st)),
        on_result=results.append, limits=EndpointLimits(), clock=lambda: dt.datetime.now(dt.UTC))
    ca = certs.new_ca(now=dt.datetime.now(dt.UTC))
    runner, port = await start_site(app, "127.0.0.1:0",
                                    ssl_context=_server_context(ca, tmp_path_factory.mktemp("tls")))
    try:
        yield TlsSink(Sink(f"https://127.0.0.1:{port}/v1/reports", reports, results, [True]), ca)
    finally:
        await runner.cleanup()


async def test_install_copies_the_report_ca_and_removes_it_when_gone(guest: Guest) -> None:
    (guest.disk / "report-ca.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    installed = guest.root / "etc/licensectl/report-ca.crt"
    assert installed.read_bytes() == (guest.disk / "report-ca.crt").read_bytes() and mode(installed) == 0o600
    (guest.disk / "report-ca.crt").unlink()
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    assert not installed.exists()
    assert len(guest.systemctl_calls()) == 1  # the CA never restarts gridd


async def test_probe_verifies_https_with_the_disk_ca(guest: Guest, tls_sink: TlsSink) -> None:
    guest.write_disk(url=tls_sink.sink.url)
    (guest.disk / "report-ca.crt").write_bytes(tls_sink.ca.cert_pem)
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    r = await run(guest, PROBE, guest.env())
    assert r.rc == 0, r.err
    assert tls_sink.sink.results == ["accepted"]
    r.assert_no_secret()


async def test_probe_refuses_a_server_the_disk_ca_did_not_sign(guest: Guest, tls_sink: TlsSink) -> None:
    guest.write_disk(url=tls_sink.sink.url)
    (guest.disk / "report-ca.crt").write_bytes(certs.new_ca(now=dt.datetime.now(dt.UTC)).cert_pem)
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    r = await run(guest, PROBE, guest.env(LICENSECTL_ATTEMPTS="1"))
    assert r.rc == 5, r.err
    assert tls_sink.sink.results == []  # nothing (no credential) reached the server's handler
    # The TLS verification failure is named (curl exit 60), bounded to one line.
    line = next(x for x in r.err.splitlines() if "attempt 1 failed" in x)
    assert re.search(r"\(HTTP 000; curl: \(60\) .*certificate", line), line
    assert len(line) < 300
    r.assert_no_secret()


async def test_probe_ca_file_setting_overrides_the_disk_ca(guest: Guest, tls_sink: TlsSink) -> None:
    guest.write_disk(url=tls_sink.sink.url)
    (guest.disk / "report-ca.crt").write_bytes(certs.new_ca(now=dt.datetime.now(dt.UTC)).cert_pem)
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    (guest.tmp / "right-ca.pem").write_bytes(tls_sink.ca.cert_pem)
    r = await run(guest, PROBE, guest.env(LICENSECTL_CA_FILE=str(guest.tmp / "right-ca.pem")))
    assert r.rc == 0, r.err
    assert tls_sink.sink.results == ["accepted"]


async def test_probe_plain_http_url_ignores_the_disk_ca(guest: Guest, sink: Sink) -> None:
    guest.write_disk(url=sink.url)
    (guest.disk / "report-ca.crt").write_bytes(b"not even a certificate")
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    r = await run(guest, PROBE, guest.env())
    assert r.rc == 0, r.err
    assert sink.results == ["accepted"]


async def test_probe_refuses_https_with_a_wget_that_cannot_verify(guest: Guest, tls_sink: TlsSink) -> None:
    guest.write_disk(url=tls_sink.sink.url)
    (guest.disk / "report-ca.crt").write_bytes(tls_sink.ca.cert_pem)
    assert (await run(guest, INSTALL, guest.env())).rc == 0
    (guest.tmp / "wget-only").mkdir()
    busybox = shutil.which("busybox")
    assert busybox
    (guest.tmp / "wget-only/wget").symlink_to(busybox)
    path = (f"{guest.fakebin}:{guest.tmp / 'wget-only'}:{guest.busybox_bin}" if guest.shell == "busybox"
            else f"{guest.fakebin}:{guest.tmp / 'wget-only'}:/bin")
    r = await run(guest, PROBE, guest.env(PATH=path, LICENSECTL_HTTP_CLIENT="wget"))
    assert r.rc == 3 and "cannot verify" in r.err, r.err
    assert tls_sink.sink.results == []
