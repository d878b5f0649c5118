"""The delivery alerts on a two-pod scrape, on promtool and vmalert-tool (docs/operations.md#delivery-readiness).

Every replica runs the delivery probe and exports `licensectl_delivery_ready` about itself; only the
leader checks the webhook configuration. So LicensectlDeliveryNotReady must not fire while any replica
holds evidence (a standby still starting, a replica whose probe failed once), and must fire once when
none does; LicensectlWebhookConfigurationProblem fires once per configuration and problem, and a
failover (the new leader re-checks at once) neither doubles nor ends it. The cases are built here and
run through the shipped rules (annotations dropped: alerts.test.yaml pins their texts) by the real
tools; a rule taking `min` over pods is shown to fail them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.monitoring.test_alerts import promtool, rule_spec, run, write_rules  # noqa: F401 (promtool: fixture)
from tests.monitoring.test_alerts_ha import without_annotations
from tests.monitoring.test_alerts_victoriametrics import vmalert_tool  # noqa: F401 (fixture)
from tests.monitoring.vmalert_cases import run_vmalert_tool

MINUTES = 40
PROBLEM = ('licensectl_webhook_configuration_problem{{pod="{pod}",kind="MutatingWebhookConfiguration",'
           'name="licensectl",problem="{problem}"}}')


def ready(pod: str, values: str) -> dict[str, str]:
    return {"series": f'licensectl_delivery_ready{{pod="{pod}"}}', "values": values}


def cases() -> dict[str, Any]:
    delivery_labels = {"severity": "critical"}
    config_labels = {"severity": "critical", "kind": "MutatingWebhookConfiguration", "name": "licensectl",
                     "problem": "no_ca_bundle"}
    return {
        "rule_files": ["licensectl.rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {"name": "one replica with evidence is enough: the other starting or failing fires nothing",
             "interval": "1m",
             "input_series": [ready("licensectl-0", f"1x{MINUTES}"), ready("licensectl-1", f"0x{MINUTES}")],
             "alert_rule_test": [{"eval_time": f"{m}m", "alertname": "LicensectlDeliveryNotReady", "exp_alerts": []}
                                 for m in (5, 15, 30)]},
            {"name": "no replica with evidence for 10 minutes fires once; evidence back clears it",
             "interval": "1m",
             "input_series": [ready("licensectl-0", "1x5 0x20 1x14"), ready("licensectl-1", "1x5 0x20 1x14")],
             "alert_rule_test": [
                 {"eval_time": "12m", "alertname": "LicensectlDeliveryNotReady", "exp_alerts": []},
                 {"eval_time": "18m", "alertname": "LicensectlDeliveryNotReady",
                  "exp_alerts": [{"exp_labels": delivery_labels}]},
                 {"eval_time": "30m", "alertname": "LicensectlDeliveryNotReady", "exp_alerts": []}]},
            {"name": "a configuration problem fires once, through a failover to the other pod",
             "interval": "1m",
             # pod-0 leads until minute 20 (its series then ends), pod-1 after it, seeing the same problem.
             "input_series": [
                 {"series": PROBLEM.format(pod="licensectl-0", problem="no_ca_bundle"), "values": "1x20"},
                 {"series": PROBLEM.format(pod="licensectl-0", problem="missing"), "values": "0x20"},
                 {"series": PROBLEM.format(pod="licensectl-1", problem="no_ca_bundle"), "values": "_x20 1x19"},
                 {"series": PROBLEM.format(pod="licensectl-1", problem="missing"), "values": "_x20 0x19"}],
             "alert_rule_test": [
                 {"eval_time": "3m", "alertname": "LicensectlWebhookConfigurationProblem", "exp_alerts": []},
                 *({"eval_time": f"{m}m", "alertname": "LicensectlWebhookConfigurationProblem",
                    "exp_alerts": [{"exp_labels": config_labels}]} for m in (10, 21, 35))]},
        ],
    }


def _promtool(tool: str, directory: Path, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    write_rules(directory, spec)
    (directory / "delivery.test.yaml").write_text(yaml.safe_dump(cases(), sort_keys=False))
    return run([tool, "test", "rules", str(directory / "delivery.test.yaml")])


def test_promtool_delivery_alerts_on_two_pods(promtool: str, tmp_path: Path) -> None:  # noqa: F811
    res = _promtool(promtool, tmp_path, without_annotations(rule_spec()))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]


def test_vmalert_tool_delivery_alerts_on_two_pods(vmalert_tool: Path, tmp_path: Path) -> None:  # noqa: F811
    write_rules(tmp_path, without_annotations(rule_spec()))
    code, out = run_vmalert_tool(vmalert_tool, tmp_path, "delivery.vmalert.test.yaml", cases())
    assert code == 0, out[-4000:]
    assert "FAILED" not in out, out[-4000:]


def test_promtool_catches_a_rule_that_needs_every_pod_ready(promtool: str, tmp_path: Path) -> None:  # noqa: F811
    spec = without_annotations(rule_spec())
    target = next(r for g in spec["groups"] for r in g["rules"] if r.get("alert") == "LicensectlDeliveryNotReady")
    target["expr"] = "min(licensectl_delivery_ready) == 0"
    res = _promtool(promtool, tmp_path, spec)
    assert res.returncode != 0
    assert "LicensectlDeliveryNotReady" in res.stdout + res.stderr
