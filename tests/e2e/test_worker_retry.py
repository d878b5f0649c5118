"""The hoster's way out of a tenant worker in BootTimeout: `licensectl rollout retry-worker` (the real CLI) on the
real management apiserver, with two `licensectl run` processes, a real tenant control plane and the node agent
(docs/operations.md#tenant-cluster-workers-runbook).

A rotation restarts one worker whose machine does not come back: BootTimeout, the cluster's other workers wait.
The hoster fixes the machine and runs `retry-worker`; the leader is SIGKILLed right after. The new leader restarts
that worker exactly once more, its Node comes back Ready with a new boot ID, its record goes, and the cluster's
other workers are then drained and restarted one at a time. The CLI refuses a worker that is not down.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

from licensectl.core import drain
from licensectl.core.model import ANN_RESTART_RESULT, ANN_RESTART_REVISION
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.process import run_licensectl

from ..conftest import TenantClusterFactory
from .support import Rig, controllers
from .test_rotation_kill import current_leader, kill_leader
from .test_worker_drain import SETTINGS, Watch, boot_cluster, observe, rotate, start_pair

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]

BOOT_TIMEOUT = 8


async def test_retry_worker_restarts_a_worker_down_after_boot_timeout_once_more_through_a_leader_kill(
        rig: Rig, tenant_cluster_factory: TenantClusterFactory) -> None:
    fl = rig.fleet
    ns = fl.tenants[0]
    settings = {**SETTINGS, "worker_boot_timeout_seconds": BOOT_TIMEOUT}
    async with controllers() as started:
        b = await start_pair(rig, started, settings)
        ka, workers = await boot_cluster(rig, tenant_cluster_factory, ns, "ka")
        ka.agent.fail_reboots = True
        await b.wait_metric("licensectl_ready", 1)
        await asyncio.sleep(1.1)
        seen = Watch()
        stop = asyncio.Event()
        watcher = asyncio.create_task(observe([ka], seen, stop))
        try:
            revision = await rotate(fl)

            async def down() -> str | None:
                for name in workers:
                    ann = await fl.vm_annotations(ns, name)
                    if ann.get(drain.ANN_DRAIN_REASON) == drain.BlockReason.BOOT_TIMEOUT:
                        return name
                return None
            gone = await eventually(down, timeout=180, interval=0.5, what="a worker down after BootTimeout")
            assert gone is not None
            others = [n for n in workers if n != gone]
            assert all(len(rig.kv.record.restarts_for(ns, n)) == 0 for n in others)

            # A worker that is not down is refused, and nothing is written.
            r = await run_licensectl("rollout", "retry-worker", f"{ns}/{others[0]}", kubeconfig=rig.kv.kubeconfig_path,
                                     env=fl.cli_env)
            assert r.code == 1 and "nothing to retry" in r.err, (r.code, r.out, r.err)
            assert drain.ANN_DRAIN_RETRY_AT not in await fl.vm_annotations(ns, others[0])

            # The hoster fixes the machine, asks for a retry; the leader dies right after. The VMI that hung stays
            # hung: only the retry's restart brings the Node back.
            hung = await CustomObjectsApi(fl.api).get_namespaced_custom_object(
                "kubevirt.io", "v1", ns, "virtualmachineinstances", gone)
            ka.agent.hung_vmis.add(str(hung["metadata"]["uid"]))
            ka.agent.fail_reboots = False
            r = await run_licensectl("rollout", "retry-worker", f"{ns}/{gone}", kubeconfig=rig.kv.kubeconfig_path,
                                     env=fl.cli_env)
            assert r.code == 0 and "retry of worker" in r.out, (r.code, r.out, r.err)
            log: list[str] = []
            await kill_leader(started, rng=random.Random(7), fl=fl, log=log)
            leader = await eventually(lambda: current_leader(started), timeout=30, what="the new leader")
            assert leader is not None

            async def back() -> bool:
                ann = await fl.vm_annotations(ns, gone)
                return drain.ANN_DRAIN_STEP not in ann
            await eventually(back, timeout=120, interval=0.5, what="the retried worker back and its record gone")
            assert len(rig.kv.record.restarts_for(ns, gone)) == 2

            async def all_done() -> bool:
                for name in workers:
                    ann = await fl.vm_annotations(ns, name)
                    if ann.get(ANN_RESTART_REVISION) != revision or ann.get(ANN_RESTART_RESULT) != "done" or (
                            drain.ANN_DRAIN_STEP in ann):
                        return False
                return True
            await eventually(all_done, timeout=240, interval=0.5, what="every worker of the cluster restarted")
        finally:
            stop.set()
            await watcher
        assert {n: len(rig.kv.record.restarts_for(ns, n)) for n in workers} == {
            n: 2 if n == gone else 1 for n in workers}
        assert seen.max_disrupted == {"ka": 1}, seen.max_disrupted  # never a second worker out, retry included
        evs = (await CoreV1Api(fl.api).list_namespaced_event(
            ns, field_selector=f"involvedObject.name={gone},reason=WorkerRetryRequested")).items
        assert len(evs) == 1 and evs[0].involved_object.kind == "VirtualMachine"


async def test_skip_worker_gives_a_dead_worker_up_and_the_cluster_goes_on_through_a_leader_kill(
        rig: Rig, tenant_cluster_factory: TenantClusterFactory) -> None:
    fl = rig.fleet
    ns = fl.tenants[0]
    settings = {**SETTINGS, "worker_boot_timeout_seconds": BOOT_TIMEOUT}
    async with controllers() as started:
        b = await start_pair(rig, started, settings)
        ka, workers = await boot_cluster(rig, tenant_cluster_factory, ns, "ka")
        ka.agent.fail_reboots = True
        await b.wait_metric("licensectl_ready", 1)
        await asyncio.sleep(1.1)
        seen = Watch()
        stop = asyncio.Event()
        watcher = asyncio.create_task(observe([ka], seen, stop))
        try:
            revision = await rotate(fl)

            async def down() -> tuple[str, str] | None:
                for name in workers:
                    ann = await fl.vm_annotations(ns, name)
                    if ann.get(drain.ANN_DRAIN_REASON) == drain.BlockReason.BOOT_TIMEOUT:
                        return name, ann[drain.ANN_DRAIN_NODE]
                return None
            found = await eventually(down, timeout=180, interval=0.5, what="a worker down after BootTimeout")
            assert found is not None
            gone, node = found
            others = [n for n in workers if n != gone]
            # The machine is abandoned: its Node deleted from the tenant, its VMI never boots. The other machines
            # are fine. Its record still holds the budget.
            hung = await CustomObjectsApi(fl.api).get_namespaced_custom_object(
                "kubevirt.io", "v1", ns, "virtualmachineinstances", gone)
            ka.agent.hung_vmis.add(str(hung["metadata"]["uid"]))
            ka.agent.fail_reboots = False
            await CoreV1Api(ka.api).delete_node(node)
            await asyncio.sleep(3.0)
            assert all(len(rig.kv.record.restarts_for(ns, n)) == 0 for n in others)

            r = await run_licensectl("rollout", "skip-worker", f"{ns}/{gone}", kubeconfig=rig.kv.kubeconfig_path,
                                     env=fl.cli_env)
            assert r.code == 0 and "skip of worker" in r.out, (r.code, r.out, r.err)
            log: list[str] = []
            await kill_leader(started, rng=random.Random(8), fl=fl, log=log)

            async def others_done() -> bool:
                for name in others:
                    ann = await fl.vm_annotations(ns, name)
                    if ann.get(ANN_RESTART_REVISION) != revision or ann.get(ANN_RESTART_RESULT) != "done" or (
                            drain.ANN_DRAIN_STEP in ann):
                        return False
                return True
            await eventually(others_done, timeout=240, interval=0.5, what="the cluster's other workers restarted")
            ann = await fl.vm_annotations(ns, gone)
            assert ann.get(drain.ANN_DRAIN_REASON) in (None, drain.BlockReason.SKIPPED), ann  # never down again
            r = await run_licensectl("rollout", "skip-worker", f"{ns}/{gone}", kubeconfig=rig.kv.kubeconfig_path,
                                     env=fl.cli_env)
            assert r.code == 1 and "nothing to skip" in r.err, (r.code, r.out, r.err)
        finally:
            stop.set()
            await watcher
        assert {n: len(rig.kv.record.restarts_for(ns, n)) for n in workers} == dict.fromkeys(workers, 1)
        assert seen.max_disrupted == {"ka": 1}, seen.max_disrupted
        evs = (await CoreV1Api(fl.api).list_namespaced_event(
            ns, field_selector=f"involvedObject.name={gone},reason=WorkerSkipRequested")).items
        assert len(evs) == 1
