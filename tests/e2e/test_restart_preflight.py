"""Enforce mode never takes a running VM down for good: the restart pre-flight on the real apiserver, with two
`licensectl run` processes (leader and warm standby) and the KubeVirt simulator (docs/design.md#restart-preflight).

The fleet boots, then one more VM boots from an image nobody marked; only then is the enforce webhook
(`--vgpu-driver-check=enforce`) registered -- a hoster switching to enforce with VMs running. A rotation then
restarts every VM but that one: the dry-run create of its new VMI is refused by licensectl's own enforce
webhook, so it is held with the refusal (an Event on the VM, the status, the gauge) and keeps its VMI, through
a leader SIGKILL right after the refusal; the rotation is promoted without it, and `licensectl rollout undo`
finishes without waiting for it.
"""

from __future__ import annotations

import asyncio
import base64
import random
import time
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, CustomObjectsApi

from licensectl.core import preflight
from licensectl.core.rotation import RotationPhase, content_revision
from licensectl.kube.preflight import VmPreflightApi
from licensectl_dev.devcluster import fleet as devfleet
from licensectl_dev.devcluster import webhook as registration
from licensectl_dev.devcluster.guest_fleet import always_licensed
from licensectl_dev.testkit.poll import eventually

from .support import Rig, controllers
from .test_no_harm_rollout import stop_cleanly
from .test_rotation_kill import REPORT_INTERVAL, _phase_is, current_leader, kill_leader, restarts, undo, up

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]

MARKED_IMAGES = "quay.io/containerdisks/"  # the fleet's golden image is on the allowlist: marked
UNMARKED_IMAGE = "registry.example.com/images/no-vgpu-driver:1"
HELD = "nodriver"
SETTINGS: dict[str, Any] = {"canary": "0", "rollout_steps": "100%", "settle_seconds": 2, "max_unavailable": "1",
                            "max_per_namespace": 1, "done_gate": "ready", "analysis_deadline_seconds": 60,
                            "vgpu_driver_check": "enforce", "vgpu_driver_images": MARKED_IMAGES}


async def vmi_uid(api: ApiClient, ns: str, name: str) -> str | None:
    try:
        vmi = await CustomObjectsApi(api).get_namespaced_custom_object("kubevirt.io", "v1", ns,
                                                                       "virtualmachineinstances", name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return str(vmi["metadata"]["uid"]) if vmi["metadata"].get("uid") and (
        vmi.get("status") or {}).get("phase") == "Running" else None


class UidWatch:
    """Samples the held VM's VMI every 100 ms: every uid it ever had, and whether it was ever missing."""

    def __init__(self, api: ApiClient, ns: str) -> None:
        self.api, self.ns = api, ns
        self.seen: list[str | None] = []

    async def run(self) -> None:
        while True:
            uid = await vmi_uid(self.api, self.ns, HELD)
            if not self.seen or self.seen[-1] != uid:
                self.seen.append(uid)
            await asyncio.sleep(0.1)


async def register_enforce(rig: Rig, ctls: list[Any]) -> None:
    """The enforce ValidatingWebhookConfiguration of each controller pod (both serve admission)."""
    raw = (await CoreV1Api(rig.fleet.api).read_namespaced_secret("licensectl-tls", rig.fleet.controller_ns)).data
    bundle = base64.b64decode(raw["ca.crt"])
    for c in ctls:
        await registration.register_validating(rig.fleet.api, name=f"{c.webhook_configuration}-enforce",
                                               port=c.webhook_port, ca_bundle=bundle)


async def test_enforce_holds_an_unmarked_running_vm_through_a_rotation_a_leader_kill_and_an_undo(
        api_client: ApiClient, rig: Rig) -> None:
    fl = rig.fleet
    ns = fl.tenants[0]
    kills: list[str] = []
    async with controllers() as started:
        ctls, guests, vms = await up(rig, started, always_licensed, 1, **SETTINGS)
        watcher: asyncio.Task[None] | None = None
        try:
            # A VM booted from an unmarked image, running before enforce is switched on.
            body = devfleet.vm_body(ns, HELD, gpu_claims=["gpu"])
            body["spec"]["template"]["spec"]["volumes"][0] = {"name": "root",
                                                              "containerDisk": {"image": UNMARKED_IMAGE}}
            await CustomObjectsApi(fl.api).create_namespaced_custom_object("kubevirt.io", "v1", ns,
                                                                           "virtualmachines", body)
            await eventually(lambda: fl.ready(ns, HELD), timeout=30, what="the unmarked VM Ready")
            first_uid = await vmi_uid(fl.api, ns, HELD)
            assert first_uid is not None
            await register_enforce(rig, ctls)
            check = VmPreflightApi(fl.api)

            async def refused() -> str | None:
                a = await check.admits(ns, HELD)
                return a.message if not a.admitted and a.answered else None
            denial = await eventually(refused, timeout=60, interval=0.5, what="the enforce webhook refusing it")
            assert denial is not None and "vmi-boot-image.licensectl.io" in denial and "denied" in denial, denial
            assert (await check.admits(*vms[0])).admitted  # a marked VM's next VMI would be admitted
            await asyncio.sleep(1.1)  # boot times have one-second resolution: rotate after them

            uids = UidWatch(fl.api, ns)
            watcher = asyncio.create_task(uids.run())
            t0 = time.monotonic()
            new = await fl.rotate(1)
            candidate = content_revision(new, None)

            async def held() -> dict[str, str] | None:
                ann = await fl.vm_annotations(ns, HELD)
                return ann if ann.get(preflight.ANN_PREFLIGHT_DENIED) else None
            ann = await eventually(held, timeout=60, interval=0.05, what="the refusal recorded on the VM")
            assert ann is not None and "denied the request" in ann[preflight.ANN_PREFLIGHT_DENIED], ann
            assert ann[preflight.ANN_PREFLIGHT_VMI_UID] == first_uid
            kills.append(f"refusal recorded {time.monotonic() - t0:.1f}s after the rotation")
            await kill_leader(ctls, rng=random.Random(40), fl=fl, log=kills)  # right after the refusal

            rec = await eventually(lambda: _phase_is(fl, RotationPhase.PROMOTED), timeout=180, interval=0.25,
                                   what=f"candidate promoted without the held VM ({kills})")
            assert rec is not None and rec.candidate == candidate
            assert restarts(rig, vms) == {f"{k}/{n}": 1 for k, n in vms}, kills
            assert rig.kv.record.restarts_for(ns, HELD) == []

            # Held where a hoster looks: the Event on the VM, the status, the gauge -- on the new leader.
            evs = (await CoreV1Api(fl.api).list_namespaced_event(
                ns, field_selector=f"involvedObject.name={HELD}")).items
            said = [e for e in evs
                    if e.reason == "RestartPreflightDenied" and e.involved_object.kind == "VirtualMachine"]
            assert said and "vmi-boot-image.licensectl.io" in said[0].message, [e.message for e in said]
            leader = await eventually(lambda: current_leader(ctls), timeout=30, what="a leader")
            assert leader is not None

            async def held_in_status() -> dict[str, Any] | None:
                status = await leader.status()
                rows = [r for r in ((status or {}).get("rollout") or {}).get("vmis") or []
                        if (r["namespace"], r["vmi"]) == (ns, HELD)]
                return rows[0] if rows and rows[0]["state"] == "blocked" else None
            row = await eventually(held_in_status, timeout=30, interval=0.5, what="the held VM blocked in the status")
            assert row is not None and "denied the request" in row["reason"], row
            await leader.wait_metric("licensectl_vms_restart_held", 1, timeout=30, namespace=ns)

            # The undo finishes: every other VM restarted back, the held one counted as held, not in progress.
            undo_started = time.monotonic()
            await undo(fl, rig.kv.kubeconfig_path)
            undone = await eventually(lambda: _phase_is(fl, RotationPhase.UNDONE), timeout=60, interval=0.25,
                                      what="rotation undone")
            assert undone is not None

            async def all_back() -> bool:
                return restarts(rig, vms) == {f"{k}/{n}": 2 for k, n in vms}
            await eventually(all_back, timeout=180, interval=0.25, what="every other VM restarted back")

            async def complete() -> bool:
                status = await leader.status()
                src = ((status or {}).get("rollout") or {}).get("sources") or {}
                return bool(src) and all(s.get("phase") == "complete" for s in src.values())
            await eventually(complete, timeout=60, interval=0.5, what="the undo's rollout complete")
            print(f"undo with one VM held: {time.monotonic() - undo_started:.1f}s from `rollout undo` to complete")
            await asyncio.sleep(2 * REPORT_INTERVAL)
            assert rig.kv.record.restarts_for(ns, HELD) == []
            assert uids.seen == [first_uid], uids.seen  # never restarted, never without its VMI
        finally:
            if watcher is not None:
                watcher.cancel()
            await guests.stop()
            guests.cleanup()
        await stop_cleanly(ctls, fl.tokens)
