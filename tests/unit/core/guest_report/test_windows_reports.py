"""Reports from the Windows agent: the optional `os` and `utc-offset` headers, and Windows-format
licensing log times (local, no zone) placed on the UTC axis by the offset. Every other rule is the
Linux probe's, so the same report with the same content yields the same guest state."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from licensectl.core.guest_report import (
    BAD_FIELD,
    GriddEventKind,
    ReportError,
    evaluate,
    parse_report,
    render_report,
)

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "nvidia"
WINDOWS_LOG = (FIXTURES / "gridd-log-renew-return-windows-format.txt").read_text()
XML = (FIXTURES / "smi-qx-licensed-l40s-2q-trimmed.xml").read_text()
UUID = "5d307ca9-b3ef-428d-8be6-5b4c7e0ac3c2"
SHA = "ab" * 32
CLOCK = int(dt.datetime(2022, 12, 20, 6, 0, tzinfo=dt.UTC).timestamp())


def body(**kw: object) -> bytes:
    args: dict[str, object] = {"uuid": UUID, "hostname": "win-1", "clock": CLOCK, "token_sha256": SHA,
                               "probe_version": "1.0.0",
                               "sections": [("nvidia-smi-xml", XML), ("gridd-log", WINDOWS_LOG)]}
    args.update(kw)
    return render_report(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("offset", "delta"), [("+01:00", dt.timedelta(hours=1)),
                                               ("-05:30", -dt.timedelta(hours=5, minutes=30)),
                                               ("+00:00", dt.timedelta(0))])
def test_windows_log_times_move_to_utc_by_the_offset(offset: str, delta: dt.timedelta) -> None:
    plain = parse_report(body())
    windows = parse_report(body(guest_os="windows", utc_offset=offset))
    assert windows.guest_os == "windows"
    assert windows.utc_offset == delta
    assert [e.kind for e in windows.events] == [e.kind for e in plain.events]
    assert [e.kind for e in windows.events][-1] is GriddEventKind.RENEWED
    for w, p in zip(windows.events, plain.events, strict=True):
        assert p.at is not None
        assert w.at == p.at - delta  # local 05:56:54 at +01:00 is 04:56:54 UTC
        assert w.expiry == p.expiry  # expiry times are GMT already: never shifted


def test_the_offset_leaves_zoned_log_times_alone() -> None:
    iso = "2022-12-20T05:56:54+00:00 vm-1 nvidia-gridd[837]: License renewed successfully. (Info: x, P; " \
          "Expiry: 2022-12-21 5:56:54 GMT)"
    report = parse_report(body(sections=[("gridd-log", iso)], utc_offset="+02:00"))
    assert report.events[0].at == dt.datetime(2022, 12, 20, 5, 56, 54, tzinfo=dt.UTC)


def test_windows_and_linux_reports_of_one_guest_evaluate_alike() -> None:
    now = dt.datetime.fromtimestamp(CLOCK, tz=dt.UTC)
    linux = evaluate(parse_report(body()), current_token_sha256=SHA, now=now)
    windows = evaluate(parse_report(body(guest_os="windows", utc_offset="+00:00")), current_token_sha256=SHA, now=now)
    assert windows == linux


@pytest.mark.parametrize("header", ["os: macos", "os: Windows", "os: ", "utc-offset: +15:00", "utc-offset: 01:00",
                                    "utc-offset: +1:00", "utc-offset: +01:60", "utc-offset: Z"])
def test_malformed_windows_headers_are_refused(header: str) -> None:
    text = body().decode().replace("nvidia-smi: ok\n", f"nvidia-smi: ok\n{header}\n")
    with pytest.raises(ReportError) as e:
        parse_report(text.encode())
    assert e.value.reason == BAD_FIELD


@pytest.mark.parametrize("header", ["os: windows", "utc-offset: +01:00"])
def test_version_1_reports_cannot_carry_them(header: str) -> None:
    text = body(format_version=1).decode().replace("probe-version: 1.0.0\n", f"probe-version: 1.0.0\n{header}\n")
    with pytest.raises(ReportError) as e:
        parse_report(text.encode())
    assert e.value.reason == BAD_FIELD
