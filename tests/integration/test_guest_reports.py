"""End to end: replica carries the credential -> the real probe script posts -> metrics show the state."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
import time
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient, ApiException

from licensectl.core.model import KEY_REPORT_CREDENTIAL
from licensectl.core.render import replica_name
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster import webhook as webhook_registration
from licensectl_dev.devcluster.guest_sim import GuestProfile, SimulatedGuest

from ..conftest import KubevirtEnv
from .support import boot_guests, eventually, make_world, metric, read_secret, running_app, secret_bytes, settings_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_probe_reports_become_metrics_and_forgeries_are_rejected(
        api_client: ApiClient, kubevirt: KubevirtEnv, namespace_factory: Any, cleanup: Any) -> None:
    w = await make_world(api_client, namespace_factory, cleanup, token_days=1)
    controller_ns, root_name, cls = w.controller_ns, w.root_name, w.cls
    tenants = []
    for _ in range(2):
        tenants.append((await w.tenant())["metadata"]["name"])
        await fleet.create_claim(api_client, tenants[-1], "gpu", class_name=cls)
    ns, other_ns = tenants

    offset = [0.0]

    def clock() -> dt.datetime:
        return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=offset[0])

    settings = settings_for(kubevirt.kubeconfig_path, controller_ns, root_tenant=root_name,
                            report_interval_seconds=60.0,
                            # Simulated guests boot at once: a short allowance keeps "its chance is over"
                            # within the four minutes this test steps its clock below.
                            guest_boot_allowance_seconds=30.0)
    profiles = {"good": GuestProfile.licensed(), "bad": GuestProfile.unlicensed(),
                "soon": GuestProfile.expiring(dt.datetime.now(dt.UTC) + dt.timedelta(days=3)),
                "mute": GuestProfile.quiet(), "nodrv": GuestProfile.driver_missing(),
                "skew": GuestProfile.skewed(dt.timedelta(minutes=10))}
    guests: list[SimulatedGuest] = []
    async with running_app(settings, clock=clock) as app:
        url = f"https://127.0.0.1:{app.reports_port}/v1/reports"
        tls = ssl.create_default_context(cadata=app.tls.ca_bundle.decode())
        await eventually(lambda: read_secret(api_client, ns, replica_name(cls)), what="replica")
        await eventually(lambda: read_secret(api_client, other_ns, replica_name(cls)), what="replica 2")
        await asyncio.sleep(1.1)
        await webhook_registration.wait_delivery(api_client, namespace=ns, claim="gpu")
        for name in profiles:  # no license volume in the VM: the webhook adds it
            await fleet.create_vm(api_client, ns, name, gpu_claims=["gpu"])
        await boot_guests(app, api_client, ns, profiles, report_url=url, into=guests)

        def state(vmi: str, s: str) -> float | None:
            return metric(app, "licensectl_guest_license_state", {"namespace": ns, "vmi": vmi, "state": s})

        await eventually(lambda: state("good", "licensed") == 1.0, what="licensed guest")
        assert state("bad", "unlicensed") == 1.0
        assert state("soon", "licensed") == 1.0
        # An image without the driver is its own state; gridd's reason and the guest clock come through.
        assert state("nodrv", "driver_missing") == 1.0 and state("nodrv", "unknown") is None  # one series
        assert metric(app, "licensectl_guest_unlicensed_reason", {"vmi": "bad", "reason": "token_missing"}) == 1.0
        skew = metric(app, "licensectl_guest_clock_skew_seconds", {"vmi": "skew"})
        assert skew is not None and 590 < skew < 610
        assert state("skew", "licensed") == 1.0
        # Never reported, but it has not had its chance yet (three intervals since the controller
        # started receiving reports): not judged, so not called silent.
        assert state("mute", "unknown") is None and state("mute", "licensed") is None
        # A healthy guest has its state and expiry only; the fleet's token view is the per-tenant count.
        assert metric(app, "licensectl_guest_token_current", {"vmi": "good"}) is None
        assert (metric(app, "licensectl_guests_reporting", {"token": "current"}) or 0) >= 1.0
        assert metric(app, "licensectl_guest_token_current", {"vmi": "bad"}) == 1.0  # unlicensed: detail
        expiry = metric(app, "licensectl_guest_license_expiry_timestamp_seconds", {"vmi": "soon"})
        assert expiry is not None and 2 * 86400 < expiry - time.time() < 4 * 86400
        assert metric(app, "licensectl_reports_total", {"result": "accepted"}) == 5.0

        # Forgeries: another namespace's credential, a made-up one, and an unknown SMBIOS UUID.
        other_cred = secret_bytes(await read_secret(api_client, other_ns, replica_name(cls)),
                                  KEY_REPORT_CREDENTIAL).decode()
        own_cred = secret_bytes(await read_secret(api_client, ns, replica_name(cls)), KEY_REPORT_CREDENTIAL).decode()
        body = b"licensectl-report: 1\nuuid: 00000000-0000-0000-0000-000000000000\nhostname: x\nclock: %d\n" \
               b"token-sha256: none\nprobe-version: t\n--- end\n" % int(time.time())
        async with aiohttp.ClientSession() as http:
            for cred, expect in ((other_cred, 401), ("A" * 43, 401), (own_cred, 403)):
                async with http.post(url, data=body, headers={
                        "Authorization": f"Bearer {cred}", "X-Licensectl-Namespace": ns,
                        "Content-Type": "text/plain; charset=utf-8"}, ssl=tls) as resp:
                    text = await resp.text()
                    assert resp.status == expect, (resp.status, text)
                    assert cred not in text and own_cred not in text
        assert (metric(app, "licensectl_reports_total", {"result": "unauthorized"}) or 0) >= 2.0

        # Three missed intervals later every guest is unknown; a deleted VMI's series disappear.
        offset[0] = 4 * 60.0
        assert state("good", "unknown") == 1.0 and state("good", "licensed") is None  # one series per guest
        assert state("mute", "unknown") == 1.0  # never reported, and its chance is over
        from kubernetes_asyncio.client import CustomObjectsApi
        co = CustomObjectsApi(api_client)
        await co.delete_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachines", "bad")
        try:  # the garbage collector may have removed it already (its owner VM is gone)
            await co.delete_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances", "bad")
        except ApiException as e:
            assert e.status == 404
        await eventually(lambda: state("bad", "unknown") is None, what="deleted VMI series gone")
    for g in guests:
        g.cleanup()
