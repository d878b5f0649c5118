"""The guest fleet on the real apiserver: a guest licenses according to the token it boots with, and a
restart (a new VMI) boots it again from the replica as it is then."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from licensectl.core.guest_report import REASON_ACQUIRE_FAILED, LicenseState
from licensectl.core.model import ANN_RESTART_POLICY, ANN_SOURCE_REVISION
from licensectl.core.ports import RestartResult
from licensectl.kube.kubevirt import KubevirtClient
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster import webhook as webhook_registration
from licensectl_dev.devcluster.guest_fleet import GuestFleet, licensed_unless

from ..conftest import KubevirtEnv
from .support import eventually, make_world, read_secret, running_app, settings_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_guest_licenses_by_its_boot_token_and_reboots_on_restart(
        api_client: ApiClient, kubevirt: KubevirtEnv, namespace_factory: Any, cleanup: Any) -> None:
    w = await make_world(api_client, namespace_factory, cleanup)
    ns = (await w.tenant(claim=True))["metadata"]["name"]
    settings = settings_for(kubevirt.kubeconfig_path, w.controller_ns, root_tenant=w.root_name)
    async with running_app(settings) as app:
        url = f"https://127.0.0.1:{app.reports_port}/v1/reports"
        first_rev = await eventually(lambda: w.replica_revision(ns), what="replica")
        await asyncio.sleep(1.1)  # the VM starts after its replica (one-second timestamps)
        await webhook_registration.wait_delivery(api_client, namespace=ns, claim="gpu")
        # The world's token belongs to another license server: guests booting with it are refused.
        async with GuestFleet(api_client, url, profile_for=licensed_unless({w.token}), interval_seconds=0.5) as gf:
            # Restarted by hand below, not by the rollout, so its boots are exactly the ones this test makes.
            await fleet.create_vm(api_client, ns, "old", gpu_claims=["gpu"],
                                  annotations={ANN_RESTART_POLICY: "manual"})
            gf.add(ns, "old")

            def reason(vmi: str) -> str | None:
                g = app.guests.get(ns, vmi)
                return g.reason if g is not None else None

            await eventually(lambda: reason("old") == REASON_ACQUIRE_FAILED, timeout=60, what="old refused")
            [b1] = gf.boots(ns, "old")
            assert b1.token_sha256 == hashlib.sha256(w.token).hexdigest() and b1.install_rc == 0
            assert (b1.replica_name, b1.revision, b1.profile) == (w.replica, first_rev, "acquire-failed")
            stored = app.guests.get(ns, "old")
            assert stored is not None and stored.state is LicenseState.UNLICENSED

            # The hoster installs a token from the right server; the replica follows, the running guest
            # keeps its disk (and stays refused) until its VMI is recreated.
            await asyncio.sleep(1.1)
            good = await w.rotate(1)
            second_rev = await eventually(
                lambda: _rev_if_changed(w.replica_revision(ns), first_rev), what="replica rotated")
            replica = await read_secret(api_client, ns, w.replica)
            source_rev = (replica.metadata.annotations or {}).get(ANN_SOURCE_REVISION, "")
            await fleet.create_vm(api_client, ns, "new", gpu_claims=["gpu"])
            gf.add(ns, "new")
            await eventually(lambda: (s := app.guests.get(ns, "new")) is not None
                             and s.state is LicenseState.LICENSED, timeout=60, what="new licensed")
            assert reason("old") == REASON_ACQUIRE_FAILED and len(gf.boots(ns, "old")) == 1
            [n1] = gf.boots(ns, "new")
            assert (n1.token_sha256, n1.revision, n1.profile) == (
                hashlib.sha256(good).hexdigest(), second_rev, "licensed")

            # A restart gives a new VMI: the guest boots again, now with the good token, and licenses.
            kv = KubevirtClient(app.api)
            assert await kv.restart(namespace=ns, vm="old", vmi_uid=b1.vmi_uid,
                                    run_strategy="Always") is RestartResult.ISSUED
            await eventually(lambda: len(gf.boots(ns, "old")) == 2, timeout=60, what="old re-booted")
            await eventually(lambda: (s := app.guests.get(ns, "old")) is not None
                             and s.state is LicenseState.LICENSED and s.reason is None,
                             timeout=60, what="old licensed after restart")
            b1_again, b2 = gf.boots(ns, "old")
            assert b1_again == b1 and b2.vmi_uid != b1.vmi_uid and b2.at > b1.at
            assert (b2.token_sha256, b2.revision, b2.source_revision, b2.profile) == (
                hashlib.sha256(good).hexdigest(), second_rev, source_rev, "licensed")
            assert gf.last_boot(ns, "old") == b2
            assert len(gf.boots(ns, "new")) == 1  # untouched by the other guest's restart
        assert gf.guest(ns, "old") is None  # leaving the context removed the simulated guests


async def _rev_if_changed(current: Any, old: str) -> str | None:
    rev = await current
    return rev if rev and rev != old else None
