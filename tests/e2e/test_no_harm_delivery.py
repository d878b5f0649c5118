"""No harm from ordinary events on the delivery side (issue: failover, start-up, one tenant's odd VM).

Two real controller processes with leader election, the shipped webhook topology: ONE
MutatingWebhookConfiguration (the shipped one, named by --webhook-configuration, caBundle kept by
the leader) calling the webhook Service, modelled by `TcpService` (TLS end to end, connections to
ready endpoints only, refused without one). The apiserver's own admission chain decides every VMI.

- Both replicas killed while entitled VMs start (admitted without their volume); restarted, their
  Service endpoints appearing only seconds after the caches synced: no restart is issued before the
  webhook is reachable (delivery readiness, docs/design.md#delivery-readiness), then every VM gets its
  volume with exactly one restart.
- One tenant with three VMs whose volume name is taken (the webhook refuses them) and another tenant's
  VM that missed the webhook: the second is restarted and gets its volume, the first three are never
  restarted, nothing fails and the source never pauses (docs/design.md#delivery-blocked).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, CustomObjectsApi

from licensectl.core.delivery import parse_stamp, volume_name
from licensectl.core.model import ANN_DELIVERED_REVISION, ANN_RESTART_RESULT
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster import webhook as registration
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.tcp_service import TcpService

from .support import Rig, controllers

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]

LEASE = {"lease_duration_seconds": 3, "renew_deadline_seconds": 2, "retry_period_seconds": 0.5}
ENDPOINT_DELAY = 3.0  # seconds between "caches synced" and the Service gaining its endpoints


@contextlib.asynccontextmanager
async def webhook_service(api: ApiClient, name: str) -> AsyncIterator[TcpService]:
    """The shipped configuration `name` in front of a Service stand-in without endpoints yet, and no
    caBundle: the leader's self-managed TLS sets it, as in a cluster without cert-manager."""
    svc = TcpService("licensectl-webhook")
    await svc.start()
    await registration.register(api, name=name, port=svc.port, wait=False)
    try:
        yield svc
    finally:
        await registration.unregister(api, name)
        await svc.stop()


async def start_pair(rig: Rig, started: list[ControllerProcess], configuration: str,
                     **settings: Any) -> tuple[ControllerProcess, ControllerProcess]:
    kw = {"register_webhook": False, "webhook_configuration": configuration, **LEASE, **settings}
    a = await rig.controller(started, "licensectl-a", **kw)
    b = await rig.controller(started, "licensectl-b", **kw)
    return a, b


async def ready_then_endpoints(svc: TcpService, pods: tuple[ControllerProcess, ...], *, delay: float) -> float:
    """kubelet's readiness probe passes (caches synced), then the endpoints reach the Service `delay`
    seconds later; returns the monotonic time they appeared."""
    for c in pods:
        await c.wait_ready(timeout=60)
    await asyncio.sleep(delay)  # the scenario's endpoint propagation delay, not an assertion
    svc.set_endpoints([c.webhook_port for c in pods])
    return time.monotonic()


async def vmi(api: ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = await CustomObjectsApi(api).get_namespaced_custom_object(
            "kubevirt.io", "v1", ns, "virtualmachineinstances", name)
    except Exception:
        return None
    return obj


def license_secrets(obj: dict[str, Any] | None) -> list[str]:
    vols = (obj or {}).get("spec", {}).get("volumes") or []
    return [v["secret"]["secretName"] for v in vols if "secret" in v]


def is_ready(obj: dict[str, Any] | None) -> bool:
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds) and not (
        obj or {}).get("metadata", {}).get("deletionTimestamp")


async def licensed_and_done(rig: Rig, ns: str, name: str) -> bool:
    """The VM's Ready VMI carries the replica, and its restart is recorded done."""
    obj = await vmi(rig.api, ns, name)
    if not is_ready(obj) or license_secrets(obj) != [rig.fleet.replica]:
        return False
    return (await rig.fleet.vm_annotations(ns, name)).get(ANN_RESTART_RESULT) == "done"


async def unlicensed_vms(rig: Rig, vms: list[tuple[str, str]]) -> None:
    """Each VM Ready without a license volume: the apiserver could not reach the webhook."""
    for ns, name in vms:
        obj = await eventually(lambda ns=ns, name=name: _ready(rig.api, ns, name), timeout=30, what=f"{ns}/{name}")
        assert license_secrets(obj) == [], f"{ns}/{name} got a volume while no endpoint existed"


async def _ready(api: ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    obj = await vmi(api, ns, name)
    return obj if is_ready(obj) else None


async def test_start_up_with_late_webhook_endpoints_wastes_no_restart(rig: Rig) -> None:
    fl = rig.fleet
    name = f"licensectl-{fl.controller_ns}"
    async with webhook_service(rig.api, name) as svc, controllers() as started:
        a, b = await start_pair(rig, started, name)
        await ready_then_endpoints(svc, (a, b), delay=0)
        await eventually(fl.revision, timeout=30, what="replicas in every tenant")
        for ns in fl.tenants:
            await registration.wait_delivery(rig.api, namespace=ns, claim="gpu")

        # Both replicas die; entitled VMs start meanwhile: admitted without their volume (Ignore).
        await a.kill()
        await b.kill()
        svc.set_endpoints([])
        vms = [(ns, "vm0") for ns in fl.tenants]
        for ns, vm in vms:
            await fleet.create_vm(rig.api, ns, vm, gpu_claims=["gpu"])
        await unlicensed_vms(rig, vms)

        # Both come back; the Service gains their endpoints only seconds after their caches synced.
        await a.start()
        await b.start()
        appeared = await ready_then_endpoints(svc, (a, b), delay=ENDPOINT_DELAY)
        for ns, vm in vms:
            await eventually(lambda ns=ns, vm=vm: licensed_and_done(rig, ns, vm), timeout=90,
                             what=f"{ns}/{vm} restarted onto its license volume")

        # No restart before the webhook could be reached, exactly one per VM, none refused or retried.
        restarts = {f"{ns}/{vm}": rig.kv.record.restarts_for(ns, vm) for ns, vm in vms}
        assert {k: len(v) for k, v in restarts.items()} == dict.fromkeys(restarts, 1), restarts
        early = [k for k, v in restarts.items() if v[0].at < appeared]
        assert early == [], f"restarted before the webhook Service had an endpoint: {early}"
        # The VMIs carry the delivery stamp of the replica they mount.
        for ns, vm in vms:
            obj = await vmi(rig.api, ns, vm)
            stamp = parse_stamp((obj or {}).get("metadata", {}).get("annotations", {}).get(ANN_DELIVERED_REVISION))
            assert [r for r, _ in stamp] == [fl.replica], (ns, vm, stamp)
        # Only the leader probes and exports the readiness (a standby stays read-only).
        scrapes = [await c.must_scrape() for c in (a, b)]
        assert sorted(s.value("licensectl_leader") for s in scrapes) == [0, 1]
        for s in scrapes:
            leader = s.value("licensectl_leader") == 1
            assert s.has("licensectl_delivery_ready") == leader
            assert not leader or s.value("licensectl_delivery_ready") == 1
            assert (s.value("licensectl_restarts_total", result="failed") or 0) == 0


def vm_with_taken_volume_name(ns: str, name: str, cls: str) -> dict[str, Any]:
    """A VM template that already has a volume named like licensectl's (pointing elsewhere)."""
    body = fleet.vm_body(ns, name, gpu_claims=["gpu"])
    spec = body["spec"]["template"]["spec"]
    taken = volume_name(cls)
    spec["volumes"].append({"name": taken, "emptyDisk": {"capacity": "1Gi"}})
    spec["domain"]["devices"]["disks"].append({"name": taken, "disk": {"bus": "virtio"}})
    return copy.deepcopy(body)


async def test_one_tenants_undeliverable_vms_block_nobody_else(rig: Rig) -> None:
    fl = rig.fleet
    odd, other = fl.tenants[0], fl.tenants[1]
    name = f"licensectl-{fl.controller_ns}"
    async with webhook_service(rig.api, name) as svc, controllers() as started:
        # A failure budget the odd tenant's three VMs would spend at once if they counted as failed.
        a, b = await start_pair(rig, started, name, max_failures=3)
        await ready_then_endpoints(svc, (a, b), delay=0)
        await eventually(fl.revision, timeout=30, what="replicas in every tenant")
        await registration.wait_delivery(rig.api, namespace=other, claim="gpu")

        # The odd tenant's VMs: the webhook refuses them (volume name taken) while it is up.
        odd_vms = [(odd, f"odd{i}") for i in range(3)]
        for ns, vm in odd_vms:
            await CustomObjectsApi(rig.api).create_namespaced_custom_object(
                "kubevirt.io", "v1", ns, "virtualmachines", vm_with_taken_volume_name(ns, vm, fl.cls))
        await unlicensed_vms(rig, odd_vms)
        # The other tenant's VM misses the webhook: no endpoint while it starts.
        svc.set_endpoints([])
        await fleet.create_vm(rig.api, other, "missed", gpu_claims=["gpu"])
        await unlicensed_vms(rig, [(other, "missed")])
        svc.set_endpoints([a.webhook_port, b.webhook_port])

        await eventually(lambda: licensed_and_done(rig, other, "missed"), timeout=90,
                         what="the other tenant's VM restarted onto its volume")
        assert len(rig.kv.record.restarts_for(other, "missed")) == 1
        # Give the odd VMs the time a wrong rule would need to restart them and fail them all.
        leader = a if (await a.must_scrape()).value("licensectl_leader") == 1 else b
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            s = await leader.must_scrape()
            assert (s.value("licensectl_rollout_paused") or 0) == 0, "the source paused"
            assert (s.value("licensectl_restarts_total", result="failed") or 0) == 0
            await asyncio.sleep(1)
        assert {vm: len(rig.kv.record.restarts_for(ns, vm)) for ns, vm in odd_vms} == dict.fromkeys(
            [vm for _, vm in odd_vms], 0)
        for ns, vm in odd_vms:
            assert license_secrets(await vmi(rig.api, ns, vm)) == []
