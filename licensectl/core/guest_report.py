"""Guest reports: untrusted text from inside a VM turned into a bounded, typed guest state.

Pure: no I/O, no clock (`now` is passed in). Everything here parses attacker-controlled bytes, so
every field is length- and charset-bounded, XML goes through defusedxml, and every failure is a
`ReportError` with one of a few machine reasons (used as a metric label) and a message that never
quotes the input. The wire format is documented in docs/guest.md; the probe that produces it is
licensectl/guest/licensectl-probe.sh.
"""

from __future__ import annotations

import datetime as dt
import re
import xml.etree.ElementTree as ET  # only for the ParseError type; parsing goes through defusedxml
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import defusedxml
import defusedxml.ElementTree as DET

from licensectl.core.timecodec import parse_time

# ---------------------------------------------------------------------------------------------
# Errors and limits
# ---------------------------------------------------------------------------------------------

TOO_LARGE: Final = "too_large"
BAD_ENCODING: Final = "bad_encoding"
BAD_FORMAT: Final = "bad_format"
BAD_FIELD: Final = "bad_field"
BAD_XML: Final = "bad_xml"
XML_FORBIDDEN: Final = "xml_forbidden"
REASONS: Final = frozenset({TOO_LARGE, BAD_ENCODING, BAD_FORMAT, BAD_FIELD, BAD_XML, XML_FORBIDDEN})


class ReportError(ValueError):
    """A rejected report. `reason` is one of REASONS; `message` never contains report content."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown report error reason {reason!r}")
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class ReportLimits:
    """Bounds on what a guest may send. The probe stays well below them (docs/guest.md)."""

    max_body_bytes: int = 512 * 1024
    max_header_lines: int = 16
    max_field_chars: int = 256
    max_log_lines: int = 200
    max_line_chars: int = 2048
    max_gpus: int = 32
    max_text_lines: int = 20_000


DEFAULT_LIMITS: Final = ReportLimits()

# Version 2 adds the `nvidia-smi` header (ok | missing | failed) so an image without the guest
# driver is told apart from a driver that printed nothing; version 1 bodies are still accepted.
FORMAT_VERSION: Final = 2
SUPPORTED_FORMAT_VERSIONS: Final = frozenset({1, 2})
MAGIC_KEY: Final = "licensectl-report"
SMI_HEADER: Final = "nvidia-smi"
SMI_OK: Final = "ok"
SMI_MISSING: Final = "missing"  # no nvidia-smi on PATH: the image has no vGPU guest driver
SMI_FAILED: Final = "failed"  # nvidia-smi present but gave no usable output
SMI_STATUSES: Final = frozenset({SMI_OK, SMI_MISSING, SMI_FAILED})

# Bounds on stored strings (independent of limits: they shape what downstream code may assume).
MAX_PRODUCT_CHARS: Final = 96
MAX_RAW_STATUS_CHARS: Final = 96
MAX_MESSAGE_CHARS: Final = 240


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


class LicenseState(StrEnum):
    """A guest's license condition. Parsing yields licensed/unlicensed/restricted/unknown per GPU
    (grace is a flag there); `evaluate` adds grace, expired and driver_missing for the guest."""

    LICENSED = "licensed"
    UNLICENSED = "unlicensed"
    RESTRICTED = "restricted"
    GRACE = "grace"  # `Unlicensed (Unrestricted)`: full speed for now, restricted soon
    EXPIRED = "expired"
    DRIVER_MISSING = "driver_missing"  # the probe found no nvidia-smi: image without the guest driver
    UNKNOWN = "unknown"


# Worst-first aggregation: a guest is as bad as its worst GPU. Restricted is throttled right now,
# expired is about to be, unlicensed is past or outside grace, grace still runs at full speed,
# unknown says nothing bad for sure. driver_missing never mixes with GPU states (no GPU is seen).
SEVERITY: Final[dict[LicenseState, int]] = {
    LicenseState.LICENSED: 0,
    LicenseState.UNKNOWN: 1,
    LicenseState.GRACE: 2,
    LicenseState.UNLICENSED: 3,
    LicenseState.EXPIRED: 4,
    LicenseState.RESTRICTED: 5,
    LicenseState.DRIVER_MISSING: 6,
}

# Why a guest holds no license, from gridd's own log (bounded: used as a metric label).
REASON_TOKEN_MISSING: Final = "token_missing"
REASON_TOKEN_CORRUPT: Final = "token_corrupt"
REASON_CONFIG_MISSING: Final = "config_missing"
REASON_ACQUIRE_FAILED: Final = "acquire_failed"
REASON_NOT_FOUND: Final = "not_found"
REASON_LEASE_EXPIRED: Final = "lease_expired"  # licensed once, the expiry passed without renewal
REASON_UNKNOWN: Final = "unknown"  # the log (if any) names no cause
UNLICENSED_REASONS: Final = frozenset({REASON_TOKEN_MISSING, REASON_TOKEN_CORRUPT, REASON_CONFIG_MISSING,
                                       REASON_ACQUIRE_FAILED, REASON_NOT_FOUND, REASON_LEASE_EXPIRED,
                                       REASON_UNKNOWN})


@dataclass(frozen=True, slots=True)
class GpuLicense:
    """One GPU's licensing as nvidia-smi printed it. `grace` marks `Unlicensed (Unrestricted)`."""

    product: str | None
    state: LicenseState
    expiry: dt.datetime | None
    raw_status: str
    driver_version: str | None = None
    pci_id: str | None = None
    gpu_uuid: str | None = None
    gpu_name: str | None = None
    grace: bool = False


class GriddEventKind(StrEnum):
    ACQUIRED = "acquired"
    RENEWED = "renewed"
    RETURNED = "returned"
    FAILED = "failed"
    NOT_FOUND = "not_found"
    TOKEN_MISSING = "token_missing"
    TOKEN_CORRUPT = "token_corrupt"
    CONFIG_MISSING = "config_missing"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True, slots=True)
class GriddEvent:
    """One recognised nvidia-gridd log line. `at` is None when the line carries no timestamp."""

    kind: GriddEventKind
    at: dt.datetime | None
    message: str
    server: str | None = None
    product: str | None = None
    expiry: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class GuestReport:
    """A parsed, validated report. Holds no secret: only the token's SHA-256."""

    format_version: int
    uuid: str
    hostname: str
    clock: dt.datetime
    token_sha256: str | None
    probe_version: str
    smi_format: str | None  # "xml", "text" or None when nvidia-smi gave nothing
    gpus: tuple[GpuLicense, ...]
    events: tuple[GriddEvent, ...]
    smi_status: str | None = None  # one of SMI_STATUSES; None: a version 1 probe did not say


@dataclass(frozen=True, slots=True)
class GuestState:
    """What the rest of licensectl needs to know about one guest after one report."""

    uuid: str
    hostname: str
    state: LicenseState
    product: str | None
    expiry: dt.datetime | None
    driver_version: str | None
    gpu_count: int
    grace: bool
    token_sha256: str | None
    token_current: bool
    clock_skew_seconds: float
    reported_at: dt.datetime
    last_event: GriddEventKind | None
    last_event_at: dt.datetime | None
    reason: str | None = None  # one of UNLICENSED_REASONS while the guest holds no license


# ---------------------------------------------------------------------------------------------
# Small bounded-string helpers
# ---------------------------------------------------------------------------------------------

_PRODUCT_CHARS = re.compile(r"[^A-Za-z0-9 ._()/+,:;=-]")
_SPACES = re.compile(r"\s+")
_TOKENISH = re.compile(r"[A-Za-z0-9._:-]+")


def clean_text(s: str, max_chars: int) -> str:
    """Collapse whitespace, drop characters outside a safe printable set, truncate."""
    s = _PRODUCT_CHARS.sub("", _SPACES.sub(" ", s)).strip()
    return s[:max_chars]


def _clean_opt(s: str | None, max_chars: int) -> str | None:
    if s is None:
        return None
    c = clean_text(s, max_chars)
    return c or None


def _token_opt(s: str | None, max_chars: int) -> str | None:
    """An identifier-like value (driver version, PCI id, GPU UUID): charset-checked or dropped."""
    if s is None:
        return None
    s = s.strip()
    if not s or len(s) > max_chars or not _TOKENISH.fullmatch(s):
        return None
    return s


# Metric-safe product labels: the free-text product collapses onto a fixed, small set.
_PRODUCT_LABELS: Final = {
    "nvidia rtx virtual workstation": "vws",
    "nvidia virtual pc": "vpc",
    "nvidia virtual applications": "vapps",
    "nvidia virtual compute server": "vcs",
    "nvidia ai enterprise": "nvaie",
}
PRODUCT_LABELS: Final = frozenset({*_PRODUCT_LABELS.values(), "other", "none"})


def product_label(product: str | None) -> str:
    """A bounded label for metrics: one of PRODUCT_LABELS, never the free text itself."""
    if not product:
        return "none"
    return _PRODUCT_LABELS.get(_SPACES.sub(" ", product).strip().lower(), "other")


# What a class's FeatureType implies the guest must hold (docs/design.md#feature-type): 2 is RTX
# Virtual Workstation, 4 Virtual Compute Server (NVIDIA AI Enterprise is the same compute pool).
# FeatureType 1 lets gridd pick the product from the vGPU type, so the class implies nothing and
# no guest of such a class is ever judged wrong; 0 (unlicensed) implies nothing either.
_IMPLIED_PRODUCTS: Final[dict[int, frozenset[str]]] = {2: frozenset({"vws"}), 4: frozenset({"vcs", "nvaie"})}


def implied_products(feature_type: int | None) -> frozenset[str] | None:
    """Product labels a guest of a class with this FeatureType may hold; None: cannot tell."""
    return None if feature_type is None else _IMPLIED_PRODUCTS.get(feature_type)


def wrong_product(product: str | None, feature_type: int | None) -> bool | None:
    """True when the guest holds another product than its class implies (it draws from the wrong,
    possibly dearer, license pool); None when the class implies nothing or no product is held."""
    allowed = implied_products(feature_type)
    held = product_label(product)
    if allowed is None or held == "none":
        return None
    return held not in allowed


# ---------------------------------------------------------------------------------------------
# License status
# ---------------------------------------------------------------------------------------------

# Driver format (fixtures/nvidia/README.md): `Licensed (Expiry: 2026-7-7 16:1:44 GMT)`, no zero padding.
_EXPIRY = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2}) (\d{1,2}):(\d{1,2}):(\d{1,2}) GMT")
_LICENSED = re.compile(r"Licensed(?:\s*\(\s*Expiry:\s*(?P<exp>[^)]*)\))?")
_UNLICENSED = re.compile(r"Unlicensed(?:\s*\(\s*(?P<q>Restricted|Unrestricted)\s*\))?")


def parse_expiry(s: str) -> dt.datetime | None:
    """`2026-7-7 16:1:44 GMT` -> aware UTC datetime; anything else (e.g. `N/A`) -> None."""
    m = _EXPIRY.fullmatch(s.strip())
    if not m:
        return None
    try:
        y, mo, d, h, mi, sec = (int(g) for g in m.groups())
        return dt.datetime(y, mo, d, h, mi, sec, tzinfo=dt.UTC)
    except ValueError:
        return None


def _parse_status(s: str) -> tuple[LicenseState, dt.datetime | None, bool]:
    s = _SPACES.sub(" ", s).strip()
    m = _LICENSED.fullmatch(s)
    if m:
        exp = m.group("exp")
        return LicenseState.LICENSED, parse_expiry(exp) if exp is not None else None, False
    m = _UNLICENSED.fullmatch(s)
    if m:
        q = m.group("q")
        if q == "Restricted":
            return LicenseState.RESTRICTED, None, False
        return LicenseState.UNLICENSED, None, q == "Unrestricted"
    return LicenseState.UNKNOWN, None, False


def parse_license_status(s: str) -> tuple[LicenseState, dt.datetime | None]:
    """Map nvidia-smi's `License Status` to a state and expiry.

    Whether a past expiry means *expired* depends on `now`: that is `evaluate`'s job, not parsing's.
    """
    state, expiry, _ = _parse_status(s)
    return state, expiry


def is_grace(s: str) -> bool:
    """True for `Unlicensed (Unrestricted)`: no license yet, but still at full speed."""
    return _parse_status(s)[2]


def _gpu(product: str | None, raw_status: str | None, **ids: str | None) -> GpuLicense:
    raw = raw_status or ""
    state, expiry, grace = _parse_status(raw)
    return GpuLicense(
        product=_clean_opt(product, MAX_PRODUCT_CHARS),
        state=state,
        expiry=expiry,
        raw_status=clean_text(raw, MAX_RAW_STATUS_CHARS),
        driver_version=_token_opt(ids.get("driver_version"), 32),
        pci_id=_token_opt(ids.get("pci_id"), 32),
        gpu_uuid=_token_opt(ids.get("gpu_uuid"), 64),
        gpu_name=_clean_opt(ids.get("gpu_name"), MAX_PRODUCT_CHARS),
        grace=grace,
    )


# ---------------------------------------------------------------------------------------------
# nvidia-smi -q -x
# ---------------------------------------------------------------------------------------------

# Real `nvidia-smi -q -x` output starts with `<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_vNN.dtd">`
# (see apache/hadoop GpuDeviceInformationParser.java, which disables external DTD loading for the
# same reason). That exact external-subset-only declaration is removed before parsing; any other
# DTD (internal subset, entities, other names) is refused by defusedxml as xml_forbidden.
_NVIDIA_DOCTYPE = re.compile(
    rb'\A(\s*<\?xml[^<>]*\?>)?(\s*)<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+"nvsmi[A-Za-z0-9_.-]{0,40}\.dtd"\s*>'
)


def parse_smi_xml(xml: bytes, limits: ReportLimits = DEFAULT_LIMITS) -> tuple[GpuLicense, ...]:
    """Licensing of every GPU in `nvidia-smi -q -x` output (defusedxml: no DTD, entities, externals)."""
    if len(xml) > limits.max_body_bytes:
        raise ReportError(TOO_LARGE, "nvidia-smi XML exceeds the size limit")
    xml = _NVIDIA_DOCTYPE.sub(lambda m: (m.group(1) or b"") + m.group(2), xml, count=1)
    try:
        root = DET.fromstring(xml, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException:
        raise ReportError(XML_FORBIDDEN, "XML with a DTD, entity or external reference") from None
    except (ET.ParseError, ValueError, LookupError, UnicodeError, RecursionError):
        raise ReportError(BAD_XML, "nvidia-smi XML is not well-formed") from None
    if root.tag != "nvidia_smi_log":
        raise ReportError(BAD_XML, "XML root is not nvidia_smi_log")
    driver = root.findtext("driver_version")
    gpus = root.findall("gpu")
    if len(gpus) > limits.max_gpus:
        raise ReportError(BAD_FORMAT, "too many GPUs")
    out = []
    for g in gpus:
        lic = g.find("vgpu_software_licensed_product")
        product = lic.findtext("licensed_product_name") if lic is not None else None
        status = lic.findtext("license_status") if lic is not None else None
        out.append(_gpu(product, status, driver_version=driver, pci_id=g.get("id"),
                        gpu_uuid=g.findtext("uuid"), gpu_name=g.findtext("product_name")))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# nvidia-smi -q (text)
# ---------------------------------------------------------------------------------------------

_GPU_HEADER = re.compile(r"GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_LICENSE_SECTION = "vgpu software licensed product"


def parse_smi_text(text: str, limits: ReportLimits = DEFAULT_LIMITS) -> tuple[GpuLicense, ...]:
    """Licensing of every GPU in `nvidia-smi -q` text.

    Key/value lines are split on the first `:` (column padding varies between drivers). The
    license section ends at the next header line or at a line indented no deeper than its header;
    the header itself may be unindented (fixtures/nvidia/smi-q-licensed-unpadded-date.txt).
    """
    lines = text.splitlines()
    if len(lines) > limits.max_text_lines:
        raise ReportError(TOO_LARGE, "nvidia-smi text has too many lines")
    driver: str | None = None
    gpus: list[dict[str, str | None]] = []
    current: dict[str, str | None] | None = None
    section_indent: int | None = None  # set while inside a license section

    for raw in lines:
        stripped = raw.strip()
        if not stripped:
            continue
        indent = len(raw) - len(raw.lstrip())
        header = _GPU_HEADER.fullmatch(stripped)
        if header:
            current = {"pci_id": header.group(1)}
            gpus.append(current)
            section_indent = None
            continue
        key, sep, value = stripped.partition(":")
        if not sep:
            section_indent = None
            if stripped.lower() == _LICENSE_SECTION:
                if current is None or "license_seen" in current:
                    # No GPU header (grep'd output) or a second section: a GPU of its own.
                    current = {"pci_id": None} if current is None else {"pci_id": current.get("pci_id")}
                    gpus.append(current)
                current["license_seen"] = "1"
                section_indent = indent
            continue
        key, value = key.strip().lower(), value.strip()
        if section_indent is not None and indent <= section_indent:
            section_indent = None
        if section_indent is not None and current is not None:
            if key == "product name":
                current["product"] = value
            elif key == "license status":
                current["status"] = value
        elif key == "driver version" and driver is None:
            driver = value
        elif current is not None and key == "gpu uuid":
            current["gpu_uuid"] = value
        elif current is not None and key == "product name":
            current["gpu_name"] = value
        if len(gpus) > limits.max_gpus:
            raise ReportError(BAD_FORMAT, "too many GPUs")
    return tuple(
        _gpu(g.get("product"), g.get("status"), driver_version=driver, pci_id=g.get("pci_id"),
             gpu_uuid=g.get("gpu_uuid"), gpu_name=g.get("gpu_name"))
        for g in gpus
    )


# ---------------------------------------------------------------------------------------------
# nvidia-gridd log lines
# ---------------------------------------------------------------------------------------------

_MONTHS: Final = {m: i for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1)}
# `Apr 02 19:11:13 host nvidia-gridd[837]: msg` (classic syslog / journalctl -o short: no year, local time).
_SYSLOG = re.compile(r"([A-Z][a-z]{2})\s+(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) \S+ (\S+?)(?:\[\d+\])?: (.*)")
# `2026-04-02T19:11:13+00:00 host nvidia-gridd[837]: msg` (journalctl -o short-iso, RFC 5424 syslog).
_ISO = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?) \S+ "
                  r"(\S+?)(?:\[\d+\])?: (.*)")
# `Tue Dec 20 05:55:57 2022:<2>:msg` (Windows guests).
_WINDOWS = re.compile(r"[A-Z][a-z]{2} ([A-Z][a-z]{2})\s+(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4}):<\d+>:(.*)")
# `nvidia-gridd[2986]: msg` (timestamps stripped by the publisher or by the log tool).
_BARE = re.compile(r"(\S+?)(?:\[\d+\])?: (.*)")

_INFO = re.compile(r"\(Info: (?P<info>[^)]*)\)")
_GRIDD_IDENT = "nvidia-gridd"


def _yearless(mon: str, day: str, hh: str, mm: str, ss: str, reference: dt.datetime | None
              ) -> dt.datetime | None:
    """A syslog time without year: the latest such instant not after `reference` (+1 day slack)."""
    month = _MONTHS.get(mon.lower())
    if month is None or reference is None:
        return None
    ref = reference if reference.tzinfo is dt.UTC else reference.astimezone(dt.UTC)
    try:
        latest = ref + _ONE_DAY
    except OverflowError:  # a guest clock on the last day datetime can hold: an answer, not a crash
        latest = dt.datetime.max.replace(tzinfo=dt.UTC)
    for year in (ref.year, ref.year - 1):
        try:
            t = dt.datetime(year, month, int(day), int(hh), int(mm), int(ss), tzinfo=dt.UTC)
        except ValueError:
            continue
        if t <= latest:
            return t
    return None


_ONE_DAY: Final = dt.timedelta(days=1)


# A syslog time without a year as logged (month, day, hh, mm, ss): its year comes from the guest clock.
_YearlessTime = tuple[str, str, str, str, str]


def _split_line(line: str) -> tuple[dt.datetime | None, _YearlessTime | None, str] | None:
    """(timestamp, yearless syslog time, message) of an nvidia-gridd line; None for other daemons'
    lines. The yearless time is left unresolved so the result depends on the line alone."""
    if _GRIDD_IDENT not in line:  # only the Windows format names no daemon: skip three regexes
        w = _windows_line(line)
        return None if w is None else (w[0], None, w[1])
    m = _ISO.fullmatch(line)
    if m:
        return (parse_time(m.group(1), assume_utc=True), None, m.group(3)) if m.group(2) == _GRIDD_IDENT else None
    m = _SYSLOG.fullmatch(line)
    if m:
        if m.group(6) != _GRIDD_IDENT:
            return None
        return None, (m.group(1), m.group(2), m.group(3), m.group(4), m.group(5)), m.group(7)
    w = _windows_line(line)
    if w is not None:
        return w[0], None, w[1]
    m = _BARE.fullmatch(line)
    if m:
        return (None, None, m.group(2)) if m.group(1) == _GRIDD_IDENT else None
    return None


def _windows_line(line: str) -> tuple[dt.datetime | None, str] | None:
    m = _WINDOWS.fullmatch(line)
    if m is None:
        return None
    month = _MONTHS.get(m.group(1).lower())
    try:
        at = dt.datetime(int(m.group(6)), month or 0, int(m.group(2)), int(m.group(3)),
                         int(m.group(4)), int(m.group(5)), tzinfo=dt.UTC)
    except ValueError:
        at = None
    return at, m.group(7)


def _info_fields(msg: str) -> tuple[str | None, str | None, dt.datetime | None]:
    """(server, product, expiry) from `(Info: server, product; Expiry: ...)`."""
    m = _INFO.search(msg)
    if not m:
        return None, None, None
    info = m.group("info")
    main, _, expiry_part = info.partition(";")
    expiry = None
    if expiry_part.strip().startswith("Expiry:"):
        expiry = parse_expiry(expiry_part.strip()[len("Expiry:"):])
    server, _, product = main.partition(",")
    return _token_opt(server, 128), _clean_opt(product, MAX_PRODUCT_CHARS), expiry


def _classify(msg: str) -> tuple[GriddEventKind, str | None, str | None, dt.datetime | None] | None:
    if msg.startswith("License acquired successfully"):
        return (GriddEventKind.ACQUIRED, *_info_fields(msg))
    if msg.startswith("License renewed successfully"):
        return (GriddEventKind.RENEWED, *_info_fields(msg))
    if msg.startswith(("License returned successfully", "License released successfully")):
        return (GriddEventKind.RETURNED, *_info_fields(msg))
    if msg.startswith("Failed to acquire license"):
        server = None
        m = re.match(r"Failed to acquire license from (\S+)", msg)
        if m:
            server = _token_opt(m.group(1), 128)
        product = None
        info = _INFO.search(msg)
        if info:
            product = _clean_opt(info.group("info").partition(" - Error:")[0], MAX_PRODUCT_CHARS)
        return GriddEventKind.FAILED, server, product, None
    if msg.startswith("Failed to register client"):
        return GriddEventKind.FAILED, None, None, None
    if msg.startswith(("Valid GRID license not found", "Valid vGPU license not found")):
        return GriddEventKind.NOT_FOUND, None, None, None
    if msg.startswith("Unable to fetch the client configuration token"):
        return GriddEventKind.TOKEN_MISSING, None, None, None
    if msg.startswith(("Failed to decode signature from token",
                       "Failed to read configurations from client configuration token")):
        return GriddEventKind.TOKEN_CORRUPT, None, None, None
    if msg.startswith("Failed to open file") and "gridd.conf" in msg:
        return GriddEventKind.CONFIG_MISSING, None, None, None
    if re.fullmatch(r"Shutdown \(\d+\)", msg.strip()):
        return GriddEventKind.SHUTDOWN, None, None, None
    return None


# Every message `_classify` recognises starts with one of these ("Shutdown (" for `Shutdown (n)`).
# The message is a substring of its line, so a line containing none of them holds no event and is
# dropped before its timestamp is parsed: most lines of a journal tail are such lines.
_EVENT_HINT: Final = re.compile(
    r"License (?:acquired|renewed|returned|released) successfully"
    r"|Failed to (?:acquire license|register client|decode signature from token"
    r"|read configurations from client configuration token|open file)"
    r"|Valid (?:GRID|vGPU) license not found|Unable to fetch the client configuration token|Shutdown \("
)


@dataclass(frozen=True, slots=True)
class ScannedLog:
    """Recognised gridd events before the guest clock is known: events whose syslog timestamp has no
    year carry `at=None` here and are listed in `yearless` (index, time as logged). A pure function
    of the lines."""

    events: tuple[GriddEvent, ...]
    yearless: tuple[tuple[int, _YearlessTime], ...] = ()

    def resolve(self, reference: dt.datetime | None) -> tuple[GriddEvent, ...]:
        """The events with yearless times placed in the year `reference` (the guest clock) implies."""
        if not self.yearless:
            return self.events
        if reference is not None and reference.tzinfo is not dt.UTC:
            reference = reference.astimezone(dt.UTC)  # once, not per line
        out = list(self.events)
        for i, (mon, day, hh, mm, ss) in self.yearless:
            e = out[i]
            out[i] = GriddEvent(kind=e.kind, at=_yearless(mon, day, hh, mm, ss, reference), message=e.message,
                                server=e.server, product=e.product, expiry=e.expiry)
        return tuple(out)


def scan_gridd_log(lines: Iterable[str]) -> ScannedLog:
    """Recognised nvidia-gridd events, in input order, other lines ignored; yearless times unresolved."""
    out: list[GriddEvent] = []
    yearless: list[tuple[int, _YearlessTime]] = []
    for raw in lines:
        line = raw.rstrip("\r\n").strip()
        if _EVENT_HINT.search(line) is None:
            continue
        split = _split_line(line)
        if split is None:
            continue
        at, when, msg = split
        msg = msg.strip()
        c = _classify(msg)
        if c is None:
            continue
        kind, server, product, expiry = c
        if when is not None:
            yearless.append((len(out), when))
        out.append(GriddEvent(kind=kind, at=at, message=clean_text(msg, MAX_MESSAGE_CHARS),
                              server=server, product=product, expiry=expiry))
    return ScannedLog(tuple(out), tuple(yearless))


def parse_gridd_log(lines: Iterable[str], reference: dt.datetime | None = None) -> tuple[GriddEvent, ...]:
    """Recognised nvidia-gridd events, in input order; other lines are ignored.

    `reference` (the guest clock) supplies the year for syslog timestamps that lack one; such
    local times are taken as UTC, so they are approximate on guests not running in UTC.
    """
    return scan_gridd_log(lines).resolve(reference)


# ---------------------------------------------------------------------------------------------
# The report envelope
# ---------------------------------------------------------------------------------------------

SECTION_SMI_XML: Final = "nvidia-smi-xml"
SECTION_SMI_TEXT: Final = "nvidia-smi-text"
SECTION_GRIDD_LOG: Final = "gridd-log"
SECTION_END: Final = "end"
SECTIONS: Final = frozenset({SECTION_SMI_XML, SECTION_SMI_TEXT, SECTION_GRIDD_LOG})
SECTION_MARKER: Final = "--- "

HEADER_KEYS: Final = frozenset({MAGIC_KEY, "uuid", "hostname", "clock", "token-sha256", "probe-version",
                                SMI_HEADER})
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HOSTNAME = re.compile(r"[A-Za-z0-9._-]{0,253}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_PROBE_VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,32}")
_HEADER_KEY = re.compile(r"[a-z0-9-]{1,32}")
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
    r"(?=--- )"
)
_PROBE_HEADER_LINES: Final = 7
_PROBE_HEADER_LONGEST: Final = len("hostname: ") + 253


def _headers(text: str, limits: ReportLimits) -> tuple[dict[str, str], int]:
    """Header fields up to the first section marker, and where that marker starts."""
    if limits.max_header_lines >= _PROBE_HEADER_LINES and limits.max_field_chars + 34 >= _PROBE_HEADER_LONGEST:
        m = _PROBE_HEADER.match(text)
        if m is not None:
            version, uuid, hostname, clock, sha, probe_version, smi = m.groups()
            fast = {MAGIC_KEY: version, "uuid": uuid, "hostname": hostname, "clock": clock, "token-sha256": sha,
                    "probe-version": probe_version}
            if smi is not None:
                fast[SMI_HEADER] = smi
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
        events=log.resolve(clock),
        smi_status=smi_status,
    )


def render_report(*, uuid: str, hostname: str, clock: int, token_sha256: str | None,
                  probe_version: str, sections: Sequence[tuple[str, str]] = (),
                  smi_status: str | None = None, format_version: int = FORMAT_VERSION) -> bytes:
    """The body the probe would send: the format's reference producer, for tests and tooling.

    `smi_status` defaults to what the sections imply (ok with an nvidia-smi section, else failed);
    `format_version=1` renders what an old probe sends (no nvidia-smi header)."""
    out = [f"{MAGIC_KEY}: {format_version}", f"uuid: {uuid}", f"hostname: {hostname}", f"clock: {clock}",
           f"token-sha256: {token_sha256 or 'none'}", f"probe-version: {probe_version}"]
    if format_version >= 2:
        if smi_status is None:
            has_smi = any(name in (SECTION_SMI_XML, SECTION_SMI_TEXT) for name, _ in sections)
            smi_status = SMI_OK if has_smi else SMI_FAILED
        out.append(f"{SMI_HEADER}: {smi_status}")
    for name, content in sections:
        out.append(SECTION_MARKER + name)
        out.extend(content.splitlines())
    out.append(SECTION_MARKER + SECTION_END)
    return ("\n".join(out) + "\n").encode("utf-8")


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


_REASON_OF_EVENT: Final = {
    GriddEventKind.TOKEN_MISSING: REASON_TOKEN_MISSING,
    GriddEventKind.TOKEN_CORRUPT: REASON_TOKEN_CORRUPT,
    GriddEventKind.CONFIG_MISSING: REASON_CONFIG_MISSING,
    GriddEventKind.FAILED: REASON_ACQUIRE_FAILED,
    GriddEventKind.NOT_FOUND: REASON_NOT_FOUND,
}
_LICENSE_HELD: Final = frozenset({GriddEventKind.ACQUIRED, GriddEventKind.RENEWED})


def unlicensed_reason(events: Sequence[GriddEvent]) -> str:
    """gridd's cause for holding no license: the root cause among the failures logged since the
    last acquire/renew (a missing or corrupt token or gridd.conf outranks the "not found" warning
    and failed acquisitions it leads to); `unknown` when the log names none."""
    since = list(events)
    for i in range(len(since) - 1, -1, -1):
        if since[i].kind in _LICENSE_HELD:
            since = since[i + 1:]
            break
    found = {_REASON_OF_EVENT[e.kind] for e in since if e.kind in _REASON_OF_EVENT}
    for reason in (REASON_TOKEN_CORRUPT, REASON_TOKEN_MISSING, REASON_CONFIG_MISSING, REASON_ACQUIRE_FAILED,
                   REASON_NOT_FOUND):
        if reason in found:
            return reason
    return REASON_UNKNOWN


def _guest_gpu_state(g: GpuLicense, now: dt.datetime) -> LicenseState:
    if g.state is LicenseState.LICENSED and g.expiry is not None and g.expiry < now:
        return LicenseState.EXPIRED
    if g.state is LicenseState.UNLICENSED and g.grace:
        return LicenseState.GRACE
    return g.state


def evaluate(report: GuestReport, *, current_token_sha256: str | None, now: dt.datetime) -> GuestState:
    """Summarise a report at `now`: worst GPU state, earliest expiry, token freshness, clock skew,
    and gridd's reason when the guest holds no license."""
    # One pass over the GPUs (this runs once per report): the worst state (the first GPU among equally
    # bad ones), the earliest expiry, the first product and driver named, whether any is in grace.
    worst_state = LicenseState.UNKNOWN
    worst_gpu: GpuLicense | None = None
    worst = -1
    expiry: dt.datetime | None = None
    first_product: str | None = None
    driver: str | None = None
    grace = False
    for g in report.gpus:
        state = _guest_gpu_state(g, now)
        severity = SEVERITY[state]
        if severity > worst:
            worst, worst_state, worst_gpu = severity, state, g
        if g.expiry is not None and (expiry is None or g.expiry < expiry):
            expiry = g.expiry
        if first_product is None and g.product:
            first_product = g.product
        if driver is None and g.driver_version:
            driver = g.driver_version
        if g.grace:
            grace = True
    if report.smi_status == SMI_MISSING:
        worst_state, worst_gpu = LicenseState.DRIVER_MISSING, None
    reason = None
    if worst_state is LicenseState.EXPIRED:
        reason = REASON_LEASE_EXPIRED
    elif worst_state in (LicenseState.UNLICENSED, LicenseState.RESTRICTED, LicenseState.GRACE):
        reason = unlicensed_reason(report.events)
    product = worst_gpu.product if worst_gpu is not None else None
    if product is None:
        product = first_product
    last = report.events[-1] if report.events else None
    return GuestState(
        uuid=report.uuid,
        hostname=report.hostname,
        state=worst_state,
        product=product,
        expiry=expiry,
        driver_version=driver,
        gpu_count=len(report.gpus),
        grace=grace,
        token_sha256=report.token_sha256,
        token_current=(current_token_sha256 is not None
                       and report.token_sha256 == current_token_sha256.lower()),
        clock_skew_seconds=(report.clock - now).total_seconds(),
        reported_at=now,
        last_event=last.kind if last else None,
        last_event_at=last.at if last else None,
        reason=reason,
    )
