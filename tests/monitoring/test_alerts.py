"""The shipped PrometheusRule, checked and unit-tested with the real promtool.

promtool missing is a failure, not a skip: CI must install it (Debian package `prometheus`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring.promql_names import CONTRACT_LABELS, exported_series, problems, registry_families

ROOT = Path(__file__).resolve().parents[2]
RULE = ROOT / "manifests" / "components" / "monitoring" / "prometheusrule.yaml"
UNIT_TESTS = Path(__file__).with_name("alerts.test.yaml")
RUNBOOK = ROOT / "docs" / "operations.md"
RUNBOOK_BASE = "https://licensectl.invalid/docs/operations.md"


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found on PATH: install the Debian package `prometheus`")
    return path


def rule_spec() -> dict[str, Any]:
    doc = yaml.safe_load(RULE.read_text())
    assert doc["kind"] == "PrometheusRule"
    spec: dict[str, Any] = doc["spec"]
    return spec


def alerts() -> list[dict[str, Any]]:
    return [r for g in rule_spec()["groups"] for r in g["rules"] if "alert" in r]


def write_rules(directory: Path, spec: dict[str, Any]) -> Path:
    """The PrometheusRule's spec as a plain Prometheus rules file, plus the unit tests beside it."""
    rules = directory / "licensectl.rules.yaml"
    rules.write_text(yaml.safe_dump(spec, sort_keys=False))
    shutil.copy(UNIT_TESTS, directory / UNIT_TESTS.name)
    return rules


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)


def test_promtool_check_rules(promtool: str, tmp_path: Path) -> None:
    rules = write_rules(tmp_path, rule_spec())
    res = run([promtool, "check", "rules", str(rules)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule_spec()['groups'])} rules found" in res.stdout


def test_promtool_unit_tests(promtool: str, tmp_path: Path) -> None:
    write_rules(tmp_path, rule_spec())
    res = run([promtool, "test", "rules", str(tmp_path / UNIT_TESTS.name)])
    assert res.returncode == 0, res.stdout + res.stderr


def test_unit_tests_catch_a_changed_rule(promtool: str, tmp_path: Path) -> None:
    """The unit tests pin behaviour: a longer `for` on one alert makes them fail."""
    spec = rule_spec()
    target = next(r for g in spec["groups"] for r in g["rules"] if r.get("alert") == "LicensectlGuestUnlicensed")
    target["for"] = "30m"
    write_rules(tmp_path, spec)
    res = run([promtool, "test", "rules", str(tmp_path / UNIT_TESTS.name)])
    assert res.returncode != 0
    assert "LicensectlGuestUnlicensed" in res.stdout + res.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    # alerts.test.yaml and the topic files beside it (alerts-<topic>.test.yaml, each with its own runner).
    cases = [c for f in sorted(UNIT_TESTS.parent.glob("alerts*.test.yaml"))
             for c in yaml.safe_load(f.read_text())["tests"]]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in cases:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - fired == set(), "alerts never shown firing"
    assert names - quiet == set(), "alerts never shown quiet"
    assert names >= {
        "LicensectlGuestUnlicensed", "LicensectlGuestLicenseExpiringSoon", "LicensectlGuestNotReporting",
        "LicensectlRolloutPaused", "LicensectlRolloutStuck", "LicensectlReplicaConflict",
        "LicensectlSourceInvalid", "LicensectlTokenExpiringSoon", "LicensectlDown",
        "LicensectlDeletionCapHit", "LicensectlTenantLinkBroken", "LicensectlGuestLicenseRestricted",
        "LicensectlGuestInGracePeriod", "LicensectlGuestDriverMissing", "LicensectlGuestTokenNotCurrent",
        "LicensectlGuestClockSkew", "LicensectlManualRestartOverdue", "LicensectlGuestWrongProduct",
        "LicensectlRolloutAborted", "LicensectlFeatureTypeMismatch", "LicensectlGPUClassLicenseChanged",
        "LicensectlSourceTokenUnreadable", "LicensectlWatchStale",
    }


def test_alerts_carry_severity_and_runbook_text() -> None:
    for a in alerts():
        assert a["labels"]["severity"] in {"critical", "warning", "info"}, a["alert"]
        ann = a["annotations"]
        assert ann["summary"] and ann["description"], a["alert"]
        # Absolute (Alertmanager opens it as is); the placeholder base is replaced at install time.
        assert ann["runbook_url"] == f"{RUNBOOK_BASE}#{a['alert'].lower()}", a["alert"]


def github_anchors(markdown: str) -> set[str]:
    """Anchors GitHub generates for headings: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def test_runbook_sections_exist() -> None:
    anchors = github_anchors(RUNBOOK.read_text())
    missing = {a["annotations"]["runbook_url"] for a in alerts()
               if a["annotations"]["runbook_url"].split("#", 1)[1] not in anchors}
    assert missing == set()


def test_contract_covers_metrics_py() -> None:
    """The label table names exactly the series metrics.py defines, so it cannot drift silently."""
    assert set(CONTRACT_LABELS) == registry_families()


def test_alert_expressions_use_contract_metrics_and_labels() -> None:
    series = exported_series()
    bad = {a["alert"] + ": " + a["expr"]: problems(a["expr"], series) for a in alerts()}
    assert {k: v for k, v in bad.items() if v} == {}


def test_contract_check_rejects_unknown_names_and_labels() -> None:
    series = exported_series()
    assert problems("licensectl_guest_license_state{state='unknown'}", series) == []
    assert problems("licensectl_guest_licence_state", series) == ["unknown series 'licensectl_guest_licence_state'"]
    assert problems("licensectl_replicas{tenant='a'}", series) == ["licensectl_replicas has no label(s) ['tenant']"]
    assert problems("sum by (tenant) (licensectl_rollout_vmis)", series) == [
        "by ['tenant'] over ['licensectl_rollout_vmis']: no label(s) ['tenant']"]
    assert problems("histogram_quantile(0.9, sum by (le) (rate(licensectl_reconcile_duration_seconds_bucket[5m])))",
                    series) == []
