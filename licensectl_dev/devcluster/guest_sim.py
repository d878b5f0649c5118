"""Simulated vGPU guests: the *real* guest scripts, run against a fake guest filesystem.

A GPU and a guest OS cannot run here, so each simulated guest is a directory tree standing in for
the VM's root filesystem. The shipped `licensectl-install.sh` and `licensectl-probe.sh` run for
real under `dash`, with the license disk filled from the VMI's replica Secret (what KubeVirt's ISO
would hold), the SMBIOS UUID set to the VMI's firmware UUID, and a fake `nvidia-smi` that prints
recorded real output from tests/fixtures/nvidia/. Derived variants (a different expiry date in the
XML, say) are built here and named as derived; recorded fixtures are never edited.

A Windows guest (`GuestProfile.windows`) cannot run its agent here: its license disk is installed the
same way, and its probe sends the report the Windows agent (guest/windows) would send -- `os: windows`,
the guest's UTC offset, the nvidia-smi output as the agent collects it (`-q -x`, else `-q`) and the tail
of its licensing log, a recorded Windows-format log in local time -- to the same endpoint.
`GuestProfile.on_windows` makes the Windows twin of a Linux profile: the same driver output, the same
gridd events at the same instants (a Linux twin's journal of a Windows-format log is derived from it).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import hashlib
import re
import shutil
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from licensectl.core.guest_report import render_report
from licensectl.kube.raw import RawApi

REPO = Path(__file__).resolve().parents[2]
GUEST_DIR = REPO / "licensectl" / "guest"
FIXTURES = REPO / "tests" / "fixtures" / "nvidia"

# Guest profiles: what `nvidia-smi` prints in that guest.
LICENSED_XML = "smi-qx-licensed-l40s-2q-trimmed.xml"
UNLICENSED_TEXT = "smi-q-unlicensed-vcs.txt"
RESTRICTED_TEXT = "smi-q-unlicensed-restricted-vcs.txt"
GRIDD_LOG = "gridd-log-acquired-cls.txt"
MISSING_TOKEN_LOG = "gridd-log-missing-token.txt"
JOURNAL_DAY = "2026-04-02"  # the recorded syslog lines carry no year; the journal needs one
# Recorded Windows licensing logs (Log.NVDisplay.Container.exe.log): renewals, and a CLS instance
# without a pool for the product asked for ("No pool features found").
WINDOWS_LICENSED_LOG = "gridd-log-renew-return-windows-format.txt"
WINDOWS_NO_POOL_LOG = "gridd-log-no-pool-windows-format.txt"
WINDOWS_UTC_OFFSET = dt.timedelta(hours=1)  # the simulated Windows guests' zone: their log times are local
# The agent's bounds (guest/windows/internal/agent/report.go): log tail, line lengths.
AGENT_LOG_LINES = 50
AGENT_SMI_LINE_CHARS = 4096
AGENT_LOG_LINE_CHARS = 1024

_SYSLOG_LINE = re.compile(r"[A-Z][a-z]{2} [ 0-9]\d (\d\d:\d\d:\d\d)( .*)")
_WINDOWS_LINE = re.compile(r"[A-Z][a-z]{2} ([A-Z][a-z]{2} [ 0-9]?\d \d\d:\d\d:\d\d \d{4}):<\d+>:(.*)")


def derived_xml_with_expiry(expiry: dt.datetime) -> str:
    """Derived from the recorded L40S-2Q XML: only the expiry in <license_status> is changed,
    written the way the driver prints it (no zero padding, GMT)."""
    xml = (FIXTURES / LICENSED_XML).read_text()
    e = expiry.astimezone(dt.UTC)
    stamp = f"{e.year}-{e.month}-{e.day} {e.hour}:{e.minute}:{e.second} GMT"
    return re.sub(r"<license_status>[^<]*</license_status>",
                  f"<license_status>Licensed (Expiry: {stamp})</license_status>", xml, count=1)


@dataclass
class GuestProfile:
    """What the guest's driver reports: an XML document, or text output only (-q -x failing)."""

    name: str
    xml: str | None = None
    text_fixture: str | None = None
    silent: bool = False  # never reports (probe not installed / network blocked)
    lease: dt.timedelta | None = None  # renewing: every probe sees expiry = now + lease, as gridd renews
    gridd_log: str = GRIDD_LOG  # recorded nvidia-gridd log the guest's journal holds
    driver: bool = True  # False: an image without the guest driver (no nvidia-smi on PATH)
    clock_offset: dt.timedelta = dt.timedelta(0)  # guest clock minus true time
    windows: bool = False  # reports as the Windows agent would (see the module docstring)

    @classmethod
    def licensed(cls, lease: dt.timedelta = dt.timedelta(days=1)) -> GuestProfile:
        """The recorded licensed L40S-2Q output with a current, renewing lease (the recorded expiry is
        in the past)."""
        return cls("licensed", xml=derived_xml_with_expiry(dt.datetime.now(dt.UTC) + lease), lease=lease)

    def current_xml(self) -> str | None:
        if self.lease is not None:
            return derived_xml_with_expiry(dt.datetime.now(dt.UTC).replace(microsecond=0) + self.lease)
        return self.xml

    @classmethod
    def recorded(cls) -> GuestProfile:
        """The recorded XML verbatim (its lease expired long ago: the guest reads as expired)."""
        return cls("recorded", xml=(FIXTURES / LICENSED_XML).read_text())

    @classmethod
    def expiring(cls, expiry: dt.datetime) -> GuestProfile:
        return cls("expiring", xml=derived_xml_with_expiry(expiry))

    @classmethod
    def unlicensed(cls, gridd_log: str = MISSING_TOKEN_LOG) -> GuestProfile:
        """Recorded `Unlicensed` output; the journal holds `gridd_log` (by default gridd's
        "Unable to fetch the client configuration token file", so the reason is `token_missing`)."""
        return cls("unlicensed", text_fixture=UNLICENSED_TEXT, gridd_log=gridd_log)

    @classmethod
    def driver_missing(cls) -> GuestProfile:
        """An image without the vGPU guest driver: no `nvidia-smi` at all, no gridd log."""
        return cls("driver-missing", driver=False)

    @classmethod
    def skewed(cls, offset: dt.timedelta, lease: dt.timedelta = dt.timedelta(days=1)) -> GuestProfile:
        """Licensed output (renewing lease), but the guest clock is off by `offset`."""
        p = cls.licensed(lease)
        p.name, p.clock_offset = "skewed", offset
        return p

    @classmethod
    def unlicensed_no_pool(cls) -> GuestProfile:
        """Recorded `Unlicensed` output; gridd failed to acquire: the license server has no pool for the
        product ("No pool features found", recorded on a Windows guest; this Linux guest's journal is
        derived from it), so the reason is `acquire_failed`."""
        return cls("unlicensed-no-pool", text_fixture=UNLICENSED_TEXT, gridd_log=WINDOWS_NO_POOL_LOG)

    def on_windows(self, log: str | None = None) -> GuestProfile:
        """The Windows twin: the same driver output, reported the Windows agent's way, its licensing log
        holding the recorded Windows-format `log` (default: this profile's own log when it is one, else
        the recorded renewals)."""
        if log is None:
            log = self.gridd_log if is_windows_log(self.gridd_log) else WINDOWS_LICENSED_LOG
        assert is_windows_log(log), f"{log} is not a Windows-format licensing log"
        return dataclasses.replace(self, name=f"windows-{self.name}", windows=True, gridd_log=log)

    @classmethod
    def windows_licensed(cls, lease: dt.timedelta = dt.timedelta(days=1)) -> GuestProfile:
        """A licensed Windows guest: the renewing licensed output, reported the Windows agent's way."""
        return dataclasses.replace(cls.licensed(lease).on_windows(), name="windows")

    @classmethod
    def restricted(cls) -> GuestProfile:
        return cls("restricted", text_fixture=RESTRICTED_TEXT)

    @classmethod
    def quiet(cls) -> GuestProfile:
        return cls("silent", silent=True)


def is_windows_log(fixture: str) -> bool:
    """Whether the recorded log is a Windows licensing log (`<date>:<level>:<message>` lines)."""
    lines = [line for line in (FIXTURES / fixture).read_text().splitlines() if line.strip()]
    return bool(lines) and all(_WINDOWS_LINE.fullmatch(line) for line in lines)


def journal_text(fixture: str) -> str:
    """The fixture's nvidia-gridd lines as `journalctl -o short-iso --utc` prints them: recorded
    syslog times are placed on JOURNAL_DAY, lines without a time get noon of that day. A Windows-format
    log gives derived lines: the same messages at the same instants (its local times read in the zone of
    the simulated Windows guests)."""
    if is_windows_log(fixture):
        out = []
        for line in (FIXTURES / fixture).read_text().splitlines():
            m = _WINDOWS_LINE.fullmatch(line)
            if m:
                at = dt.datetime.strptime(m.group(1), "%b %d %H:%M:%S %Y") - WINDOWS_UTC_OFFSET
                out.append(f"{at:%Y-%m-%dT%H:%M:%S}+00:00 guest nvidia-gridd[1]: {m.group(2)}\n")
        return "".join(out)
    out = []
    for line in (FIXTURES / fixture).read_text().splitlines():
        if "nvidia-gridd[" not in line and "nvidia-gridd:" not in line:
            continue  # other daemons' lines (systemd's "Started nvidia-gridd.service")
        m = _SYSLOG_LINE.fullmatch(line)
        if m:
            out.append(f"{JOURNAL_DAY}T{m.group(1)}+00:00{m.group(2)}\n")
        elif line.startswith("nvidia-gridd"):
            out.append(f"{JOURNAL_DAY}T12:00:00+00:00 guest {line}\n")
    return "".join(out)


def mounted_secret(vmi: dict[str, Any]) -> str | None:
    """The Secret the VMI mounts as a disk (the license disk); None when it mounts none."""
    return next((str(v["secret"]["secretName"]) for v in (vmi.get("spec") or {}).get("volumes") or []
                 if isinstance(v, dict) and isinstance(v.get("secret"), dict)), None)


def agent_section_text(text: str, max_line: int) -> str:
    """A section as the agent writes it: printable ASCII and tabs only, lines bounded, a line that would
    read as a section marker shifted by a space."""
    out = []
    for line in text.rstrip("\r\n").split("\n"):
        kept = "".join(c for c in line if c == "\t" or " " <= c <= "~")
        if kept.startswith("---"):
            kept = " " + kept
        out.append(kept[:max_line])
    return "\n".join(out)


def agent_log_tail(text: str, lines: int = AGENT_LOG_LINES) -> list[str]:
    """The licensing log lines the agent reports: the last `lines` non-empty ones."""
    kept = [line for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    return kept[-lines:]


def windows_report(*, uuid: str, hostname: str, clock: int, token_sha256: str | None, smi_xml: str | None,
                   smi_text: str | None, driver: bool, log: str | None, utc_offset: dt.timedelta) -> bytes:
    """The body the Windows agent sends (Collect + Body in guest/windows/internal/agent): nvidia-smi
    `missing` without the driver, else the XML, else the text form, else `failed`; the log's tail."""
    sections = []
    status = "missing"
    if driver:
        status = "failed"
        if smi_xml:
            status = "ok"
            sections.append(("nvidia-smi-xml", agent_section_text(smi_xml, AGENT_SMI_LINE_CHARS)))
        elif smi_text:
            status = "ok"
            sections.append(("nvidia-smi-text", agent_section_text(smi_text, AGENT_SMI_LINE_CHARS)))
    tail = agent_log_tail(log) if log is not None else []
    if tail:
        sections.append(("gridd-log", agent_section_text("\n".join(tail), AGENT_LOG_LINE_CHARS)))
    minutes = int(utc_offset.total_seconds()) // 60
    offset = f"{'-' if minutes < 0 else '+'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    return render_report(uuid=uuid, hostname=re.sub(r"[^A-Za-z0-9._-]", "", hostname)[:253], clock=clock,
                         token_sha256=token_sha256, probe_version="1.0.0", sections=sections, smi_status=status,
                         guest_os="windows", utc_offset=offset)


def _write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@dataclass
class SimulatedGuest:
    namespace: str
    vmi: str
    profile: GuestProfile
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="licensectl-guest-")))
    last_rc: int | None = None
    last_stderr: str = ""
    # The wall-clock second the last probe run ended in (see `probe`).
    last_probe_second: int | None = None

    def __post_init__(self) -> None:
        self.root = self.base / "root"
        self.disk = self.base / "disk"
        self.bin = self.base / "bin"
        for d in (self.root / "sys/class/dmi/id", self.disk, self.bin, self.base / "tmp", self.base / "mnt"):
            d.mkdir(parents=True, exist_ok=True)
        _write_exe(self.bin / "systemctl", "#!/bin/sh\nexit 0\n")
        self.set_profile(self.profile)

    def set_profile(self, profile: GuestProfile) -> None:
        """Become a guest with `profile` (a re-boot may license differently): rewrites the fake
        nvidia-smi, the journal and the clock."""
        self.profile = profile
        for exe in ("nvidia-smi", "date"):
            (self.bin / exe).unlink(missing_ok=True)
        smi_xml = self.base / "smi.xml"
        smi_xml.unlink(missing_ok=True)
        if self.profile.xml is not None:
            smi_xml.write_text(self.profile.xml)
        text = FIXTURES / (self.profile.text_fixture or UNLICENSED_TEXT)
        xml_case = f'cat "{smi_xml}"' if self.profile.xml is not None else "exit 9"
        if self.profile.driver:
            _write_exe(self.bin / "nvidia-smi", f'#!/bin/sh\ncase "$*" in\n"-q -x") {xml_case} ;;\n'
                                               f'"-q") cat "{text}" ;;\n*) exit 2 ;;\nesac\n')
        journal = self.base / "journal.txt"
        journal.write_text(journal_text(self.profile.gridd_log) if self.profile.driver else "")
        _write_exe(self.bin / "journalctl", f'#!/bin/sh\ncat "{journal}"\n')
        offset = int(self.profile.clock_offset.total_seconds())
        real_date = shutil.which("date") or "/bin/date"
        if offset:
            # Only the probe's `date +%s` (the report clock and its own deadline arithmetic) moves.
            _write_exe(self.bin / "date", f'#!/bin/sh\nif [ "$*" = "+%s" ]; then\n'
                                          f'\techo $(( $("{real_date}" +%s) + ({offset}) ))\n'
                                          f'else\n\texec "{real_date}" "$@"\nfi\n')

    def env(self) -> dict[str, str]:
        return {
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.base), "TMPDIR": str(self.base / "tmp"),
            "LICENSECTL_ROOT": str(self.root), "LICENSECTL_ENV_FILE": str(self.base / "no-env-file"),
            "LICENSECTL_DISK_DIR": str(self.disk), "LICENSECTL_DISK_WAIT": "0",
            "JOURNALCTL": str(self.bin / "journalctl"), "LICENSECTL_BACKOFF": "1", "LICENSECTL_ATTEMPTS": "3",
            "LICENSECTL_DEADLINE": "20",
        }

    async def _run(self, script: str) -> int:
        shell = shutil.which("dash") or "/bin/sh"
        proc = await asyncio.create_subprocess_exec(
            shell, str(GUEST_DIR / script), env=self.env(), cwd=self.base,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        self.last_rc = proc.returncode
        self.last_stderr = err.decode(errors="replace")[-2000:]
        return proc.returncode if proc.returncode is not None else -1

    async def boot(self, api: ApiClient, *, report_url: str | None = None) -> int:
        """What KubeVirt + the boot unit do: expose the replica as the license disk, set the SMBIOS
        UUID, run licensectl-install. `report_url` overrides the URL inside the disk (the demo's
        controller listens on loopback, not on the in-cluster Service name)."""
        vmi: dict[str, Any] = await RawApi(CustomObjectsApi(api)).get_namespaced_custom_object(
            "kubevirt.io", "v1", self.namespace, "virtualmachineinstances", self.vmi)
        secret_name = mounted_secret(vmi)
        if secret_name is None:
            return 2
        secret = await RawApi(CoreV1Api(api)).read_namespaced_secret(secret_name, self.namespace)
        return await self.install(vmi, secret, report_url=report_url)

    async def install(self, vmi: dict[str, Any], secret: dict[str, Any] | None, *,
                      report_url: str | None = None) -> int:
        """`boot` from a VMI and its license Secret already read (None: no license disk)."""
        uuid = (((vmi.get("spec") or {}).get("domain") or {}).get("firmware") or {}).get("uuid", "")
        (self.root / "sys/class/dmi/id/product_uuid").write_text(str(uuid).upper() + "\n")
        for f in self.disk.iterdir():
            f.unlink()
        for key, value in ((secret or {}).get("data") or {}).items():
            data = base64.b64decode(value)
            if key == "report-url" and report_url:
                data = report_url.encode()
            (self.disk / key).write_bytes(data)
        return await self._run("licensectl-install.sh")

    async def probe(self) -> int:
        """One run of licensectl-probe. A report's clock is in whole seconds and the controller refuses one
        not newer than the last it accepted from the VMI (a replay); a real guest's probe runs once a
        minute (its timer), so a run here waits for the next second after the last, as a real one always has."""
        if self.profile.silent:
            return 0
        if self.last_probe_second is not None:
            wait = self.last_probe_second + 1 - time.time()
            if wait > 0:
                await asyncio.sleep(wait + 0.01)
        xml = self.profile.current_xml()
        if xml is not None:
            (self.base / "smi.xml").write_text(xml)
        try:
            if self.profile.windows:
                return await self._probe_windows(xml)
            return await self._run("licensectl-probe.sh")
        finally:
            self.last_probe_second = int(time.time())

    async def _probe_windows(self, xml: str | None) -> int:
        """One report as the Windows agent sends it, with the settings licensectl-install put in place;
        returns the probe's exit code for the outcome (0 accepted, 2 not configured, 4 refused, 5 failed)."""
        state = self.root / "etc" / "licensectl"
        try:
            url, ns, cred = ((state / k).read_text().strip()
                             for k in ("report-url", "report-namespace", "report-credential"))
        except OSError:
            self.last_rc = 2
            return 2
        tokens = sorted((self.root / "etc" / "nvidia" / "ClientConfigToken").glob("licensectl_*.tok"))
        sha = hashlib.sha256(tokens[0].read_bytes()).hexdigest() if len(tokens) == 1 else None
        uuid = (self.root / "sys/class/dmi/id/product_uuid").read_text().strip().lower()
        p = self.profile
        body = windows_report(
            uuid=uuid, hostname=self.vmi, clock=int(time.time() + p.clock_offset.total_seconds()), token_sha256=sha,
            smi_xml=xml, smi_text=(FIXTURES / (p.text_fixture or UNLICENSED_TEXT)).read_text(), driver=p.driver,
            log=(FIXTURES / p.gridd_log).read_text() if p.driver else None, utc_offset=WINDOWS_UTC_OFFSET)
        headers = {"Authorization": f"Bearer {cred}", "X-Licensectl-Namespace": ns,
                   "Content-Type": "text/plain; charset=utf-8"}
        # As the agent does: an https URL is verified against the CA from the license disk.
        ca = state / "report-ca.crt"
        tls = ssl.create_default_context(cafile=str(ca)) if url.startswith("https://") and ca.is_file() else None
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session, \
                    session.post(url, data=body, headers=headers, ssl=tls if tls is not None else True) as resp:
                status = resp.status
                self.last_stderr = "" if status == 202 else f"HTTP {status}: {(await resp.text())[:200]}"
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            status, self.last_stderr = 0, f"HTTP 000; {type(e).__name__}"
        self.last_rc = 0 if status == 202 else 4 if 400 <= status < 500 and status not in (408, 429) else 5
        return self.last_rc

    def cleanup(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

