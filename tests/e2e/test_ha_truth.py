"""The numbers tell the truth under HA: two `licensectl run` processes with leader election, a real
Prometheus scraping both with the shipped rules, simulated guests running the real probe script.

A tenant cluster's worker sits mid-drain throughout, its cluster unreachable (held): the worker
gauges (`licensectl_worker_drains`, `licensectl_worker_drain_blocked`) come from the leader only,
and its one true alert, LicensectlWorkerDrainBlocked, is expected in every phase.

1. All guests licensed for five report intervals: no guest alert at all, pending or firing.
2. One guest unlicensed, one silent, one without the guest driver, one with a skewed clock, one
   still licensed: exactly the four matching alerts fire, for exactly those guests.
3. The leader is killed (SIGKILL): the standby takes over, and no alert flaps -- every firing alert
   keeps firing with the same activeAt and nothing else starts; the new leader exports the worker
   gauges the old one did.

The rules are the shipped PrometheusRule's, with one rewrite: every `for` and `keep_firing_for` is
scaled by this test's report interval over the default one (3 s / 60 s), so the alerts' durations
keep their ratio to the report interval. The Lease timings are not scaled (3 s instead of 0.75 s):
the failover gap is relatively longer here than with the defaults, so this is the stricter case.
The rewrite is checked to touch nothing but those durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import itertools
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient, CoreV1Api

from licensectl import config
from licensectl.core import drain
from licensectl.core.model import LABEL_CAPI_CLUSTER_NAME, LABEL_CAPI_ROLE
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster import webhook as webhook_registration
from licensectl_dev.devcluster.guest_sim import GuestProfile, SimulatedGuest
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.metrics_text import SampleKey, Scrape
from licensectl_dev.testkit.poll import EventuallyTimeout, eventually
from tests.monitoring.test_alerts_ha import seconds

from .support import REPORT_INTERVAL, Prometheus, Rig, controllers, start_prometheus

# Starts `licensectl run` processes and Prometheus itself: cluster tier even if its fixtures change.
pytestmark = [pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
RULE = ROOT / "manifests" / "components" / "monitoring" / "prometheusrule.yaml"
# Longer than the other failover tests: a renewal missed on a busy machine would hand the lease over
# before the test kills the leader, and this test needs to know which replica leads.
LEASE: dict[str, float] = {"lease_duration_seconds": 6, "renew_deadline_seconds": 4, "retry_period_seconds": 0.5}
SCALE = REPORT_INTERVAL / config.Settings().report_interval_seconds
# A new VMI's patience before its first report, on the same scaled clock as the alerts' `for`.
LEASE["guest_boot_allowance_seconds"] = round(config.Settings().guest_boot_allowance_seconds * SCALE, 1)
DURATION_KEYS = ("for", "keep_firing_for")
SKEW = 900  # seconds: beyond the clock-skew alert's threshold, inside the reports endpoint's window
AlertKey = frozenset[tuple[str, str]]
WORKER_GAUGES = ("licensectl_worker_drains", "licensectl_worker_drain_blocked")
WORKER = "gone-md-0"  # the held worker VM


def shipped_spec() -> dict[str, Any]:
    doc = yaml.safe_load(RULE.read_text())
    assert doc["kind"] == "PrometheusRule"
    spec: dict[str, Any] = doc["spec"]
    return spec


def scaled_spec() -> dict[str, Any]:
    out = copy.deepcopy(shipped_spec())
    for g in out["groups"]:
        for r in g["rules"]:
            for key in DURATION_KEYS:
                if key in r:
                    r[key] = f"{max(1, round(seconds(r[key]) * SCALE))}s"
    return out


def without_durations(spec: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    for g in out["groups"]:
        for r in g["rules"]:
            for key in DURATION_KEYS:
                r.pop(key, None)
    return out


def write_config(directory: Path, ns: str, targets: dict[str, int]) -> Path:
    rules = directory / "licensectl.rules.yaml"
    rules.write_text(yaml.safe_dump(scaled_spec(), sort_keys=False))
    cfg = directory / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        # What the ServiceMonitor scrapes: every pod of the Deployment, leader and standby alike,
        # with honorLabels (guest series carry the VM's own `namespace`).
        "scrape_configs": [{"job_name": "licensectl-metrics", "honor_labels": True, "static_configs": [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": ns, "pod": pod, "container": "licensectl"}}
            for pod, port in targets.items()]}],
    }, sort_keys=False))
    return cfg


@dataclass
class Alert:
    state: str
    active_at: str


@dataclass
class AlertLog:
    """Every poll of Prometheus' /api/v1/alerts, by phase: label set -> state and activeAt."""

    polls: list[tuple[str, float, dict[AlertKey, Alert]]] = field(default_factory=list)
    phase: str = "setup"

    def during(self, phase: str) -> list[dict[AlertKey, Alert]]:
        return [alerts for p, _, alerts in self.polls if p == phase]


async def alerts_now(prom: Prometheus) -> dict[AlertKey, Alert]:
    data = await prom.get("/api/v1/alerts")
    return {frozenset(a["labels"].items()): Alert(a["state"], a["activeAt"]) for a in data["alerts"]
            if a["state"] in ("pending", "firing")}


async def watch_alerts(prom: Prometheus, log: AlertLog, stop: asyncio.Event) -> None:
    while not stop.is_set():
        log.polls.append((log.phase, time.monotonic(), await alerts_now(prom)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


def brief(alerts: dict[AlertKey, Alert]) -> set[tuple[str, str, str, str]]:
    """(alertname, namespace/vmi, cause, state) per alert, for readable assertions."""
    out = set()
    for labels, a in alerts.items():
        d = dict(labels)
        where = f"{d.get('namespace', '')}/{d.get('vmi', '')}".strip("/")
        out.add((d["alertname"], where, d.get("cause", ""), a.state))
    return out


def worker_gauges(s: Scrape) -> dict[SampleKey, float]:
    return {k: v for k, v in s.samples.items() if k[0] in WORKER_GAUGES}


async def longest_gap(prom: Prometheus, expr: str, start: float, end: float) -> float:
    """The longest stretch in [start, end] without a sample of `expr` (0.5 s resolution)."""
    data = await prom.get("/api/v1/query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="0.5")
    stamps = sorted({float(t) for series in data["result"] for t, _ in series["values"]})
    edges = [start, *stamps, end]
    return max(b - a for a, b in itertools.pairwise(edges))


class Guests:
    """The guests' probe timers: one probe run per report interval, profiles swappable."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.sims: dict[str, SimulatedGuest] = {}
        self.retired: list[SimulatedGuest] = []

    async def set(self, ns: str, vmi: str, profile: GuestProfile) -> None:
        g = SimulatedGuest(ns, vmi, profile)
        assert await g.boot(self.api) == 0, g.last_stderr
        old = self.sims.get(vmi)
        self.sims[vmi] = g
        if old is not None:
            self.retired.append(old)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.gather(*(g.probe() for g in list(self.sims.values())))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), REPORT_INTERVAL)

    def cleanup(self) -> None:
        for g in [*self.sims.values(), *self.retired]:
            g.cleanup()


def test_the_rules_under_test_are_the_shipped_ones_with_scaled_durations() -> None:
    shipped, scaled = shipped_spec(), scaled_spec()
    assert without_durations(scaled) == without_durations(shipped)
    pairs = [(r, s) for g, h in zip(shipped["groups"], scaled["groups"], strict=True)
             for r, s in zip(g["rules"], h["rules"], strict=True)]
    changed = [(r[k], s[k]) for r, s in pairs for k in DURATION_KEYS if k in r]
    assert changed and all(seconds(b) == max(1, round(seconds(a) * SCALE)) for a, b in changed), changed


@pytest.mark.asyncio(loop_scope="session")
async def test_two_replicas_one_prometheus_no_false_alert_exact_alerts_no_flap_on_failover(
        api_client: ApiClient, rig: Rig, tmp_path: Path, record_property: Callable[[str, object], None]) -> None:
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus not installed: run scripts/install-system-deps"
    fl = rig.fleet
    # A customer tenant with a sub-tenant: guests in both, the `tenant` label is the customer.
    customer = fl.tenants[0]
    parent = api_client.sanitize_for_serialization(await CoreV1Api(api_client).read_namespace(customer))
    sub = (await fl.tenant(parent=parent, claim=True))["metadata"]["name"]
    placement = {"ok": customer, "unlicensed": sub, "silent": sub, "nodriver": sub, "skewed": sub}
    worker_ns = fl.tenants[1]
    worker_alert = ("LicensectlWorkerDrainBlocked", worker_ns, "")

    def guest_alerts(alerts: set[tuple[str, str, str, str]]) -> set[tuple[str, str, str, str]]:
        return {x for x in alerts if x[:3] != worker_alert}

    guests = Guests(api_client)
    stop = asyncio.Event()
    log = AlertLog()
    prom: Prometheus | None = None
    tasks: list[asyncio.Task[None]] = []
    try:
        async with controllers() as started:
            a = await rig.controller(started, "licensectl-a", **LEASE)
            await a.wait_metric("licensectl_leader", 1)
            b = await rig.controller(started, "licensectl-b", **LEASE)
            await b.wait_metric("licensectl_ready", 1)

            await eventually(fl.revision, timeout=30, what="replicas in every tenant")
            await asyncio.sleep(1.1)  # revision times have one-second resolution
            for ns in sorted(set(placement.values())):
                await webhook_registration.wait_delivery(api_client, namespace=ns, claim="gpu")
            for vmi, ns in placement.items():
                await fleet.create_vm(api_client, ns, vmi, gpu_claims=["gpu"])
            # A tenant cluster's worker caught mid-drain when its cluster became unreachable (no kubeconfig
            # Secret): licensectl cannot tell whether its Node is still cordoned, so it holds it.
            since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
            await fleet.create_vm(api_client, worker_ns, WORKER, labels={
                LABEL_CAPI_CLUSTER_NAME: "gone", LABEL_CAPI_ROLE: "worker"},
                annotations=drain.DrainIntent(drain.Step.DRAIN, "r0", since, since, node=WORKER,
                                              cordoned=True).render_annotations())
            await a.wait_metric("licensectl_worker_drain_blocked", 1, timeout=30, namespace=worker_ns, vm=WORKER,
                                reason="ClusterUnreachable")
            for vmi, ns in placement.items():
                await eventually(lambda ns=ns, vmi=vmi: fl.ready(ns, vmi), timeout=30, what=f"{vmi} ready")
                await guests.set(ns, vmi, GuestProfile.licensed())
            tasks.append(asyncio.create_task(guests.run(stop)))

            data = tmp_path / "prometheus"
            data.mkdir()
            prom = await start_prometheus(binary, write_config(tmp_path, fl.controller_ns, {
                "licensectl-a": a.metrics_port, "licensectl-b": b.metrics_port}), data / "tsdb")
            names = {r["alert"] for g in shipped_spec()["groups"] for r in g["rules"] if "alert" in r}

            async def rules_loaded() -> bool:
                assert prom is not None
                groups = (await prom.get("/api/v1/rules"))["groups"]
                rules = [r for g in groups for r in g["rules"] if r["type"] == "alerting"]
                return {r["name"] for r in rules} == names and all(r["health"] == "ok" for r in rules)

            await eventually(rules_loaded, timeout=30, what="the shipped rules loaded and evaluated")

            async def licensed_in_prometheus() -> bool:
                assert prom is not None
                r = await prom.query('count(max by (namespace, vmi) '
                                     '(licensectl_guest_license_state{state="licensed"}) == 1)')
                return bool(r) and float(r[0]["value"][1]) == len(placement)

            await eventually(licensed_in_prometheus, timeout=30, what="every guest licensed in Prometheus")
            # Leftover namespaces of earlier tests (terminating) may still look like broken tenants.
            await eventually(lambda: _no_tenant_problems(a), timeout=60, what="no foreign tenant problems")
            await asyncio.sleep(2 * REPORT_INTERVAL)  # renewing leases: the expiry series moves
            tasks.append(asyncio.create_task(watch_alerts(prom, log, stop)))

            # -- 1. five report intervals, every guest licensed: no guest alert, pending or firing --
            log.phase = "licensed"
            await asyncio.sleep(5 * REPORT_INTERVAL)
            seen = [guest_alerts(brief(p)) for p in log.during("licensed") if guest_alerts(brief(p))]
            assert len(log.during("licensed")) >= 5 * REPORT_INTERVAL
            assert seen == [], seen[:3]
            # The standby exports no guest series; the leader's carry the customer tenant.
            sb, sa = await b.must_scrape(), await a.must_scrape()
            assert not sb.has("licensectl_guest_license_state") and not sb.has("licensectl_guests")
            assert not sb.has("licensectl_rollout_vmis")
            # The worker gauges too: the leader's only, the held worker's cycle and hold.
            assert worker_gauges(sb) == {}
            held = worker_gauges(sa)
            assert sa.value("licensectl_worker_drain_blocked", namespace=worker_ns, vm=WORKER, cluster="gone",
                            reason="ClusterUnreachable") == 1
            assert sa.value("licensectl_worker_drains", namespace=worker_ns, cluster="gone") == 1, held
            assert {ls["tenant"] for ls in sa.labels_of("licensectl_guest_license_state", 1.0)} == {customer}
            assert sa.value("licensectl_guests", tenant=customer, state="licensed") == len(placement)

            async def scalar(expr: str) -> float:
                assert prom is not None
                r = await prom.query(expr)
                assert len(r) == 1, (expr, r)
                return float(r[0]["value"][1])

            # In Prometheus: guest and rollout series from one pod, replication series from both with
            # equal values, so the shipped `max` aggregations are exact.
            assert await scalar("count(count by (pod) (licensectl_guest_license_state))") == 1
            assert await scalar("count(count by (pod) (licensectl_rollout_vmis))") == 1
            for gauge in WORKER_GAUGES:
                assert await scalar(f"count(count by (pod) ({gauge}))") == 1, gauge
            assert await scalar("count(count by (pod) (licensectl_replicas))") == 2
            assert await scalar('max(licensectl_replicas{state="in_sync"})') == await scalar(
                'min(licensectl_replicas{state="in_sync"})') == sa.value("licensectl_replicas", state="in_sync")
            assert await scalar("sum(licensectl_leader)") == 1
            # The rotation record lives in the cluster: both pods export it, equal, so the shipped
            # `max by (source...)` of LicensectlRolloutAborted counts each source once.
            assert await scalar("count(count by (pod) (licensectl_rotation_phase))") == 2
            assert await scalar('max(licensectl_rotation_phase{phase="stable"})') == await scalar(
                'min(licensectl_rotation_phase{phase="stable"})') == 1
            assert await scalar('count(max by (source_namespace, source_name) '
                                '(licensectl_rotation_phase{phase="stable"}))') == 1
            # Admission is answered by both pods (each VMI passed both registrations: one added the
            # volume, the other found it); the backstop's gauge is a rollout series, leader-only,
            # and empty because every VMI carries its volume.
            assert await scalar("count(count by (pod) (licensectl_webhook_admissions_total))") == 2
            assert await scalar('sum(licensectl_webhook_admissions_total{result="mutated"})') >= len(placement)
            assert await scalar('sum(licensectl_webhook_admissions_total{result="unchanged"})') >= len(placement)
            assert sa.value("licensectl_webhook_admissions_total") > 0 < sb.value("licensectl_webhook_admissions_total")
            assert not sa.has("licensectl_vmis_missing_license_volume")
            assert not sb.has("licensectl_vmis_missing_license_volume")

            # -- 2. four conditions: exactly the matching alerts, for exactly those guests --------
            log.phase = "conditions"
            await guests.set(sub, "unlicensed", GuestProfile.unlicensed())
            await guests.set(sub, "silent", GuestProfile.quiet())
            await guests.set(sub, "nodriver", GuestProfile.driver_missing())
            await guests.set(sub, "skewed", GuestProfile.skewed(dt.timedelta(seconds=SKEW)))
            expected = {
                (*worker_alert, "firing"),
                ("LicensectlGuestUnlicensed", f"{sub}/unlicensed", "", "firing"),
                ("LicensectlGuestNotReporting", f"{sub}/silent", "", "firing"),
                ("LicensectlGuestDriverMissing", f"{sub}/nodriver", "", "firing"),
                ("LicensectlGuestClockSkew", f"{sub}/skewed", "", "firing"),
            }

            async def exactly_expected() -> bool:
                assert prom is not None
                return brief(await alerts_now(prom)) == expected

            longest_for = max(seconds(r["for"]) for g in scaled_spec()["groups"] for r in g["rules"]
                              if r.get("alert") in {e[0] for e in expected})
            try:
                await eventually(exactly_expected, timeout=longest_for + 3 * REPORT_INTERVAL + 30, interval=0.5,
                                 what="exactly the four expected guest alerts and the worker's firing")
            except EventuallyTimeout:
                assert brief(await alerts_now(prom)) == expected
            firing = await alerts_now(prom)
            assert all(dict(k)["tenant"] == customer for k in firing if "vmi" in dict(k)), firing
            # Nothing else was ever even pending on the way (the licensed guest stayed quiet).
            others = {(n, w) for p in log.during("conditions") for n, w, _, _ in brief(p)} - {
                (n, w) for n, w, _, _ in expected}
            assert others == set(), others

            # -- 3. kill the leader: nothing flaps -----------------------------------------------
            log.phase = "failover"
            killed, killed_wall = time.monotonic(), time.time()
            await a.kill()
            await b.wait_metric("licensectl_leader", 1, timeout=LEASE["lease_duration_seconds"] + 5)
            takeover = time.monotonic() - killed
            # Long enough for every guest to have reported to the new leader and the silent one to
            # be judged by it (three intervals after the takeover), plus a margin.
            await asyncio.sleep(3 * REPORT_INTERVAL + 8)
            sb = await b.must_scrape()
            assert worker_gauges(sb) == held  # the same worker series, from the new leader
            assert sb.value("licensectl_guest_license_state", vmi="silent", state="unknown") == 1
            assert sb.value("licensectl_guest_license_state", vmi="unlicensed", state="unlicensed") == 1
            stop.set()
            await asyncio.gather(*tasks)
            # The export gap was real (the old leader's series went stale, the new leader judged
            # the silent guest only after its patience), so the alerts really had to bridge it.
            gap = await longest_gap(prom, 'licensectl_guest_license_state{vmi="silent",state="unknown"} == 1',
                                    killed_wall - 5, time.time())
            record_property("silent_guest_export_gap_seconds", round(gap, 1))
            record_property("takeover_seconds", round(takeover, 1))
            assert 3 * REPORT_INTERVAL <= gap <= takeover + 3 * REPORT_INTERVAL + 5, (gap, takeover)
            polls = log.during("failover")
            assert len(polls) >= 10
            for p in polls:
                now = {k: v for k, v in p.items() if k in firing}
                assert {k: (v.state, v.active_at) for k, v in now.items()} == {
                    k: ("firing", v.active_at) for k, v in firing.items()}, (takeover, brief(p))
                extra = brief({k: v for k, v in p.items() if k not in firing})
                # While no replica holds the Lease (the takeover), "no leader" is the truth; it may
                # turn pending, never firing (its `for` is far longer than a takeover).
                assert extra <= {("LicensectlDown", "", "no-leader", "pending")}, (takeover, extra)
            assert await b.stop() == 0
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if prom is not None:
            await prom.stop()
        guests.cleanup()


async def _no_tenant_problems(c: ControllerProcess) -> bool:
    s = await c.scrape()
    return s is not None and s.has("licensectl_tenant_problems") and s.value("licensectl_tenant_problems") == 0
