"""The report envelope: header fields, section markers, and `parse_report`, which checks the body's
size and encoding, validates every header and hands each section to its parser; `render_report` is the
format's reference producer. The top of the parsing side: the one module that knows the wire format as
a whole (docs/guest.md, "Wire format").
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Final

from licensectl.core.guest_report.gridd_log import ScannedLog, scan_gridd_log
from licensectl.core.guest_report.limits import (
    BAD_ENCODING,
    BAD_FIELD,
    BAD_FORMAT,
    DEFAULT_LIMITS,
    FORMAT_VERSION,
    MAGIC_KEY,
    OS_HEADER,
    OS_VALUES,
    SMI_FAILED,
    SMI_HEADER,
    SMI_OK,
    SMI_STATUSES,
    SUPPORTED_FORMAT_VERSIONS,
    TOO_LARGE,
    UTC_OFFSET_HEADER,
    ReportError,
    ReportLimits,
)
from licensectl.core.guest_report.smi_text import parse_smi_text
from licensectl.core.guest_report.smi_xml import parse_smi_xml
from licensectl.core.guest_report.state import GpuLicense, GuestReport

SECTION_SMI_XML: Final = "nvidia-smi-xml"
SECTION_SMI_TEXT: Final = "nvidia-smi-text"
SECTION_GRIDD_LOG: Final = "gridd-log"
SECTION_END: Final = "end"
SECTIONS: Final = frozenset({SECTION_SMI_XML, SECTION_SMI_TEXT, SECTION_GRIDD_LOG})
SECTION_MARKER: Final = "--- "

HEADER_KEYS: Final = frozenset({MAGIC_KEY, "uuid", "hostname", "clock", "token-sha256", "probe-version",
                                SMI_HEADER, OS_HEADER, UTC_OFFSET_HEADER})
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HOSTNAME = re.compile(r"[A-Za-z0-9._-]{0,253}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_PROBE_VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,32}")
_HEADER_KEY = re.compile(r"[a-z0-9-]{1,32}")
_UTC_OFFSET = re.compile(r"([+-])(0\d|1[0-4]):([0-5]\d)")
MAX_CLOCK: Final = 253402300799  # 9999-12-31T23:59:59Z
_VERSIONS: Final = {str(v): v for v in SUPPORTED_FORMAT_VERSIONS}


def _bad(field: str) -> ReportError:
    return ReportError(BAD_FIELD, f"header field {field!r} is missing or malformed")


def _sections(text: str, start: int) -> dict[str, str]:
    """Section name -> its text (lines joined by "\\n"), from the first marker line (at `start`) to
    the end marker.

    Marker lines are found with str.find and each section is sliced out, not rebuilt: a per-line
    Python loop over a report's few hundred log lines was the largest cost of parsing it."""
    sections: dict[str, str] = {}
    current: str | None = None
    body_at = start
    if text.startswith(SECTION_MARKER, start) and (start == 0 or text[start - 1] == "\n"):
        at = start
    else:
        nl = text.find("\n" + SECTION_MARKER, start)
        at = nl + 1 if nl >= 0 else -1
    while at >= 0:
        eol = text.find("\n", at)
        if eol < 0:
            eol = len(text)
        if current is not None:
            sections[current] = text[body_at:at - 1]
        name = text[at + len(SECTION_MARKER):eol].rstrip("\r")
        if name == SECTION_END:
            if text[eol:].strip():
                raise ReportError(BAD_FORMAT, "content after the end marker")
            return sections
        if name not in SECTIONS:
            raise ReportError(BAD_FORMAT, "unknown section")
        if name in sections or name == current:
            raise ReportError(BAD_FORMAT, "duplicate section")
        current = name
        body_at = eol + 1
        nl = text.find("\n" + SECTION_MARKER, eol)
        at = nl + 1 if nl >= 0 else -1
    raise ReportError(BAD_FORMAT, "missing end marker (truncated report?)")


# The header exactly as the probe writes it, matched in one step instead of line by line. Its values
# are already in the form the field checks accept, so it matches only headers `_header_lines` accepts
# too (line count and length permitting); anything else -- CRLF, another order, an upper-case UUID --
# goes through that loop, which stays the one definition of a valid header.
_PROBE_HEADER = re.compile(
    r"licensectl-report: ([12])\n"
    r"uuid: ([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\n"
    r"hostname: ([A-Za-z0-9._-]{0,253})\n"
    r"clock: ([0-9]{1,12})\n"
    r"token-sha256: (none|[0-9a-f]{64})\n"
    r"probe-version: ([0-9A-Za-z.+_-]{1,32})\n"
    r"(?:nvidia-smi: (ok|missing|failed)\n)?"
    r"(?:os: (linux|windows)\n)?"
    r"(?:utc-offset: ([+-](?:0\d|1[0-4]):[0-5]\d)\n)?"
    r"(?=--- )"
)
_PROBE_HEADER_LINES: Final = 9
_PROBE_HEADER_LONGEST: Final = len("hostname: ") + 253


def _headers(text: str, limits: ReportLimits) -> tuple[dict[str, str], int]:
    """Header fields up to the first section marker, and where that marker starts."""
    if limits.max_header_lines >= _PROBE_HEADER_LINES and limits.max_field_chars + 34 >= _PROBE_HEADER_LONGEST:
        m = _PROBE_HEADER.match(text)
        if m is not None:
            version, uuid, hostname, clock, sha, probe_version, smi, guest_os, offset = m.groups()
            fast = {MAGIC_KEY: version, "uuid": uuid, "hostname": hostname, "clock": clock, "token-sha256": sha,
                    "probe-version": probe_version}
            for key, value in ((SMI_HEADER, smi), (OS_HEADER, guest_os), (UTC_OFFSET_HEADER, offset)):
                if value is not None:
                    fast[key] = value
            return fast, m.end()
    return _header_lines(text, limits)


def _header_lines(text: str, limits: ReportLimits) -> tuple[dict[str, str], int]:
    """`_headers` line by line: the definition of a valid header."""
    # Header lines only: the loop below gives up after max_header_lines, so the rest stays one string.
    lines = text.split("\n", limits.max_header_lines + 1)
    headers: dict[str, str] = {}
    i = 0
    while i < len(lines) and not lines[i].startswith(SECTION_MARKER):
        line = lines[i].rstrip("\r")
        i += 1
        if i > limits.max_header_lines:
            raise ReportError(BAD_FORMAT, "too many header lines")
        if len(line) > limits.max_field_chars + 34:
            raise ReportError(BAD_FIELD, "header line too long")
        key, sep, value = line.partition(": ")
        if not sep or not _HEADER_KEY.fullmatch(key):
            raise ReportError(BAD_FORMAT, f"header line {i} is not 'key: value'")
        if i == 1 and key != MAGIC_KEY:
            raise ReportError(BAD_FORMAT, f"first line must be '{MAGIC_KEY}: <version>'")
        if key not in HEADER_KEYS:
            raise ReportError(BAD_FIELD, f"unknown header field on line {i}")
        if key in headers:
            raise ReportError(BAD_FORMAT, f"duplicate header field on line {i}")
        headers[key] = value
    return headers, sum(len(line) + 1 for line in lines[:i])


def _smi_section(section: str, text: str, limits: ReportLimits) -> tuple[GpuLicense, ...]:
    xml = section == SECTION_SMI_XML
    return parse_smi_xml(text.encode("utf-8"), limits) if xml else parse_smi_text(text, limits)


def _log_section(text: str, limits: ReportLimits) -> ScannedLog:
    log = [ln for ln in text.split("\n") if ln.strip()]
    if len(log) > limits.max_log_lines:
        raise ReportError(TOO_LARGE, f"more than {limits.max_log_lines} gridd log lines")
    if any(len(ln) > limits.max_line_chars for ln in log):
        raise ReportError(BAD_FIELD, "gridd log line too long")
    return scan_gridd_log(log)


def _os_fields(headers: dict[str, str], version: int) -> tuple[str | None, dt.timedelta | None]:
    """The optional `os` and `utc-offset` headers (format version 2 only)."""
    guest_os = headers.get(OS_HEADER)
    offset_s = headers.get(UTC_OFFSET_HEADER)
    if version == 1 and (guest_os is not None or offset_s is not None):
        raise ReportError(BAD_FIELD, "header fields 'os' and 'utc-offset' need format version 2")
    if guest_os is not None and guest_os not in OS_VALUES:
        raise _bad(OS_HEADER)
    if offset_s is None:
        return guest_os, None
    m = _UTC_OFFSET.fullmatch(offset_s)
    if m is None:
        raise _bad(UTC_OFFSET_HEADER)
    offset = dt.timedelta(hours=int(m.group(2)), minutes=int(m.group(3)))
    return guest_os, -offset if m.group(1) == "-" else offset


def parse_report(body: bytes, limits: ReportLimits = DEFAULT_LIMITS) -> GuestReport:
    """Parse and validate one report body (docs/guest.md, "Wire format"). Strict: no guessing."""
    if len(body) > limits.max_body_bytes:
        raise ReportError(TOO_LARGE, f"body exceeds {limits.max_body_bytes} bytes")
    if b"\x00" in body:
        raise ReportError(BAD_ENCODING, "body contains NUL bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ReportError(BAD_ENCODING, "body is not UTF-8") from None

    if text.count("\n") + 1 > limits.max_text_lines + limits.max_log_lines + limits.max_header_lines + 8:
        raise ReportError(TOO_LARGE, "body has too many lines")
    headers, sections_at = _headers(text, limits)
    if MAGIC_KEY not in headers:
        raise ReportError(BAD_FORMAT, "not a licensectl report")
    version = _VERSIONS.get(headers[MAGIC_KEY])
    if version is None:
        raise ReportError(BAD_FORMAT, "unsupported report format version")

    sections = _sections(text, sections_at)
    if SECTION_SMI_XML in sections and SECTION_SMI_TEXT in sections:
        raise ReportError(BAD_FORMAT, "both XML and text nvidia-smi sections")

    uuid = headers.get("uuid", "").strip().lower()
    if not _UUID.fullmatch(uuid):
        raise _bad("uuid")
    hostname = headers.get("hostname", "")
    if not _HOSTNAME.fullmatch(hostname):
        raise _bad("hostname")
    clock_s = headers.get("clock", "")
    if not clock_s.isascii() or not clock_s.isdigit() or len(clock_s) > 12 or int(clock_s) > MAX_CLOCK:
        raise _bad("clock")
    clock = dt.datetime.fromtimestamp(int(clock_s), tz=dt.UTC)
    sha = headers.get("token-sha256", "")
    if sha != "none" and not _SHA256.fullmatch(sha):
        raise _bad("token-sha256")
    probe_version = headers.get("probe-version", "")
    if not _PROBE_VERSION.fullmatch(probe_version):
        raise _bad("probe-version")

    smi_status = headers.get(SMI_HEADER)
    if version == 1 and smi_status is not None:
        raise ReportError(BAD_FIELD, f"header field {SMI_HEADER!r} needs format version 2")
    if version >= 2 and smi_status not in SMI_STATUSES:
        raise _bad(SMI_HEADER)
    has_smi = SECTION_SMI_XML in sections or SECTION_SMI_TEXT in sections
    if smi_status is not None and has_smi != (smi_status == SMI_OK):
        raise ReportError(BAD_FORMAT, "nvidia-smi status and sections disagree")

    guest_os, utc_offset = _os_fields(headers, version)

    smi_format: str | None = None
    gpus: tuple[GpuLicense, ...] = ()
    if SECTION_SMI_XML in sections:
        smi_format = "xml"
        gpus = _smi_section(SECTION_SMI_XML, sections[SECTION_SMI_XML], limits)
    elif SECTION_SMI_TEXT in sections:
        smi_format = "text"
        gpus = _smi_section(SECTION_SMI_TEXT, sections[SECTION_SMI_TEXT], limits)
    log = _log_section(sections.get(SECTION_GRIDD_LOG, ""), limits)

    return GuestReport(
        format_version=version,
        uuid=uuid,
        hostname=hostname,
        clock=clock,
        token_sha256=None if sha == "none" else sha,
        probe_version=probe_version,
        smi_format=smi_format,
        gpus=gpus,
        events=log.resolve(clock, utc_offset),
        smi_status=smi_status,
        guest_os=guest_os,
        utc_offset=utc_offset,
    )


def render_report(*, uuid: str, hostname: str, clock: int, token_sha256: str | None,
                  probe_version: str, sections: Sequence[tuple[str, str]] = (),
                  smi_status: str | None = None, format_version: int = FORMAT_VERSION,
                  guest_os: str | None = None, utc_offset: str | None = None) -> bytes:
    """The body the probe would send: the format's reference producer, for tests and tooling.

    `smi_status` defaults to what the sections imply (ok with an nvidia-smi section, else failed);
    `format_version=1` renders what an old probe sends (no nvidia-smi header); `guest_os` and
    `utc_offset` (e.g. "+01:00") what the Windows agent adds."""
    out = [f"{MAGIC_KEY}: {format_version}", f"uuid: {uuid}", f"hostname: {hostname}", f"clock: {clock}",
           f"token-sha256: {token_sha256 or 'none'}", f"probe-version: {probe_version}"]
    if format_version >= 2:
        if smi_status is None:
            has_smi = any(name in (SECTION_SMI_XML, SECTION_SMI_TEXT) for name, _ in sections)
            smi_status = SMI_OK if has_smi else SMI_FAILED
        out.append(f"{SMI_HEADER}: {smi_status}")
        if guest_os is not None:
            out.append(f"{OS_HEADER}: {guest_os}")
        if utc_offset is not None:
            out.append(f"{UTC_OFFSET_HEADER}: {utc_offset}")
    for name, content in sections:
        out.append(SECTION_MARKER + name)
        out.extend(content.splitlines())
    out.append(SECTION_MARKER + SECTION_END)
    return ("\n".join(out) + "\n").encode("utf-8")
