"""The shipped alert rules on VictoriaMetrics: the promtool cases, run by the real vmalert-tool.

Cozystack's monitoring stack evaluates rules with vmalert (MetricsQL), not Prometheus. The cases are
the same file promtool runs (alerts.test.yaml), converted by vmalert_cases.to_vmalert, so every
alert is shown firing and quiet on both engines from one source. vmalert-tool is built from its
pinned Go module on first use (licensectl_dev.devcluster.gotools); a failed build is an error, not a skip.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from licensectl_dev.devcluster.gotools import ensure_tool
from tests.monitoring.test_alerts import UNIT_TESTS, alerts, rule_spec, write_rules
from tests.monitoring.vmalert_cases import (
    VMALERT_TOOL_EPOCH,
    VMALERT_TOOL_FLAGS,
    metric_name,
    shift_values,
    to_vmalert,
)


@pytest.fixture(scope="session")
def vmalert_tool() -> Path:
    return ensure_tool("vmalert-tool")


def run_vmalert_tool(tool: Path, directory: Path, spec: dict[str, Any], cases: dict[str, Any]) -> str:
    """Write the rules and converted cases into `directory`, run `vmalert-tool unittest`, return output."""
    write_rules(directory, spec)
    test_file = directory / "alerts.vmalert.test.yaml"
    test_file.write_text(yaml.safe_dump(cases, sort_keys=False))
    res = subprocess.run(
        [str(tool), "unittest", f"--files={test_file}", *VMALERT_TOOL_FLAGS],
        cwd=directory, capture_output=True, text=True, timeout=300, check=False,
    )
    out = res.stdout + res.stderr
    return f"exit={res.returncode}\n{out}"


def source_cases() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(UNIT_TESTS.read_text())
    return doc


def test_vmalert_tool_runs_every_promtool_case(vmalert_tool: Path, tmp_path: Path) -> None:
    out = run_vmalert_tool(vmalert_tool, tmp_path, rule_spec(), to_vmalert(source_cases()))
    assert out.startswith("exit=0\n"), out
    assert "SUCCESS" in out and "FAILED" not in out, out


def test_vmalert_tool_catches_a_changed_rule(vmalert_tool: Path, tmp_path: Path) -> None:
    """The same mutation the promtool suite must catch: a longer `for` breaks the firing case."""
    spec = rule_spec()
    target = next(r for g in spec["groups"] for r in g["rules"] if r.get("alert") == "LicensectlGuestUnlicensed")
    target["for"] = "30m"
    out = run_vmalert_tool(vmalert_tool, tmp_path, spec,
                           to_vmalert(source_cases(), only_alert="LicensectlGuestUnlicensed"))
    assert not out.startswith("exit=0\n"), out
    assert "FAILED" in out and "LicensectlGuestUnlicensed" in out, out


def test_vmalert_tool_sees_clock_origin_of_unshifted_timestamps(vmalert_tool: Path, tmp_path: Path) -> None:
    """Without the clock shift, a guest that reports every minute looks silent on vmalert-tool.

    Proves the shift in to_vmalert is needed (and that vmalert-tool's clock really starts in 2000).
    """
    cases = to_vmalert(source_cases(), only_alert="LicensectlGuestNotReporting")
    for case in cases["tests"]:
        for s in case["input_series"]:
            if metric_name(s["series"]).endswith("_timestamp_seconds"):
                s["values"] = shift_values(s["values"], -VMALERT_TOOL_EPOCH, keep_zero=False)
    out = run_vmalert_tool(vmalert_tool, tmp_path, rule_spec(), cases)
    assert not out.startswith("exit=0\n"), out
    assert 'vmi="chatty"' in out, out


def test_conversion_keeps_every_case_and_every_alert_both_ways() -> None:
    src = source_cases()
    conv = to_vmalert(src)
    assert [c["name"] for c in conv["tests"]] == [c["name"] for c in src["tests"]]
    assert conv["rule_files"] == src["rule_files"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case, orig in zip(conv["tests"], src["tests"], strict=True):
        assert case["alert_rule_test"] == orig["alert_rule_test"]
        for check in case["alert_rule_test"]:
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    # Alerts whose cases live in a topic file (alerts-<topic>.test.yaml, converted by its own runner).
    topic_files = [f for f in UNIT_TESTS.parent.glob("alerts-*.test.yaml") if f.name != "alerts-ha.test.yaml"]
    topics = {check["alertname"] for f in topic_files
              for case in yaml.safe_load(f.read_text())["tests"] for check in case.get("alert_rule_test", [])}
    names = {a["alert"] for a in alerts()} - topics
    assert names <= fired and names <= quiet
    assert src == source_cases(), "conversion must not modify its input"


def test_only_timestamp_series_are_shifted() -> None:
    conv = to_vmalert(source_cases())
    by_series = {s["series"]: s["values"] for c in conv["tests"] for s in c["input_series"]}
    src = {s["series"]: s["values"] for c in source_cases()["tests"] for s in c["input_series"]}
    for series, values in src.items():
        name = metric_name(series)
        if not name.endswith("_timestamp_seconds"):
            assert by_series[series] == values, series
    stuck = 'licensectl_guest_license_expiry_timestamp_seconds{namespace="tenant-a",vmi="stuck",'
    assert next(v for s, v in by_series.items() if s.startswith(stuck)) == f"{86400 + VMALERT_TOOL_EPOCH}x800"
    na = 'licensectl_guest_license_expiry_timestamp_seconds{namespace="tenant-a",vmi="na",'
    assert next(v for s, v in by_series.items() if s.startswith(na)) == "0x800", "0 = no expiry known"


@pytest.mark.parametrize(
    ("values", "keep_zero", "expected"),
    [
        ("60x60", False, "1060x60"),
        ("0+60x60", True, "1000+60x60"),
        ("0x60", False, "1000x60"),
        ("0x60", True, "0x60"),
        ("0x14 1x16", True, "0x14 1001x16"),
        ("5-1x3 _x2 stale 7", False, "1005-1x3 _x2 stale 1007"),
        ("1.5e3", False, "2500"),
    ],
)
def test_shift_values(values: str, keep_zero: bool, expected: str) -> None:
    assert shift_values(values, 1000, keep_zero=keep_zero) == expected


def test_shift_values_rejects_unknown_notation() -> None:
    with pytest.raises(ValueError, match="unsupported series value token 'abc'"):
        shift_values("1 abc", 1000, keep_zero=False)
