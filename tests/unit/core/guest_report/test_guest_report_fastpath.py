"""guest_report fast paths pinned to the plain ones: the probe-header match, the marker scan, the
event pre-filter, log scans resolved per guest clock and the one-pass evaluate."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from licensectl.core import guest_report as gr
from licensectl.core.guest_report import (
    BAD_FORMAT,
    DEFAULT_LIMITS,
    SECTION_GRIDD_LOG,
    SECTION_SMI_TEXT,
    SECTION_SMI_XML,
    SMI_FAILED,
    SMI_MISSING,
    SMI_OK,
    ReportError,
    ReportLimits,
    envelope,
    evaluate,
    evaluation,
    gridd_log,
    parse_report,
    render_report,
    scan_gridd_log,
    unlicensed_reason,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "nvidia"
SMI_FIXTURES = sorted(p.name for p in FIXTURES.glob("smi-*"))
LOG_FIXTURES = sorted(p.name for p in FIXTURES.glob("gridd-log-*"))
UUID = "5d307ca9-b3ef-428d-8be6-5b4c7e0ac3c2"
SHA = "ab" * 32
T0 = dt.datetime(2026, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
# Header lines up to 262 characters: the line loop accepts every probe header, the one-step match
# (longest line 263) is never tried. Parsing with these limits is parsing "the plain way".
LINE_BY_LINE = ReportLimits(max_field_chars=228)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def outcome(f: object, *args: object) -> object:
    """What a call returns, or the (reason, message) it is rejected with."""
    try:
        return f(*args)  # type: ignore[operator]
    except ReportError as e:
        return ("rejected", e.reason, e.message)


# ---------------------------------------------------------------------------------------------
# Whole reports: every fixture pair, probe-header match and line loop
# ---------------------------------------------------------------------------------------------


def _body(smi: str | None, log: str | None, *, clock: dt.datetime, version: int = 2, hostname: str = "vm-1") -> bytes:
    sections = []
    if smi is not None:
        sections.append((SECTION_SMI_XML if smi.endswith(".xml") else SECTION_SMI_TEXT, fixture(smi)))
    if log is not None:
        sections.append((SECTION_GRIDD_LOG, fixture(log)))
    return render_report(uuid=UUID, hostname=hostname, clock=int(clock.timestamp()), token_sha256=SHA,
                         probe_version="1.1", sections=sections, format_version=version)


@pytest.mark.parametrize("smi", [*SMI_FIXTURES, None])
@pytest.mark.parametrize("log", [*LOG_FIXTURES, None])
def test_every_fixture_pair_parses_alike_every_way(smi: str | None, log: str | None) -> None:
    for version in (1, 2):
        # Clocks a year apart place yearless syslog times in different years: a reused scan must follow.
        for clock in (T0, T0 + dt.timedelta(seconds=61), T0 + dt.timedelta(days=300), T0 - dt.timedelta(days=200)):
            body = _body(smi, log, clock=clock, version=version)
            plain = parse_report(body, LINE_BY_LINE)
            assert parse_report(body) == plain
            assert evaluate(parse_report(body), current_token_sha256=SHA, now=clock) == evaluate(
                plain, current_token_sha256=SHA, now=clock)


# ---------------------------------------------------------------------------------------------
# The probe header in one step
# ---------------------------------------------------------------------------------------------

PROBE_LINES = [
    "licensectl-report: 2", f"uuid: {UUID}", "hostname: vm-1", "clock: 1777636800", f"token-sha256: {SHA}",
    "probe-version: 1.1", "nvidia-smi: ok",
]
ODD_LINES = [
    *PROBE_LINES, "licensectl-report: 1", "licensectl-report: 3", f"uuid: {UUID.upper()}", f"uuid:  {UUID}",
    "hostname: ", "hostname: " + "h" * 253, "hostname: " + "h" * 254, "hostname: a b", "clock: 0", "clock: ",
    "clock: 1234567890123", "token-sha256: none", "token-sha256: NONE", "probe-version: ", "nvidia-smi: missing",
    "nvidia-smi: failed", "nvidia-smi: maybe", "unknown: x", "hostname:vm", "--- end", "--- gridd-log", "",
    "licensectl-report: 2\r", "hostname: vm-1\r", "os: windows", "os: linux", "os: Windows", "utc-offset: +01:00",
    "utc-offset: -05:30", "utc-offset: +15:00", "utc-offset: 01:00", "utc-offset: +1:00",
]
# What the Windows agent sends: the probe header and its two optional fields.
WINDOWS_LINES = [*PROBE_LINES, "os: windows", "utc-offset: -05:30"]
LINE_VARIANTS = st.sampled_from(ODD_LINES)


# The limits at which the one-step match starts being tried (a 263-character line allowed), around it.
LIMITS_AROUND = [DEFAULT_LIMITS, LINE_BY_LINE, ReportLimits(max_field_chars=229), ReportLimits(max_header_lines=6),
                 ReportLimits(max_header_lines=7), ReportLimits(max_header_lines=8), ReportLimits(max_header_lines=9)]
HEADER_LIMITS = st.sampled_from(LIMITS_AROUND)


@given(st.lists(LINE_VARIANTS, max_size=10), HEADER_LIMITS)
def test_probe_header_match_agrees_with_the_line_loop(lines: list[str], limits: ReportLimits) -> None:
    text = "\n".join([*lines, "--- end", ""])
    assert outcome(envelope._headers, text, limits) == outcome(envelope._header_lines, text, limits)


@pytest.mark.parametrize("limits", LIMITS_AROUND)
def test_probe_header_match_agrees_with_the_line_loop_one_line_off(limits: ReportLimits) -> None:
    """Every probe header with one line replaced, inserted or dropped: all of them, not a sample."""
    texts = []
    for base in (PROBE_LINES, WINDOWS_LINES):
        for at in range(len(base) + 1):
            for line in ODD_LINES:
                for how in ("replace", "insert", "drop"):
                    lines = list(base)
                    if how == "insert":
                        lines.insert(at, line)
                    elif at < len(lines):
                        lines[at:at + 1] = [line] if how == "replace" else []
                    texts.append("\n".join([*lines, "--- end", ""]))
    for text in texts:
        assert outcome(envelope._headers, text, limits) == outcome(envelope._header_lines, text, limits), text


@pytest.mark.parametrize("lines", [PROBE_LINES, WINDOWS_LINES], ids=["linux", "windows"])
def test_probe_header_match_is_taken_for_probe_output(lines: list[str]) -> None:
    text = "\n".join([*lines, "--- end", ""])
    assert envelope._PROBE_HEADER.match(text) is not None
    assert envelope._headers(text, DEFAULT_LIMITS) == envelope._header_lines(text, DEFAULT_LIMITS)


# ---------------------------------------------------------------------------------------------
# Section markers: str.find scan against the regex scan it replaced
# ---------------------------------------------------------------------------------------------

_MARKER_LINE = re.compile(r"^--- ([^\n]*)", re.MULTILINE)


def regex_sections(text: str, start: int) -> dict[str, str]:
    """The previous marker scan, kept as the reference."""
    sections: dict[str, str] = {}
    current: str | None = None
    body_at = start
    for m in _MARKER_LINE.finditer(text, start):
        if current is not None:
            sections[current] = text[body_at:m.start()][:-1]
        name = m.group(1).rstrip("\r")
        if name == "end":
            if text[m.end():].strip():
                raise ReportError(BAD_FORMAT, "content after the end marker")
            return sections
        if name not in gr.SECTIONS:
            raise ReportError(BAD_FORMAT, "unknown section")
        if name in sections or name == current:
            raise ReportError(BAD_FORMAT, "duplicate section")
        current = name
        body_at = m.end() + 1
    raise ReportError(BAD_FORMAT, "missing end marker (truncated report?)")


SECTION_PIECES = st.sampled_from(["--- ", "---", "-", "end", "gridd-log", "nvidia-smi-xml", "nvidia-smi-text",
                                  "\n", "\r", "\r\n", " ", "x", "x\n", "--- end\n", "\n--- gridd-log\n",
                                  "--- nvidia-smi-text\n"])


@settings(max_examples=500)
@given(st.lists(SECTION_PIECES, max_size=20), st.integers(min_value=0, max_value=40))
def test_section_scan_agrees_with_the_regex_scan(pieces: list[str], start: int) -> None:
    text = "".join(pieces)
    assert outcome(envelope._sections, text, start) == outcome(regex_sections, text, start)


@pytest.mark.parametrize("smi", [*SMI_FIXTURES, None])
@pytest.mark.parametrize("log", [*LOG_FIXTURES, None])
def test_section_scan_agrees_with_the_regex_scan_on_reports(smi: str | None, log: str | None) -> None:
    text = _body(smi, log, clock=T0).decode()
    _, start = envelope._header_lines(text, DEFAULT_LIMITS)
    sections = envelope._sections(text, start)
    assert sections == regex_sections(text, start)
    assert len(sections) == (smi is not None) + (log is not None)
    for cut in (len(text) - 1, len(text) - 9):  # truncated: no end marker, or cut inside it
        assert outcome(envelope._sections, text[:cut], start) == outcome(regex_sections, text[:cut], start)


# ---------------------------------------------------------------------------------------------
# gridd log: the pre-filter drops no event; a reused scan resolves as a fresh one
# ---------------------------------------------------------------------------------------------

MESSAGE_PIECES = st.sampled_from([
    "License acquired successfully", "License renewed successfully", "License returned successfully",
    "License released successfully", "Failed to acquire license from s", "Failed to register client",
    "Valid GRID license not found", "Valid vGPU license not found", "Unable to fetch the client configuration token",
    "Failed to decode signature from token", "Failed to read configurations from client configuration token",
    "Failed to open file /etc/nvidia/gridd.conf", "Shutdown (", "Shutdown", "(", ")", "12", " ", ".", "License ",
    "Failed to ", "Valid ", "gridd.conf", "(Info: a, NVIDIA Virtual PC; Expiry: 2026-1-2 3:4:5 GMT)", "x",
])


@settings(max_examples=500)
@given(st.lists(MESSAGE_PIECES, max_size=6))
def test_event_prefilter_keeps_every_recognised_message(pieces: list[str]) -> None:
    msg = "".join(pieces)
    assert gridd_log._classify(msg.strip()) is None or gridd_log._EVENT_HINT.search(msg) is not None


SYSLOG_LINE = st.builds(
    lambda mon, day, h, m, s, msg: f"{mon} {day:02d} {h:02d}:{m:02d}:{s:02d} vm nvidia-gridd[7]: {msg}",
    st.sampled_from(["Jan", "Feb", "Mar", "Jun", "Dec", "dec", "Foo"]), st.integers(0, 32), st.integers(0, 24),
    st.integers(0, 59), st.integers(0, 60),
    st.sampled_from(["License renewed successfully. (Info: s, NVIDIA Virtual PC)", "Shutdown (3)", "NLS initialized"]))
OTHER_LINE = st.sampled_from([
    "2026-04-02T19:11:13+00:00 vm nvidia-gridd[837]: License acquired successfully. (Info: s, NVIDIA Virtual PC)",
    "Tue Dec 20 05:55:58 2022:<2>:License returned successfully. (Info: 192.168.178.33)",
    "nvidia-gridd[2986]: Valid GRID license not found. GPU features and performance will be restricted.",
    "Apr 02 19:11:13 vm systemd[1]: Started nvidia-gridd.service - NVIDIA Grid Daemon.",
])
REFERENCES = st.one_of(
    st.none(),
    st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30), timezones=st.just(dt.UTC)),
    st.datetimes(min_value=dt.datetime(2024, 12, 25), max_value=dt.datetime(2026, 1, 5), timezones=st.just(dt.UTC)),
    st.datetimes(min_value=dt.datetime(2026, 1, 1), max_value=dt.datetime(2026, 1, 3),
                 timezones=st.just(dt.timezone(dt.timedelta(hours=-5)))),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(SYSLOG_LINE, OTHER_LINE), max_size=6), st.lists(REFERENCES, min_size=1, max_size=8))
def test_a_reused_scan_resolves_like_a_fresh_one(lines: list[str], references: list[dt.datetime | None]) -> None:
    reused = scan_gridd_log(lines)
    for ref in references:
        assert reused.resolve(ref) == scan_gridd_log(lines).resolve(ref) == gr.parse_gridd_log(lines, ref)


def test_a_yearless_time_is_placed_by_each_reference() -> None:
    scanned = scan_gridd_log(["Dec 31 23:00:00 vm nvidia-gridd[7]: Shutdown (1)"])
    first = scanned.resolve(dt.datetime(2026, 6, 1, tzinfo=dt.UTC))
    assert first[0].at == dt.datetime(2025, 12, 31, 23, tzinfo=dt.UTC)
    assert scanned.resolve(dt.datetime(2026, 6, 2, tzinfo=dt.UTC)) == first
    # From a day before that time, the same line means this year's Dec 31.
    late = scanned.resolve(dt.datetime(2026, 12, 30, 23, tzinfo=dt.UTC))
    assert late[0].at == dt.datetime(2026, 12, 31, 23, tzinfo=dt.UTC)
    assert scanned.resolve(dt.datetime(2026, 12, 30, 22, 59, 59, tzinfo=dt.UTC))[0].at == first[0].at


# ---------------------------------------------------------------------------------------------
# evaluate: the one-pass summary against the previous list-and-max one
# ---------------------------------------------------------------------------------------------


def reference_evaluate(report: gr.GuestReport, *, current_token_sha256: str | None, now: dt.datetime) -> gr.GuestState:
    """The previous evaluate, kept as the reference."""
    states = [(evaluation._guest_gpu_state(g, now), g) for g in report.gpus]
    worst_gpu: gr.GpuLicense | None
    if report.smi_status == SMI_MISSING:
        worst_state, worst_gpu = gr.LicenseState.DRIVER_MISSING, None
    elif states:
        worst_state, worst_gpu = max(states, key=lambda sg: sg[0].severity)
    else:
        worst_state, worst_gpu = gr.LicenseState.UNKNOWN, None
    reason = None
    if worst_state is gr.LicenseState.EXPIRED:
        reason = gr.REASON_LEASE_EXPIRED
    elif worst_state.no_license and worst_state is not gr.LicenseState.EXPIRED:
        reason = unlicensed_reason(report.events)
    expiries = [g.expiry for g in report.gpus if g.expiry is not None]
    product = worst_gpu.product if worst_gpu is not None else None
    if product is None:
        product = next((g.product for g in report.gpus if g.product), None)
    driver = next((g.driver_version for g in report.gpus if g.driver_version), None)
    last = report.events[-1] if report.events else None
    return gr.GuestState(
        uuid=report.uuid, hostname=report.hostname, state=worst_state, product=product,
        expiry=min(expiries) if expiries else None, driver_version=driver, gpu_count=len(report.gpus),
        grace=any(g.grace for g in report.gpus), token_sha256=report.token_sha256,
        token_current=(current_token_sha256 is not None and report.token_sha256 == current_token_sha256.lower()),
        clock_skew_seconds=(report.clock - now).total_seconds(), reported_at=now,
        last_event=last.kind if last else None, last_event_at=last.at if last else None, reason=reason)


EXPIRIES = st.one_of(st.none(), st.sampled_from([T0 - dt.timedelta(days=1), T0, T0 + dt.timedelta(days=1)]))
GPUS = st.builds(
    gr.GpuLicense, product=st.sampled_from([None, "NVIDIA Virtual PC", "NVIDIA RTX Virtual Workstation"]),
    state=st.sampled_from([gr.LicenseState.LICENSED, gr.LicenseState.UNLICENSED, gr.LicenseState.RESTRICTED,
                           gr.LicenseState.UNKNOWN]),
    expiry=EXPIRIES, raw_status=st.just("x"), driver_version=st.sampled_from([None, "580.105.08", "570.1"]),
    grace=st.booleans())
EVENTS = st.builds(gr.GriddEvent, kind=st.sampled_from(list(gr.GriddEventKind)), at=EXPIRIES, message=st.just("m"))


@settings(max_examples=300)
@given(st.lists(GPUS, max_size=4), st.lists(EVENTS, max_size=4),
       st.sampled_from([None, SMI_OK, SMI_MISSING, SMI_FAILED]), st.sampled_from([None, SHA, SHA.upper(), "cd" * 32]))
def test_evaluate_agrees_with_the_reference(gpus: list[gr.GpuLicense], events: list[gr.GriddEvent], smi: str | None,
                                            current: str | None) -> None:
    report = gr.GuestReport(format_version=2, uuid=UUID, hostname="vm-1", clock=T0, token_sha256=SHA,
                         probe_version="1.1", smi_format=None, gpus=tuple(gpus), events=tuple(events), smi_status=smi)
    assert evaluate(report, current_token_sha256=current, now=T0) == reference_evaluate(
        report, current_token_sha256=current, now=T0)




def test_a_guest_clock_at_the_largest_allowed_value_parses_instead_of_crashing() -> None:
    """A yearless log line with the clock at MAX_CLOCK (9999-12-31) used to overflow into a 500; the
    endpoint's clock-window check rejects such a report afterwards, with a clear reason."""
    body = render_report(uuid=UUID, hostname="vm-1", clock=gr.MAX_CLOCK, token_sha256=SHA, probe_version="1.1",
                         sections=[(SECTION_GRIDD_LOG, "Dec 31 23:59:59 vm nvidia-gridd[1]: License renewed "
                                                       "successfully. (Info: s, NVIDIA Virtual PC)")])
    report = parse_report(body)
    assert report.clock.year == 9999
    assert [e.at for e in report.events] == [dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)]
