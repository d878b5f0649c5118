"""The drain shell's pass does no tenant I/O: each tenant cluster is driven by its own task, so a hung
tenant API holds up neither the pass nor another cluster, and its task ends with the leadership."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Mapping

from licensectl import config
from licensectl.controllers.worker_drain import WorkerDrainer
from licensectl.core import drain
from licensectl.core.model import ANN_RESTART_ATTEMPTED_AT, ANN_RESTART_ISSUED_AT, Vm, frozen_map
from licensectl.core.rollout import RestartVm, RolloutPlan
from licensectl.core.timecodec import format_micro_time
from licensectl.metrics import Metrics
from licensectl_dev.testkit.memory import MemoryClusterApi, MemoryEvents, MemoryTenantCluster

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class _Hung(MemoryTenantCluster):
    """A tenant whose API accepts the connection and never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    async def nodes(self) -> list[drain.TenantNode]:
        self.asked.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class _Tenants:
    def __init__(self, clusters: Mapping[str, MemoryTenantCluster]) -> None:
        self.clusters = clusters

    @contextlib.asynccontextmanager
    async def open(self, _namespace: str, cluster: str) -> AsyncIterator[MemoryTenantCluster]:
        yield self.clusters[cluster]


class _Kubevirt:
    def __init__(self, *, accept: bool = True) -> None:
        self.patched: list[tuple[str, Mapping[str, str | None]]] = []
        self.accept = accept

    async def annotate_vm(self, *, namespace: str, name: str, resource_version: str,
                          annotations: Mapping[str, str | None]) -> bool:
        self.patched.append((name, annotations))
        return self.accept


def _worker(cluster: str) -> Vm:
    """A worker whose cycle is open at the cordon step (its Node `<cluster>-n`)."""
    cycle = drain.DrainIntent(drain.Step.CORDON, "r2", NOW, NOW, node=f"{cluster}-n", cordoned=True)
    return Vm("t", f"{cluster}-md-0", "Always", frozen_map(cycle.render_annotations()), resource_version="1",
              labels=frozen_map({drain.LABEL_CLUSTER_NAME: cluster, drain.LABEL_ROLE: "worker"}))


async def test_a_hung_tenant_holds_up_neither_the_pass_nor_another_cluster_and_ends_with_leadership() -> None:
    hung = _Hung()
    fine = MemoryTenantCluster([drain.TenantNode("ok-n", "kubevirt://ok-md-0", ready=True, boot_id="b")])
    kubevirt = _Kubevirt()
    woken: list[str] = []
    watched: list[list[tuple[str, str]]] = []
    d = WorkerDrainer(cluster_api=MemoryClusterApi(), tenants=_Tenants({"hung": hung, "ok": fine}),
                      kubevirt=kubevirt, events=MemoryEvents(), metrics=Metrics(),  # type: ignore[arg-type]
                      settings=config.Settings(), clock=lambda: NOW, wake_rollout=lambda: woken.append("pass"),
                      watch_kubeconfigs=lambda c: watched.append(list(c)))
    vms = {(vm.namespace, vm.name): vm for vm in (_worker("hung"), _worker("ok"))}
    plan = RolloutPlan(actions=(), vmi_states={}, sources={}, next_wakeup=None)
    try:
        # The pass only hands the work over: it returns at once, whatever the tenants do.
        assert await asyncio.wait_for(d.reconcile(plan, vms, {}), 1) is None
        assert watched[-1] == [("t", "hung"), ("t", "ok")]  # their kubeconfig Secrets, by name
        await asyncio.wait_for(hung.asked.wait(), 5)
        for _ in range(200):
            if kubevirt.patched:
                break
            await asyncio.sleep(0.01)
        # The other cluster was driven (its Node and Pods read, the cycle's next step written on its VM; no
        # restart is planned, so the cycle closes) while the hung one still waits.
        assert fine.calls[:2] == [("list", "nodes"), ("list", "pods on ok-n")]
        assert [name for name, _ in kubevirt.patched] == ["ok-md-0"], kubevirt.patched
        assert d.busy_clusters() == frozenset({"t/hung"})
        # More passes change nothing for the hung cluster: it keeps only the latest work.
        assert await asyncio.wait_for(d.reconcile(plan, vms, {}), 1) is None
        assert d.busy_clusters() == frozenset({"t/hung"})
    finally:
        tasks = [t.task for t in d._tasks.tasks.values()]
        await d.stop()  # leadership lost: every cluster task ends, the kubeconfig watches too
    assert tasks and all(t.done() for t in tasks)
    assert watched[-1] == []


async def test_a_workers_restart_intent_is_timed_from_its_drain_step_not_from_the_plan() -> None:
    # The plan that named the restart is two minutes old (the tenant API was slow): the rollout must time
    # the restart from when the drain makes it, or it would judge it late before it began.
    kubevirt = _Kubevirt(accept=False)  # the patch is what is checked; nothing acts after it
    d = WorkerDrainer(cluster_api=MemoryClusterApi(), tenants=_Tenants({}), kubevirt=kubevirt,  # type: ignore[arg-type]
                      events=MemoryEvents(), metrics=Metrics(), settings=config.Settings(), clock=lambda: NOW)
    vm = _worker("ok")
    worker = drain.WorkerIdentity.from_vm(vm.namespace, vm.name, vm.labels)
    assert worker is not None
    cycle = drain.DrainIntent(drain.Step.RESTART, "r2", NOW, NOW, node="ok-n", cordoned=True, vmi_uid="u1")
    old, earlier = NOW - dt.timedelta(minutes=2), NOW - dt.timedelta(minutes=5)
    for planned, issued in ((RestartVm("t", vm.name, "u1", "r2", "rep", old, old, drained=True), NOW),
                            (RestartVm("t", vm.name, "u1", "r2", "rep", earlier, old, drained=True), earlier)):
        kubevirt.patched.clear()
        await d._apply(vm, worker, drain.Restart("u1", cycle), planned, None, NOW, None, None)
        [(_, patch)] = kubevirt.patched
        assert patch[ANN_RESTART_ATTEMPTED_AT] == format_micro_time(NOW)
        assert patch[ANN_RESTART_ISSUED_AT] == format_micro_time(issued)  # a re-issue keeps its first time
