"""The license-delivery alerts (group licensectl.delivery) on promtool and vmalert-tool.

alerts-delivery.test.yaml holds their cases, with the conventions of alerts.test.yaml; promtool runs
the file as it is, vmalert-tool runs it converted by vmalert_cases.to_vmalert.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.monitoring.test_alerts import promtool, rule_spec, run, write_rules  # noqa: F401 (promtool: fixture)
from tests.monitoring.test_alerts_victoriametrics import run_vmalert_tool, vmalert_tool  # noqa: F401 (fixture)
from tests.monitoring.vmalert_cases import to_vmalert

DELIVERY_TESTS = Path(__file__).with_name("alerts-delivery.test.yaml")


def delivery_cases() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(DELIVERY_TESTS.read_text())
    return doc


def test_promtool_delivery_alerts(promtool: str, tmp_path: Path) -> None:  # noqa: F811
    write_rules(tmp_path, rule_spec())
    shutil.copy(DELIVERY_TESTS, tmp_path / DELIVERY_TESTS.name)
    res = run([promtool, "test", "rules", str(tmp_path / DELIVERY_TESTS.name)])
    assert res.returncode == 0, res.stdout + res.stderr


def test_vmalert_tool_delivery_alerts(vmalert_tool: Path, tmp_path: Path) -> None:  # noqa: F811
    out = run_vmalert_tool(vmalert_tool, tmp_path, rule_spec(), to_vmalert(delivery_cases()))
    assert out.startswith("exit=0\n"), out
    assert "SUCCESS" in out and "FAILED" not in out, out
