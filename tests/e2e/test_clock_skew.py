"""A controller whose clock is wrong still restarts every stale VMI exactly once.

Rollouts compare revision times (stamped by licensectl) with VMI start times (stamped by the
cluster). licensectl judges both on the apiserver's clock (Date headers, kube/server_clock.py), so a
controller host whose clock is minutes off neither restarts a VM again and again (clock ahead) nor
misses one (clock behind). The controller runs under libfaketime (Debian package `faketime`), the
real apiserver and simulator on the true clock.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from licensectl_dev.devcluster.controlplane import ControlPlane
from licensectl_dev.testkit.poll import eventually

from ..conftest import KubevirtFactory
from .support import controllers, make_fleet, start_controller

# Starts `licensectl run` processes itself: cluster tier even if its fixtures change.
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]


# Only "ahead": with the clock behind, the fresh test certificates are not yet valid for the
# controller (TLS fails before licensectl runs); the offset logic is symmetric and unit-tested
# (tests/unit/kube/test_server_clock.py).
@pytest.mark.parametrize("skew", ["+300s"])
async def test_rollout_is_exact_with_a_skewed_controller_clock(
        skew: str, api_client: ApiClient, control_plane: ControlPlane, kubevirt_factory: KubevirtFactory,
        namespace_factory: Any, cleanup: Any, tmp_path: Path) -> None:
    faketime = shutil.which("faketime")
    assert faketime, "install the Debian package faketime (scripts/install-system-deps does)"
    kv = await kubevirt_factory(ready_delay=0.5)
    fl = await make_fleet(api_client, namespace_factory, cleanup, tenants=2)
    async with controllers() as started:
        c = await start_controller(
            "skewed", kv.kubeconfig_path, fl.controller_ns, tmp_path, wrapper=[faketime, "-f", skew],
            extra_env={"FAKETIME_DONT_FAKE_MONOTONIC": "1"}, root_tenant=fl.root_name, settle_seconds=3,
            max_unavailable="2", restart_timeout_seconds=60, webhook_api=api_client)
        started.append(c)
        await c.wait_metric("licensectl_ready", 1)
        vms = await fl.boot(per_tenant=2)
        await c.wait_metric("licensectl_rollout_vmis", 4.0, state="current")
        assert not [r for r in kv.record.restarts if r.status == 202], "nothing is stale before a rotation"
        old = await fl.revision()
        await fl.rotate(2)

        async def new_revision() -> str | None:
            rev = await fl.revision()
            return rev if rev and rev != old else None

        rev = await eventually(new_revision, timeout=30, what="replicas rotated")
        await eventually(lambda: fl.all_done(vms, rev), timeout=90, interval=0.5, what="every VM restarted and done")
        # Settle a little longer than a few passes: a clock-ahead controller would restart again here.
        await c.wait_metric("licensectl_rollout_vmis", 4.0, state="current")
        await asyncio.sleep(5)
    counts = {f"{ns}/{name}": len(kv.record.restarts_for(ns, name)) for ns, name in vms}
    assert counts == dict.fromkeys(counts, 1), counts
