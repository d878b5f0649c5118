"""Signing-key rotations that never lock out a running guest, and readiness through an apiserver restart.

Two `licensectl run` processes with leader election against the real apiserver and the KubeVirt
simulator; guests are the real probe scripts (guest simulator) reporting through the reports Service.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from licensectl.core.credentials import keyring_from_secret_data
from licensectl.core.model import ANN_CREDENTIAL_KEY, ANN_DELIVERED_KEY
from licensectl.kube.signing_key import SECRET_NAME
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.guest_sim import GuestProfile, SimulatedGuest, mounted_secret
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.process import run_licensectl

from .support import Rig, assert_each_restarted_once, controllers

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]


async def key_ids(api: ApiClient, ns: str) -> tuple[str, ...]:
    s = await CoreV1Api(api).read_namespaced_secret(SECRET_NAME, ns)
    ring = keyring_from_secret_data({k: base64.b64decode(v) for k, v in (s.data or {}).items()})
    return ring.ids


async def _changed(fl: Any, before: str | None) -> str | None:
    rev = await fl.revision()
    return rev if rev is not None and rev != before else None


async def _ids_are(api: ApiClient, ns: str, want: tuple[str, ...]) -> bool:
    return await key_ids(api, ns) == want


async def replicas_on(api: ApiClient, fl: Any, key: str) -> bool:
    for ns in fl.tenants:
        s = await CoreV1Api(api).read_namespaced_secret(fl.replica, ns)
        if (s.metadata.annotations or {}).get(ANN_CREDENTIAL_KEY) != key:
            return False
    return True


async def source_and_replica_reasons(api: ApiClient, fl: Any) -> set[str]:
    """The Event reasons on the source Secret and on every tenant's replica."""
    core = CoreV1Api(api)
    out: set[str] = set()
    for ns, name in [fl.source, *((t, fl.replica) for t in fl.tenants)]:
        evs = await core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
        out |= {e.reason for e in evs.items}
    return out


async def reasons_on_source(api: ApiClient, fl: Any, reason: str) -> bool:
    evs = await CoreV1Api(api).list_namespaced_event(fl.source_ns,
                                                     field_selector=f"involvedObject.name={fl.source_name}")
    return reason in {e.reason for e in evs.items}


def locked_out(out: str) -> set[str]:
    """The VMIs a `--revoke-older` run says it locks out (its first line after the key line)."""
    for line in out.splitlines():
        if "hold a revoked credential" in line:
            return set(line.rsplit(": ", 1)[1].split(", "))
    return set()


async def test_three_rotations_keep_running_guests_reporting_and_revoke_names_the_holders(
        api_client: ApiClient, rig: Rig) -> None:
    fl = rig.fleet
    async with controllers() as started:
        # A 1-second grace: older keys are kept only because running VMIs hold them, not by a timer.
        a, _b, vms = await rig.leader_and_standby(started, key_grace_seconds=1)
        guests = [SimulatedGuest(ns, name, GuestProfile.licensed()) for ns, name in vms]
        try:
            for g in guests:
                assert await g.boot(api_client) == 0, g.last_stderr
                assert await g.probe() == 0, g.last_stderr
            first = await key_ids(api_client, fl.controller_ns)
            for round_ in (1, 2, 3):
                r = await run_licensectl("keys", "rotate", "--namespace", fl.controller_ns,
                                         kubeconfig=rig.cp.kubeconfig_path)
                assert r.code == 0, r.err
                ids = await key_ids(api_client, fl.controller_ns)
                assert ids[-1] == first[0], ids  # the key every running VM booted with is kept
                # The output names every running VM: each still holds the first key.
                assert f"older key {first[0]} is kept: held by {len(vms)} running VMI(s)" in r.out, r.out
                for ns, name in vms:
                    assert f"{ns}/{name}" in r.out, r.out
                await eventually(lambda ids=ids: replicas_on(api_client, fl, ids[0]), timeout=30,
                                 what="replicas rewritten with the new key")
                # A key no running VMI holds (the one between the rotations) is retired by the leader.
                await eventually(lambda cur=ids[0]: _ids_are(api_client, fl.controller_ns, (cur, first[0])),
                                 timeout=30, what=f"round {round_}: only the current and the held key; {r.out}")
                # Not restarted, still on the credential they booted with: every report accepted.
                for g in guests:
                    assert await g.probe() == 0, g.last_stderr
            # Each rewrite was said for what it was: a new report credential, never an edit "reverted", and
            # the license did not rotate.
            await eventually(lambda: reasons_on_source(api_client, fl, "CredentialRewritten"), timeout=30,
                             what="CredentialRewritten on the source")
            seen = await source_and_replica_reasons(api_client, fl)
            assert "ReplicaReverted" not in seen and "LicenseRotated" not in seen, seen
            sa = await a.must_scrape()
            assert sa.value("licensectl_reports_total", result="unauthorized") == 0
            assert sa.value("licensectl_reports_total", result="accepted") >= 3 * len(guests)
            assert rig.accepted_restarts() == 0  # a key rotation restarts no VM

            # Revoking on purpose: only the new key remains, the command names who stops reporting, and
            # the rollout restarts every holder (each VM once, paced by the rollout) onto the new key.
            before = await fl.revision()
            r = await run_licensectl("keys", "rotate", "--revoke-older", "--namespace", fl.controller_ns,
                                     kubeconfig=rig.cp.kubeconfig_path)
            assert r.code == 0, r.err
            assert locked_out(r.out) == {f"{ns}/{name}" for ns, name in vms}, r.out
            (new_key,) = await key_ids(api_client, fl.controller_ns)
            assert await guests[0].probe() == 4 and "unauthorized" in guests[0].last_stderr
            revision = await eventually(fl.revision, timeout=30, what="replicas on one revision")
            if revision == before:
                revision = await eventually(lambda: _changed(fl, before), timeout=30, what="a new revision")
            await eventually(lambda: fl.all_done(vms, revision), timeout=120, interval=0.5,
                             what="every holder restarted onto the new credential")
            assert_each_restarted_once(rig.kv, vms)
            # A revocation restarts VMs but rotates no license: CredentialRevoked, never LicenseRotated.
            await eventually(lambda: reasons_on_source(api_client, fl, "CredentialRevoked"), timeout=30,
                             what="CredentialRevoked on the source")
            seen = await source_and_replica_reasons(api_client, fl)
            assert "ReplicaReverted" not in seen and "LicenseRotated" not in seen, seen
            for ns, name in vms:
                vmi = await CustomObjectsApi(api_client).get_namespaced_custom_object(
                    "kubevirt.io", "v1", ns, "virtualmachineinstances", name)
                assert vmi["metadata"]["annotations"].get(ANN_DELIVERED_KEY) == new_key, vmi["metadata"]
            for g in guests:  # the restarted guests boot with the new credential and report again
                assert await g.boot(api_client) == 0, g.last_stderr
                assert await g.probe() == 0, g.last_stderr

            # Every VM now holds the current key; revoking again ends that key too. The command's list
            # is exactly the set of guests whose next report gets 401 (counted both ways).
            r = await run_licensectl("keys", "rotate", "--revoke-older", "--namespace", fl.controller_ns,
                                     kubeconfig=rig.cp.kubeconfig_path)
            assert r.code == 0, r.err
            named = locked_out(r.out)
            rejected: set[str] = set()
            for g in guests:
                code = await g.probe()
                if code == 4 and "unauthorized" in g.last_stderr:
                    rejected.add(f"{g.namespace}/{g.vmi}")
                else:
                    assert code == 0, g.last_stderr
            assert named == rejected and len(named) == len(vms), (r.out, rejected)
            assert f"{len(vms)} of them are restarted automatically by the rollout" in r.out, r.out
        finally:
            for g in guests:
                g.cleanup()


async def readyz(c: Any) -> str:
    got = await c.get("/readyz")
    return "down" if got is None else str(got[0])


async def test_apiserver_restart_keeps_endpoints_and_every_new_vmi_gets_its_volume(
        api_client: ApiClient, rig: Rig) -> None:
    fl = rig.fleet
    async with controllers() as started:
        a, b, _vms = await rig.leader_and_standby(started)
        timeline: list[tuple[float, str, str]] = []
        stop = asyncio.Event()

        async def watch_readiness() -> None:
            t0 = time.monotonic()
            while not stop.is_set():
                for pod, c in (("a", a), ("b", b)):
                    timeline.append((round(time.monotonic() - t0, 1), pod, await readyz(c)))
                await asyncio.sleep(0.25)

        watcher = asyncio.create_task(watch_readiness())
        try:
            await asyncio.sleep(1.0)
            outage = time.monotonic()
            await asyncio.to_thread(rig.cp.restart_apiserver)
            recovered = time.monotonic()
            # New VMIs right after recovery: each gets its license volume from the webhook.
            created = []
            for ns in fl.tenants:
                await fleet.create_vm(api_client, ns, "after-outage", gpu_claims=["gpu"])
                created.append(ns)
            for ns in created:
                await eventually(lambda ns=ns: fl.ready(ns, "after-outage"), timeout=60, what=f"{ns}/after-outage")
                vmi = await CustomObjectsApi(api_client).get_namespaced_custom_object(
                    "kubevirt.io", "v1", ns, "virtualmachineinstances", "after-outage")
                assert mounted_secret(vmi) == fl.replica, vmi["spec"].get("volumes")
            await asyncio.sleep(2.0)
        finally:
            stop.set()
            await watcher
        # What the readiness endpoints said over time (kept in the test log).
        changes = [x for i, x in enumerate(timeline)
                   if i < 2 or x[2] != next((y[2] for y in reversed(timeline[:i]) if y[1] == x[1]), None)]
        print(f"apiserver restart took {recovered - outage:.1f} s; /readyz transitions: {changes}")
        # A blip is not a reason to drop endpoints: both replicas stayed ready throughout.
        assert {s for _, _, s in timeline} == {"200"}, changes
