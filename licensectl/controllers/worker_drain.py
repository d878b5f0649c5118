"""Tenant-cluster workers: cordon, drain, restart, wait for the new boot, uncordon (core/drain.py decides).

The rollout plans which VMs restart; a CAPK worker it picks is handed here instead of being restarted,
and so is every worker whose VM carries an open drain cycle. Each pass, per worker: observe (the VM and
its VMI from the caches; the tenant's Node and Pods, the Machine's drain settings and the Cluster's
policy read live), ask `drain.next_step`, write the intent it returns onto the VM (guarded by the VM's
resourceVersion) and only then act. Nothing that matters is kept in memory: a new leader reads the
intent, the Node's marker and the Pods, and carries on or undoes (docs/design.md#tenant-worker-drain).

The pass does no tenant I/O: each tenant cluster has its own task (controllers/cluster_tasks.py), handed
the latest plan's workers and its own timeouts, so a hung tenant API slows no other tenant and no plain VM
(docs/design.md#failure-domains). The tenant kubeconfig is read per run and dropped after it. Every
read and write goes through a port (core/ports.py: `TenantClusters`, `ClusterApi`, `KubevirtApi`): the
wire formats of Nodes, Pods, Machines and Clusters are the adapters' (kube/tenant.py, kube/cluster_api.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass

from licensectl import config, logs
from licensectl.controllers.cluster_tasks import ClusterTask, ClusterTasks
from licensectl.controllers.settings import drain_settings
from licensectl.controllers.vm_restart import restart_vmi, vm_object
from licensectl.core import drain
from licensectl.core.defaults import DRAIN_HOLD_RETRIES
from licensectl.core.model import ANN_RESTART_ATTEMPTED_AT, ObjectRef, Vm, Vmi
from licensectl.core.ports import (
    ClusterApi,
    EventSink,
    InvolvedObject,
    KubevirtApi,
    MachineSays,
    ReadFailed,
    TenantCluster,
    TenantClusters,
    TenantUnreachable,
)
from licensectl.core.reasons import EventType, Reason
from licensectl.core.rollout import RestartVm, RolloutPlan, VmiRolloutState, VmiState
from licensectl.core.timecodec import format_micro_time
from licensectl.metrics import GaugeSample, Metrics

log = logs.get(__name__)

BOOT_POLL_SECONDS = 5.0

_Item = tuple[Vm, RestartVm | None, drain.WorkerIdentity]
_Key = tuple[str, str]
# Holds a changed kubeconfig Secret may lift: they are released at once when it changes.
_KUBECONFIG_HOLDS = (drain.BlockReason.CLUSTER_UNREACHABLE, drain.BlockReason.NODE_MISSING)


@dataclass(frozen=True, slots=True, eq=False)
class ClusterWork:
    """What one pass hands a tenant cluster's task: its workers to drive (with the restart planned), its
    workers held without a cycle, the plan, and the live caches the task reads each VM from afresh."""

    namespace: str
    cluster: str
    items: tuple[tuple[_Key, RestartVm | None], ...]
    held: tuple[_Key, ...]
    plan: RolloutPlan
    vms: Mapping[_Key, Vm]
    vmis: Mapping[_Key, Vmi]
    holders: tuple[drain.WorkerIdentity, ...]

    def signature(self) -> Hashable:
        """What makes a run due at once: the workers, their VMs' versions, what the plan says of them."""
        def state(key: _Key) -> str:
            st = self.plan.vmi_states.get(key)
            return st.state.value if st is not None else ""

        def rv(key: _Key) -> str:
            vm = self.vms.get(key)
            return vm.resource_version if vm is not None else ""

        return (tuple((k, rv(k), r.revision if r is not None else None, state(k)) for k, r in self.items),
                tuple((k, rv(k)) for k in self.held), tuple(h.key for h in self.holders))


class WorkerDrainer:
    """The drain shell, driven by the rollout loop after each plan (leader only)."""

    def __init__(self, *, cluster_api: ClusterApi, tenants: TenantClusters, kubevirt: KubevirtApi,
                 events: EventSink, metrics: Metrics, settings: config.Settings, clock: Callable[[], dt.datetime],
                 expect: Callable[[str, str, str], None] = lambda _ns, _vm, _rv: None,
                 wake_rollout: Callable[[], None] = lambda: None,
                 watch_kubeconfigs: Callable[[Iterable[tuple[str, str]]], None] = lambda _clusters: None,
                 active: Callable[[], bool] = lambda: True) -> None:
        self.cluster_api = cluster_api
        self.tenants = tenants
        self.kubevirt = kubevirt
        self.events = events
        self.metrics = metrics
        self.settings = settings
        self.clock = clock
        self._expect = expect  # the rollout loop waits for the watch cache to show our VM writes
        # Each cluster's policy as last read (once per pass with work in it): the planner's per-cluster limits.
        self._policies: dict[str, drain.ClusterPolicy] = {}
        # Pods whose last eviction got a 429, per worker: only says PDBBlocked vs DrainTimeout at the timeout.
        self._refused: dict[str, frozenset[str]] = {}
        self.conditions: dict[tuple[str, str], tuple[str, drain.BlockReason]] = {}  # (ns, vm) -> (cluster, why)
        self._wake_rollout = wake_rollout
        self._active = active  # leading: cluster tasks run only then (a pass begun as leader may end after)
        self._watch = watch_kubeconfigs  # the `<cluster>-kubeconfig` Secrets of the clusters with a task
        # VM -> the resourceVersion a task wrote over: that VM waits for the cache to show the write.
        self._written: dict[_Key, str] = {}
        self._tasks: ClusterTasks[ClusterWork] = ClusterTasks(
            self._run_cluster, clock=clock, retry_seconds=settings.drain_retry_seconds, after_run=self._after_run)

    def set_expect(self, expect: Callable[[str, str, str], None]) -> None:
        self._expect = expect

    # -- the per-cluster limits the planner reads -------------------------------------------------
    def worker_limits(self) -> dict[str, int]:
        """Per tenant cluster (`namespace/cluster`): its Cluster's limit, as last read (others: the default)."""
        return {k: p.max_disrupted for k, p in self._policies.items()}

    async def _policy(self, namespace: str, cluster: str) -> drain.ClusterPolicy | None:
        """The Cluster's policy; a failed read is no answer (never "no annotations"): the policy as last
        read, or None -- the cluster waits a pass rather than run on defaults the hoster may have lowered."""
        key = f"{namespace}/{cluster}"
        try:
            ann = await self.cluster_api.cluster_annotations(namespace, cluster)
        except ReadFailed as e:
            log.warning("cluster policy read failed", namespace=namespace, cluster=cluster, error=e.error,
                        status=e.status)
            return self._policies.get(key)
        said = drain.ClusterPolicy.from_annotations(ann)
        limit = said.max_disrupted if drain.ANN_MAX_DISRUPTED_WORKERS in ann else self.settings.max_disrupted_workers
        policy = drain.ClusterPolicy(limit, said.restart_without_drain)
        self._policies[key] = policy
        return policy

    async def _machine(self, worker: drain.WorkerIdentity) -> MachineSays | None:
        """KubevirtMachine -> its controller Machine: nodeDrainTimeout and the exclude annotation. None: a
        read failed -- never taken as "no exclude annotation", which would cordon an excluded Node."""
        try:
            return await self.cluster_api.machine(worker.namespace, worker.machine)
        except ReadFailed as e:
            log.warning("machine read failed", namespace=worker.namespace, vm=worker.vm, error=e.error,
                        status=e.status)
            return None

    # -- a pass ------------------------------------------------------------------------------------
    def workers_to_drive(self, plan: RolloutPlan,
                         vms: Mapping[tuple[str, str], Vm]) -> list[tuple[Vm, RestartVm | None]]:
        """Workers the rollout picked this pass, and every VM with a drain record: (VM, its restart if planned)."""
        picked = {(r.namespace, r.vm): r for r in plan.restarts if r.drained}
        out: dict[tuple[str, str], tuple[Vm, RestartVm | None]] = {}
        for key, r in picked.items():
            if (vm := vms.get(key)) is not None:
                out[key] = (vm, r)
        for key, vm in vms.items():
            if key in out:
                continue
            if drain.ANN_DRAIN_STEP in vm.annotations or (
                    drain.ANN_DRAIN_HELD in vm.annotations and _hold_over(plan.vmi_states.get(key))):
                out[key] = (vm, plan.drains.get(key))
        return [out[k] for k in sorted(out)]

    async def reconcile(self, plan: RolloutPlan, vms: Mapping[tuple[str, str], Vm],
                        vmis: Mapping[tuple[str, str], Vmi]) -> dt.datetime | None:
        """Hand each tenant cluster's task the workers this plan gives it; no tenant I/O here, so a hung
        tenant API slows neither the pass nor another cluster. The tasks keep their own time: None."""
        if not self._active():
            return None
        work = self.workers_to_drive(plan, vms)
        seen_keys = {(vm.namespace, vm.name) for vm, _ in work}
        for key in [k for k in self.conditions if k not in seen_keys]:
            del self.conditions[key]
        by_cluster: dict[str, list[tuple[tuple[str, str], RestartVm | None]]] = {}
        held: dict[str, list[tuple[str, str]]] = {}
        for vm, restart in work:
            worker = drain.WorkerIdentity.from_vm(vm.namespace, vm.name, vm.labels)
            if worker is not None:
                by_cluster.setdefault(worker.cluster_key, []).append(((vm.namespace, vm.name), restart))
        for key, vm in vms.items():
            if drain.ANN_DRAIN_HELD in vm.annotations and drain.ANN_DRAIN_STEP not in vm.annotations and (
                    worker := drain.WorkerIdentity.from_vm(vm.namespace, vm.name, vm.labels)) is not None:
                held.setdefault(worker.cluster_key, []).append(key)
        holders_by_cluster = drain.budget_holders_by_cluster(
            (vm.namespace, vm.name, vm.labels, vm.annotations) for vm in vms.values()
            if drain.ANN_DRAIN_STEP in vm.annotations)
        tasks: dict[str, tuple[ClusterWork, Hashable]] = {}
        for ck in sorted(by_cluster.keys() | held.keys()):
            ns, cluster = ck.split("/", 1)
            items = tuple(by_cluster.get(ck, ()))
            cw = ClusterWork(ns, cluster, items, tuple(held.get(ck, ())), plan, vms, vmis,
                             holders_by_cluster.get(ck, ()))
            tasks[ck] = (cw, cw.signature())
        self._tasks.sync(tasks)
        self._watch(sorted((cw.namespace, cw.cluster) for cw, _ in tasks.values()))
        return None

    def busy_clusters(self) -> frozenset[str]:
        """Tenant clusters (`namespace/cluster`) whose task has not answered the work it was handed: the
        planner picks none of their workers meanwhile, so a worker of a hung tenant never takes a restart
        slot from the VMs beside it (docs/design.md#failure-domains)."""
        return self._tasks.busy()

    def kick(self, namespace: str, cluster: str) -> None:
        """The cluster's kubeconfig Secret changed: its held workers are tried again at once."""
        self._tasks.kick(f"{namespace}/{cluster}")

    async def stop(self) -> None:
        """Leadership lost or shutting down: every cluster task ends, and the kubeconfig watches."""
        await self._tasks.stop()
        self._watch(())
        self._written.clear()

    def _after_run(self, task: ClusterTask[ClusterWork]) -> None:
        if task.asked_while_busy:  # a pass held this cluster's picks back: plan again now it has answered
            task.asked_while_busy = False
            self._wake_rollout()

    async def _run_cluster(self, work: ClusterWork, fresh: bool, kicked: bool) -> dt.datetime | None:
        """One run of one cluster's task, over the live VM and VMI caches. A pick is acted on only in the run
        that follows the plan that made it; runs on the task's own time drive the open cycles alone."""
        if not self._active():
            return None
        if kicked:
            await self._release_holds(work)
        items: list[_Item] = []
        for key, restart in work.items:
            vm = work.vms.get(key)
            if vm is None or self._written.get(key) == vm.resource_version:
                continue  # gone, or the cache does not show our last write yet: its watch event brings new work
            self._written.pop(key, None)
            if not (fresh or kicked) and drain.ANN_DRAIN_STEP not in vm.annotations:
                continue
            worker = drain.WorkerIdentity.from_vm(vm.namespace, vm.name, vm.labels)
            if worker is not None:
                items.append((vm, restart, worker))
        if not items:
            return None
        wakeups = await self._cluster_pass(work.namespace, work.cluster, items, work.plan, work.vmis, work.holders)
        # At the latest once per hold: a tenant back, a Node back after BootTimeout show in no watch of ours.
        hold = dt.timedelta(seconds=DRAIN_HOLD_RETRIES * self.settings.drain_retry_seconds)
        return min([*wakeups, self.clock() + hold])

    async def _release_holds(self, work: ClusterWork) -> None:
        """Holds a new kubeconfig may lift (the API could not be used, or showed no Node for the worker):
        dropped from the VMs, so the rollout plans those workers again at once (guarded by resourceVersion)."""
        for key in work.held:
            vm = work.vms.get(key)
            held = drain.held_of(vm.annotations) if vm is not None else None
            if vm is None or held is None or held.reason not in _KUBECONFIG_HOLDS:
                continue
            if await self.kubevirt.annotate_vm(namespace=vm.namespace, name=vm.name,
                                               resource_version=vm.resource_version,
                                               annotations={k: None for k in drain.HELD_ANNOTATIONS}):
                self._written[key] = vm.resource_version
                self._expect(vm.namespace, vm.name, vm.resource_version)
                log.info("worker hold released: the kubeconfig Secret changed", namespace=vm.namespace, vm=vm.name)

    async def _cluster_pass(self, namespace: str, cluster: str,
                            items: list[_Item], plan: RolloutPlan, vmis: Mapping[tuple[str, str], Vmi],
                            holders: tuple[drain.WorkerIdentity, ...]) -> list[dt.datetime]:
        policy = await self._policy(namespace, cluster)
        if policy is None:
            return [self.clock() + dt.timedelta(seconds=self.settings.drain_retry_seconds)]
        wakeups: list[dt.datetime] = []
        try:
            async with self.tenants.open(namespace, cluster) as tenant:
                nodes = await tenant.nodes()
                for vm, restart, worker in items:
                    wakeups.extend(await self._worker(vm, restart, worker, plan, vmis, policy, tenant, nodes, None,
                                                      holders))
        except TenantUnreachable as e:
            for vm, restart, worker in items:
                wakeups.extend(await self._worker(vm, restart, worker, plan, vmis, policy, None, [], str(e),
                                                  holders))
        return wakeups

    async def _worker(self, vm: Vm, restart: RestartVm | None, worker: drain.WorkerIdentity, plan: RolloutPlan,
                      vmis: Mapping[tuple[str, str], Vmi], policy: drain.ClusterPolicy, tenant: TenantCluster | None,
                      nodes: list[drain.TenantNode], unreachable: str | None,
                      holders: tuple[drain.WorkerIdentity, ...] = ()) -> list[dt.datetime]:
        key = (vm.namespace, vm.name)
        now = self.clock()
        vmi = vmis.get(key)
        state = plan.vmi_states.get(key)
        needed = restart is not None and (state is None or state.state in (VmiState.STALE, VmiState.DRAINING))
        revision = restart.revision if restart is not None else (
            state.revision if state is not None else "")
        intent = drain.parse_annotations(vm.annotations)
        if not revision and isinstance(intent, drain.DrainIntent):
            revision = intent.revision
        node = drain.node_for(worker.provider_id, nodes) if tenant is not None else None
        pods: tuple[drain.TenantPod, ...] = ()
        if tenant is not None and node is not None:
            pods = await tenant.pods_on(node.name)
        if isinstance(intent, drain.DrainIntent) and _block_over(intent, state, node):
            intent = None  # its record and metric go (an own cordon is still undone first)
        machine = await self._machine(worker) if worker.role is drain.Role.WORKER else MachineSays()
        if machine is None:  # unknown whether the Machine excludes draining: try again, do nothing now
            return [now + dt.timedelta(seconds=self.settings.drain_retry_seconds)]
        seen = drain.Observed(revision=revision, needed=needed, vmi_uid=vmi.uid if vmi is not None else None,
                              vmi_deleting=bool(vmi is not None and vmi.deleting), reachable=tenant is not None,
                              node=node, pods=pods, pdb_refused=self._refused.get(worker.key, frozenset()),
                              disrupted=drain.disrupted_workers(nodes, holders, worker))
        ds = drain_settings(self.settings, machine_drain_timeout=machine.drain_timeout,
                            exclude_draining=machine.exclude, restart_without_drain=policy.restart_without_drain,
                            max_disrupted=policy.max_disrupted)
        action = drain.next_step(intent, worker, seen, now=now, settings=ds)
        return await self._apply(vm, worker, action, restart, tenant, now, unreachable,
                                 state.source if state is not None else None)

    async def _apply(self, vm: Vm, worker: drain.WorkerIdentity, action: drain.Action, restart: RestartVm | None,
                     tenant: TenantCluster | None, now: dt.datetime, unreachable: str | None,
                     source: ObjectRef | None) -> list[dt.datetime]:
        key = (vm.namespace, vm.name)
        patch: dict[str, str | None] = {k: None for k in drain.INTENT_ANNOTATIONS}
        if action.intent is not None:
            patch.update(action.intent.render_annotations())
        held = isinstance(action, drain.Blocked) and not action.closed
        old_held = drain.held_of(vm.annotations)
        if isinstance(action, drain.Blocked) and held:
            # A worker without a cycle is held afresh each time the rollout picks it again (the hold is what
            # spaces those picks); an open cycle, driven every pass, keeps the time the condition began.
            same = old_held is not None and old_held.reason is action.reason
            at = old_held.at if same and old_held is not None and action.intent is not None else now
            patch.update(drain.Held(action.reason, at).render_annotations())
        else:
            patch.update({k: None for k in drain.HELD_ANNOTATIONS})
        if isinstance(action, drain.Restart):
            if restart is not None:
                # The rollout tracks it from here, as any restart, timed from now: the plan that named it may be
                # a while old (its cluster's task ran on its own time, or its tenant API was slow to answer).
                first = restart.issued_at == restart.attempted_at
                restart = dataclasses.replace(restart, attempted_at=now, issued_at=now if first else restart.issued_at)
                patch.update(restart.intent_annotations())
            else:
                patch[ANN_RESTART_ATTEMPTED_AT] = format_micro_time(now)  # a re-issue of the restart already recorded
        changed = {k: v for k, v in patch.items() if vm.annotations.get(k) != v}
        if changed:
            if not await self.kubevirt.annotate_vm(namespace=vm.namespace, name=vm.name,
                                                   resource_version=vm.resource_version, annotations=changed):
                log.info("drain step dropped: VM changed since it was read", namespace=vm.namespace, vm=vm.name)
                return []
            self._written[key] = vm.resource_version
            self._expect(vm.namespace, vm.name, vm.resource_version)
        if isinstance(action, drain.Blocked):
            self.conditions[key] = (worker.cluster, action.reason)
            if changed and (action.closed or old_held is None or old_held.reason is not action.reason):
                await self._blocked(vm, worker, action.reason, unreachable, source)
        else:
            self.conditions.pop(key, None)
        return await self._act(vm, worker, action, restart, tenant)

    async def _act(self, vm: Vm, worker: drain.WorkerIdentity, action: drain.Action, restart: RestartVm | None,
                   tenant: TenantCluster | None) -> list[dt.datetime]:
        # A step taken in the tenant cluster shows in no watch of licensectl's: the next pass comes at once.
        if isinstance(action, drain.Cordon) and tenant is not None:
            await self._patch_node(tenant, action.node, unschedulable=True, marker=worker.key, owner=worker.key)
            log.info("worker cordoned", namespace=vm.namespace, vm=vm.name, node=action.node)
            return [self.clock()]
        elif isinstance(action, drain.Uncordon) and tenant is not None:
            await self._patch_node(tenant, action.node, unschedulable=False, marker=None, owner=worker.key)
            self._refused.pop(worker.key, None)
            log.info("worker uncordoned", namespace=vm.namespace, vm=vm.name, node=action.node)
            return [self.clock()]
        elif isinstance(action, drain.Evict) and tenant is not None:
            refused: set[str] = set()
            for pod in action.pods:
                result = await self._evict(tenant, pod)
                if result == "refused":
                    refused.add(pod.key)
            self._refused[worker.key] = frozenset(refused)
            return [action.recheck_at]
        elif isinstance(action, drain.WaitEvictions):
            return [action.recheck_at]
        elif isinstance(action, drain.WaitBoot):
            # The Node's return shows in the tenant cluster only, which licensectl does not watch: poll it.
            return [min(action.until, self.clock() + dt.timedelta(seconds=BOOT_POLL_SECONDS))]
        elif isinstance(action, drain.Restart):
            await self._restart(vm, action, restart)
        elif isinstance(action, drain.Done):
            self._refused.pop(worker.key, None)
        elif isinstance(action, drain.Blocked) and not action.closed:
            # A held cycle changes in no watch of licensectl's either (the tenant comes back, a Node
            # returns): tried again once per hold, not at the next resync.
            return [self.clock() + dt.timedelta(seconds=DRAIN_HOLD_RETRIES * self.settings.drain_retry_seconds)]
        return []

    async def _patch_node(self, tenant: TenantCluster, name: str, *, unschedulable: bool, marker: str | None,
                          owner: str) -> None:
        """Cordon with the marker in the same patch, or uncordon and drop it. Read afresh and guarded by its
        resourceVersion: an uncordon happens only while the Node still carries this VM's marker."""
        got = await tenant.node(name)
        if got is None:
            return
        current, rv = got
        if not unschedulable and current.cordoned_by != owner:
            return  # someone else's cordon now (or already undone): never touched
        if not await tenant.set_cordon(name, unschedulable=unschedulable, marker=marker, resource_version=rv):
            log.info("node patch dropped: the Node changed since it was read", node=name)

    async def _evict(self, tenant: TenantCluster, pod: drain.TenantPod) -> str:
        status = await tenant.evict(pod.namespace, pod.name)
        result = {201: "evicted", 200: "evicted", 429: "refused", 404: "gone"}.get(status, "error")
        self.metrics.worker_evictions.labels(result).inc()
        if result == "error":
            log.warning("eviction failed", namespace=pod.namespace, pod=pod.name, status=status)
        return result

    async def _restart(self, vm: Vm, action: drain.Restart, restart: RestartVm | None) -> None:
        # A VMI already replaced or going is not restarted: the next pass sees its successor and waits for
        # the boot.
        res = await restart_vmi(self.kubevirt, self.events, namespace=vm.namespace, vm=vm.name,
                                vmi_uid=action.vmi_uid, run_strategy=vm.run_strategy)
        self.metrics.restarts_total.labels(res.value).inc()
        log.info("worker restart", namespace=vm.namespace, vm=vm.name, result=res.value,
                 revision=(restart.revision[:12] if restart else action.intent.revision[:12]))

    async def _blocked(self, vm: Vm, worker: drain.WorkerIdentity, reason: drain.BlockReason,
                       unreachable: str | None, source: ObjectRef | None) -> None:
        text = _BLOCK_TEXT.get(reason, reason.value)
        if reason is drain.BlockReason.CLUSTER_UNREACHABLE and unreachable:
            text += f" ({unreachable})"
        message = f"of tenant cluster {worker.cluster}: {reason.value}: {text}"
        await self.events.emit(vm_object(vm.namespace, vm.name), EventType.WARNING, Reason.WORKER_DRAIN_BLOCKED,
                               f"Worker {message}")
        if source is not None:
            await self.events.emit(InvolvedObject("v1", "Secret", source.namespace, source.name), EventType.WARNING,
                                   Reason.WORKER_DRAIN_BLOCKED, f"Worker {vm.namespace}/{vm.name} {message}")

    # -- metrics -----------------------------------------------------------------------------------
    def samples(self, vms: Iterable[Vm]) -> Iterable[GaugeSample]:
        """From the VMs' drain records (any replica derives the same) plus this leader's held conditions."""
        steps: dict[tuple[str, str, str], int] = {}
        blocked: dict[tuple[str, str, str, str], float] = {}
        for vm in vms:
            if drain.ANN_DRAIN_STEP not in vm.annotations and drain.ANN_DRAIN_HELD not in vm.annotations:
                continue
            worker = drain.WorkerIdentity.from_vm(vm.namespace, vm.name, vm.labels)
            if worker is None:
                continue
            intent = drain.parse_annotations(vm.annotations)
            if isinstance(intent, drain.DrainIntent) and intent.active:
                k = (vm.namespace, worker.cluster, intent.step.value)
                steps[k] = steps.get(k, 0) + 1
            elif isinstance(intent, drain.DrainIntent) and intent.reason is not None:
                blocked[(vm.namespace, vm.name, worker.cluster, intent.reason.value)] = 1.0
            held = drain.held_of(vm.annotations)
            if held is not None:
                blocked[(vm.namespace, vm.name, worker.cluster, held.reason.value)] = 1.0
        for (ns, cluster, step), n in sorted(steps.items()):
            yield GaugeSample("worker_drains", (("namespace", ns), ("cluster", cluster), ("step", step)), float(n))
        for (ns, name, cluster, why), v in sorted(blocked.items()):
            yield GaugeSample("worker_drain_blocked", (("namespace", ns), ("vm", name), ("cluster", cluster),
                                                       ("reason", why)), v)


def _hold_over(state: VmiRolloutState | None) -> bool:
    """A hold without a cycle whose worker no longer waits for a restart (restarted by hand, gone): its
    record and metric go. A worker still stale keeps it until the rollout picks it again."""
    return state is None or state.state is not VmiState.STALE


def _block_over(intent: drain.DrainIntent, state: VmiRolloutState | None, node: drain.TenantNode | None) -> bool:
    """A closed cycle whose condition is gone: the VMI was restarted since (by hand) and runs the current
    revision, or, after a boot timeout, the Node came back Ready with a new boot."""
    if intent.step is not drain.Step.BLOCKED:
        return False
    if intent.reason is drain.BlockReason.BOOT_TIMEOUT:
        return node is not None and node.ready is True and bool(node.boot_id) and node.boot_id != intent.boot_id
    return state is not None and state.state in (VmiState.CURRENT, VmiState.DONE)


_BLOCK_TEXT = {
    drain.BlockReason.PDB_BLOCKED: "the drain timed out on Pods whose PodDisruptionBudget refused their eviction; "
                                   "the Node was uncordoned and the VM is not restarted for this revision",
    drain.BlockReason.DRAIN_TIMEOUT: "the drain timed out; the Node was uncordoned and the VM is not restarted "
                                     "for this revision",
    drain.BlockReason.BOOT_TIMEOUT: "the restarted worker's Node did not come back Ready with a new boot ID; it "
                                    "counts against the cluster's limit of disrupted workers until it does",
    drain.BlockReason.INTENT_UNREADABLE: "the VM's licensectl.io/drain-* annotations cannot be read; nothing is "
                                         "guessed (a Node licensectl cordoned for it is uncordoned)",
    drain.BlockReason.CLUSTER_UNREACHABLE: "the tenant cluster's API cannot be used, so the worker is neither "
                                           "drained nor restarted (annotate the Cluster "
                                           f"{drain.ANN_RESTART_WITHOUT_DRAIN}=true to restart without a drain)",
    drain.BlockReason.NODE_MISSING: "no Node of the tenant cluster has this worker's providerID",
    drain.BlockReason.CONTROL_PLANE_MANUAL: "control-plane machines are restarted by hand",
    drain.BlockReason.BUDGET_SPENT: "the cluster's limit of disrupted workers is reached (licensectl's cycles, "
                                    "workers it restarted whose Node is not back, and Nodes not Ready or "
                                    "cordoned for any other reason): the worker waits",
}
