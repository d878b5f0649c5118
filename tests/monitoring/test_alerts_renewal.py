"""No alert for a healthy VM, ever; the expiry alert before a failing lease ends (docs/design.md#lease-renewal).

Simulated fleets, run through the shipped rules by the real promtool and the real vmalert-tool: a
guest reports every minute, its lease renews at 15 % of its length (every 3.6 h for a 1-day lease,
every 135 s for a 15-minute one), and the exporter's series are derived with the controller's own rule
for the observed lease length (core/guest_report/observation.py). "Nothing fires" is checked on the
`ALERTS` series itself, so pending alerts count too.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from licensectl.controllers.guests import STATES
from licensectl.core.guest_report.observation import BOOT_ALLOWANCE_SECONDS, lease_seconds
from tests.monitoring import test_alerts, test_alerts_victoriametrics
from tests.monitoring.test_alerts import rule_spec, run, write_rules
from tests.monitoring.vmalert_cases import run_vmalert_tool

# The tool fixtures of the suites this extends (the tools are found or built once per session).
promtool = test_alerts.promtool
vmalert_tool = test_alerts_victoriametrics.vmalert_tool

STEP = 60  # seconds between samples: one report per minute
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
RENEW_FRACTION = 0.15  # gridd renews after 15 % of the lease (docs/design.md#lease-renewal)


def compress(values: list[float | None]) -> str:
    """promtool's series notation: runs of one value as `vxN`, gaps (no sample) as `_`."""
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        v = values[i]
        token = "_" if v is None else (str(int(v)) if float(v).is_integer() else repr(v))
        out.append(token if j == i else f"{token}x{j - i}")
        i = j + 1
    return " ".join(out)


@dataclass
class Guest:
    """One simulated VMI: reports from `first_report` on, lease `lease` renewed at 15 % until `renew_until`."""

    name: str
    lease: float
    first_report: float = 0.0
    renew_until: float | None = None  # None: renewals never fail

    def expiry_at(self, t: float) -> float:
        period = self.lease * RENEW_FRACTION
        last = min(t, self.renew_until) if self.renew_until is not None else t
        renewed = self.first_report + (max(0.0, last - self.first_report) // period) * period
        return renewed + self.lease

    def series(self, samples: int) -> list[dict[str, str]]:
        ts = [i * STEP for i in range(samples + 1)]
        on = [t >= self.first_report for t in ts]
        expiry: list[float | None] = []
        lease: list[float | None] = []
        prev_exp: dt.datetime | None = None
        prev_lease: float | None = None
        for t, live in zip(ts, on, strict=True):
            if not live:
                expiry.append(None)
                lease.append(None)
                continue
            exp = EPOCH + dt.timedelta(seconds=self.expiry_at(t))
            est = lease_seconds(previous_expiry=prev_exp, previous_lease=prev_lease, expiry=exp,
                                reported_at=EPOCH + dt.timedelta(seconds=t))
            expiry.append(exp.timestamp())
            lease.append(est)
            prev_exp, prev_lease = exp, est
        labels = f'namespace="tenant-a",vmi="{self.name}",tenant="tenant-a",pod="licensectl-0"'

        def one(name: str, values: list[float | None], extra: str = "") -> dict[str, str]:
            return {"series": f"{name}{{{labels}{extra}}}", "values": compress(values)}

        def when(v: float) -> list[float | None]:
            return [v if live else None for live in on]

        out = [one("licensectl_guest_license_state", when(1.0 if s == "licensed" else 0.0), f',state="{s}"')
               for s in STATES]
        out += [one("licensectl_guest_license_expiry_timestamp_seconds", expiry),
                one("licensectl_guest_license_lease_seconds", lease),
                one("licensectl_guest_last_report_timestamp_seconds",
                    [float(t) if live else None for t, live in zip(ts, on, strict=True)]),
                one("licensectl_guest_token_current", when(1.0)),
                one("licensectl_guest_clock_skew_seconds", when(0.5))]
        return out


def humanize_duration(v: float) -> str:
    """Prometheus' (and vmalert's) `humanizeDuration` for the values these cases produce."""
    if v < 60:
        return f"{v:.4g}s"
    s, m, h, d = int(v) % 60, int(v / 60) % 60, int(v / 3600) % 24, int(v / 86400)
    if d:
        return f"{d}d {h}h {m}m {s}s"
    return f"{h}h {m}m {s}s" if h else f"{m}m {s}s"


def controller_series(samples: int) -> list[dict[str, str]]:
    """Two healthy replicas, one leader, every cache fresh: what a healthy controller exports."""
    n = samples
    return [
        {"series": 'up{job="licensectl-metrics",pod="licensectl-0"}', "values": f"1x{n}"},
        {"series": 'up{job="licensectl-metrics",pod="licensectl-1"}', "values": f"1x{n}"},
        {"series": 'licensectl_leader{pod="licensectl-0"}', "values": f"1x{n}"},
        {"series": 'licensectl_leader{pod="licensectl-1"}', "values": f"0x{n}"},
        {"series": 'licensectl_watch_stale_seconds{resource="virtualmachineinstances",pod="licensectl-0"}',
         "values": f"20x{n}"},
    ]


def case(name: str, guests: list[Guest], hours: float, *, quiet_until: float,
         firing: tuple[tuple[float, Guest], ...] = ()) -> dict[str, Any]:
    """A test group: no ALERTS sample at all (pending included) up to `quiet_until` seconds, then the
    expiry alert firing for the named guest at each (time, vmi) of `firing`."""
    samples = int(hours * 3600 / STEP)
    inputs = controller_series(samples)
    for g in guests:
        inputs += g.series(samples)
    end = int(quiet_until)
    doc: dict[str, Any] = {
        "name": name, "interval": f"{STEP}s", "input_series": inputs,
        # Every alert state the rules produced in the window: none (the result has no series).
        "promql_expr_test": [{"expr": f"count_over_time(ALERTS[{end}s])", "eval_time": f"{end}s", "exp_samples": []}],
    }
    tests = []
    for at, g in firing:
        left = humanize_duration(g.expiry_at(at) - at)
        tests.append({"eval_time": f"{int(at)}s", "alertname": "LicensectlGuestLicenseExpiringSoon", "exp_alerts": [{
            "exp_labels": {"severity": "warning", "namespace": "tenant-a", "vmi": g.name, "tenant": "tenant-a"},
            "exp_annotations": {
                "summary": f"vGPU license lease of tenant-a/{g.name} is not being renewed",
                "description": f"The license lease of VMI tenant-a/{g.name} (tenant tenant-a) ends in {left}, less "
                               "than half of its length: nvidia-gridd's renewals are failing.",
                "runbook_url": "https://licensectl.invalid/docs/operations.md#licensectlguestlicenseexpiringsoon"}}]})
    if tests:
        doc["alert_rule_test"] = tests
    return doc


DAY, QUARTER = 86400.0, 900.0
JOIN = 6 * 3600.0 + BOOT_ALLOWANCE_SECONDS - 60  # a VM started at 6 h reports within its boot allowance


def cases() -> dict[str, Any]:
    healthy_day = [Guest("day-1", DAY), Guest("day-2", DAY, first_report=1800.0)]
    failing_day = Guest("failing-day", DAY, renew_until=8 * 3600.0)
    failing_quarter = Guest("failing-quarter", QUARTER, renew_until=1800.0)
    return {
        "rule_files": ["licensectl.rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            case("1-day leases renewed every 3.6 h for 2 days, and a VM joining at 6 h: no alert, pending included",
                 [*healthy_day, Guest("joiner", DAY, first_report=JOIN)], 48, quiet_until=48 * 3600),
            case("15-minute leases renewed every 135 s for 6 hours: no alert, pending included",
                 [Guest("quarter-1", QUARTER), Guest("quarter-2", QUARTER, first_report=420.0)], 6,
                 quiet_until=6 * 3600),
            # Renewals stop after 8 h; the last one at 7.2 h leaves the lease ending at 31.2 h.
            case("1-day lease whose renewals fail: the expiry alert fires hours before the lease ends",
                 [failing_day], 32, quiet_until=19 * 3600, firing=((20 * 3600, failing_day), (31 * 3600, failing_day))),
            # Renewals stop after 30 min; the last one at 1755 s leaves the lease ending at 2655 s (44.25 min).
            case("15-minute lease whose renewals fail: the expiry alert fires before the lease ends",
                 [failing_quarter], 1, quiet_until=36 * 60,
                 firing=((41 * 60, failing_quarter), (44 * 60, failing_quarter))),
        ],
    }


def test_the_simulation_renews_as_described() -> None:
    g = Guest("g", DAY, renew_until=8 * 3600.0)
    assert g.expiry_at(0) == DAY
    assert g.expiry_at(3.6 * 3600 - 1) == DAY and g.expiry_at(3.6 * 3600) == DAY + 3.6 * 3600
    assert g.expiry_at(30 * 3600) == 7.2 * 3600 + DAY  # no renewal after 8 h
    assert compress([1.0, 1.0, 1.0, None, 2.5]) == "1x2 _ 2.5"


def test_promtool_no_alert_for_healthy_guests_and_expiry_before_lease_end(promtool: str, tmp_path: Path) -> None:
    write_rules(tmp_path, rule_spec())
    (tmp_path / "renewal.test.yaml").write_text(yaml.safe_dump(cases(), sort_keys=False))
    res = run([promtool, "test", "rules", str(tmp_path / "renewal.test.yaml")])
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]


def test_vmalert_tool_no_alert_for_healthy_guests_and_expiry_before_lease_end(vmalert_tool: Path,
                                                                              tmp_path: Path) -> None:
    write_rules(tmp_path, rule_spec())
    code, out = run_vmalert_tool(vmalert_tool, tmp_path, "renewal.vmalert.test.yaml", cases())
    assert code == 0, out[-4000:]
    assert "FAILED" not in out, out[-4000:]


def broken(kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A rule spec with a naive expiry rule, and the healthy case it wrongly alerts on."""
    spec = rule_spec()
    target = next(r for g in spec["groups"] for r in g["rules"]
                  if r.get("alert") == "LicensectlGuestLicenseExpiringSoon")
    if kind == "changes":  # the rule before: "expiry unchanged for 2 h"
        target["expr"] = ("(min by (namespace, vmi, tenant) (licensectl_guest_license_expiry_timestamp_seconds > 0)"
                          " - time() < 7 * 86400) and (max by (namespace, vmi, tenant) "
                          "(changes(licensectl_guest_license_expiry_timestamp_seconds[2h])) == 0)")
    else:  # a fixed "less than an hour left", blind to the lease length
        target["expr"] = ("min by (namespace, vmi, tenant) (licensectl_guest_license_expiry_timestamp_seconds > 0)"
                          " - time() < 3600")
    doc = cases()
    doc["tests"] = [doc["tests"][0 if kind == "changes" else 1]]
    return spec, doc


@pytest.mark.parametrize("kind", ["changes", "no-lease"])
def test_promtool_catches_naive_rules(promtool: str, tmp_path: Path, kind: str) -> None:
    """The simulation has teeth: the old "expiry unchanged for 2 h" rule alerts on healthy 1-day leases,
    and a rule that ignores the lease length on healthy 15-minute leases."""
    spec, doc = broken(kind)
    write_rules(tmp_path, spec)
    (tmp_path / "renewal.test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    res = run([promtool, "test", "rules", str(tmp_path / "renewal.test.yaml")])
    assert res.returncode != 0, res.stdout[-2000:]
    assert "LicensectlGuestLicenseExpiringSoon" in res.stdout + res.stderr


def test_vmalert_tool_catches_a_naive_rule(vmalert_tool: Path, tmp_path: Path) -> None:
    """The ALERTS check has teeth on vmalert-tool too (pending and firing states are written back)."""
    spec, doc = broken("no-lease")
    write_rules(tmp_path, spec)
    code, out = run_vmalert_tool(vmalert_tool, tmp_path, "renewal.vmalert.test.yaml", doc)
    assert code != 0, out[-2000:]
    assert "LicensectlGuestLicenseExpiringSoon" in out, out[-2000:]
