"""Tenant Kubernetes clusters' GPU workers are drained before their license restart
(docs/design.md#tenant-worker-drain): two `licensectl run` processes (leader and warm standby) against the
real management apiserver, two real tenant control planes (kube-apiserver, kube-scheduler, the
ReplicaSet, Deployment and disruption controllers) whose kubeconfigs sit in `<cluster>-kubeconfig`
Secrets, the KubeVirt simulator and a node agent playing the tenants' kubelets.

Each tenant cluster has three GPU workers and a control-plane machine, and runs a Deployment of three
replicas with a PodDisruptionBudget of maxUnavailable 1. One worker of the second cluster also hosts a
Pod whose budget never allows an eviction. A rotation, with the leader SIGKILLed while a worker drains:

* every other worker is cordoned, drained, restarted exactly once and uncordoned; the control-plane
  machines are never restarted (manual);
* never two workers of one cluster disrupted together (unschedulable or not Ready), no Node ever goes
  down with a Deployment Pod still on it, and each Deployment keeps at least two Ready replicas;
* the worker whose budget never allows is blocked (PDBBlocked: Event, metric, status), its Node
  uncordoned, its VMI never restarted, while the others finish;
* at the end no Node is left cordoned and none carries licensectl's marker.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, AppsV1Api, CoreV1Api, PolicyV1Api

from licensectl.core import drain
from licensectl.core.model import ANN_RESTART_RESULT, ANN_RESTART_REVISION, LABEL_CAPI_CLUSTER_NAME, LABEL_CAPI_ROLE
from licensectl_dev.devcluster import fleet as devfleet
from licensectl_dev.devcluster import webhook as webhook_registration
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.poll import EventuallyTimeout, eventually

from ..conftest import TenantClusterFactory, TenantEnv
from .support import Rig, controllers
from .test_rotation_kill import PODS, kill_leader, start_pod

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]

WORKERS = 3
# A plain rotation (no canary), restarts of both clusters at once, a drain given 20 s to finish.
SETTINGS: dict[str, Any] = {"canary": "0", "rollout_steps": "100%", "done_gate": "ready", "max_unavailable": "4",
                            "max_per_namespace": 4, "restart_timeout_seconds": 90, "restart_reissue_seconds": 10,
                            "drain_retry_seconds": 1, "drain_timeout_seconds": 20, "worker_boot_timeout_seconds": 60,
                            "settle_seconds": 1}


def worker_labels(cluster: str, role: str = "worker") -> dict[str, str]:
    return {LABEL_CAPI_CLUSTER_NAME: cluster, LABEL_CAPI_ROLE: role}


def deployment(name: str, replicas: int, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "registry.example/web:1"}],
                            "terminationGracePeriodSeconds": 1}
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


def pdb(name: str, **budget: Any) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"app": name}}, **budget}}


def _ready(obj: Any) -> str:
    for c in (obj.status.conditions or []) if obj.status else []:
        if c.type == "Ready":
            return str(c.status)
    return "Unknown"


@dataclass
class Watch:
    """What a tenant cluster looked like throughout, sampled: the assertions' evidence."""

    min_ready: dict[str, int] = field(default_factory=dict)  # cluster -> fewest Ready `web` replicas seen
    max_disrupted: dict[str, int] = field(default_factory=dict)  # cluster -> most workers disrupted at once
    down_with_pods: list[str] = field(default_factory=list)  # a Node not Ready while a `web` Pod was on it
    samples: int = 0


async def observe(tenants: list[TenantEnv], seen: Watch, stop: asyncio.Event) -> None:
    while not stop.is_set():
        for t in tenants:
            core = CoreV1Api(t.api)
            nodes = (await core.list_node()).items
            pods = (await core.list_namespaced_pod("default", label_selector="app=web")).items
            workers = [n for n in nodes if "node-role.kubernetes.io/control-plane" not in (n.metadata.labels or {})]
            disrupted = sum(1 for n in workers if n.spec.unschedulable or _ready(n) != "True")
            seen.max_disrupted[t.cluster] = max(seen.max_disrupted.get(t.cluster, 0), disrupted)
            ready = sum(1 for p in pods if p.metadata.deletion_timestamp is None and _ready(p) == "True")
            seen.min_ready[t.cluster] = min(seen.min_ready.get(t.cluster, 99), ready)
            for n in workers:
                if _ready(n) != "True" and any(p.spec.node_name == n.metadata.name
                                               and p.metadata.deletion_timestamp is None for p in pods):
                    seen.down_with_pods.append(f"{t.cluster}/{n.metadata.name}")
        seen.samples += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


async def start_pair(rig: Rig, started: list[ControllerProcess], settings: dict[str, Any]) -> ControllerProcess:
    """A leader and a warm standby, replicas in every tenant and delivery proven there; returns the standby."""
    fl = rig.fleet
    a = await start_pod(rig, started, PODS[0], **settings)
    await a.wait_metric("licensectl_leader", 1)
    b = await start_pod(rig, started, PODS[1], **settings)
    await eventually(fl.revision, timeout=30, what="replicas in every tenant")
    for ns in fl.tenants[:2]:
        await webhook_registration.wait_delivery(fl.api, namespace=ns, claim="gpu")
    await asyncio.sleep(1.1)  # one-second revision times: boot after the revision
    return b


async def rotate(fl: Any) -> str:
    """A new token; returns the new revision once every tenant's replica carries it."""
    old = await fl.revision()
    await fl.rotate(1)

    async def new_revision() -> str | None:
        rev = await fl.revision()
        return rev if rev != old else None

    return str(await eventually(new_revision, timeout=30, what="the new revision everywhere"))


async def boot_cluster(rig: Rig, make: TenantClusterFactory, ns: str, cluster: str,
                       *, budget: bool = True) -> tuple[TenantEnv, list[str]]:
    """A tenant cluster: its workers and control-plane machine as vGPU VMs, Nodes Ready, `web` Ready
    (with its PodDisruptionBudget unless `budget=False`)."""
    t = await make(ns, cluster, kubevirt=rig.kv, fresh=True, ready_delay=0.5)
    names = [f"{cluster}-md-{i}" for i in range(WORKERS)]
    for name in names:
        await devfleet.create_vm(rig.api, ns, name, gpu_claims=["gpu"], labels=worker_labels(cluster))
    await devfleet.create_vm(rig.api, ns, f"{cluster}-cp-0", gpu_claims=["gpu"],
                             labels=worker_labels(cluster, "control-plane"))
    core = CoreV1Api(t.api)

    async def nodes_ready() -> bool:
        nodes = (await core.list_node()).items
        return len(nodes) == WORKERS + 1 and all(_ready(n) == "True" for n in nodes)

    await eventually(nodes_ready, timeout=60, what=f"{cluster}: every Node Ready")
    await AppsV1Api(t.api).create_namespaced_deployment("default", deployment("web", 3))
    if budget:
        await PolicyV1Api(t.api).create_namespaced_pod_disruption_budget("default", pdb("web", maxUnavailable=1))

    async def web_ready() -> bool:
        pods = (await core.list_namespaced_pod("default", label_selector="app=web")).items
        return sum(1 for p in pods if _ready(p) == "True") == 3

    await eventually(web_ready, timeout=60, what=f"{cluster}: web Ready")
    return t, names


async def test_rotation_drains_each_worker_once_within_budgets_through_a_leader_kill(
        rig: Rig, tenant_cluster_factory: TenantClusterFactory) -> None:
    fl = rig.fleet
    ns_a, ns_b = fl.tenants[0], fl.tenants[1]
    async with controllers() as started:
        b = await start_pair(rig, started, SETTINGS)
        ka, workers_a = await boot_cluster(rig, tenant_cluster_factory, ns_a, "ka")
        kb, workers_b = await boot_cluster(rig, tenant_cluster_factory, ns_b, "kb")
        # A Pod on kb's last worker whose budget never allows an eviction.
        stuck = workers_b[-1]
        await AppsV1Api(kb.api).create_namespaced_deployment("default", deployment("solo", 1, node=stuck))
        await PolicyV1Api(kb.api).create_namespaced_pod_disruption_budget("default", pdb("solo", minAvailable=1))
        await eventually(lambda: _solo_ready(kb.api), timeout=60, what="solo Ready")
        await b.wait_metric("licensectl_ready", 1)
        await asyncio.sleep(1.1)

        seen = Watch()
        stop = asyncio.Event()
        watcher = asyncio.create_task(observe([ka, kb], seen, stop))
        restarts_before = len(rig.kv.record.restarts)
        try:
            revision = await rotate(fl)

            async def draining() -> bool:
                for ns, names in ((ns_a, workers_a), (ns_b, workers_b)):
                    for name in names:
                        if (await fl.vm_annotations(ns, name)).get(drain.ANN_DRAIN_STEP) == drain.Step.DRAIN:
                            return True
                return False

            await eventually(draining, timeout=60, interval=0.05, what="a worker draining")
            log: list[str] = []
            await kill_leader(started, rng=random.Random(7), fl=fl, log=log)

            finished = [(ns_a, n) for n in workers_a] + [(ns_b, n) for n in workers_b[:-1]]

            async def unfinished() -> list[str]:
                out = []
                for ns, name in finished:
                    ann = await fl.vm_annotations(ns, name)
                    if (ann.get(ANN_RESTART_REVISION) != revision or ann.get(ANN_RESTART_RESULT) != "done"
                            or drain.ANN_DRAIN_STEP in ann):
                        out.append(f"{name}: {_licensectl(ann)}")
                ann = await fl.vm_annotations(ns_b, stuck)
                if ann.get(drain.ANN_DRAIN_STEP) != drain.Step.BLOCKED:
                    out.append(f"{stuck}: {_licensectl(ann)}")
                return out

            async def all_finished() -> bool:
                return not await unfinished()

            try:
                await eventually(all_finished, timeout=240, interval=0.5, what="every worker drained and restarted")
            except EventuallyTimeout:
                raise AssertionError(f"unfinished after 240 s: {await unfinished()}; kills: {log}") from None
            await asyncio.sleep(2)  # a few more passes: nothing more restarts, nothing is cordoned again
        finally:
            stop.set()
            await watcher

        # Exactly once per finished worker, never the blocked one or a control-plane machine.
        counts = {f"{ns}/{name}": len(rig.kv.record.restarts_for(ns, name)) for ns, name in finished}
        assert counts == dict.fromkeys(counts, 1), counts
        assert rig.kv.record.restarts_for(ns_b, stuck) == []
        assert rig.kv.record.restarts_for(ns_a, "ka-cp-0") == [] and rig.kv.record.restarts_for(ns_b, "kb-cp-0") == []
        assert len(rig.kv.record.restarts) - restarts_before == len(finished)
        # The tenants' view throughout.
        assert seen.samples > 20
        assert seen.max_disrupted == {"ka": 1, "kb": 1}, seen.max_disrupted
        assert seen.down_with_pods == [], seen.down_with_pods[:5]
        assert min(seen.min_ready.values()) >= 2, seen.min_ready
        # Every Node of both clusters schedulable again, none carrying licensectl's marker.
        for t in (ka, kb):
            for n in (await CoreV1Api(t.api).list_node()).items:
                assert not n.spec.unschedulable, n.metadata.name
                assert drain.ANN_CORDONED_BY not in (n.metadata.annotations or {}), n.metadata.name
            for node in (n for n in t.agent.record.boot_ids if "-md-" in n and n != stuck):
                assert len(t.agent.record.boot_ids[node]) == 2, (node, t.agent.record.boot_ids[node])
        # The blocked worker: named in its intent, an Event on the VM, the metric on the leader.
        ann = await fl.vm_annotations(ns_b, stuck)
        assert ann.get(drain.ANN_DRAIN_REASON) == drain.BlockReason.PDB_BLOCKED
        events = (await CoreV1Api(fl.api).list_namespaced_event(
            ns_b, field_selector=f"involvedObject.name={stuck},reason=WorkerDrainBlocked")).items
        assert events and "PDBBlocked" in events[0].message
        live = [c for c in started if c.alive()]
        scrapes = [await c.scrape() for c in live]
        assert any(s is not None and s.value("licensectl_worker_drain_blocked", namespace=ns_b, vm=stuck,
                                             cluster="kb", reason="PDBBlocked") == 1.0 for s in scrapes)
        assert any(s is not None and (s.value("licensectl_worker_evictions_total", result="refused") or 0) > 0
                   for s in scrapes)
        assert log, "the leader was killed mid-drain"


def _licensectl(ann: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix("licensectl.io/"): v for k, v in ann.items() if k.startswith("licensectl.io/")}


async def _solo_ready(api: ApiClient) -> bool:
    pods = (await CoreV1Api(api).list_namespaced_pod("default", label_selector="app=solo")).items
    return any(_ready(p) == "True" for p in pods)
