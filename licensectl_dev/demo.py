"""`python -m licensectl_dev.demo` (`make demo`): a hoster's fleet on an embedded control plane, a token
rotation, live metrics.

Everything real that can run on a laptop is real: kube-apiserver + etcd (built from Go modules),
the controller, the guest scripts (under dash, against recorded nvidia-smi output), Prometheus with
the shipped alert rules. KubeVirt's controllers are played by the simulator (docs/design.md#kubevirt-restart).
One tenant also runs a Kubernetes cluster (Cluster API + CAPK shape) on two GPU worker VMs: a second real
control plane with kube-scheduler, whose kubelets the node agent plays; the rotation drains each worker
before restarting it (docs/design.md#tenant-worker-drain), and the demo shows that from the cluster's state.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import functools
import json
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from licensectl import config, logs
from licensectl.app import App
from licensectl.cli.status_fetch import status_from_controller
from licensectl.cli.status_offline import read_cluster
from licensectl.cli.status_render import status_table
from licensectl.core.drain import ANN_CORDONED_BY, ANN_DRAIN_STEP, ROLE_WORKER
from licensectl.core.model import ANN_SOURCE_REVISION
from licensectl.core.render import replica_name
from licensectl.core.revision_text import source_revision
from licensectl.core.rollout.view import progress_line
from licensectl.kube.tasks import cancel_and_wait
from licensectl.kube.watch import Informer, InformerOptions
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster import webhook as webhook_registration
from licensectl_dev.devcluster.controlplane import ControlPlane, ensure_binaries, ensure_scheduler
from licensectl_dev.devcluster.guest_fleet import GuestFleet, constant
from licensectl_dev.devcluster.guest_sim import GuestProfile
from licensectl_dev.devcluster.kubeapi import api_client_from_kubeconfig, install_crds
from licensectl_dev.devcluster.tenant_cluster import (
    CLUSTER_NAME_LABEL,
    ROLE_LABEL,
    kubeconfig_secret_name,
    publish_kubeconfig,
    tenant_api_client,
    tenant_control_plane,
)
from licensectl_dev.devcluster.tenant_nodes import TenantNodeAgent
from licensectl_dev.devcluster.virt_api import RestartProxy
from licensectl_dev.devcluster.virt_controller import KubevirtSimulator
from licensectl_dev.devcluster.vm_semantics import GROUP, VERSION, VM_PLURAL, VMI_PLURAL, Obj, is_deleting, is_ready

log = structlog.get_logger(__name__)

ROOT = "tenant-root"
CONTROLLER_NS = "licensectl-system"
SOURCE_NS = "hoster-licenses"
GRAPHICS, COMPUTE = "rtx-vws", "compute-vcs"
MAX_UNAVAILABLE, MAX_PER_NAMESPACE = 2, 1

# The tenant tree: (namespace, parent, vgpu flag: True granted / False withheld / None never set).
TREE: tuple[tuple[str, str | None, bool | None], ...] = (
    (ROOT, None, True),
    ("tenant-acme", ROOT, True),
    ("tenant-acme-render", "tenant-acme", True),
    ("tenant-acme-render-farm", "tenant-acme-render", True),
    ("tenant-acme-lab", "tenant-acme", False),          # withheld by acme for its lab...
    ("tenant-acme-lab-gpu", "tenant-acme-lab", True),   # ...so the flag below it does not hold
    ("tenant-globex", ROOT, True),
    ("tenant-globex-ml", "tenant-globex", True),
    ("tenant-initech", ROOT, None),                     # never granted vGPU
)
# Claims: (namespace, class).
CLAIMS: tuple[tuple[str, str], ...] = (
    ("tenant-acme-render", GRAPHICS), ("tenant-acme-render-farm", GRAPHICS), ("tenant-acme-lab-gpu", GRAPHICS),
    ("tenant-globex", GRAPHICS), ("tenant-globex", COMPUTE), ("tenant-globex-ml", COMPUTE),
    ("tenant-initech", GRAPHICS),
)
EXPECTED_ENTITLED = {("tenant-acme-render", GRAPHICS), ("tenant-acme-render-farm", GRAPHICS),
                     ("tenant-globex", GRAPHICS), ("tenant-globex", COMPUTE), ("tenant-globex-ml", COMPUTE)}
# A tenant Kubernetes cluster: globex runs cluster `ka` on two GPU worker VMs (CAPK's labels), which carry
# a Deployment of two replicas under a PodDisruptionBudget of maxUnavailable 1.
CLUSTER, CLUSTER_NS = "ka", "tenant-globex"
WORKERS = (f"{CLUSTER}-md-0", f"{CLUSTER}-md-1")
WEB, WEB_REPLICAS, WEB_MAX_UNAVAILABLE = "web", 2, 1
# VMs: (namespace, name, class, guest profile name).
VMS: tuple[tuple[str, str, str, str], ...] = (
    ("tenant-acme-render", "ws1", GRAPHICS, "licensed"),
    ("tenant-acme-render", "ws2", GRAPHICS, "licensed"),
    ("tenant-acme-render", "ws3", GRAPHICS, "licensed"),
    ("tenant-acme-render-farm", "node1", GRAPHICS, "licensed"),
    ("tenant-acme-render-farm", "node2", GRAPHICS, "silent"),
    # A Windows desktop: its reports are the Windows agent's (os, UTC offset, Windows-format log). In a
    # tenant of its own size class, so the rotation's longest wave (one restart at a time per tenant)
    # stays as long as it was.
    ("tenant-acme-render-farm", "win1", GRAPHICS, "windows"),
    ("tenant-globex", "desk1", GRAPHICS, "expiring"),
    ("tenant-globex-ml", "train1", COMPUTE, "licensed"),
    ("tenant-globex-ml", "train2", COMPUTE, "unlicensed"),
    *((CLUSTER_NS, worker, GRAPHICS, "licensed") for worker in WORKERS),
)
# desk1's license expires in three days, but nothing says its renewals fail: the expiry alert judges time
# left against the lease length a guest's renewals show (docs/design.md#lease-renewal), which a
# minute-long demo never runs down, so it stays quiet here (tests/monitoring/test_alerts_renewal.py).
EXPECTED_ALERTS = {"LicensectlGuestUnlicensed", "LicensectlGuestNotReporting", "LicensectlGuestWrongProduct"}
# Which guest each guest alert names: train1's compute class (FeatureType 4) implies Virtual Compute
# Server, but its guest holds the recorded RTX Virtual Workstation license (the dearer pool); train2's
# gridd log says the token is missing.
EXPECTED_ALERT_GUESTS = {
    "LicensectlGuestUnlicensed": ["tenant-globex-ml/train2"],
    "LicensectlGuestWrongProduct": ["tenant-globex-ml/train1"],
    "LicensectlGuestNotReporting": ["tenant-acme-render-farm/node2"],
}


def profile(name: str) -> GuestProfile:
    if name == "unlicensed":
        return GuestProfile.unlicensed()
    if name == "silent":
        return GuestProfile.quiet()
    if name == "expiring":
        return GuestProfile.expiring(dt.datetime.now(dt.UTC) + dt.timedelta(days=3))
    if name == "windows":
        return GuestProfile.windows_licensed()
    return GuestProfile.licensed()


def say(msg: str = "") -> None:
    print(msg, flush=True)


async def wait_for(cond: Callable[[], bool], seconds: float, failure: str) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{failure} within {seconds:.0f} s")
        await asyncio.sleep(0.2)


def web_deployment() -> dict[str, Any]:
    """The tenant's workload: spread softly over the workers (a cordoned Node does not count)."""
    spread = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
              "nodeTaintsPolicy": "Honor", "labelSelector": {"matchLabels": {"app": WEB}}}
    spec = {"containers": [{"name": WEB, "image": "registry.example/web:1"}], "terminationGracePeriodSeconds": 1,
            "topologySpreadConstraints": [spread]}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": WEB},
            "spec": {"replicas": WEB_REPLICAS, "selector": {"matchLabels": {"app": WEB}},
                     "template": {"metadata": {"labels": {"app": WEB}}, "spec": spec}}}


def web_pdb() -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": WEB},
            "spec": {"selector": {"matchLabels": {"app": WEB}}, "maxUnavailable": WEB_MAX_UNAVAILABLE}}


def _obj(raw: Mapping[str, Any]) -> Obj:
    return raw if isinstance(raw, dict) else dict(raw)


@dataclass
class WorkerTrace:
    """One worker as the clusters showed it: the drain intent licensectl wrote on its VM, its VMI, its
    tenant Node and the `web` Pods that left that Node. Events count only once `armed` (the rotation)."""

    events: list[tuple[float, str]] = field(default_factory=list)  # (monotonic time, what happened)
    steps: list[str] = field(default_factory=list)  # licensectl.io/drain-step values, in the order written
    evicted: set[str] = field(default_factory=set)  # uids of `web` Pods that left the Node
    step: str = ""  # the drain-step on the VM now
    vmi_uid: str = ""  # the running VMI (empty while it is going or gone)
    boot_id: str = ""  # the Node's last Ready bootID
    unschedulable: bool = False
    marked: bool = False  # the Node carries licensectl's cordon marker
    ready: bool = False  # the Node's Ready condition

    def phrases(self) -> list[str]:
        """The drain as one line's parts, in the order seen: evictions counted where the first happened."""
        out: list[str] = []
        for _, what in self.events:
            if what == "evicted":
                n = len(self.evicted)
                what = f"{n} pod{'' if n == 1 else 's'} evicted"
            if what not in out:
                out.append(what)
        if "cordoned" in out and "restarted" in out and not self.evicted:
            out.insert(out.index("cordoned") + 1, "no pod to evict")  # drained at once
        return out

    def seconds(self, first: str, last: str) -> float | None:
        start = next((t for t, w in self.events if w == first), None)
        end = next((t for t, w in reversed(self.events) if w == last), None)
        return None if start is None or end is None else end - start


class ClusterWatch:
    """The tenant cluster's story, read from state through watches: the worker VMs and VMIs (management
    cluster), the Nodes and the `web` Pods (tenant cluster). Every change is seen, however short."""

    def __init__(self, mgmt_api: Any, tenant_api: Any) -> None:
        from kubernetes_asyncio.client import CoreV1Api, CustomObjectsApi

        co: Any = CustomObjectsApi(mgmt_api)
        core: Any = CoreV1Api(tenant_api)
        self.workers = {w: WorkerTrace() for w in WORKERS}
        self.armed_at: float | None = None
        self.pods: dict[str, Obj] = {}  # uid -> `web` Pod
        self.min_ready: int | None = None  # fewest Ready `web` replicas seen since armed
        self.max_disrupted = 0  # most workers cordoned or not Ready at once, since armed
        self.down_with_pods: set[str] = set()  # a worker's Node not Ready while a `web` Pod was still on it
        self.observations = 0
        selector = f"{CLUSTER_NAME_LABEL}={CLUSTER}"

        def informer(name: str, lister: Any, on_change: Any, label_selector: str | None) -> Informer[Obj]:
            return Informer(f"demo-{CLUSTER}-{name}", lister, _obj, label_selector=label_selector,
                            on_change=on_change,
                            options=InformerOptions(watch_timeout=240.0, backoff_base=0.2, backoff_cap=1.0))

        self.informers = [
            informer("vms", functools.partial(co.list_namespaced_custom_object, GROUP, VERSION, CLUSTER_NS,
                                              VM_PLURAL), self._vm, selector),
            informer("vmis", functools.partial(co.list_namespaced_custom_object, GROUP, VERSION, CLUSTER_NS,
                                               VMI_PLURAL), self._vmi, selector),
            informer("nodes", core.list_node, self._node, None),
            informer("pods", functools.partial(core.list_namespaced_pod, "default"), self._pod, f"app={WEB}"),
        ]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(i.run(), name=i.name) for i in self.informers]
        for i in self.informers:
            if not await i.wait_synced(30):
                raise RuntimeError(f"tenant cluster {CLUSTER}: watch {i.name} did not sync within 30 s")

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks.clear()

    def arm(self) -> None:
        """From now on every drain step counts, and so does every moment the Deployment was short."""
        self.armed_at = time.monotonic()
        self._observe()

    # -- what the watches say ------------------------------------------------------------------------
    def _mark(self, worker: str, what: str) -> None:
        if self.armed_at is not None:
            self.workers[worker].events.append((time.monotonic(), what))

    def _vm(self, key: Any, _old: Obj | None, new: Obj | None) -> None:
        trace = self.workers.get(key[1])
        if trace is None:
            return
        step = str((((new or {}).get("metadata") or {}).get("annotations") or {}).get(ANN_DRAIN_STEP) or "")
        if step != trace.step and step and self.armed_at is not None:
            trace.steps.append(step)
        trace.step = step

    def _vmi(self, key: Any, _old: Obj | None, new: Obj | None) -> None:
        trace = self.workers.get(key[1])
        if trace is None:
            return
        uid = str(new["metadata"]["uid"]) if new is not None and not is_deleting(new) else ""
        if trace.vmi_uid and uid != trace.vmi_uid:
            self._mark(key[1], "restarted")  # the VMI it ran on is going: a restart (a new boot follows)
        trace.vmi_uid = uid

    def _node(self, key: Any, _old: Obj | None, new: Obj | None) -> None:
        trace = self.workers.get(key[1])
        if trace is None or new is None:
            return
        unschedulable = bool((new.get("spec") or {}).get("unschedulable"))
        if unschedulable != trace.unschedulable:
            self._mark(key[1], "cordoned" if unschedulable else "uncordoned")
        trace.unschedulable = unschedulable
        trace.marked = ANN_CORDONED_BY in ((new.get("metadata") or {}).get("annotations") or {})
        trace.ready = is_ready(new)
        boot = str(((new.get("status") or {}).get("nodeInfo") or {}).get("bootID") or "")
        if trace.ready and boot:
            if trace.boot_id and boot != trace.boot_id:
                self._mark(key[1], "node back (new boot)")
            trace.boot_id = boot
        self._observe()

    def _pod(self, _key: Any, old: Obj | None, new: Obj | None) -> None:
        was = old or new or {}
        uid = str((was.get("metadata") or {}).get("uid") or "")
        node = str((was.get("spec") or {}).get("nodeName") or "")
        leaving = new is None or (is_deleting(new) and (old is None or not is_deleting(old)))
        trace = self.workers.get(node)
        if trace is not None and leaving and uid not in trace.evicted and self.armed_at is not None:
            trace.evicted.add(uid)
            self._mark(node, "evicted")
        if new is None:
            self.pods.pop(uid, None)
        else:
            self.pods[str(new["metadata"]["uid"])] = new
        self._observe()

    def _observe(self) -> None:
        if self.armed_at is None:
            return
        self.observations += 1
        live = [p for p in self.pods.values() if not is_deleting(p)]
        ready = sum(1 for p in live if is_ready(p))
        self.min_ready = ready if self.min_ready is None else min(self.min_ready, ready)
        disrupted = [w for w, t in self.workers.items() if t.unschedulable or not t.ready]
        self.max_disrupted = max(self.max_disrupted, len(disrupted))
        for w, t in self.workers.items():
            if not t.ready and any((p.get("spec") or {}).get("nodeName") == w for p in live):
                self.down_with_pods.add(w)

    # -- what the demo asks -------------------------------------------------------------------------
    def nodes_ready(self) -> bool:
        return all(t.ready and t.boot_id for t in self.workers.values())

    def web_ready(self) -> int:
        return sum(1 for p in self.pods.values() if not is_deleting(p) and is_ready(p))

    def web_placement(self) -> dict[str, int]:
        return {w: sum(1 for p in self.pods.values() if (p.get("spec") or {}).get("nodeName") == w) for w in WORKERS}

    def idle(self) -> bool:
        """No drain cycle open: no intent on a worker VM, no worker cordoned."""
        return all(not t.step and not t.unschedulable for t in self.workers.values())

    def state(self, worker: str) -> str:
        t = self.workers[worker]
        return t.step or ("done" if any(w == "uncordoned" for _, w in t.events) else "-")

    def summary(self) -> dict[str, Any]:
        return {
            "namespace": CLUSTER_NS, "cluster": CLUSTER, "workers": list(WORKERS),
            "drains": {w: {"phrases": t.phrases(), "steps": t.steps, "evicted": len(t.evicted),
                           "cordons": sum(1 for _, what in t.events if what == "cordoned"),
                           "events": [(round(at - (self.armed_at or at), 2), what) for at, what in t.events],
                           "cordoned_seconds": t.seconds("cordoned", "uncordoned")}
                       for w, t in self.workers.items()},
            "deployment": {"name": WEB, "replicas": WEB_REPLICAS, "max_unavailable": WEB_MAX_UNAVAILABLE,
                           "min_ready": self.min_ready, "observations": self.observations},
            "max_disrupted_workers": self.max_disrupted,
            "down_with_pods": sorted(self.down_with_pods),
            "left_cordoned": sorted(w for w, t in self.workers.items() if t.unschedulable or t.marked),
        }


@dataclass
class Demo:
    duration: float
    with_prometheus: bool
    json_out: str | None
    metrics_port: int
    summary: dict[str, Any] = field(default_factory=dict)
    guests: dict[tuple[str, str], GuestProfile] = field(default_factory=dict)  # each VM's guest profile
    fleet: GuestFleet | None = None
    tenant_api: Any = None  # admin client of the tenant cluster
    agent: TenantNodeAgent | None = None
    watch: ClusterWatch | None = None

    async def run(self, stop: asyncio.Event) -> int:
        started = time.monotonic()
        say("== licensectl demo ==")
        bin_dir = await asyncio.to_thread(ensure_binaries, log=lambda m: say(f"   {m}"))
        await asyncio.to_thread(ensure_scheduler, log=lambda m: say(f"   {m}"))  # for the tenant cluster
        cp = ControlPlane(bin_dir, log=lambda m: say(f"   {m}"))
        await asyncio.to_thread(cp.start)
        prom = None
        app: App | None = None
        sim = proxy = None
        tenant_cp = tenant_control_plane(CLUSTER, log_fn=lambda m: log.info("tenant control plane", detail=m))
        tenant_start: asyncio.Task[ControlPlane] | None = None
        guest_task: asyncio.Task[None] | None = None
        api = await api_client_from_kubeconfig(cp.kubeconfig_path)
        try:
            # The tenant cluster's control plane starts beside the rest of the setup (about 7 s).
            tenant_start = asyncio.create_task(asyncio.to_thread(tenant_cp.start))
            await install_crds(api)
            sim = KubevirtSimulator(api, ready_delay=1.0)
            await sim.start()
            proxy = RestartProxy(sim, upstream=cp.server, ca_path=cp.ca_path, token=cp.admin_token)
            await proxy.start()
            say(f"1. control plane: kube-apiserver {cp.version} at {cp.server}; KubeVirt simulator + CRDs installed")
            await self.seed(api)
            settings = config.Settings(
                kubeconfig=str(proxy.kubeconfig_path), namespace=CONTROLLER_NS,
                metrics_address=f"127.0.0.1:{self.metrics_port}", reports_address="127.0.0.1:0",
                settle_seconds=5.0, max_unavailable=str(MAX_UNAVAILABLE), max_per_namespace=MAX_PER_NAMESPACE,
                restart_timeout_seconds=25.0, done_gate="ready-licensed", report_interval_seconds=5.0,
                # Simulated guests boot at once: a silent one shows as not reporting within the demo.
                guest_boot_allowance_seconds=10.0,
                canary="1", rollout_steps="50%,100%", analysis_deadline_seconds=120.0,
                resync_seconds=30.0, log_level="warning", tls_hosts="127.0.0.1",
                webhook_address="127.0.0.1:0", webhook_configuration="licensectl-demo",
                # The demo's golden image carries the vGPU guest driver (docs/operations.md#vgpu-driver-marks).
                vgpu_driver_images=fleet.GOLDEN_IMAGE,
                # Tenant cluster workers: an eviction a PodDisruptionBudget refused is retried after 1 s.
                drain_retry_seconds=1.0)
            app = App(settings, identity="demo")
            await app.start()
            # The apiserver calls the webhook for every VMI with a GPU claim: the VMs below carry no
            # license volume of their own, the webhook adds it (docs/operations.md#license-delivery).
            await webhook_registration.register(api, name=settings.webhook_configuration, port=app.webhook_port,
                                                ca_bundle=app.tls.ca_bundle)
            app.tls.wake()  # registered after start: re-check it now, not at the next periodic pass
            # Guests verify the loopback listener with the CA their replica carries (127.0.0.1 is a SAN).
            report_url = f"https://127.0.0.1:{app.reports_port}/v1/reports"
            say(f"3. controller running: metrics http://127.0.0.1:{app.metrics_port}/metrics  "
                f"status http://127.0.0.1:{app.metrics_port}/v1/status")
            if self.with_prometheus:
                from licensectl_dev.devcluster.prometheus import Prometheus

                prom = Prometheus([f"127.0.0.1:{app.metrics_port}"])
                await asyncio.to_thread(prom.start)
                say(f"   Prometheus {prom.url} scraping it with the shipped alert rules")
            await self.wait_replicas(api)
            await self.show_replicas(api, settings)
            await asyncio.sleep(1.1)  # VMs boot after their license exists (1 s timestamp resolution)
            await self.create_vms(api)
            guest_task = asyncio.create_task(self.guest_loop(api, report_url))
            guests_reporting = asyncio.create_task(self.wait_guests(app))  # meanwhile, the tenant cluster
            try:
                await self.start_tenant_cluster(api, tenant_start)
            except BaseException:
                guests_reporting.cancel()
                with contextlib.suppress(BaseException):
                    await guests_reporting
                raise
            await guests_reporting
            say("5. guests report through the real probe script:")
            self.print_guests(app)
            self.print_tenant_cluster(tenant_cp)
            assert self.watch is not None
            self.watch.arm()
            before = await self.rotate(api)
            say(f"6. rotated the {GRAPHICS} token in {SOURCE_NS}/nls-graphics ({source_revision(before)} -> new); "
                f"safe rotation: a canary, then 50% and 100% of the tenants, each step analysed on guest "
                f"reports; maxUnavailable {MAX_UNAVAILABLE}, {MAX_PER_NAMESPACE} per tenant, settle 5 s; "
                f"each worker of cluster {CLUSTER} is drained before its restart, one at a time")
            ok = await self.watch_rollout(app, sim, stop=stop, started=started)
            self.print_drains()
            await asyncio.sleep(3)  # one more probe round after the last restart
            await self.wait_silent_judged(app)
            view = await read_cluster(api, settings)
            doc = status_from_controller(app.status())  # what `licensectl status` shows: the controller's view
            say("7. licensectl status:")
            say(status_table(doc))
            alerts: list[str] = []
            if prom is not None:
                alerts = await self.show_alerts(prom)
            self.summarize(view, doc, sim=sim, app=app, alerts=alerts, ok=ok)
            remaining = self.duration - (time.monotonic() - started) if self.duration else None
            if remaining is None:
                say("demo complete; metrics keep being served. Press Ctrl-C to stop.")
                await stop.wait()
            elif remaining > 0 and not stop.is_set():
                say(f"serving metrics for {remaining:.0f} s more (--duration)")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), remaining)
            return 0 if ok else 1
        finally:
            if self.json_out:
                await asyncio.to_thread(Path(self.json_out).write_text,
                                        json.dumps(self.summary, indent=2, default=str))
            if app is not None:
                await app.stop()
            await self.stop_tenant_cluster()
            if guest_task is not None:
                guest_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await guest_task
            if prom is not None:
                prom.stop()
            if proxy is not None:
                await proxy.stop()
            if sim is not None:
                await sim.stop()
            await api.close()
            if self.fleet is not None:
                self.fleet.cleanup()
            if tenant_start is not None:
                with contextlib.suppress(Exception):  # a start that failed has stopped what it started
                    await tenant_start
            await asyncio.gather(asyncio.to_thread(cp.stop), asyncio.to_thread(tenant_cp.stop))
            say("stopped: control plane, tenant cluster, controller, simulator and Prometheus are gone")

    # -- steps --------------------------------------------------------------------------------------
    async def seed(self, api: Any) -> None:
        from kubernetes_asyncio.client import CoreV1Api

        core: Any = CoreV1Api(api)
        for ns in (CONTROLLER_NS, SOURCE_NS):
            await core.create_namespace({"metadata": {"name": ns}})
        made: dict[str, dict[str, Any]] = {}
        for name, parent, flag in TREE:
            made[name] = await fleet.create_tenant(api, name, parent=made.get(parent or ""), vgpu=flag)
        now = int(time.time())
        await fleet.put_source_secret(api, SOURCE_NS, "nls-graphics", token=fleet.fake_token(now + 86400 * 90),
                                      gridd_conf="# hoster defaults\nEnableUI=FALSE\n")
        await fleet.put_source_secret(api, SOURCE_NS, "nls-compute", token=fleet.fake_token(now + 86400 * 10))
        await fleet.create_gpu_class(api, GRAPHICS, mode="vgpu", secret=(SOURCE_NS, "nls-graphics"), feature_type=2)
        await fleet.create_gpu_class(api, COMPUTE, mode="vgpu", secret=(SOURCE_NS, "nls-compute"), feature_type=4)
        for i, (ns, cls) in enumerate(CLAIMS):
            await fleet.create_claim(api, ns, f"gpu-{i}", class_name=cls)
        say("2. seeded the hoster: tenant tree")
        for name, parent, flag in TREE:
            depth = 0
            p = parent
            while p:
                depth += 1
                p = next(x[1] for x in TREE if x[0] == p)
            mark = {True: "vgpu=true", False: "vgpu=false (withheld)", None: "vgpu unset"}[flag]
            claims = ", ".join(c for n, c in CLAIMS if n == name)
            say(f"   {'  ' * depth}{name:<26} {mark:<22} {('claims: ' + claims) if claims else ''}")
        say(f"   classes: {GRAPHICS} (vgpu, FeatureType 2, {SOURCE_NS}/nls-graphics), "
            f"{COMPUTE} (vgpu, FeatureType 4, {SOURCE_NS}/nls-compute)")

    async def wait_replicas(self, api: Any) -> None:
        from kubernetes_asyncio.client import CoreV1Api

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = await self.replica_holders(CoreV1Api(api))
            if found >= EXPECTED_ENTITLED:
                return
            await asyncio.sleep(0.5)
        raise RuntimeError("replicas did not appear within 60 s")

    async def replica_holders(self, core: Any) -> set[tuple[str, str]]:
        secrets = await core.list_secret_for_all_namespaces(label_selector="app.kubernetes.io/managed-by=licensectl")
        return {(s.metadata.namespace, (s.metadata.annotations or {}).get("licensectl.io/class", ""))
                for s in secrets.items if (s.metadata.annotations or {}).get("licensectl.io/class")}

    async def show_replicas(self, api: Any, settings: config.Settings) -> None:
        from kubernetes_asyncio.client import CoreV1Api

        holders = await self.replica_holders(CoreV1Api(api))
        say("4. replicas (only where the flag holds up to the root and a vGPU claim exists):")
        for ns, _, _ in TREE:
            classes = sorted(c for n, c in holders if n == ns)
            say(f"   {ns:<26} {', '.join(replica_name(c) for c in classes) or '-'}")
        self.summary["replicas"] = sorted([list(x) for x in holders])
        self.summary["expected_entitled"] = sorted([list(x) for x in EXPECTED_ENTITLED])

    async def create_vms(self, api: Any) -> None:
        for ns, name, cls, prof in VMS:
            # The tenant cluster's workers carry CAPK's labels, on the VM and its VMIs.
            labels = {CLUSTER_NAME_LABEL: CLUSTER, ROLE_LABEL: ROLE_WORKER} if name in WORKERS else None
            await fleet.create_vm(api, ns, name, gpu_claims=[f"gpu-{CLAIMS.index((ns, cls))}"], labels=labels)
            self.guests[(ns, name)] = profile(prof)

    async def start_tenant_cluster(self, api: Any, starting: asyncio.Task[ControlPlane]) -> None:
        """The tenant's cluster: its kubeconfig where Cluster API keeps it, kubelets for the worker VMs,
        the watch that records the drain, then `web` Ready on both workers under its budget."""
        from kubernetes_asyncio.client import AppsV1Api, PolicyV1Api

        tenant_cp = await starting
        await publish_kubeconfig(api, CLUSTER_NS, CLUSTER, tenant_cp)
        self.tenant_api = await tenant_api_client(tenant_cp)
        self.agent = TenantNodeAgent(api, self.tenant_api, namespace=CLUSTER_NS, cluster=CLUSTER,
                                     termination_delay=0.3, ready_delay=0.5)
        await self.agent.start()
        self.watch = ClusterWatch(api, self.tenant_api)
        await self.watch.start()
        await wait_for(self.watch.nodes_ready, 60, f"the Nodes of {CLUSTER}'s workers did not become Ready")
        apps: Any = AppsV1Api(self.tenant_api)
        policy: Any = PolicyV1Api(self.tenant_api)
        await apps.create_namespaced_deployment("default", web_deployment())
        await policy.create_namespaced_pod_disruption_budget("default", web_pdb())
        await wait_for(lambda: self.watch is not None and self.watch.web_ready() == WEB_REPLICAS, 60,
                       f"Deployment {WEB} in {CLUSTER} did not become Ready")

    async def stop_tenant_cluster(self) -> None:
        if self.watch is not None:
            await self.watch.stop()
        if self.agent is not None:
            await self.agent.stop()
        if self.tenant_api is not None:
            await self.tenant_api.close()

    def print_tenant_cluster(self, tenant_cp: ControlPlane) -> None:
        assert self.watch is not None
        placed = self.watch.web_placement()
        say(f"   {CLUSTER_NS} also runs Kubernetes cluster {CLUSTER} (Cluster API + CAPK): its own control plane "
            f"(kube-apiserver {tenant_cp.version} at {tenant_cp.server}, kube-scheduler), kubeconfig in Secret "
            f"{CLUSTER_NS}/{kubeconfig_secret_name(CLUSTER)}")
        say(f"   its GPU workers {', '.join(WORKERS)} are Nodes Ready; Deployment {WEB} {self.watch.web_ready()}/"
            f"{WEB_REPLICAS} Ready ({', '.join(f'{n} on {w}' for w, n in placed.items())}), "
            f"PodDisruptionBudget maxUnavailable {WEB_MAX_UNAVAILABLE}")

    async def guest_loop(self, api: Any, report_url: str) -> None:
        """Every simulated guest: (re)boot when its VMI is new (a restart), then probe on a timer."""
        self.fleet = GuestFleet(api, report_url, interval_seconds=2.0)
        for (ns, name), prof in self.guests.items():
            self.fleet.add(ns, name, profile_for=constant(prof))  # the demo's guests ignore the token
        await self.fleet.run()

    async def wait_guests(self, app: App) -> None:
        deadline = time.monotonic() + 60
        reporting = sum(1 for *_, p in VMS if p != "silent")
        known: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            known = [g for g in app.status()["guests"]["list"] if g["state"] != "unknown"]
            if len(known) >= reporting:
                return
            await asyncio.sleep(0.5)
        heard = {f"{g['namespace']}/{g['vmi']}" for g in known}
        missing = sorted(f"{ns}/{name}" for ns, name, _, p in VMS if p != "silent" and f"{ns}/{name}" not in heard)
        raise RuntimeError(f"guests did not report within 60 s: {', '.join(missing)}")

    async def wait_silent_judged(self, app: App) -> None:
        """A silent guest restarted by the rollout gets a new VMI's patience (boot allowance plus three
        report intervals): wait, bounded, until the controller calls every silent guest not reporting."""
        silent = {f"{ns}/{name}" for ns, name, _, p in VMS if p == "silent"}
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            judged = {f"{g['namespace']}/{g['vmi']}" for g in app.status()["guests"]["list"] if g["state"] == "unknown"}
            if silent <= judged:
                return
            await asyncio.sleep(0.5)

    def print_guests(self, app: App) -> None:
        for g in app.status()["guests"]["list"]:
            say(f"   {g['namespace'] + '/' + g['vmi']:<32} {g['state']:<11} expiry {g['expiry'] or '-'}")

    async def rotate(self, api: Any) -> str:
        from kubernetes_asyncio.client import CoreV1Api

        core = CoreV1Api(api)
        old = await core.read_namespaced_secret("nls-graphics", SOURCE_NS)
        rev = ""
        for s in (await core.list_secret_for_all_namespaces(
                label_selector="app.kubernetes.io/managed-by=licensectl")).items:
            if (s.metadata.annotations or {}).get("licensectl.io/class") == GRAPHICS:
                rev = s.metadata.annotations.get(ANN_SOURCE_REVISION, "")
        new = fleet.fake_token(int(time.time()) + 86400 * 365, extra={"rotation": 2})
        import base64

        old.data["client_configuration_token.tok"] = base64.b64encode(new).decode()
        await core.replace_namespaced_secret("nls-graphics", SOURCE_NS, old)
        return rev

    async def watch_rollout(self, app: App, sim: KubevirtSimulator, *, stop: asyncio.Event, started: float) -> bool:
        """Live progress from the controller's own view (it holds the guest evidence the gate uses)."""
        tty = sys.stdout.isatty()
        last = ""
        source = f"{SOURCE_NS}/nls-graphics"
        seen_progress = False
        deadline = started + self.duration if self.duration else None
        while not stop.is_set():
            status = app.status()
            r = (status["rollout"].get("sources") or {}).get(source)
            rot = (status.get("rotation") or {}).get(source) or {}
            if r is not None:
                per_ns = {ns: len([x for x in sim.record.restarts if x.namespace == ns and x.status == 202])
                          for ns, *_ in TREE if any(v[0] == ns and v[2] == GRAPHICS for v in VMS)}
                line = progress_line(source, {**r, "rotation": rot}, tty) + (
                    "  restarts per tenant: ") + ", ".join(
                    f"{ns.removeprefix('tenant-')}={n}" for ns, n in per_ns.items()) + self.drain_segment()
                if line != last:
                    say("   " + line)
                    last = line
                seen_progress = seen_progress or r["phase"] in ("settling", "progressing", "paused")
                # Done when the rotation decided (promoted everywhere, or aborted) and no restart is left.
                settled = r["phase"] in ("complete", "paused") and not r["restarting"] and (
                    self.watch is None or self.watch.idle())  # and every worker's drain cycle closed
                if seen_progress and settled and rot.get("phase") in ("promoted", "aborted"):
                    return bool(r["phase"] == "complete" and rot.get("phase") == "promoted")
            if deadline is not None and time.monotonic() > deadline:
                say("   --duration reached before the rollout finished")
                return False
            await asyncio.sleep(0.5)
        return False

    def drain_segment(self) -> str:
        """The workers' drain steps for the progress line (the intent on each VM, `done` once uncordoned)."""
        if self.watch is None:
            return ""
        w = self.watch
        return f"  {CLUSTER} workers: " + ", ".join(
            f"{name.removeprefix(CLUSTER + '-')}={w.state(name)}" for name in WORKERS)

    def print_drains(self) -> None:
        """Each worker's drain as its VM, VMI, Node and Pods showed it, and what the tenant's workload saw."""
        if self.watch is None:
            return
        doc = self.watch.summary()
        say(f"   tenant cluster {CLUSTER} ({CLUSTER_NS}), from its Nodes and Pods and the drain intent on the VMs:")
        for name, d in doc["drains"].items():
            held = f"; cordoned {d['cordoned_seconds']:.1f} s" if d["cordoned_seconds"] is not None else ""
            say(f"   {name}: {', '.join(d['phrases']) or 'not drained'}  "
                f"(drain-step {' > '.join(d['steps']) or '-'}{held})")
        dep = doc["deployment"]
        least = dep["min_ready"] if dep["min_ready"] is not None else 0
        kept = (f"kept at least {least} of {WEB_REPLICAS} replicas Ready throughout" if least >= 1
                else f"had NO Ready replica at some point, of {WEB_REPLICAS}")
        down = ("no Node went down with a web Pod on it" if not doc["down_with_pods"]
                else f"went down with web Pods on it: {', '.join(doc['down_with_pods'])}")
        n = doc["max_disrupted_workers"]
        say(f"   Deployment {WEB}: {kept} (PodDisruptionBudget maxUnavailable {WEB_MAX_UNAVAILABLE}); "
            f"at most {n} worker{'' if n == 1 else 's'} disrupted at once; {down}")
        self.summary["tenant_cluster"] = doc

    async def show_alerts(self, prom: Any) -> list[str]:
        await asyncio.sleep(6)  # two evaluation rounds after the final state
        alerts = await asyncio.to_thread(prom.alerts)
        say("8. Prometheus alerts (rules as shipped; long `for:` durations show as pending in a short demo):")
        names = sorted({(a["labels"]["alertname"], a["state"], a["labels"].get("vmi", "")) for a in alerts})
        for name, state, vmi in names:
            say(f"   {state:<8} {name} {vmi}")
        guests: dict[str, set[str]] = {}
        for a in alerts:
            lab = a["labels"]
            if "vmi" in lab and "namespace" in lab:
                guests.setdefault(lab["alertname"], set()).add(f"{lab['namespace']}/{lab['vmi']}")
        self.summary["alert_guests"] = {k: sorted(v) for k, v in sorted(guests.items())}
        self.summary["alert_reasons"] = {f"{a['labels']['namespace']}/{a['labels']['vmi']}": a["labels"]["reason"]
                                         for a in alerts if a["labels"]["alertname"] == "LicensectlGuestUnlicensed"
                                         and "reason" in a["labels"]}
        return sorted({n for n, _, _ in names})

    def summarize(self, view: Any, doc: dict[str, Any], *, sim: KubevirtSimulator, app: App, alerts: list[str],
                  ok: bool) -> None:
        rec = sim.record
        graphics_vms = [(ns, name) for ns, name, cls, _ in VMS if cls == GRAPHICS]
        self.summary.update({
            "rollout_complete": ok,
            "rollout": doc["rollouts"].get(f"{SOURCE_NS}/nls-graphics"),
            "restarts": {f"{ns}/{name}": len(rec.restarts_for(ns, name)) for ns, name, _, _ in VMS},
            "graphics_vms": [f"{ns}/{name}" for ns, name in graphics_vms],
            "max_concurrent_unavailable": rec.max_concurrent_unavailable(),
            "max_concurrent_unavailable_per_namespace": {
                ns: rec.max_concurrent_unavailable(ns) for ns, *_ in TREE},
            "limits": {"max_unavailable": MAX_UNAVAILABLE, "max_per_namespace": MAX_PER_NAMESPACE},
            "guests": {f"{g['namespace']}/{g['vmi']}": g for g in app.status()["guests"]["list"]},
            "guest_profiles": {f"{ns}/{name}": p for ns, name, _, p in VMS},
            "alerts": alerts,
            "expected_alerts": sorted(EXPECTED_ALERTS),
            "expected_alert_guests": EXPECTED_ALERT_GUESTS,
            "metrics_url": f"http://127.0.0.1:{app.metrics_port}/metrics",
        })


def demo_main(args: Any) -> int:
    logs.configure("console", "warning")
    demo = Demo(duration=args.duration, with_prometheus=args.prometheus, json_out=args.json_out,
                metrics_port=args.metrics_port)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await demo.run(stop)

    try:
        return asyncio.run(main())
    except RuntimeError as e:
        print(f"licensectl demo: {e}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    """The demo's flags; it is dev tooling, so it is no subcommand of the shipped `licensectl`."""
    p = argparse.ArgumentParser(prog="python -m licensectl_dev.demo",
                                description="run a demo fleet on an embedded local control plane")
    p.add_argument("--duration", type=float, default=0.0,
                   help="stop after this many seconds (0: run until Ctrl-C)")
    p.add_argument("--prometheus", action="store_true", help="also start a real Prometheus with the alerts")
    p.add_argument("--json", dest="json_out", default=None, help="write a JSON summary to this file")
    p.add_argument("--metrics-port", type=int, default=9108)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return demo_main(_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
