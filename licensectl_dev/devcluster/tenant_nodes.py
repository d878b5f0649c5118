"""Node agent simulator: the kubelets (and node-lifecycle controller) of a CAPK tenant cluster.

Each worker VM of a Cluster API + CAPK tenant cluster is a Node of that cluster. The tenant control
plane here is real (kube-apiserver, kube-scheduler, kube-controller-manager without the node-lifecycle
controller), but there are no kubelets; `TenantNodeAgent` plays them, driven by the management
cluster's VMIs (from the KubeVirt simulator) and the tenant's Pods and Nodes, all through watches.

Upstream behaviour each rule plays:
- kubelet registration (kubernetes pkg/kubelet/kubelet_node_status.go `initialNode`): a Node named
  after the host (the VMI name = VM name), `kubernetes.io/hostname`/os/arch labels, providerID
  `kubevirt://<KubevirtMachine>` (CAPK pkg/kubevirt/machine.go `GenerateProviderID`; machine name from
  the `capk.cluster.x-k8s.io/kubevirt-machine-name` label, else the VM name). kubeadm adds the
  control-plane role label and `node-role.kubernetes.io/control-plane:NoSchedule` taint on those.
  The Node is never deleted: a rebooting machine keeps its Node object.
- kubelet status (pkg/kubelet/nodestatus/setters.go): capacity/allocatable, pressure conditions False,
  Ready True with heartbeat times, `nodeInfo.bootID` (here: the VMI uid, so a new VMI is a new boot).
- node-lifecycle controller (pkg/controller/nodelifecycle): when the kubelet stops posting (VMI absent,
  deleting or not Ready) every condition becomes Unknown (`NodeStatusUnknown`, the grace period
  compressed to zero), `MarkPodsNotReady` sets the Node's pods Ready=False, and taint-by-condition adds
  `node.kubernetes.io/unreachable` NoSchedule + NoExecute (and removes it, and the `not-ready` taint the
  TaintNodesByCondition admission plugin puts on new Nodes, once Ready).
- kubelet pod workers (pkg/kubelet/status/status_manager.go): a Pod bound to an up Node becomes
  Running with all conditions True and ready containers `ready_delay` seconds later (image pull,
  container start, first readiness probe: a replacement is never Ready at once, which is what keeps a
  PodDisruptionBudget spent for a while); after a reboot the same Pod objects run again with
  restartCount + 1. A Pod with a deletionTimestamp on an up Node is deleted with grace 0
  `termination_delay` seconds later (containers stopped); on a down Node nothing happens (no kubelet).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.rest import ApiException

from licensectl.core.timecodec import format_time
from licensectl.kube.tasks import cancel_and_wait
from licensectl.kube.watch import Informer, InformerOptions
from licensectl_dev.devcluster.controlplane import K8S_VERSION
from licensectl_dev.devcluster.tenant_cluster import CLUSTER_NAME_LABEL, MACHINE_NAME_LABEL, ROLE_LABEL
from licensectl_dev.devcluster.vm_semantics import GROUP, JSON_PATCH, VERSION, VMI_PLURAL, Obj, is_deleting, is_ready

log = structlog.get_logger(__name__)

STRATEGIC = "application/strategic-merge-patch+json"
PROVIDER_PREFIX = "kubevirt://"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
NODE_CONDITIONS = (("MemoryPressure", "KubeletHasSufficientMemory"), ("DiskPressure", "KubeletHasNoDiskPressure"),
                   ("PIDPressure", "KubeletHasSufficientPID"), ("Ready", "KubeletReady"))
CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}


def _now() -> str:
    return format_time(dt.datetime.now(dt.UTC))


def _raw(obj: Mapping[str, Any]) -> Obj:
    return obj if isinstance(obj, dict) else dict(obj)


def _cond(obj: Obj, typ: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == typ:
            return dict(c)
    return {}


def vmi_up(vmi: Obj | None) -> bool:
    """The guest runs and its kubelet would post status: VMI Running, Ready and not being deleted."""
    return (vmi is not None and (vmi.get("status") or {}).get("phase") == "Running" and is_ready(vmi)
            and not is_deleting(vmi))


@dataclass
class AgentRecord:
    """What the agent wrote, with monotonic times, for tests to assert on."""

    ready: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # node -> (t, Ready status)
    boot_ids: dict[str, list[str]] = field(default_factory=dict)
    pod_deletions: list[tuple[float, str, str]] = field(default_factory=list)  # (t, namespace, name)

    def ready_states(self, node: str) -> list[str]:
        return [s for _, s in self.ready.get(node, [])]

    def _ready(self, node: str, status: str) -> None:
        hist = self.ready.setdefault(node, [])
        if not hist or hist[-1][1] != status:
            hist.append((time.monotonic(), status))

    def _boot(self, node: str, boot_id: str) -> None:
        seen = self.boot_ids.setdefault(node, [])
        if not seen or seen[-1] != boot_id:
            seen.append(boot_id)


class TenantNodeAgent:
    """Plays the kubelets of the tenant cluster `cluster`, whose machines are VMIs in `namespace`."""

    def __init__(self, mgmt_api: ApiClient, tenant_api: ApiClient, *, namespace: str, cluster: str,
                 termination_delay: float = 0.3, ready_delay: float = 1.0, heartbeat: float = 10.0) -> None:
        self.namespace, self.cluster = namespace, cluster
        self.ready_delay = ready_delay
        self.termination_delay, self.heartbeat = termination_delay, heartbeat
        self.record = AgentRecord()
        # A machine that reboots never comes back: its kubelet posts nothing after the first boot it ran,
        # so its Node stays NotReady (Unknown) with the old boot ID (a broken image, a hung boot).
        self.fail_reboots = False
        # VMIs that never boot to a kubelet whatever `fail_reboots` says (a machine broken for good): a test
        # turns `fail_reboots` off, and only a VMI created after (another restart) comes back.
        self.hung_vmis: set[str] = set()
        self._core: Any = client.CoreV1Api(tenant_api)  # Any: the stubs lack `_content_type`
        co = client.CustomObjectsApi(mgmt_api)

        def informer(name: str, lister: Any, selector: str | None = None) -> Informer[Obj]:
            # Short backoff, as the KubeVirt simulator's: follow an apiserver restart within a second.
            return Informer(f"tenant-agent-{cluster}-{name}", lister, _raw, label_selector=selector,
                            on_change=self._changed,
                            options=InformerOptions(watch_timeout=240.0, backoff_base=0.2, backoff_cap=1.0))

        self.vmis = informer("vmis", functools.partial(co.list_namespaced_custom_object, GROUP, VERSION,
                                                       namespace, VMI_PLURAL), f"{CLUSTER_NAME_LABEL}={cluster}")
        self.nodes = informer("nodes", self._core.list_node)
        self.pods = informer("pods", self._core.list_pod_for_all_namespaces)
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._side: set[asyncio.Task[None]] = set()
        self._index: dict[str, int] = {}  # node -> small number for its addresses
        self._terminating: set[str] = set()  # pod uids with a deletion scheduled
        self._pod_boot: dict[str, str] = {}  # pod uid -> bootID its containers last started on
        self._written: dict[str, tuple[str, str]] = {}  # node -> (Ready, bootID) last written
        self._ips = 0
        self._starting: dict[tuple[str, str], float] = {}  # (pod uid, bootID) -> when its start began

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        for inf in (self.vmis, self.nodes, self.pods):
            self._tasks.append(asyncio.create_task(inf.run(), name=f"informer-{inf.name}"))
        for inf in (self.vmis, self.nodes, self.pods):
            if not await inf.wait_synced(30):
                await self.stop()
                raise TimeoutError(f"{inf.name} did not sync in 30 s")
        self._tasks.append(asyncio.create_task(self._work(), name=f"tenant-agent-{self.cluster}"))
        self._tasks.append(asyncio.create_task(self._tick(), name=f"tenant-agent-{self.cluster}-heartbeat"))
        self._kick.set()
        log.info("tenant node agent started", namespace=self.namespace, cluster=self.cluster)

    async def stop(self) -> None:
        await cancel_and_wait([*self._tasks, *self._side])
        self._tasks.clear()
        self._side.clear()

    async def __aenter__(self) -> TenantNodeAgent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _changed(self, key: Any, old: Obj | None, new: Obj | None) -> None:
        self._kick.set()  # level-based: every change re-reconciles everything (a handful of objects)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            self._kick.set()

    async def _work(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            try:
                await self._reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                err = f"HTTP {e.status} {e.reason}" if isinstance(e, ApiException) else repr(e)
                log.warning("tenant node agent reconcile failed; retrying", cluster=self.cluster, error=err)
                await asyncio.sleep(0.2)
                self._kick.set()

    # -- reconcile -------------------------------------------------------------------------
    async def _reconcile(self) -> None:
        vmis = {k[1]: v for k, v in self.vmis.snapshot().items()}
        nodes = {k[1]: v for k, v in self.nodes.snapshot().items()
                 if str((v.get("spec") or {}).get("providerID") or "").startswith(PROVIDER_PREFIX)}
        up: dict[str, str] = {}  # node -> bootID, for Nodes whose kubelet runs
        for name in sorted(set(vmis) | set(nodes) | set(self._written)):
            vmi = vmis.get(name)
            node = nodes.get(name)
            if node is None:
                if vmi_up(vmi) and not self._hung(name, vmi):  # a kubelet that never starts registers nothing
                    assert vmi is not None
                    await self._register(name, vmi)  # its watch event brings the status pass
                continue
            if vmi_up(vmi) and not self._hung(name, vmi):
                assert vmi is not None
                up[name] = str(vmi["metadata"]["uid"])
            await self._node_status(name, node, vmi if name in up else None)
        for pod in self.pods.snapshot().values():
            node_name = (pod.get("spec") or {}).get("nodeName")
            if node_name and (node_name in nodes or node_name in up):
                await self._pod(pod, node_name, up.get(node_name))

    def _hung(self, name: str, vmi: Obj | None) -> bool:
        """With `fail_reboots`: a VMI other than the first one this Node ran never boots to a kubelet."""
        booted = self.record.boot_ids.get(name)
        if vmi is not None and str(vmi["metadata"]["uid"]) in self.hung_vmis:
            return True
        return bool(self.fail_reboots and vmi is not None and booted and str(vmi["metadata"]["uid"]) != booted[0])

    def _node_ip(self, name: str) -> str:
        i = self._index.setdefault(name, len(self._index) + 1)
        return f"10.100.{i // 250}.{i % 250 + 2}"

    async def _register(self, name: str, vmi: Obj) -> None:
        """kubelet `initialNode` + registerWithAPIServer (and kubeadm's control-plane label and taint)."""
        labels = (vmi.get("metadata") or {}).get("labels") or {}
        machine = labels.get(MACHINE_NAME_LABEL) or name
        node_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
        taints: list[dict[str, Any]] = []
        if labels.get(ROLE_LABEL) == "control-plane":
            node_labels[CONTROL_PLANE_LABEL] = ""
            taints.append({"key": CONTROL_PLANE_LABEL, "effect": "NoSchedule"})
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels},
                "spec": {"providerID": f"{PROVIDER_PREFIX}{machine}", "taints": taints}}
        try:
            await self._core.create_node(body)
            log.info("tenant node registered", cluster=self.cluster, node=name, machine=machine)
        except ApiException as e:
            if e.status != 409:
                raise

    async def _node_status(self, name: str, node: Obj, vmi: Obj | None) -> None:
        """Post kubelet status while `vmi` is up; play node-lifecycle's Unknown + taints when it is not."""
        status = node.get("status") or {}
        ready = _cond(node, "Ready")
        info = status.get("nodeInfo") or {}
        now = _now()
        if vmi is not None:
            boot = str(vmi["metadata"]["uid"])
            stale = not ready.get("lastHeartbeatTime") or (
                dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(str(ready["lastHeartbeatTime"]))
            ).total_seconds() >= self.heartbeat
            if ready.get("status") != "True" or info.get("bootID") != boot or stale:
                changed = ready.get("status") != "True"
                conds = [{"type": t, "status": "True" if t == "Ready" else "False", "reason": r,
                          "message": "kubelet is posting ready status" if t == "Ready" else f"kubelet has {r}",
                          "lastHeartbeatTime": now,
                          "lastTransitionTime": now if changed else _cond(node, t).get("lastTransitionTime", now)}
                         for t, r in NODE_CONDITIONS]
                fw = ((vmi.get("spec") or {}).get("domain") or {}).get("firmware") or {}
                ip = self._node_ip(name)
                await self._patch_node_status(name, {
                    "capacity": CAPACITY, "allocatable": CAPACITY, "conditions": conds,
                    "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                    "nodeInfo": {"bootID": boot, "machineID": hashlib.md5(name.encode()).hexdigest(),  # noqa: S324
                                 "systemUUID": str(fw.get("uuid") or ""), "kubeletVersion": K8S_VERSION,
                                 "kubeProxyVersion": "", "kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04 LTS",
                                 "containerRuntimeVersion": "containerd://2.0.0", "operatingSystem": "linux",
                                 "architecture": "amd64"}})
                self._wrote(name, "True", boot)
        elif ready and ready.get("status") != "Unknown":
            conds = [{**_cond(node, t), "type": t, "status": "Unknown", "reason": "NodeStatusUnknown",
                      "message": "Kubelet stopped posting node status.", "lastTransitionTime": now}
                     for t, _ in NODE_CONDITIONS]
            await self._patch_node_status(name, {"conditions": conds})
            self._wrote(name, "Unknown", str(info.get("bootID") or ""))
        await self._taints(name, node, up=vmi is not None)

    def _wrote(self, name: str, ready: str, boot: str) -> None:
        if self._written.get(name) != (ready, boot):
            log.info("tenant node status", cluster=self.cluster, node=name, ready=ready, boot_id=boot)
        self._written[name] = (ready, boot)
        self.record._ready(name, ready)
        if boot:
            self.record._boot(name, boot)

    async def _patch_node_status(self, name: str, status: dict[str, Any]) -> None:
        await self._core.patch_node_status(name, {"status": status}, _content_type=STRATEGIC)

    async def _taints(self, name: str, node: Obj, *, up: bool) -> None:
        """node-lifecycle taint-by-condition: `unreachable` NoSchedule/NoExecute only while down."""
        current: list[dict[str, Any]] = list((node.get("spec") or {}).get("taints") or [])
        keep = [t for t in current if t.get("key") not in (TAINT_UNREACHABLE, TAINT_NOT_READY)]
        want = keep if up else [*keep, *({"key": TAINT_UNREACHABLE, "effect": e, "timeAdded": _now()}
                                         for e in ("NoSchedule", "NoExecute"))]
        if up and keep == current:
            return
        if not up and [(t.get("key"), t.get("effect")) for t in current] == [(t["key"], t["effect"]) for t in want]:
            return
        patch = [{"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]},
                 {"op": "add", "path": "/spec/taints", "value": want}]
        try:
            await self._core.patch_node(name, patch, _content_type=JSON_PATCH)
        except ApiException as e:
            if e.status not in (409, 422):
                raise
            self._kick.set()  # raced another writer (a cordon): look again

    async def _pod(self, pod: Obj, node: str, boot: str | None) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        uid = str(meta["uid"])
        if meta.get("deletionTimestamp"):
            if boot is not None and uid not in self._terminating:
                self._terminating.add(uid)
                task = asyncio.create_task(self._terminate(meta["namespace"], meta["name"], uid, node))
                self._side.add(task)
                task.add_done_callback(self._side.discard)
            return
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        ready = _cond(pod, "Ready").get("status") == "True"
        if boot is None:
            if ready:  # node-lifecycle MarkPodsNotReady
                cond = {**_cond(pod, "Ready"), "type": "Ready", "status": "False", "lastTransitionTime": _now()}
                await self._patch_pod_status(pod, {"conditions": [cond]})
            return
        if ready and status.get("phase") == "Running" and self._pod_boot.get(uid, boot) == boot:
            self._pod_boot[uid] = boot
            return
        began = self._starting.setdefault((uid, boot), time.monotonic())
        wait = began + self.ready_delay - time.monotonic()
        if wait > 0:
            asyncio.get_running_loop().call_later(wait, self._kick.set)
            return
        await self._run_pod(pod, node, boot)

    async def _run_pod(self, pod: Obj, node: str, boot: str) -> None:
        """kubelet: start the containers (again, after a reboot) and report the Pod Running and Ready."""
        meta, status = pod["metadata"], pod.get("status") or {}
        uid, now = str(meta["uid"]), _now()
        old = {c.get("name"): c for c in status.get("containerStatuses") or []}
        rebooted = bool(old) and self._pod_boot.get(uid) != boot
        if not status.get("podIP"):
            self._ips += 1
        pod_ip = status.get("podIP") or f"10.244.{self._index.get(node, 0)}.{self._ips % 250 + 2}"
        containers = [{
            "name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": True, "started": True,
            "containerID": "containerd://" + hashlib.sha256(f"{uid}/{c['name']}/{boot}".encode()).hexdigest(),
            "restartCount": int((old.get(c["name"]) or {}).get("restartCount", 0)) + (1 if rebooted else 0),
            "state": {"running": {"startedAt": now}},
        } for c in (pod.get("spec") or {}).get("containers") or []]
        conds = [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
                 for t in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")]
        host_ip = self._node_ip(node)
        if await self._patch_pod_status(pod, {
            "phase": "Running", "conditions": conds, "containerStatuses": containers,
            "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "podIP": pod_ip, "podIPs": [{"ip": pod_ip}],
            "startTime": status.get("startTime") or now,
        }):
            self._pod_boot[uid] = boot
            self._starting.pop((uid, boot), None)

    async def _patch_pod_status(self, pod: Obj, status: dict[str, Any]) -> bool:
        meta = pod["metadata"]
        body = {"metadata": {"uid": meta["uid"]}, "status": status}  # uid precondition: never a successor
        try:
            await self._core.patch_namespaced_pod_status(meta["name"], meta["namespace"], body,
                                                         _content_type=STRATEGIC)
            return True
        except ApiException as e:
            if e.status in (404, 409, 422):
                return False
            raise

    async def _terminate(self, ns: str, name: str, uid: str, node: str) -> None:
        """kubelet: stop the containers, then delete the Pod object with grace 0 (if the node stayed up)."""
        try:
            await asyncio.sleep(self.termination_delay)
            vmi = self.vmis.cache.get((self.namespace, node))
            if not vmi_up(vmi):
                return  # the kubelet went away with its node; the Pod stays terminating
            await self._core.delete_namespaced_pod(name, ns, grace_period_seconds=0,
                                                   body=client.V1DeleteOptions(
                                                       grace_period_seconds=0,
                                                       preconditions=client.V1Preconditions(uid=uid)))
            self.record.pod_deletions.append((time.monotonic(), ns, name))
            log.info("tenant pod terminated", cluster=self.cluster, namespace=ns, pod=name, node=node)
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("tenant pod delete failed", namespace=ns, pod=name, error=f"HTTP {e.status}")
        finally:
            self._terminating.discard(uid)
            self._kick.set()
