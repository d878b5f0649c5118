"""The shipped rules on a two-pod scrape and across a failover, on promtool and on vmalert-tool.

alerts-ha.test.yaml follows docs/operations.md#which-pod-exports-what. It checks which alerts fire
for which label sets, so the copy of the rules it runs against has its annotations dropped (their
texts are pinned by alerts.test.yaml); everything else is the shipped rule file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from licensectl import config
from licensectl.controllers.guests import MISSED_INTERVALS
from tests.monitoring.test_alerts import alerts, promtool, rule_spec  # noqa: F401 - promtool is a fixture
from tests.monitoring.test_alerts_victoriametrics import run_vmalert_tool, vmalert_tool  # noqa: F401 - fixture
from tests.monitoring.vmalert_cases import to_vmalert

HA_TESTS = Path(__file__).with_name("alerts-ha.test.yaml")
# Series only the leader exports (docs/operations.md#which-pod-exports-what).
LEADER_ONLY = re.compile(r"licensectl_(guest_\w+|guests(?:_\w+)?|rollout_(?!duration)\w+|worker_drain\w*)\b")
_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(duration: str) -> int:
    parts = _DURATION.findall(duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * _UNIT[u] for n, u in parts)


def without_annotations(spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = yaml.safe_load(yaml.safe_dump(spec))
    for g in out["groups"]:
        for r in g["rules"]:
            r.pop("annotations", None)
    return out


def without_keep_firing(spec: dict[str, Any]) -> dict[str, Any]:
    out = without_annotations(spec)
    for g in out["groups"]:
        for r in g["rules"]:
            r.pop("keep_firing_for", None)
    return out


def cases() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(HA_TESTS.read_text())
    return doc


def run_promtool(tool: str, directory: Path, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    (directory / "licensectl.rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    shutil.copy(HA_TESTS, directory / HA_TESTS.name)
    return subprocess.run([tool, "test", "rules", str(directory / HA_TESTS.name)], capture_output=True, text=True,
                          timeout=300, check=False)


def test_two_pod_cases_on_promtool(promtool: str, tmp_path: Path) -> None:  # noqa: F811
    res = run_promtool(promtool, tmp_path, without_annotations(rule_spec()))
    assert res.returncode == 0, res.stdout + res.stderr


def test_failover_case_needs_keep_firing_for(promtool: str, tmp_path: Path) -> None:  # noqa: F811
    """Without keep_firing_for the alerts firing before the failover resolve in the gap."""
    res = run_promtool(promtool, tmp_path, without_keep_firing(rule_spec()))
    assert res.returncode != 0
    out = res.stdout + res.stderr
    assert "failover" in out and "LicensectlGuestUnlicensed" in out, out


def test_two_pod_cases_on_vmalert_tool(vmalert_tool: Path, tmp_path: Path) -> None:  # noqa: F811
    out = run_vmalert_tool(vmalert_tool, tmp_path, without_annotations(rule_spec()), to_vmalert(cases()))
    assert out.startswith("exit=0\n"), out
    assert "SUCCESS" in out and "FAILED" not in out, out


def test_alerts_on_leader_only_series_outlast_a_failover() -> None:
    """Every alert reading a leader-only family keeps firing longer than the export gap of a failover
    with the default settings: a takeover after a crash, then three report intervals before the new
    leader judges a silent guest, then one scrape."""
    s = config.Settings()
    gap = (s.lease_duration_seconds + s.retry_period_seconds + MISSED_INTERVALS * s.report_interval_seconds
           + 60)  # a scrape interval of up to a minute
    checked = 0
    for a in alerts():
        if LEADER_ONLY.search(a["expr"]):
            checked += 1
            assert "keep_firing_for" in a, a["alert"]
            assert seconds(a["keep_firing_for"]) >= gap, (a["alert"], a["keep_firing_for"], gap)
    assert checked >= 5


def test_leader_only_pattern() -> None:
    assert LEADER_ONLY.search("max(licensectl_guest_license_state)")
    assert LEADER_ONLY.search("sum(licensectl_guests{state='x'})")
    assert LEADER_ONLY.search("licensectl_rollout_paused == 1")
    assert LEADER_ONLY.search("max by (vm) (licensectl_worker_drain_blocked) > 0")
    assert LEADER_ONLY.search("sum(licensectl_worker_drains)")
    assert not LEADER_ONLY.search("rate(licensectl_worker_evictions_total[5m])")
    assert not LEADER_ONLY.search("rate(licensectl_rollout_duration_seconds_bucket[5m])")
    assert not LEADER_ONLY.search("max(licensectl_replicas)")
