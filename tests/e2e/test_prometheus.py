"""A real Prometheus scrapes a real `licensectl run` driving a fleet; every dashboard query returns data.

The fleet has what every panel needs: tenants with licensed, unlicensed, expiring and silent guests
(the real probe script reporting through the real endpoint; the silent one stops reporting after the
rotation, since a VMI that never reported is not judged within its boot allowance), a rotation
rollout, a second source whose rollout is in progress and paused, an invalid source, a source whose
token is not a JWT and whose rotation rollout completes, a broken tenant link and a watch interrupted
mid-stream. One tenant's VMs hang when restarted: the first rotation's restart there fails and pauses
that tenant's part of it, the second source's is still hanging when the hoster pauses that rollout.
Another tenant's VM has a volume under licensectl's volume name, so the webhook admits it without its
license volume and the backstop reports it undeliverable. A tenant cluster's worker sits mid-drain,
its cluster unreachable (held). Prometheus loads the shipped alert rules
(the PrometheusRule's `.spec`).

A licensed, an unlicensed ("No pool features found"), a wrong-product (a vWS license held under a
FeatureType 4 class) and a silent guest each have a Windows twin reporting as the Windows agent does
(`os: windows`, its UTC offset, the recorded Windows licensing log in local time): each twin raises
exactly the alerts (names, severity, labels) its Linux twin raises.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime as dt
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from licensectl.core import drain
from licensectl.core.delivery import volume_name
from licensectl.core.model import ANN_ROLLOUT_PAUSED, LABEL_CAPI_CLUSTER_NAME, LABEL_CAPI_ROLE
from licensectl.core.render import replica_name
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster import webhook as webhook_registration
from licensectl_dev.devcluster.controlplane import ControlPlane
from licensectl_dev.devcluster.guest_sim import WINDOWS_LICENSED_LOG, GuestProfile, SimulatedGuest
from licensectl_dev.devcluster.vm_semantics import ANN_BOOT
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.world import unique

from ..conftest import KubevirtFactory
from .support import (
    Prometheus,
    RecordingProxy,
    controllers,
    make_fleet,
    start_controller,
    start_prometheus,
)

# Starts `licensectl run` and Prometheus itself: cluster tier even if its fixtures change.
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "licensectl.json"
RULE = ROOT / "manifests" / "components" / "monitoring" / "prometheusrule.yaml"
REPORT_INTERVAL = 5.0
# A hung restart fails after this; one failure pauses its namespace (docs/design.md#failure-budget-per-tenant).
# Source A's hung restart must fail before the panels are queried, source B's (issued after it) must not: B's
# restart comes a whole timeout after A's, and the queries follow it within about 25 s.
RESTART_TIMEOUT = 60.0
# Grafana's $__rate_interval is max($__interval + scrape interval, 4 x scrape interval); with a 1 s
# scrape and a short test, a few scrape intervals. $__range: the whole test fits in it.
GRAFANA_VARS = {"__rate_interval": "10s", "__range": "10m", "__interval": "1s"}
# Linux guest -> its Windows twin.
TWINS = {"licensed": "win-licensed", "unlicensed": "win-unlicensed", "silent": "win-silent", "wrong": "win-wrong"}


def panel_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())

    def walk(panels: list[dict[str, Any]]) -> Any:
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))

    return [(f"{p.get('title')} [{t.get('refId')}]", t["expr"]) for p in walk(dash["panels"])
            for t in p.get("targets", []) if t.get("expr")]


def template_queries() -> dict[str, tuple[str, str]]:
    """Query variables: name -> (metric, label) of their label_values() query."""
    dash = json.loads(DASHBOARD.read_text())
    out = {}
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", v["query"]["query"])
            assert m, v["query"]
            out[v["name"]] = (m.group(1), m.group(2))
    return out


def substitute(expr: str, values: dict[str, str]) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"unknown template variable ${name} in {expr}"
        return values[name]

    out = re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)
    return out


def alert_names() -> set[str]:
    spec = yaml.safe_load(RULE.read_text())["spec"]
    return {r["alert"] for g in spec["groups"] for r in g["rules"] if "alert" in r}


def write_prometheus_config(directory: Path, metrics_port: int, namespace: str) -> Path:
    rules = directory / "licensectl.rules.yaml"
    doc = yaml.safe_load(RULE.read_text())
    assert doc["kind"] == "PrometheusRule"
    rules.write_text(yaml.safe_dump(doc["spec"], sort_keys=False))
    cfg = directory / "prometheus.yml"
    # The labels the ServiceMonitor's scrape would attach (namespace, pod, job containing "licensectl"),
    # and its honorLabels: a guest series keeps its own `namespace`, the VM's.
    cfg.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "licensectl-metrics", "honor_labels": True, "static_configs": [{
            "targets": [f"127.0.0.1:{metrics_port}"],
            "labels": {"namespace": namespace, "pod": "licensectl-0", "container": "licensectl"}}]}],
    }, sort_keys=False))
    return cfg


async def probe_forever(guests: list[SimulatedGuest], stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.gather(*(g.probe() for g in guests))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.5)


async def admit_until(api: ApiClient, namespace: str, stop: asyncio.Event) -> None:
    """A dry-run VMI create in `namespace` every second: the admission path, without a VMI."""
    while not stop.is_set():
        await webhook_registration.wait_delivery(api, namespace=namespace, claim="gpu")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1)


async def rules_healthy(prom: Prometheus, names: set[str]) -> bool:
    groups = (await prom.get("/api/v1/rules"))["groups"]
    rules = [r for g in groups for r in g["rules"] if r["type"] == "alerting"]
    return {r["name"] for r in rules} == names and all(r["health"] == "ok" for r in rules)


async def test_every_dashboard_panel_and_alert_rule_works_against_a_live_controller(
        api_client: ApiClient, control_plane: ControlPlane, kubevirt_factory: KubevirtFactory,
        namespace_factory: Any, cleanup: Any, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus not installed: run scripts/install-system-deps"
    kv = await kubevirt_factory(ready_delay=0.3)
    fl = await make_fleet(api_client, namespace_factory, cleanup)
    co = CustomObjectsApi(api_client)
    guest_ns, problem_ns, hang_ns = fl.tenants

    # A second source, claimed by one tenant, whose rollout will hang and be paused.
    cls_b = unique("vcs")
    await fleet.put_source_secret(api_client, fl.source_ns, "nls-b", token=fleet.fake_token(int(dt.datetime.now(
        dt.UTC).timestamp()) + 86400 * 10))
    await fleet.create_gpu_class(api_client, cls_b, mode="vgpu", secret=(fl.source_ns, "nls-b"))
    cleanup(lambda: fleet.delete_gpu_class(api_client, cls_b))
    await fleet.create_claim(api_client, hang_ns, "gpu-b", class_name=cls_b)
    # An invalid source, and a namespace that looks like a tenant but has no parent link.
    cls_bad = unique("bad")
    await fleet.create_gpu_class(api_client, cls_bad, mode="vgpu", secret=(fl.source_ns, "does-not-exist"))
    cleanup(lambda: fleet.delete_gpu_class(api_client, cls_bad))
    await fleet.create_claim(api_client, problem_ns, "gpu-bad", class_name=cls_bad)
    # A valid source whose token is not a JWT (probably the wrong file), claimed by a tenant.
    cls_opaque = unique("opq")
    await fleet.put_source_secret(api_client, fl.source_ns, "nls-opaque", token=b"opaque-not-a-jwt")
    await fleet.create_gpu_class(api_client, cls_opaque, mode="vgpu", secret=(fl.source_ns, "nls-opaque"))
    cleanup(lambda: fleet.delete_gpu_class(api_client, cls_opaque))
    await fleet.create_claim(api_client, problem_ns, "gpu-opaque", class_name=cls_opaque)
    # A class for Virtual Compute Server (FeatureType 4) whose guests hold vWS licenses: the wrong product.
    cls_vcs = unique("vcs4")
    await fleet.put_source_secret(api_client, fl.source_ns, "nls-vcs", token=fleet.fake_token(int(dt.datetime.now(
        dt.UTC).timestamp()) + 86400 * 10))
    await fleet.create_gpu_class(api_client, cls_vcs, mode="vgpu", secret=(fl.source_ns, "nls-vcs"), feature_type=4)
    cleanup(lambda: fleet.delete_gpu_class(api_client, cls_vcs))
    await fleet.create_claim(api_client, guest_ns, "gpu-vcs", class_name=cls_vcs)
    # A Secret of the tenant's own, mounted under the name the webhook would give the license volume.
    await CoreV1Api(api_client).create_namespaced_secret(problem_ns, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "app-config"}, "data": {}})
    orphan = await namespace_factory(name=f"tenant-{unique('orphan')}", labels={
        f"{fleet.TENANT_LABEL_PREFIX}{fl.root_name}": "", fleet.VGPU_LABEL: "true"})
    await fleet.create_claim(api_client, orphan, "gpu", class_name=fl.cls)

    proxy = RecordingProxy(kv.proxy.url, control_plane.ca_path)
    await proxy.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(proxy.kubeconfig(control_plane.admin_token))
    kubeconfig.chmod(0o600)
    guests: list[SimulatedGuest] = []
    stop_probes = asyncio.Event()
    stop_admissions = asyncio.Event()
    prom: Prometheus | None = None
    try:
        async with controllers() as started:
            c = await start_controller("licensectl-0", kubeconfig, fl.controller_ns, tmp_path,
                                       leader_elect=True, root_tenant=fl.root_name, max_unavailable="2",
                                       report_url="http://127.0.0.1:1/v1/reports",
                                       report_interval_seconds=REPORT_INTERVAL, webhook_api=api_client,
                                       restart_timeout_seconds=RESTART_TIMEOUT, max_failures=1)
            started.append(c)
            await c.wait_metric("licensectl_leader", 1)
            data = tmp_path / "prometheus"
            data.mkdir()
            prom = await start_prometheus(binary, write_prometheus_config(tmp_path, c.metrics_port,
                                                                          fl.controller_ns), data / "tsdb")
            await eventually(lambda: rules_healthy(prom, alert_names()), timeout=30,
                             what="every shipped alert rule loaded and evaluated")

            # The fleet: seven guests of source A in one tenant (four Linux, three of their Windows twins) and
            # a Linux/Windows pair of the FeatureType 4 class; in another one VM of source B and one of
            # source A, both hanging when restarted; in a third a VM of source A the webhook cannot deliver
            # to and a VM of the source whose token is not a JWT.
            await eventually(fl.revision, timeout=30, what="replicas")
            await eventually(lambda: _replica(api_client, hang_ns, cls_b), timeout=30, what="replica B")
            await eventually(lambda: _replica(api_client, guest_ns, cls_vcs), timeout=30, what="replica vcs")
            await asyncio.sleep(1.1)
            # Linux twins log what the recorded Windows logs hold (journals derived from them).
            licensed = dataclasses.replace(GuestProfile.expiring(dt.datetime.now(dt.UTC) + dt.timedelta(days=20)),
                                           gridd_log=WINDOWS_LICENSED_LOG)
            profiles = {
                "licensed": licensed,
                "unlicensed": GuestProfile.unlicensed_no_pool(),
                "expiring": GuestProfile.expiring(dt.datetime.now(dt.UTC) + dt.timedelta(hours=6)),
                # Reports until after the rotation, then falls silent (set_profile below).
                "silent": licensed,
            }
            profiles.update({TWINS[n]: profiles[n].on_windows() for n in ("licensed", "unlicensed", "silent")})
            wrong_product = {"wrong": licensed, TWINS["wrong"]: licensed.on_windows()}
            # No license volume in the VMs: the webhook adds it (every replica answers admission).
            await webhook_registration.wait_delivery(api_client, namespace=guest_ns, claim="gpu")
            await webhook_registration.wait_delivery(api_client, namespace=guest_ns, claim="gpu-vcs")
            await webhook_registration.wait_delivery(api_client, namespace=hang_ns, claim="gpu-b")
            await webhook_registration.wait_delivery(api_client, namespace=hang_ns, claim="gpu")
            await webhook_registration.wait_delivery(api_client, namespace=problem_ns, claim="gpu")
            await webhook_registration.wait_delivery(api_client, namespace=problem_ns, claim="gpu-opaque")
            for name in profiles:
                await fleet.create_vm(api_client, guest_ns, name, gpu_claims=["gpu"])
            for name in wrong_product:
                await fleet.create_vm(api_client, guest_ns, name, gpu_claims=["gpu-vcs"])
            await fleet.create_vm(api_client, hang_ns, "hang", gpu_claims=["gpu-b"])
            await fleet.create_vm(api_client, hang_ns, "hang-a", gpu_claims=["gpu"])
            await fleet.create_vm(api_client, problem_ns, "opaque", gpu_claims=["gpu-opaque"])
            taken = fleet.vm_body(problem_ns, "taken", gpu_claims=["gpu"])
            spec = taken["spec"]["template"]["spec"]
            spec["volumes"].append({"name": volume_name(fl.cls), "secret": {"secretName": "app-config"}})
            spec["domain"]["devices"]["disks"].append({"name": volume_name(fl.cls), "disk": {"bus": "virtio"}})
            await co.create_namespaced_custom_object("kubevirt.io", "v1", problem_ns, "virtualmachines", taken)
            # A tenant cluster's worker caught mid-drain when its cluster became unreachable (its kubeconfig
            # Secret is gone): licensectl cannot tell whether the Node is still cordoned, so the cycle stays
            # open and held (the worker panels and LicensectlWorkerDrainBlocked have their data).
            since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
            await fleet.create_vm(api_client, problem_ns, "gone-md-0", labels={
                LABEL_CAPI_CLUSTER_NAME: "gone", LABEL_CAPI_ROLE: "worker"},
                annotations=drain.DrainIntent(drain.Step.DRAIN, "r0", since, since, node="gone-md-0",
                                              cordoned=True).render_annotations())
            for name in [*profiles, *wrong_product]:
                await eventually(lambda name=name: fl.ready(guest_ns, name), timeout=30, what=f"{name} ready")
            await eventually(lambda: fl.ready(hang_ns, "hang"), timeout=30, what="hang ready")
            await eventually(lambda: fl.ready(hang_ns, "hang-a"), timeout=30, what="hang-a ready")
            await eventually(lambda: fl.ready(problem_ns, "taken"), timeout=30, what="taken ready")
            await eventually(lambda: fl.ready(problem_ns, "opaque"), timeout=30, what="opaque ready")
            await c.wait_metric("licensectl_vmis_delivery_blocked", 1, timeout=30, namespace=problem_ns,
                                reason="volume_name_taken")
            await c.wait_metric("licensectl_webhook_skipped_total", 1, reason="volume_name_taken")
            await c.wait_metric("licensectl_worker_drain_blocked", 1, timeout=30, namespace=problem_ns,
                                vm="gone-md-0", reason="ClusterUnreachable")

            async def boot_guests() -> None:
                for g in guests:
                    assert await g.boot(api_client, report_url=c.reports_url) == 0, g.last_stderr

            guests.extend(SimulatedGuest(guest_ns, name, p) for name, p in {**profiles, **wrong_product}.items())
            await boot_guests()
            prober = asyncio.create_task(probe_forever(guests, stop_probes))
            for vmi in ("unlicensed", TWINS["unlicensed"]):
                await c.wait_metric("licensectl_guest_license_state", 1, namespace=guest_ns, vmi=vmi,
                                    state="unlicensed")

            # A watch cut mid-stream (a load balancer or apiserver restart): informers resume.
            assert proxy.sever() > 0
            # Rotation of source A: a rollout that completes while Prometheus watches, except in the
            # hanging tenant, whose restart fails and pauses that tenant's part of it.
            await _hang_on_restart(co, hang_ns, "hang-a")
            old = await fl.revision()
            await fl.rotate(1)
            new = await eventually(lambda: _changed(fl, old), timeout=30, what="replicas rotated")
            vms = [(guest_ns, n) for n in profiles]
            await eventually(lambda: fl.all_done(vms, new), timeout=60, interval=0.25, what="rollout A done")
            await boot_guests()  # the restarted guests install the new token at boot
            # The silent guest stops reporting: "not reporting" three report intervals later (a guest that
            # never reported would not be judged within its boot allowance, longer than this test).
            for vmi in ("silent", TWINS["silent"]):
                await c.wait_metric("licensectl_guest_license_state", 1, timeout=20, namespace=guest_ns, vmi=vmi,
                                    state="licensed")
            for g in guests:
                if g.vmi in ("silent", TWINS["silent"]):
                    g.set_profile(GuestProfile.quiet())
            # Rotation of the source whose token is not a JWT: a rollout that completes (rollout A stays
            # paused in the hanging tenant), so the rollout duration histogram has an observation.
            await fleet.put_source_secret(api_client, fl.source_ns, "nls-opaque", token=b"opaque-not-a-jwt-2")
            await c.wait_metric("licensectl_rollout_duration_seconds_count", 1, timeout=60)
            await c.wait_metric("licensectl_rollout_namespace_paused", 1, timeout=RESTART_TIMEOUT + 30,
                                source_name=fl.source_name, namespace=hang_ns)

            # Source B: its only VM hangs when restarted; the hoster pauses that rollout.
            await _hang_on_restart(co, hang_ns, "hang")
            token_b = fleet.fake_token(int(dt.datetime.now(dt.UTC).timestamp()) + 86400 * 300)
            await CoreV1Api(api_client).patch_namespaced_secret("nls-b", fl.source_ns, {"data": {
                "client_configuration_token.tok": base64.b64encode(token_b).decode()}})
            await eventually(lambda: kv.record.restarts_for(hang_ns, "hang"), timeout=30,
                             what="restart of the hanging VM issued")
            await CoreV1Api(api_client).patch_namespaced_secret("nls-b", fl.source_ns, {
                "metadata": {"annotations": {ANN_ROLLOUT_PAUSED: "true"}}})
            await c.wait_metric("licensectl_rollout_paused", 1, timeout=20, source_name="nls-b", reason="manual")
            await asyncio.sleep(2)
            assert proxy.sever() > 0  # a second cut, so the restart counter really increases
            await c.wait_metric("licensectl_guest_license_state", 1, timeout=20, namespace=guest_ns,
                                vmi="licensed", state="licensed")
            s = await c.must_scrape()
            assert s.value("licensectl_watch_restarts_total") >= 2
            assert s.value("licensectl_tenant_problems") >= 1
            # The webhook latency panel is a rate over its window: NaN when no VMI was admitted in it. The
            # fleet's admissions ended a while ago (later on a busy machine), so keep some coming.
            admissions = asyncio.create_task(admit_until(api_client, guest_ns, stop_admissions))
            await asyncio.sleep(12)  # a few rate windows of samples

            # Every panel query returns data, with "All" selected and with one tenant/source picked.
            tenants = await prom.get("/api/v1/label/tenant/values", **{"match[]": "licensectl_guests"})
            assert guest_ns in tenants
            variables = {}
            for var, (metric, label) in template_queries().items():
                values = await prom.get(f"/api/v1/label/{label}/values", **{"match[]": metric})
                assert values, f"template variable ${var}: label_values({metric}, {label}) is empty"
                variables[var] = values
            empty: list[str] = []
            nan: list[str] = []
            for pick in ("all", "one"):
                chosen = {v: ".*" if pick == "all" else (guest_ns if v == "tenant" else "nls-token")
                          for v in variables}
                for title, expr in panel_queries():
                    q = substitute(expr, {**GRAFANA_VARS, **chosen})
                    result = await prom.query(q)
                    if not result:
                        empty.append(f"{pick}: {title}: {q}")
                    elif all(r["value"][1] == "NaN" for r in result):
                        nan.append(f"{pick}: {title}: {q}")
            assert empty == [], "panels without data:\n" + "\n".join(empty)
            stop_admissions.set()
            await admissions
            assert nan == [], "panels with only NaN:\n" + "\n".join(nan)

            # The numbers are the fleet's: five licensed guests (licensed, expiring, the wrong-product pair and
            # a Windows twin), two unlicensed, two not reporting (the silent twins: the VMs that never reported
            # are still within their boot allowance), one leader, two paused rollouts (A in the hanging
            # tenant, B by hand), one invalid source.
            async def scalar(expr: str) -> float:
                r = await prom.query(substitute(expr, {**GRAFANA_VARS, "tenant": ".*", "source": ".*"}))
                assert len(r) == 1, (expr, r)
                return float(r[0]["value"][1])

            by_title = {t.split(" [")[0]: e for t, e in panel_queries()}
            assert await scalar(by_title["Licensed guests"]) == 5
            assert await scalar(by_title["Unlicensed guests"]) == 2
            assert await scalar(by_title["Not reporting"]) == 2
            assert await scalar(by_title["Leaders"]) == 1
            assert await scalar(by_title["Targets up"]) == 1
            assert await scalar(by_title["Rollouts paused"]) == 2
            assert await scalar(by_title["Invalid sources"]) == 1
            assert await scalar(by_title["Broken tenant links"]) >= 1

            # The shipped alerts evaluate against the live series: the right ones are pending.
            active = {a["labels"]["alertname"] for a in (await prom.get("/api/v1/alerts"))["alerts"]
                      if a["state"] in ("pending", "firing")}
            assert {"LicensectlGuestUnlicensed", "LicensectlGuestNotReporting", "LicensectlSourceInvalid",
                    "LicensectlTenantLinkBroken", "LicensectlRolloutPaused",
                    "LicensectlWorkerDrainBlocked"} <= active, active
            assert "LicensectlDown" not in active
            await _windows_twins_raise_the_same_alerts(prom, guest_ns)
            stop_probes.set()
            await prober
            assert await c.stop() == 0
    finally:
        stop_probes.set()
        stop_admissions.set()
        if prom is not None:
            await prom.stop()
        await proxy.stop()
        for g in guests:
            g.cleanup()


async def _windows_twins_raise_the_same_alerts(prom: Prometheus, namespace: str) -> None:
    """Each Windows twin's active (pending or firing) alerts equal its Linux twin's, labels and all but
    `vmi`, at one evaluation; so do their license states. Both twins went through the same steps at
    the same time, so a short wait covers their reports landing in different evaluations."""
    Alerts = dict[str, set[tuple[tuple[str, str], ...]]]

    async def observe() -> tuple[Alerts, Alerts]:
        alerts: Alerts = {vmi: set() for pair in TWINS.items() for vmi in pair}
        for a in (await prom.get("/api/v1/alerts"))["alerts"]:
            labels = dict(a["labels"])
            vmi = labels.pop("vmi", None)
            if a["state"] in ("pending", "firing") and labels.get("namespace") == namespace and vmi in alerts:
                alerts[vmi].add(tuple(sorted(labels.items())))
        states: Alerts = {vmi: set() for vmi in alerts}
        for r in await prom.query(f'licensectl_guest_license_state{{namespace="{namespace}"}} == 1'):
            if r["metric"].get("vmi") in states:
                states[r["metric"]["vmi"]].add((("state", r["metric"]["state"]),))
        return alerts, states

    last: tuple[Alerts, Alerts] = ({}, {})
    for _ in range(20):
        last = await observe()
        if all(seen[linux] == seen[windows] for seen in last for linux, windows in TWINS.items()):
            break
        await asyncio.sleep(1)
    alerts, states = last
    for linux, windows in TWINS.items():
        assert alerts[windows] == alerts[linux], (linux, alerts[linux], windows, alerts[windows])
        assert states[windows] == states[linux] != set(), (linux, states[linux], windows, states[windows])
    # The comparison has teeth: the twins' conditions differ from each other and all but the licensed
    # pair raise guest alerts.
    assert len({frozenset(alerts[linux]) for linux in TWINS}) == len(TWINS), alerts
    assert all(alerts[linux] for linux in TWINS if linux != "licensed"), alerts


async def _hang_on_restart(co: CustomObjectsApi, ns: str, vm: str) -> None:
    """The VM's next VMI never boots (its running VMI is unaffected)."""
    await co.patch_namespaced_custom_object(
        "kubevirt.io", "v1", ns, "virtualmachines", vm,
        {"spec": {"template": {"metadata": {"annotations": {ANN_BOOT: "hang"}}}}},
        _content_type="application/merge-patch+json")


async def _replica(api: ApiClient, ns: str, cls: str) -> bool:
    try:
        await CoreV1Api(api).read_namespaced_secret(replica_name(cls), ns)
        return True
    except Exception:
        return False


async def _changed(fl: Any, old: str | None) -> str | None:
    rev: str | None = await fl.revision()
    return rev if rev is not None and rev != old else None
