"""Rotation rollouts against the real apiserver and the KubeVirt simulator."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from licensectl.core.model import (
    ANN_RESTART_POLICY,
    ANN_RESTART_RESULT,
    ANN_RESTART_REVISION,
    ANN_REVISION_TIME,
    ANN_ROLLOUT_PAUSED,
    ANN_ROLLOUT_RESUMED_AT,
)
from licensectl.core.timecodec import format_micro_time, parse_time
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.vm_semantics import ANN_BOOT
from licensectl_dev.testkit.process import run_licensectl

from ..conftest import KubevirtEnv
from .support import (
    World,
    events_for,
    eventually,
    make_world,
    metric,
    running_app,
    wait_event,
    world_settings,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


@dataclass
class Fleet(World):
    """The world with its tenants and the KubeVirt simulator the rollouts restart VMs on."""

    kv: KubevirtEnv = field(kw_only=True)

    def settings(self, **kw: Any) -> Any:
        # The fleet's golden image is marked (allowlisted): routine restarts must write no Event at all.
        # No guests report here: a short report interval keeps the wait a controller that just started
        # takes before passing a restarted VM on readiness short (docs/design.md#evidence-after-takeover).
        base: dict[str, Any] = {"max_unavailable": "2", "max_per_namespace": 1, "restart_timeout_seconds": 30.0,
                                "log_level": "info", "vgpu_driver_images": fleet.GOLDEN_IMAGE,
                                "report_interval_seconds": 1.0}
        base.update(kw)
        return world_settings(self, self.kv.kubeconfig_path, **base)

    async def vm(self, ns: str, name: str, **kw: Any) -> None:
        # No license volume in the VM: the admission webhook adds it (the App registers it).
        await fleet.create_vm(self.api, ns, name, gpu_claims=["gpu"], **kw)

    async def vm_obj(self, ns: str, name: str) -> Any:
        return await CustomObjectsApi(self.api).get_namespaced_custom_object(
            "kubevirt.io", "v1", ns, "virtualmachines", name)

    async def vmi_obj(self, ns: str, name: str) -> Any:
        return await CustomObjectsApi(self.api).get_namespaced_custom_object(
            "kubevirt.io", "v1", ns, "virtualmachineinstances", name)

    async def ready(self, ns: str, name: str) -> bool:
        try:
            vmi = await self.vmi_obj(ns, name)
        except Exception:
            return False
        conds = (vmi.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


@pytest_asyncio.fixture(loop_scope="session")
async def rig(api_client: ApiClient, kubevirt: KubevirtEnv, namespace_factory: Any, cleanup: Any
              ) -> AsyncIterator[Fleet]:
    w = await make_world(api_client, namespace_factory, cleanup, token_days=1)
    f = Fleet(**vars(w), kv=kubevirt)
    for _ in range(3):
        await f.tenant(claim=True)
    yield f


async def boot_fleet(f: Fleet, per_tenant: int) -> list[tuple[str, str]]:
    """Replicas first (as in a real cluster, a VMI cannot start before its Secret exists), then VMs."""
    for ns in f.tenants:
        await eventually(lambda ns=ns: f.replica_revision(ns), what=f"replica in {ns}")
    # Timestamps have one-second resolution; a VMI started in the revision's own second counts as
    # stale (conservatively), so the fleet boots a moment after its replicas were written.
    await _sleep(1.1)
    vms = []
    for ns in f.tenants:
        for i in range(per_tenant):
            await f.vm(ns, f"vm{i}")
            vms.append((ns, f"vm{i}"))
    for ns, name in vms:
        await eventually(lambda ns=ns, name=name: f.ready(ns, name), what=f"{ns}/{name} ready")
    # Likewise a rotation comes a moment after the fleet is up: the revision time is stamped from the
    # controller's estimate of the apiserver clock, to the second, so a VMI that turned Running in the
    # rotation's own second may be judged started after it (docs/design.md#decision-stale-rule, known limit).
    await _sleep(1.1)
    return vms


async def wait_done(f: Fleet, vms: list[tuple[str, str]], revision: str, timeout: float = 90.0) -> None:
    async def all_done() -> bool:
        for ns, name in vms:
            ann = (await f.vm_obj(ns, name))["metadata"].get("annotations") or {}
            if ann.get(ANN_RESTART_REVISION) != revision or ann.get(ANN_RESTART_RESULT) != "done":
                return False
        return True

    await eventually(all_done, timeout=timeout, interval=0.25, what="every VM restarted and done")


async def test_rotation_restarts_each_stale_vmi_once_within_limits(rig: Fleet) -> None:
    f = rig
    async with running_app(f.settings()) as app:
        vms = await boot_fleet(f, per_tenant=3)
        await eventually(lambda: metric(app, "licensectl_rollout_vmis", {"state": "current"}) == 9.0,
                         what="all current before the rotation")
        assert not f.kv.record.restarts
        old_rev = await _rev_changed(f)
        await f.rotate(2)
        new_rev = await eventually(lambda: _rev_changed_from(f, old_rev), what="replicas rotated")
        # A VM created after the rotation is current and must never be restarted.
        late_ns = f.tenants[0]
        await eventually(lambda: _all_rev(f, new_rev), what="all replicas at the new revision")
        await _sleep(1.1)
        await f.vm(late_ns, "late")
        await wait_done(f, vms, new_rev)
        await eventually(lambda: f.ready(late_ns, "late"), what="late VM ready")
        await eventually(lambda: metric(app, "licensectl_rollout_vmis", {"state": "current"}) == 10.0,
                         what="all current after the rollout")

        # The CLI reads the same state from the cluster: complete -> exit 0; status JSON agrees.
        code, out = await cli(f, "rollout", "status", f"{f.source_ns}/nls-token")
        assert code == 0, out
        code, out = await cli(f, "status", "-o", "json")
        assert code == 0, out
        doc = json.loads(out)
        assert doc["rollouts"][f"{f.source_ns}/nls-token"]["current"] == 10
        assert doc["replicas"]["missing"] == 0

        # The duration histogram: the new revision's time (its earliest replica stamp) to the
        # RolloutCompleted Event, both on the apiserver's clock; one observation for one rollout.
        await wait_event(f.api, f.source_ns, "nls-token", "RolloutCompleted")
        written = min([await _revision_time(f, ns) for ns in f.tenants])
        completed = max(e.event_time or e.last_timestamp for e in await events_for(f.api, f.source_ns, "nls-token")
                        if e.reason == "RolloutCompleted")
        assert metric(app, "licensectl_rollout_duration_seconds_count") == 1.0
        observed = metric(app, "licensectl_rollout_duration_seconds_sum")
        assert observed is not None
        expected = (completed - written).total_seconds()
        assert expected - 1.0 <= observed <= expected + 1.0, (observed, expected)
    rec = f.kv.record
    for ns, name in vms:
        assert len(rec.restarts_for(ns, name)) == 1, f"{ns}/{name} restarted {len(rec.restarts_for(ns, name))}x"
    assert rec.restarts_for(late_ns, "late") == []
    # Only this test's tenants: the simulator watches the whole cluster, and an earlier test's
    # namespaces may still be terminating (their VMIs going away counts as unavailable there).
    mine = [iv for iv in rec.unavailable if iv.namespace in f.tenants]
    points = sorted([(iv.start, 1) for iv in mine] + [(iv.end or float("inf"), -1) for iv in mine],
                    key=lambda p: (p[0], p[1]))
    level = peak = 0
    for _, d in points:
        level += d
        peak = max(peak, level)
    assert peak <= 2, peak
    for ns in f.tenants:
        assert rec.max_concurrent_unavailable(ns) <= 1
    # Fairness (round-robin across tenants): every tenant got its first restart before any tenant got
    # its third. (Strictly "first three in three tenants" depends on the replicas' revision times,
    # which may fall in different seconds, making one tenant eligible a second later.)
    order = [r.namespace for r in sorted((r for r in rec.restarts if r.status == 202), key=lambda r: r.at)]
    firsts = [order.index(ns) for ns in f.tenants]
    thirds = [i for i, ns in enumerate(order) if order[: i + 1].count(ns) == 3]
    assert max(firsts) < min(thirds), order
    await wait_event(f.api, f.source_ns, "nls-token", "RolloutStarted", "RolloutCompleted")
    # Routine restarts write no Event (one write per change); they are counted in restarts_total.
    assert [e.reason for e in await events_for(f.api, vms[0][0], vms[0][1])] == []


async def _revision_time(f: Fleet, ns: str) -> dt.datetime:
    annotations = await f.replica_annotations(ns)
    when = parse_time(annotations.get(ANN_REVISION_TIME)) if annotations is not None else None
    assert when is not None
    return when


async def _rev_changed(f: Fleet) -> str | None:
    revs = {await f.replica_revision(ns) for ns in f.tenants}
    return revs.pop() if len(revs) == 1 else None


async def _all_rev(f: Fleet, rev: str) -> bool:
    return all([await f.replica_revision(ns) == rev for ns in f.tenants])


async def test_standalone_vmi_blocked_and_manual_vm_pending_then_overdue(rig: Fleet) -> None:
    f = rig
    offset = [0.0]

    def clock() -> dt.datetime:
        return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset[0])

    ns = f.tenants[0]
    async with running_app(f.settings(manual_deadline_seconds=3600.0), clock=clock) as app:
        for t in f.tenants:
            await eventually(lambda t=t: f.replica_revision(t), what="replica")
        await _sleep(1.1)
        await f.vm(ns, "manual", annotations={ANN_RESTART_POLICY: "manual"})
        vmi_body = fleet.vm_body(ns, "lonely", license_secret=f.replica)["spec"]["template"]
        await CustomObjectsApi(f.api).create_namespaced_custom_object(
            "kubevirt.io", "v1", ns, "virtualmachineinstances",
            {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
             "metadata": {"name": "lonely", "namespace": ns}, "spec": vmi_body["spec"]})
        await eventually(lambda: f.ready(ns, "manual"), what="manual VM ready")
        lonely_uid = (await f.vmi_obj(ns, "lonely"))["metadata"]["uid"]
        await f.rotate(3)
        await eventually(lambda: metric(app, "licensectl_rollout_vmis", {"state": "blocked"}) == 1.0,
                         what="standalone VMI blocked")
        await eventually(lambda: metric(app, "licensectl_rollout_vmis", {"state": "manual"}) == 1.0,
                         what="manual VM pending")
        assert metric(app, "licensectl_rollout_vmis", {"state": "overdue"}) == 0.0
        # Two hours later the manual VM is overdue; nothing was restarted or deleted.
        offset[0] = 7200.0
        app._roll_trigger.set()
        await eventually(lambda: metric(app, "licensectl_rollout_vmis", {"state": "overdue"}) == 1.0,
                         what="manual VM overdue")
        status = app.status()["rollout"]["vmis"]
        manual = next(v for v in status if v["vmi"] == "manual")
        assert manual["state"] == "manual" and manual["overdue"] is True
        await wait_event(f.api, ns, "lonely", "RestartBlocked")
    assert f.kv.record.restarts_for(ns, "manual") == []
    assert (await f.vmi_obj(ns, "lonely"))["metadata"]["uid"] == lonely_uid


async def test_failure_budget_pauses_then_resume_continues(rig: Fleet) -> None:
    f = rig
    async with running_app(f.settings(max_failures=2, restart_timeout_seconds=4.0, max_unavailable="1")) as app:
        vms = await boot_fleet(f, per_tenant=2)
        # From now on, restarted VMIs of tenant 0 and 1 hang in Scheduling (never Ready).
        co = CustomObjectsApi(f.api)
        for ns in f.tenants[:2]:
            for i in range(2):
                await co.patch_namespaced_custom_object(
                    "kubevirt.io", "v1", ns, "virtualmachines", f"vm{i}",
                    {"spec": {"template": {"metadata": {"annotations": {ANN_BOOT: "hang"}}}}},
                    _content_type="application/merge-patch+json")
        await f.rotate(4)
        source = ("source_namespace", f.source_ns)
        await eventually(lambda: metric(app, "licensectl_rollout_paused", {source[0]: source[1], "reason": "failures"})
                         == 1.0, timeout=60, what="rollout paused by failures")
        issued = len([r for r in f.kv.record.restarts if r.status == 202])
        await wait_event(f.api, f.source_ns, "nls-token", "RolloutPaused")
        # Paused: no new restarts while it stays paused.
        await _sleep(3)
        assert len([r for r in f.kv.record.restarts if r.status == 202]) == issued
        # The hoster fixes the VMs and resumes.
        for ns in f.tenants[:2]:
            for i in range(2):
                await co.patch_namespaced_custom_object(
                    "kubevirt.io", "v1", ns, "virtualmachines", f"vm{i}",
                    {"spec": {"template": {"metadata": {"annotations": {ANN_BOOT: None}}}}},
                    _content_type="application/merge-patch+json")
        await CoreV1Api(f.api).patch_namespaced_secret("nls-token", f.source_ns, {"metadata": {"annotations": {
            ANN_ROLLOUT_RESUMED_AT: format_micro_time(dt.datetime.now(dt.UTC))}}})
        await eventually(lambda: metric(app, "licensectl_rollout_paused", {source[0]: source[1], "reason": "failures"})
                         == 0.0, timeout=30, what="rollout resumed")
        # The rest of the fleet is rolled out; the two hung guests stay failed for the hoster to look at.
        await eventually(lambda: metric(app, "licensectl_rollout_vmis", {"state": "stale"}) == 0.0
                         and metric(app, "licensectl_rollout_vmis", {"state": "restarting"}) == 0.0,
                         timeout=120, what="rollout finishes the remaining VMs after resume")
        assert metric(app, "licensectl_rollout_vmis", {"state": "failed"}) == 2.0
        assert metric(app, "licensectl_rollout_vmis", {"state": "current"}) == float(len(vms) - 2)
    for ns, name in vms:
        assert len(f.kv.record.restarts_for(ns, name)) == 1, f"{ns}/{name}"


async def test_manual_pause_switch_and_supersede(rig: Fleet) -> None:
    f = rig
    async with running_app(f.settings(max_unavailable="1")) as app:
        vms = await boot_fleet(f, per_tenant=2)
        core = CoreV1Api(f.api)
        await core.patch_namespaced_secret("nls-token", f.source_ns,
                                           {"metadata": {"annotations": {ANN_ROLLOUT_PAUSED: "true"}}})
        await f.rotate(5)
        await eventually(lambda: metric(app, "licensectl_rollout_paused",
                                        {"source_namespace": f.source_ns, "reason": "manual"}) == 1.0,
                         what="paused by the hoster")
        await _sleep(3)
        assert not [r for r in f.kv.record.restarts if r.status == 202]
        code, out = await cli(f, "rollout", "status", f"{f.source_ns}/nls-token")
        assert code == 4 and "paused" in out, out  # 4: paused (docs/operations.md#cli-exit-codes)
        # Unpause: the rollout runs; a second rotation mid-rollout supersedes the first.
        await core.patch_namespaced_secret("nls-token", f.source_ns,
                                           {"metadata": {"annotations": {ANN_ROLLOUT_PAUSED: None}}})
        await eventually(lambda: len([r for r in f.kv.record.restarts if r.status == 202]) >= 1,
                         what="first restart")
        first_rev = await _rev_changed(f)
        await f.rotate(6)
        await eventually(lambda: _rev_changed_from(f, first_rev), what="second rotation written")
        # Every VM ends current on the newest revision. A VM restarted for the first revision after the
        # second was written is already current and is not restarted again, so it may carry no
        # intent for the newest revision: judge by the rollout state, not by annotations.
        source = {"source_namespace": f.source_ns}
        await eventually(lambda: metric(app, "licensectl_rollout_vmis", {**source, "state": "current"})
                         == float(len(vms))
                         and metric(app, "licensectl_rollout_vmis", {**source, "state": "stale"}) == 0.0
                         and metric(app, "licensectl_rollout_vmis", {**source, "state": "restarting"}) == 0.0,
                         timeout=120, what="every VM current on the newest revision")
    rec = f.kv.record
    # Every VM is on the newest revision; none was restarted more than twice (once per revision).
    for ns, name in vms:
        assert 1 <= len(rec.restarts_for(ns, name)) <= 2


async def _rev_changed_from(f: Fleet, old: str | None) -> str | None:
    """The revision every tenant's replica agrees on, once it differs from `old`."""
    rev = await _rev_changed(f)
    return rev if rev != old else None


async def cli(f: Fleet, *argv: str) -> tuple[int, str]:
    """Run the real `licensectl` command against the cluster (admin kubeconfig through the proxy)."""
    r = await run_licensectl(*argv, kubeconfig=f.kv.kubeconfig_path, env={
        "LICENSECTL_NAMESPACE": f.controller_ns, "LICENSECTL_ROOT_TENANT": f.root_name})
    return r.code, r.out


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)
