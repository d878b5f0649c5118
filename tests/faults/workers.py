"""The worker-drain fault scenario: a tenant Kubernetes cluster's GPU workers drained and restarted by a
rotation while the controller is SIGKILLed and the tenant apiserver's connections are cut, stalled or refused.

Separate from scenarios.py because it needs a second control plane (the tenant cluster: kube-apiserver,
kube-scheduler and the tenant controllers, with the node agent playing its kubelets) and a sampler of
the tenant's Nodes and Pods: its invariants are the tenant's view (docs/operations.md#tenant-cluster-workers),
never licensectl's internals.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from kubernetes_asyncio.client import ApiClient, AppsV1Api, CoreV1Api, CustomObjectsApi, PolicyV1Api

from licensectl.kube.raw import RawApi
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.controlplane import render_kubeconfig
from licensectl_dev.devcluster.tenant_cluster import (
    CAPI_SECRET_TYPE,
    CLUSTER_NAME_LABEL,
    KUBECONFIG_KEY,
    ROLE_LABEL,
    kubeconfig_secret_name,
    tenant_api_client,
    tenant_control_plane,
)
from licensectl_dev.devcluster.tenant_nodes import TenantNodeAgent
from licensectl_dev.testkit.poll import eventually

from .scenarios import Run, kubevirt_world, rollout_checks, rotate_and_wait_replicas
from .toolkit import TcpProxy

CLUSTER = "kw"
MAX_DISRUPTED = 1  # --max-disrupted-workers
WEB_REPLICAS = 3
# Documented annotations (docs/operations.md#tenant-cluster-workers): the drain's records on the VM,
# the cordon marker on the Node.
DRAIN_ANNOTATION_PREFIX = "licensectl.io/drain-"
CORDONED_BY = "licensectl.io/cordoned-by"


class CountingTcpProxy(TcpProxy):
    """The tenant API's fault proxy, counting the connections licensectl opened through it."""

    accepted = 0

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await super()._accept(reader, writer)


def _ready(obj: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (obj.status.conditions or []) if obj.status)


@dataclass
class TenantView:
    """The tenant cluster as sampled throughout (its Nodes and the `web` Pods): the invariants' evidence."""

    workers: list[str]
    samples: int = 0
    max_disrupted: int = 0  # most workers unschedulable or not Ready at once
    min_web_ready: int = WEB_REPLICAS
    down_uncordoned: list[str] = field(default_factory=list)  # a worker not Ready while schedulable
    down_with_pods: list[str] = field(default_factory=list)  # a worker not Ready with a `web` Pod still on it
    cordoned: set[str] = field(default_factory=set)  # workers seen cordoned
    errors: int = 0

    async def sample(self, api: ApiClient, stop: asyncio.Event) -> None:
        core = CoreV1Api(api)
        while not stop.is_set():
            try:
                nodes = {n.metadata.name: n for n in (await core.list_node()).items}
                pods = (await core.list_namespaced_pod("default", label_selector="app=web")).items
            except Exception:  # the sampler reads the tenant directly; a failed read is a missed sample
                self.errors += 1
            else:
                live = [p for p in pods if p.metadata.deletion_timestamp is None]
                disrupted = 0
                for name in self.workers:
                    n = nodes.get(name)
                    if n is None:
                        continue
                    cordoned, up = bool(n.spec.unschedulable), _ready(n)
                    disrupted += int(cordoned or not up)
                    if cordoned:
                        self.cordoned.add(name)
                    if not up and not cordoned:
                        self.down_uncordoned.append(name)
                    if not up and any(p.spec.node_name == name for p in live):
                        self.down_with_pods.append(name)
                self.max_disrupted = max(self.max_disrupted, disrupted)
                self.min_web_ready = min(self.min_web_ready, sum(1 for p in live if _ready(p)))
                self.samples += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)


async def vm_annotations(api: ApiClient, ns: str, name: str) -> dict[str, str]:
    vm = await RawApi(CustomObjectsApi(api)).get_namespaced_custom_object("kubevirt.io", "v1", ns,
                                                                          "virtualmachines", name)
    return dict((vm.get("metadata") or {}).get("annotations") or {})


async def _publish_kubeconfig(run: Run, ns: str, server: str, ca_pem: bytes, token: str) -> None:
    """Secret `<cluster>-kubeconfig` as Cluster API stores it, its server the fault proxy."""
    doc = render_kubeconfig(server, ca_pem, token=token, name=CLUSTER, user=f"{CLUSTER}-admin")
    await fleet.put_secret(run.env.api, {
        "apiVersion": "v1", "kind": "Secret", "type": CAPI_SECRET_TYPE,
        "metadata": {"name": kubeconfig_secret_name(CLUSTER), "namespace": ns,
                     "labels": {CLUSTER_NAME_LABEL: CLUSTER}},
        "data": {KUBECONFIG_KEY: base64.b64encode(doc.encode()).decode()}})


async def worker_drain_faults(run: Run) -> None:
    """A rotation restarts a tenant cluster's three GPU workers (a Deployment under a PodDisruptionBudget
    on them) and plain VMs beside them, while the controller is SIGKILLed at random points and the
    tenant apiserver's connections are cut, stalled or refused. Never more than --max-disrupted-workers workers of
    the cluster disrupted; each worker cordoned, drained, restarted once and uncordoned, in that order
    (never down while schedulable, never down with a workload Pod on it); every worker ends current,
    uncordoned and unmarked."""
    long = run.mode == "long"
    tenant_cp = tenant_control_plane(CLUSTER)
    tenant_cp.start()  # before the simulators run: it blocks for its ~10 s start

    async def stop_tenant_cp() -> None:
        tenant_cp.stop()

    run.cleanups.append(stop_tenant_cp)
    w = await kubevirt_world(run, tenants=2, ready_delay=run.rng.uniform(0.4, 0.8))
    ns = w.tenants[0]
    upstream = urlparse(tenant_cp.server)
    tcp = CountingTcpProxy(upstream.port or 443, upstream.hostname or "127.0.0.1")
    await tcp.start()
    run.proxies.append(tcp)
    await _publish_kubeconfig(run, ns, tcp.url(), tenant_cp.ca_pem, tenant_cp.admin_token)
    tenant_api = await tenant_api_client(tenant_cp)  # direct: the agent, the setup and the sampler
    run.cleanups.append(tenant_api.close)
    agent = TenantNodeAgent(run.env.api, tenant_api, namespace=ns, cluster=CLUSTER, ready_delay=0.5)
    await agent.start()
    run.cleanups.append(agent.stop)

    assert run.rig is not None
    ctl = run.controller(run.kubeconfig("kv", run.rig.proxy.url), max_unavailable="2",
                         max_disrupted_workers=MAX_DISRUPTED, drain_retry_seconds=1, drain_timeout_seconds=120,
                         worker_boot_timeout_seconds=90)
    await ctl.start()
    await ctl.wait_ready()
    await eventually(lambda: w.replicas_present(w.tenants), timeout=60, what="replicas in every tenant")
    await asyncio.sleep(1.1)  # one-second revision times: boot after the revision
    workers = [f"{CLUSTER}-md-{i}" for i in range(3)]
    for name in workers:
        await fleet.create_vm(run.env.api, ns, name, license_secret=w.replica,
                              labels={CLUSTER_NAME_LABEL: CLUSTER, ROLE_LABEL: "worker"})
    worker_keys = [(ns, name) for name in workers]
    w.vms.extend(worker_keys)
    plain = await w.create_vms(2)
    vms = [*worker_keys, *plain]
    await eventually(lambda: w.vmis_ready(vms), timeout=60, what="fleet Ready")
    core = CoreV1Api(tenant_api)

    async def nodes_ready() -> bool:
        nodes = {n.metadata.name: n for n in (await core.list_node()).items}
        return all(name in nodes and _ready(nodes[name]) for name in workers)

    await eventually(nodes_ready, timeout=60, what=f"{CLUSTER}: every worker Node Ready")
    apps: Any = AppsV1Api(tenant_api)  # Any: plain dict bodies
    policy: Any = PolicyV1Api(tenant_api)
    await apps.create_namespaced_deployment("default", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": WEB_REPLICAS, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                     "containers": [{"name": "c", "image": "registry.example/web:1"}],
                     "terminationGracePeriodSeconds": 1}}}})
    await policy.create_namespaced_pod_disruption_budget("default", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "maxUnavailable": 1}})

    async def web_ready() -> bool:
        pods = (await core.list_namespaced_pod("default", label_selector="app=web")).items
        return sum(1 for p in pods if _ready(p)) == WEB_REPLICAS

    await eventually(web_ready, timeout=60, what=f"{CLUSTER}: web Ready")

    async def all_current() -> bool:
        s = await ctl.scrape()
        return s is not None and s.value("licensectl_rollout_vmis", state="current") == len(vms)

    await eventually(all_current, timeout=30, what="controller sees the fleet current")
    async def drains_closed() -> bool:
        for name in workers:
            if any(k.startswith(DRAIN_ANNOTATION_PREFIX) for k in await vm_annotations(run.env.api, ns, name)):
                return False
        return not any(n.spec.unschedulable for n in (await core.list_node()).items if n.metadata.name in workers)

    view = TenantView(workers)
    stop = asyncio.Event()
    sampler = asyncio.create_task(view.sample(tenant_api, stop))
    boots_before = {name: len(agent.record.boot_ids.get(name, [])) for name in workers}
    try:
        since, rev = await rotate_and_wait_replicas(run)

        async def draining() -> bool:
            for name in workers:
                ann = await vm_annotations(run.env.api, ns, name)
                if any(k.startswith(DRAIN_ANNOTATION_PREFIX) for k in ann):
                    return True
            return False

        # Each fault lands at a random point of a worker's drain cycle (cordon to uncordon): a SIGKILL (and
        # restart) of the controller, the tenant API's connections cut, stalled, or refused for a while.
        # The first five are these, the rest drawn.
        kinds = ["kill", "cut", "kill", "stall", "refuse"]
        kills_mid_drain = cut_conns = 0
        counts = dict.fromkeys(set(kinds), 0)
        deadline = time.monotonic() + (240 if long else 150)
        for i in range(12 if long else 6):
            if await w.vms_done(vms, rev) or time.monotonic() > deadline:
                break
            try:
                await eventually(draining, timeout=30, interval=0.05, what="a worker's drain records")
            except TimeoutError:
                continue
            await asyncio.sleep(run.rng.uniform(0.0, 0.8))
            fault = kinds[i] if i < len(kinds) else run.rng.choice(kinds)
            counts[fault] += 1
            if fault == "kill":
                kills_mid_drain += int(await draining())
                await ctl.kill()
                await asyncio.sleep(run.rng.choice([0.0, run.rng.uniform(0.1, 1.5)]))
                await ctl.start()
            elif fault == "cut":  # a slow, flapping link for 2 s: requests in flight are cut
                tcp.slow(0.3)
                for _ in range(20):
                    cut_conns += tcp.cut()
                    await asyncio.sleep(0.1)
                tcp.slow(0.0)
            elif fault == "stall":
                tcp.stall(run.rng.uniform(1.0, 4.0))
            else:
                tcp.refuse(True)
                asyncio.get_running_loop().call_later(run.rng.uniform(1.0, 4.0), tcp.refuse, False)
        await rollout_checks(run, vms, since, rev, max_unavailable=2, timeout=240 if long else 180)
        # A worker's restart is done once its VMI is Ready; its uncordon follows when its Node is back.
        with contextlib.suppress(TimeoutError):
            await eventually(drains_closed, timeout=60, interval=0.5, what="every drain closed")
    finally:
        stop.set()
        await sampler

    v = run.verdict
    run.notes.update(kills=ctl.kills, kills_mid_drain=kills_mid_drain, tenant_api_cuts=counts["cut"],
                     tenant_connections=tcp.accepted, tenant_connections_cut=cut_conns,
                     tenant_api_stalls=counts["stall"], tenant_api_refusals=counts["refuse"],
                     tenant_samples=view.samples)
    v.check("faults_during_drain", kills_mid_drain > 0 and view.cordoned != set(),
            f"{kills_mid_drain} kills mid-drain, workers seen cordoned: {sorted(view.cordoned)}: the drain was "
            "not under faults")
    v.check("tenant_api_through_the_fault_proxy", tcp.accepted > 0, "licensectl never reached the tenant API")
    v.check("tenant_sampled", view.samples > 20, f"only {view.samples} samples of the tenant cluster")
    v.check("max_disrupted_workers", view.max_disrupted <= MAX_DISRUPTED,
            f"{view.max_disrupted} workers of {CLUSTER} disrupted at once (limit {MAX_DISRUPTED})")
    v.check("restart_only_cordoned", not view.down_uncordoned,
            f"workers down while schedulable (restarted before cordon or uncordoned before back): "
            f"{sorted(set(view.down_uncordoned))}")
    v.check("restart_only_drained", not view.down_with_pods,
            f"workers down with a web Pod still on them: {sorted(set(view.down_with_pods))}")
    v.check("workload_budget_kept", view.min_web_ready >= WEB_REPLICAS - 1,
            f"web fell to {view.min_web_ready} Ready replicas (PDB maxUnavailable 1)")
    for name in workers:
        booted = len(agent.record.boot_ids.get(name, [])) - boots_before[name]
        v.check("worker_rebooted_once", booted == 1, f"{name}: {booted} new boot IDs, want 1")
    for name in workers:
        ann = await vm_annotations(run.env.api, ns, name)
        left = {k.removeprefix(DRAIN_ANNOTATION_PREFIX): val for k, val in ann.items()
                if k.startswith(DRAIN_ANNOTATION_PREFIX) and k.endswith(("step", "reason", "held"))}
        left_keys = sorted(k for k in ann if k.startswith(DRAIN_ANNOTATION_PREFIX))
        v.check("drain_records_removed", not left_keys, f"{name}: drain records left: {left_keys} {left}")
    for n in (await core.list_node()).items:
        if n.metadata.name in workers:
            v.check("worker_uncordoned", not n.spec.unschedulable, f"{n.metadata.name} left cordoned")
            v.check("cordon_marker_removed", CORDONED_BY not in (n.metadata.annotations or {}),
                    f"{n.metadata.name} still carries {CORDONED_BY}")
    await run.finish(entitled=w.tenants)
