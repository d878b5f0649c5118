"""nvidia-gridd log lines (syslog, ISO, Windows and bare formats) to recognised license events; every
other line is ignored. Separate because it is the largest parser and the only one whose result depends
on the guest clock (the year of a syslog timestamp): `ScannedLog` keeps that dependency out of the scan,
so a scan is a pure function of the lines.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from licensectl.core.guest_report.bounded_text import _clean_opt, _token_opt, clean_text
from licensectl.core.guest_report.license_status import parse_expiry
from licensectl.core.guest_report.limits import MAX_MESSAGE_CHARS, MAX_PRODUCT_CHARS
from licensectl.core.guest_report.state import GriddEvent, GriddEventKind
from licensectl.core.timecodec import parse_time

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


def _split_line(line: str) -> tuple[dt.datetime | None, _YearlessTime | None, str, bool] | None:
    """(timestamp, yearless syslog time, message, zoneless) of an nvidia-gridd line; None for other
    daemons' lines. The yearless time is left unresolved so the result depends on the line alone;
    `zoneless` marks a Windows-format time (local, no zone), taken as UTC until resolved."""
    if _GRIDD_IDENT not in line:  # only the Windows format names no daemon: skip three regexes
        w = _windows_line(line)
        return None if w is None else (w[0], None, w[1], True)
    m = _ISO.fullmatch(line)
    if m:
        if m.group(2) != _GRIDD_IDENT:
            return None
        return parse_time(m.group(1), assume_utc=True), None, m.group(3), False
    m = _SYSLOG.fullmatch(line)
    if m:
        if m.group(6) != _GRIDD_IDENT:
            return None
        return None, (m.group(1), m.group(2), m.group(3), m.group(4), m.group(5)), m.group(7), False
    w = _windows_line(line)
    if w is not None:
        return w[0], None, w[1], True
    m = _BARE.fullmatch(line)
    if m:
        return (None, None, m.group(2), False) if m.group(1) == _GRIDD_IDENT else None
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


def _shifted(local: dt.datetime, utc_offset: dt.timedelta) -> dt.datetime | None:
    """A local time read as UTC, moved to real UTC; None past the range datetime holds."""
    try:
        return local - utc_offset
    except OverflowError:
        return None


@dataclass(frozen=True, slots=True)
class ScannedLog:
    """Recognised gridd events before the guest clock is known: events whose syslog timestamp has no
    year carry `at=None` here and are listed in `yearless` (index, time as logged). A pure function
    of the lines."""

    events: tuple[GriddEvent, ...]
    yearless: tuple[tuple[int, _YearlessTime], ...] = ()
    zoneless: tuple[int, ...] = ()  # events whose time was logged without a zone (Windows format)

    def resolve(self, reference: dt.datetime | None, utc_offset: dt.timedelta | None = None
                ) -> tuple[GriddEvent, ...]:
        """The events with yearless times placed in the year `reference` (the guest clock) implies, and
        times logged without a zone moved from the guest's local time to UTC by `utc_offset`."""
        shift = utc_offset and self.zoneless
        if not self.yearless and not shift:
            return self.events
        if reference is not None and reference.tzinfo is not dt.UTC:
            reference = reference.astimezone(dt.UTC)  # once, not per line
        out = list(self.events)
        for i, (mon, day, hh, mm, ss) in self.yearless:
            e = out[i]
            out[i] = GriddEvent(kind=e.kind, at=_yearless(mon, day, hh, mm, ss, reference), message=e.message,
                                server=e.server, product=e.product, expiry=e.expiry)
        if shift and utc_offset is not None:
            for i in self.zoneless:
                e = out[i]
                if e.at is not None:
                    out[i] = GriddEvent(kind=e.kind, at=_shifted(e.at, utc_offset), message=e.message,
                                        server=e.server, product=e.product, expiry=e.expiry)
        return tuple(out)


def scan_gridd_log(lines: Iterable[str]) -> ScannedLog:
    """Recognised nvidia-gridd events, in input order, other lines ignored; yearless times unresolved."""
    out: list[GriddEvent] = []
    yearless: list[tuple[int, _YearlessTime]] = []
    zoneless: list[int] = []
    for raw in lines:
        line = raw.rstrip("\r\n").strip()
        if _EVENT_HINT.search(line) is None:
            continue
        split = _split_line(line)
        if split is None:
            continue
        at, when, msg, no_zone = split
        msg = msg.strip()
        c = _classify(msg)
        if c is None:
            continue
        kind, server, product, expiry = c
        if when is not None:
            yearless.append((len(out), when))
        if no_zone:
            zoneless.append(len(out))
        out.append(GriddEvent(kind=kind, at=at, message=clean_text(msg, MAX_MESSAGE_CHARS),
                              server=server, product=product, expiry=expiry))
    return ScannedLog(tuple(out), tuple(yearless), tuple(zoneless))


def parse_gridd_log(lines: Iterable[str], reference: dt.datetime | None = None) -> tuple[GriddEvent, ...]:
    """Recognised nvidia-gridd events, in input order; other lines are ignored.

    `reference` (the guest clock) supplies the year for syslog timestamps that lack one; such
    local times are taken as UTC, so they are approximate on guests not running in UTC.
    """
    return scan_gridd_log(lines).resolve(reference)
