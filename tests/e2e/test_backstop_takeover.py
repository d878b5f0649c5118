"""Backstop after a takeover: VMIs that started without their license volume are restarted by a new leader in
about the normal backstop time, not after its guest-evidence window (docs/design.md#evidence-after-takeover).

Two `licensectl run` processes, the done gate `ready-licensed`, a long report interval (so a long silence
window after a takeover). The webhook configurations are removed, the leader is SIGKILLed, and VMs started
meanwhile come up without their license volume; they cannot have reported to anyone. Once the standby leads and
admission delivers again, every one of them is restarted and done well before its evidence window ends.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from licensectl.core.model import ANN_RESTART_RESULT
from licensectl.core.rollout import RESULT_DONE
from licensectl_dev.devcluster import fleet as devfleet
from licensectl_dev.devcluster import webhook as registration
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.poll import eventually

from .support import Rig, controllers, start_controller
from .test_rotation_kill import current_leader

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]

REPORT_INTERVAL = 40.0  # a silence window of three intervals: 120 s after the takeover
WINDOW = 3 * REPORT_INTERVAL
MISSED = 4
LEASE: dict[str, Any] = {"lease_duration_seconds": 3, "renew_deadline_seconds": 2, "retry_period_seconds": 0.5}


async def start_pod(rig: Rig, started: list[ControllerProcess], pod: str) -> ControllerProcess:
    kubeconfig = rig.tmp / f"{pod}.kubeconfig"
    kubeconfig.write_text(rig.proxies[pod].kubeconfig(rig.cp.admin_token))
    kubeconfig.chmod(0o600)
    fl = rig.fleet
    c = await start_controller(
        pod, kubeconfig, fl.controller_ns, rig.tmp, pod_name=pod, leader_elect=True, root_tenant=fl.root_name,
        report_url=rig.service.url, reports_plain_http=True, report_interval_seconds=REPORT_INTERVAL,
        webhook_api=fl.api, done_gate="ready-licensed", max_unavailable="2", max_per_namespace=2,
        restart_timeout_seconds=90, **LEASE)
    started.append(c)
    rig.service.endpoints[pod] = c
    return c


async def has_volume(api: ApiClient, ns: str, name: str) -> bool:
    vmi = await CustomObjectsApi(api).get_namespaced_custom_object("kubevirt.io", "v1", ns,
                                                                   "virtualmachineinstances", name)
    return any((v.get("secret") or {}).get("secretName", "").startswith("nvidia-vgpu-license-")
               for v in vmi["spec"].get("volumes") or [])


async def test_vmis_started_without_their_volume_are_restarted_by_a_new_leader_without_its_evidence_wait(
        api_client: ApiClient, rig: Rig) -> None:
    fl = rig.fleet
    async with controllers() as started:
        a = await start_pod(rig, started, "licensectl-a")
        await a.wait_metric("licensectl_leader", 1)
        b = await start_pod(rig, started, "licensectl-b")
        await eventually(fl.revision, timeout=30, what="replicas in every tenant")
        for ns in fl.tenants:
            await registration.wait_delivery(fl.api, namespace=ns, claim="gpu")
        await b.wait_metric("licensectl_ready", 1)
        # licensectl's admission goes away, then the leader crashes: VMs started now miss their volume.
        for c in (a, b):
            await registration.unregister(fl.api, c.webhook_configuration)
        await a.kill()
        leader = await eventually(lambda: current_leader([a, b]), timeout=30, interval=0.1, what="b leading")
        assert leader is b
        took_over = time.monotonic()
        missed = [(fl.tenants[i % len(fl.tenants)], f"late{i}") for i in range(MISSED)]
        for ns, name in missed:
            await devfleet.create_vm(fl.api, ns, name, gpu_claims=["gpu"])
        for ns, name in missed:
            await eventually(lambda ns=ns, name=name: fl.ready(ns, name), timeout=30, what=f"{ns}/{name} Ready")
            assert not await has_volume(fl.api, ns, name)
        await b.wait_metric("licensectl_vmis_missing_license_volume", float(MISSED), timeout=30)

        # Admission delivers again (the standby's configuration back): the backstop goes.
        bundle = base64.b64decode((await CoreV1Api(fl.api).read_namespaced_secret(
            "licensectl-tls", fl.controller_ns)).data["ca.crt"])
        await registration.register(fl.api, name=b.webhook_configuration, port=b.webhook_port, ca_bundle=bundle)
        delivering = time.monotonic()

        async def all_done() -> bool:
            for ns, name in missed:
                ann = await fl.vm_annotations(ns, name)
                if ann.get(ANN_RESTART_RESULT) != RESULT_DONE or not await has_volume(fl.api, ns, name):
                    return False
            return True
        await eventually(all_done, timeout=WINDOW, interval=0.25, what="every missed VM restarted and done")
        done = time.monotonic()
        window_left = WINDOW - (delivering - took_over)
        print(f"{MISSED} VMIs without their volume restarted and done {done - delivering:.1f}s after admission "
              f"delivered again (takeover {delivering - took_over:.1f}s before; the new leader's evidence window "
              f"ended {window_left:.1f}s after it)")
        # Generous: the whole backstop inside the first half of what was left of the evidence window.
        assert done - delivering < window_left / 2, (done - delivering, window_left)
        assert all(len(rig.kv.record.restarts_for(ns, name)) == 1 for ns, name in missed)
        for c in started:
            if c.alive():
                assert await c.stop() == 0, c.log_tail()
