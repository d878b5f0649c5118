"""`--guest-metrics per-tenant` on a running controller: real reports, no per-VMI series, the
per-tenant counts keyed by the Cozystack customer (the top-level tenant of a sub-tenant's guest)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from licensectl.core.render import replica_name
from licensectl.metrics import SNAPSHOT_GAUGES
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster import webhook as webhook_registration
from licensectl_dev.devcluster.guest_sim import GuestProfile, SimulatedGuest

from ..conftest import KubevirtEnv
from .support import boot_guests, eventually, make_world, metric, read_secret, running_app, settings_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

PER_VMI = sorted(f"licensectl_{n}" for n in SNAPSHOT_GAUGES if n.startswith("guest_"))


async def test_per_tenant_mode_keeps_only_the_customer_counts(
        api_client: ApiClient, kubevirt: KubevirtEnv, namespace_factory: Any, cleanup: Any) -> None:
    w = await make_world(api_client, namespace_factory, cleanup)
    customer = await w.tenant()
    sub = (await w.tenant(parent=customer, claim=True))["metadata"]["name"]
    settings = settings_for(kubevirt.kubeconfig_path, w.controller_ns, root_tenant=w.root_name,
                            guest_metrics="per-tenant")
    guests: list[SimulatedGuest] = []
    async with running_app(settings) as app:
        url = f"https://127.0.0.1:{app.reports_port}/v1/reports"
        await eventually(lambda: read_secret(api_client, sub, replica_name(w.cls)), what="replica")
        await asyncio.sleep(1.1)
        profiles = {"good": GuestProfile.licensed(), "bad": GuestProfile.unlicensed()}
        await webhook_registration.wait_delivery(api_client, namespace=sub, claim="gpu")
        for name in profiles:  # no license volume in the VM: the webhook adds it
            await fleet.create_vm(api_client, sub, name, gpu_claims=["gpu"])
        await boot_guests(app, api_client, sub, profiles, report_url=url, into=guests)

        top = customer["metadata"]["name"]
        await eventually(lambda: metric(app, "licensectl_guests", {"tenant": top, "state": "licensed"}) == 1.0,
                         what="per-tenant count of the customer")
        assert metric(app, "licensectl_guests", {"tenant": top, "state": "unlicensed"}) == 1.0
        assert metric(app, "licensectl_guests", {"tenant": sub}) is None  # the customer, not the namespace
        assert metric(app, "licensectl_reports_total", {"result": "accepted"}) == 2.0
        assert {n: metric(app, n, {}) for n in PER_VMI} == dict.fromkeys(PER_VMI)
        # The decisions still see every guest: /v1/status lists them.
        assert {g["vmi"]: g["state"] for g in app.status()["guests"]["list"]} == {
            "good": "licensed", "bad": "unlicensed"}
    for g in guests:
        g.cleanup()
