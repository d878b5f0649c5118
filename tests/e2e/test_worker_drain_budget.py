"""A tenant worker licensectl restarted that never comes back holds its cluster's disruption budget
(docs/design.md#tenant-worker-drain), on the real management apiserver with two `licensectl run`
processes (leader and warm standby), two real tenant control planes and the node agent, whose machines
never come back from a reboot in this test:

* cluster `ka` runs `web` under a PodDisruptionBudget, cluster `kb` runs it without one;
* after a rotation exactly one worker of each cluster is ever restarted: its Node never returns Ready
  with a new boot ID, so it is blocked (`BootTimeout`: the VM's record, a `WorkerDrainBlocked` Event,
  `licensectl_worker_drain_blocked`, `licensectl_rollout_vmis{state="blocked"}`), and the cluster's
  other workers wait (`DisruptionBudgetSpent`) -- never cordoned, never restarted;
* the leader is SIGKILLed while the budget is held: the new leader derives the same from the VMs'
  records and the tenants' Nodes, and restarts no other worker;
* `licensectl rollout status` never says complete (exit 3, the blocked worker named) while a plain VM
  beside the workers is restarted as usual;
* a third cluster `kc`, whose machines do come back, is drained and restarted worker by worker to the
  end meanwhile: one failure domain's dead machines stop nothing elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest
from kubernetes_asyncio.client import CoreV1Api

from licensectl.core import drain
from licensectl.core.model import ANN_RESTART_RESULT, ANN_RESTART_REVISION
from licensectl_dev.devcluster import fleet as devfleet
from licensectl_dev.devcluster import webhook as webhook_registration
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.process import run_licensectl

from ..conftest import TenantClusterFactory
from .support import Rig, controllers
from .test_rotation_kill import current_leader, kill_leader
from .test_worker_drain import SETTINGS, Watch, boot_cluster, observe, rotate, start_pair

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]

BOOT_TIMEOUT = 8
HELD_FOR = 12.0  # seconds watched after the takeover: four hold periods (3 x drain_retry_seconds) and more


async def test_a_worker_that_never_comes_back_holds_its_cluster_through_a_leader_kill(
        rig: Rig, tenant_cluster_factory: TenantClusterFactory) -> None:
    fl = rig.fleet
    ns_a, ns_b, ns_c = fl.tenants[0], fl.tenants[1], fl.tenants[2]
    settings = {**SETTINGS, "worker_boot_timeout_seconds": BOOT_TIMEOUT}
    async with controllers() as started:
        b = await start_pair(rig, started, settings)
        ka, workers_a = await boot_cluster(rig, tenant_cluster_factory, ns_a, "ka")
        kb, workers_b = await boot_cluster(rig, tenant_cluster_factory, ns_b, "kb", budget=False)
        await webhook_registration.wait_delivery(fl.api, namespace=ns_c, claim="gpu")
        kc, workers_c = await boot_cluster(rig, tenant_cluster_factory, ns_c, "kc")
        await devfleet.create_vm(rig.api, ns_a, "plain", gpu_claims=["gpu"])
        await eventually(lambda: fl.ready(ns_a, "plain"), timeout=60, what="the plain VM ready")
        for t in (ka, kb):
            t.agent.fail_reboots = True
        await b.wait_metric("licensectl_ready", 1)
        await asyncio.sleep(1.1)

        seen = Watch()
        stop = asyncio.Event()
        watcher = asyncio.create_task(observe([ka, kb, kc], seen, stop))
        workers = {ns_a: workers_a, ns_b: workers_b}
        try:
            revision = await rotate(fl)

            async def down() -> dict[str, str] | None:
                """Per namespace, the worker whose drain ended in BootTimeout, once each cluster has one."""
                found = {}
                for ns, names in workers.items():
                    for name in names:
                        ann = await fl.vm_annotations(ns, name)
                        if ann.get(drain.ANN_DRAIN_REASON) == drain.BlockReason.BOOT_TIMEOUT:
                            found[ns] = name
                return found if len(found) == 2 else None

            gone = await eventually(down, timeout=180, interval=0.5, what="one worker of each cluster down")
            assert gone is not None
            # The budget is held: kill the leader at this decision point.
            log: list[str] = []
            await kill_leader(started, rng=random.Random(11), fl=fl, log=log)
            leader = await eventually(lambda: current_leader(started), timeout=30, what="the new leader")
            assert leader is not None
            await leader.wait_metric("licensectl_worker_drain_blocked", 1.0, timeout=30, namespace=ns_a,
                                     vm=gone[ns_a], reason="BootTimeout")
            held_until = time.monotonic() + HELD_FOR
            while time.monotonic() < held_until:
                for ns, names in workers.items():
                    for name in names:
                        if name != gone[ns]:
                            # No cycle opened (one closed without a restart, a drain that timed out on a
                            # slow replacement Pod before the first worker went down, is no disruption).
                            ann = await fl.vm_annotations(ns, name)
                            assert ann.get(drain.ANN_DRAIN_STEP) in (None, drain.Step.BLOCKED), (name, ann)
                            assert ann.get(drain.ANN_DRAIN_REASON) != drain.BlockReason.BOOT_TIMEOUT, (name, ann)
                await asyncio.sleep(0.5)

            async def healthy_done() -> bool:
                for name in workers_c:
                    ann = await fl.vm_annotations(ns_c, name)
                    if (ann.get(ANN_RESTART_REVISION) != revision or ann.get(ANN_RESTART_RESULT) != "done"
                            or drain.ANN_DRAIN_STEP in ann):
                        return False
                nodes = (await CoreV1Api(kc.api).list_node()).items
                return not any(n.spec.unschedulable for n in nodes)

            await eventually(healthy_done, timeout=120, interval=0.5, what="every worker of kc restarted, uncordoned")
        finally:
            stop.set()
            await watcher

        # Exactly one worker of each cluster was ever restarted; the plain VM beside them was.
        for ns, names in workers.items():
            counts = {n: len(rig.kv.record.restarts_for(ns, n)) for n in names}
            assert counts == {n: int(n == gone[ns]) for n in names}, counts
        plain = await fl.vm_annotations(ns_a, "plain")
        assert plain.get(ANN_RESTART_REVISION) == revision and plain.get(ANN_RESTART_RESULT) == "done", plain
        # The tenants' view: never a second worker down or cordoned, with or without a PDB.
        assert seen.samples > 20
        assert seen.max_disrupted == {"ka": 1, "kb": 1, "kc": 1}, seen.max_disrupted
        assert {n: len(rig.kv.record.restarts_for(ns_c, n)) for n in workers_c} == {n: 1 for n in workers_c}
        # Every view names the down worker; none says complete.
        scrape = await leader.scrape()
        assert scrape is not None
        for ns in (ns_a, ns_b):
            assert scrape.value("licensectl_worker_drain_blocked", namespace=ns, vm=gone[ns],
                                reason="BootTimeout") == 1.0
            events = (await CoreV1Api(fl.api).list_namespaced_event(
                ns, field_selector=f"involvedObject.name={gone[ns]},reason=WorkerDrainBlocked")).items
            assert events and "BootTimeout" in events[0].message
        assert scrape.value("licensectl_rollout_vmis", state="blocked") == 2.0
        r = await run_licensectl("rollout", "status", "--vms", "-o", "json", kubeconfig=rig.kv.kubeconfig_path,
                                 env=fl.cli_env)
        assert r.code == 3, (r.code, r.out, r.err)  # still in progress: never complete
        listed = {(v["namespace"], v["vmi"]): v for v in json.loads(r.out)["vmis"]}
        got = await leader.get("/v1/status")
        assert got is not None and got[0] == 200
        states = {(v["namespace"], v["vmi"]): v for v in json.loads(got[1])["rollout"]["vmis"]}
        for ns, names in workers.items():
            assert listed[(ns, gone[ns])]["state"] == "blocked" and "BootTimeout" in listed[(ns, gone[ns])]["reason"]
            for name in names:  # the others wait, and say why
                if name != gone[ns]:
                    assert states[(ns, name)]["state"] == "stale", states[(ns, name)]
                    assert "DisruptionBudgetSpent" in states[(ns, name)]["reason"], states[(ns, name)]
        assert log, "the leader was killed while the budget was held"
