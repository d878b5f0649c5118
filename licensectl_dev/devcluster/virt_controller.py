"""virt-controller stand-in: KubeVirt's VM loop (plus virt-handler's VMI boot) on a real apiserver.

`KubevirtSimulator` reconciles VirtualMachines into VirtualMachineInstances, driven by watches, so
the controller under test sees VMIs come and go the way they do on a KubeVirt cluster.

Upstream semantics encoded here (kubevirt/kubevirt):
- pkg/virt-controller/watch/vm/vm.go `syncRunStrategy`: per runStrategy, when to create/delete
  the VMI; `hasStopRequestForVMI` / `hasStartRequest` look only at stateChangeRequests[0];
  `isTrimFirstChangeRequestNeeded` drops a Stop request once its VMI UID is gone and a Start
  request once a live VMI exists; `setupVMIFromVM` names the VMI after the VM, copies the template
  metadata (labels, annotations) and spec, and sets a controller ownerReference.
- pkg/virt-controller/watch/vm/firmware.go: a missing `spec.template.spec.domain.firmware.uuid`
  is patched onto the VM as uuid5(6a1a24a1-4061-4607-8bf4-a3963d0c5895, vm name), so the guest's
  SMBIOS UUID is stable across restarts of the same VM.

Run strategies: Always, RerunOnFailure, Manual, Halted and Once follow `syncRunStrategy` (Halted's
paused-start path is not modelled). A VMI without a controller ownerReference to its VM is never
deleted or recreated (orphan adoption is not modelled), but it still boots, as on a cluster.

Per-VMI knobs for tests (VMI or VM-template annotations): `devcluster.licensectl.io/ready-delay`
(seconds) and `devcluster.licensectl.io/boot` = `fail` (phase Failed) or `hang` (never Running).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.rest import ApiException

from licensectl.core.timecodec import format_time
from licensectl.kube.watch import Informer, InformerOptions, ListFunc
from licensectl_dev.devcluster.ledger import SimulatorRecord, VmiEvent
from licensectl_dev.devcluster.vm_semantics import (
    ANN_BOOT,
    ANN_READY_DELAY,
    FINAL_PHASES,
    GROUP,
    JSON_PATCH,
    MERGE,
    STOP_FINALIZER,
    VERSION,
    VM_PLURAL,
    VMI_PLURAL,
    Key,
    Obj,
    change_requests,
    controller_uid,
    firmware_uuid,
    has_start_request,
    has_stop_request_for,
    is_deleting,
    is_final,
    is_ready,
    key_of,
    run_strategy,
    trim_first_request_needed,
    uid_of,
    vmi_from_vm,
)

log = structlog.get_logger(__name__)


def _now() -> str:
    """Now as `metav1.Time` (whole seconds), the type of VMI phase and condition timestamps."""
    return format_time(dt.datetime.now(dt.UTC))


async def patch_kubevirt(co: Any, ns: str, plural: str, *, name: str, body: Any, content_type: str,
                         status: bool = False) -> Obj:
    """PATCH a kubevirt.io object (or its status) with an explicit patch type.

    The generated client's stubs do not declare `_content_type`, hence the untyped `co`."""
    fn = co.patch_namespaced_custom_object_status if status else co.patch_namespaced_custom_object
    result: Obj = await fn(GROUP, VERSION, ns, plural, name, body, _content_type=content_type)
    return result


def _raw(obj: Mapping[str, Any]) -> Obj:
    """Identity projection: the stand-in works on whole objects, as virt-controller does."""
    return obj if isinstance(obj, dict) else dict(obj)


class WatchedKind:
    """One KubeVirt kind seen through the project's Informer, plus the simulator's own writes.

    `store` starts from the informer's events and is overwritten by what the simulator itself just
    wrote (virt-controller's expectations), so a reconcile does not act twice on a stale cache.
    `on_event(type, obj)` gets ADDED / MODIFIED / DELETED (with the last known object).
    """

    def __init__(self, plural: str, lister: ListFunc, on_event: Callable[[str, Obj], None]) -> None:
        self.store: dict[Key, Obj] = {}
        self._on_event = on_event
        # Short backoff: the stand-in must follow an apiserver restart within a second, as the old
        # fixed 0.5 s retry did; the controller's own informers use the production defaults.
        self.informer: Informer[Obj] = Informer(
            f"kubevirt-sim-{plural}", lister, _raw, on_change=self._changed,
            options=InformerOptions(watch_timeout=240.0, backoff_base=0.2, backoff_cap=1.0))
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.informer.run(), name=f"informer-{self.informer.name}")

    async def wait_synced(self, timeout: float) -> None:  # noqa: ASYNC109 (mirrors Informer.wait_synced)
        if not await self.informer.wait_synced(timeout):
            raise TimeoutError(f"{self.informer.name} did not sync in {timeout:g} s")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _changed(self, key: Key, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            self.store.pop(key, None)
            if old is not None:
                self._on_event("DELETED", old)
            return
        self.store[key] = new
        self._on_event("ADDED" if old is None else "MODIFIED", new)


class KubevirtSimulator:
    """Reconciles VirtualMachines into VirtualMachineInstances on a real apiserver."""

    def __init__(
        self,
        api: ApiClient,
        ready_delay: float = 0.5,
        *,
        stop_delay: float = 0.0,
        record: SimulatorRecord | None = None,
    ) -> None:
        """`stop_delay` > 0 models a graceful guest shutdown: VMIs carry a finalizer the simulator
        removes `stop_delay` seconds after deletion starts (0: VMIs vanish at once)."""
        self.api = api
        self.ready_delay = ready_delay
        self.stop_delay = stop_delay
        self.record = record or SimulatorRecord()
        self._co = client.CustomObjectsApi(api)
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._booting: set[str] = set()
        self._stopping: set[str] = set()
        self._forced: dict[str, asyncio.Event] = {}
        self._seen: set[str] = set()
        self._failures: dict[Key, int] = {}
        self._ready: set[str] = set()
        self._worker: asyncio.Task[None] | None = None
        self.vms = WatchedKind(VM_PLURAL, self._lister(VM_PLURAL), self._on_vm)
        self.vmis = WatchedKind(VMI_PLURAL, self._lister(VMI_PLURAL), self._on_vmi)

    def _lister(self, plural: str) -> ListFunc:
        return functools.partial(self._co.list_cluster_custom_object, GROUP, VERSION, plural)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._worker = asyncio.create_task(self._work(), name="kubevirt-sim-worker")
        self.vms.start()
        self.vmis.start()
        await asyncio.gather(self.vms.wait_synced(30), self.vmis.wait_synced(30))
        log.info("kubevirt simulator started", ready_delay=self.ready_delay)

    async def stop(self) -> None:
        await self.vms.stop()
        await self.vmis.stop()
        tasks = [t for t in (self._worker, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._worker = None
        self._tasks.clear()
        # Do not leave VMIs stuck behind our finalizer once nobody will remove it.
        for vmi in list(self.vmis.store.values()):
            if STOP_FINALIZER in ((vmi.get("metadata") or {}).get("finalizers") or []):
                with contextlib.suppress(Exception):
                    await self._remove_finalizer(vmi)

    async def __aenter__(self) -> KubevirtSimulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def force_stop(self, vmi_uid: str) -> None:
        """Skip the graceful stop delay for this VMI (a restart with gracePeriodSeconds=0)."""
        self._forced.setdefault(vmi_uid, asyncio.Event()).set()

    # -- event plumbing --------------------------------------------------------------------
    def _enqueue(self, k: Key) -> None:
        if k not in self._queued:
            self._queued.add(k)
            self._queue.put_nowait(k)

    def _spawn(self, coro: Any) -> None:
        t: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    def _on_vm(self, typ: str, vm: Obj) -> None:
        k = key_of(vm)
        if typ == "DELETED" or is_deleting(vm):
            self.record.vm_gone(k[0], k[1], time.monotonic())  # a deleted VM is not "unavailable"
        self._enqueue(k)

    def _counts(self, ns: str, name: str) -> bool:
        """Whether availability of this VM is tracked: it exists and is not being deleted."""
        vm = self.vms.store.get((ns, name))
        return vm is not None and not is_deleting(vm)

    def _on_vmi(self, typ: str, vmi: Obj) -> None:
        ns, name = key_of(vmi)
        uid = uid_of(vmi)
        now = time.monotonic()
        owned = controller_uid(vmi) is not None and self._counts(ns, name)
        rec = self.record
        self._record_once(self._seen, VmiEvent(now, "created", ns, name, uid))
        if typ == "DELETED":
            rec.vmi_events.append(VmiEvent(now, "deleted", ns, name, uid))
            self._booting.discard(uid)
            if owned:
                rec.vm_down(ns, name, now)
        elif is_deleting(vmi):
            if self._record_once(self._stopping, VmiEvent(now, "deleting", ns, name, uid)):
                if owned:
                    rec.vm_down(ns, name, now)
                if STOP_FINALIZER in ((vmi.get("metadata") or {}).get("finalizers") or []):
                    self._spawn(self._graceful_stop(vmi))
        else:
            phase = (vmi.get("status") or {}).get("phase") or ""
            if phase in ("", "Pending", "Scheduling", "Scheduled") and uid not in self._booting:
                self._booting.add(uid)
                self._spawn(self._boot(vmi))
            if is_ready(vmi):
                self._record_once(self._ready, VmiEvent(now, "ready", ns, name, uid))
                if owned:
                    rec.vm_up(ns, name, now)
        if owned:
            self._enqueue((ns, name))

    def _record_once(self, seen: set[str], event: VmiEvent) -> bool:
        """Record `event` the first time its VMI UID enters `seen` (watches repeat states); True if new."""
        if event.uid in seen:
            return False
        seen.add(event.uid)
        self.record.vmi_events.append(event)
        return True

    async def _work(self) -> None:
        while True:
            k = await self._queue.get()
            self._queued.discard(k)
            try:
                await self._reconcile(k)
                self._failures.pop(k, None)
            except asyncio.CancelledError:
                raise
            except ApiException as e:
                if e.status == 403 and "being terminated" in str(e.body or ""):
                    continue  # namespace going away: its deletion brings the next event
                self._retry(k, f"HTTP {e.status} {e.reason}")
            except Exception as e:
                self._retry(k, repr(e))

    def _retry(self, k: Key, error: str) -> None:
        n = self._failures.get(k, 0)
        self._failures[k] = n + 1
        delay = min(0.2 * 2**n, 5.0)
        log.warning("simulator reconcile failed; retrying", key=k, error=error, retry_in=delay)
        self._spawn(self._requeue_later(k, delay))

    async def _requeue_later(self, k: Key, delay: float) -> None:
        await asyncio.sleep(delay)
        self._enqueue(k)

    # -- VMI boot / stop (virt-handler's part) ---------------------------------------------
    async def _patch_vmi_status(self, ns: str, name: str, uid: str, status: dict[str, Any]) -> bool:
        """Merge-patch the VMI status subresource, only if the VMI with this UID still exists."""
        body = {"metadata": {"uid": uid}, "status": status}  # uid precondition: never touch a successor
        try:
            await patch_kubevirt(self._co, ns, VMI_PLURAL, name=name, body=body, content_type=MERGE, status=True)
            return True
        except ApiException as e:
            if e.status in (404, 409, 422):  # gone, or a successor with another UID (immutable uid)
                return False
            raise

    async def _boot(self, vmi: Obj) -> None:
        ns, name = key_of(vmi)
        uid = uid_of(vmi)
        ann = (vmi.get("metadata") or {}).get("annotations") or {}
        delay = float(ann.get(ANN_READY_DELAY, self.ready_delay))
        mode = ann.get(ANN_BOOT, "")
        t0 = _now()
        stamps = [{"phase": "Pending", "phaseTransitionTimestamp": t0},
                  {"phase": "Scheduling", "phaseTransitionTimestamp": t0}]
        ok = await self._patch_vmi_status(ns, name, uid, {
            "phase": "Scheduling",
            "phaseTransitionTimestamps": stamps,
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodNotReady",
                            "lastProbeTime": None, "lastTransitionTime": t0}],
        })
        if not ok or mode == "hang":
            return
        await asyncio.sleep(delay)
        t1 = _now()
        if mode == "fail":
            stamps.append({"phase": "Failed", "phaseTransitionTimestamp": t1})
            if await self._patch_vmi_status(ns, name, uid, {"phase": "Failed", "phaseTransitionTimestamps": stamps}):
                self.record.vmi_events.append(VmiEvent(time.monotonic(), "failed", ns, name, uid))
            return
        stamps += [{"phase": "Scheduled", "phaseTransitionTimestamp": t1},
                   {"phase": "Running", "phaseTransitionTimestamp": t1}]
        await self._patch_vmi_status(ns, name, uid, {
            "phase": "Running",
            "nodeName": "devcluster-node",
            "phaseTransitionTimestamps": stamps,
            "conditions": [{"type": "Ready", "status": "True", "reason": "", "lastProbeTime": None,
                            "lastTransitionTime": t1}],
        })

    async def _graceful_stop(self, vmi: Obj) -> None:
        uid = uid_of(vmi)
        forced = self._forced.setdefault(uid, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(forced.wait(), self.stop_delay)
        self._forced.pop(uid, None)
        ns, name = key_of(vmi)
        stamps = list((vmi.get("status") or {}).get("phaseTransitionTimestamps") or [])
        stamps.append({"phase": "Succeeded", "phaseTransitionTimestamp": _now()})
        await self._patch_vmi_status(ns, name, uid, {"phase": "Succeeded", "phaseTransitionTimestamps": stamps,
                                                     "conditions": [{"type": "Ready", "status": "False"}]})
        current = self.vmis.store.get((ns, name)) or vmi
        if uid_of(current) == uid:
            await self._remove_finalizer(current)

    async def _remove_finalizer(self, vmi: Obj) -> None:
        ns, name = key_of(vmi)
        for _ in range(5):
            try:
                fresh = await self._co.get_namespaced_custom_object(GROUP, VERSION, ns, VMI_PLURAL, name)
            except ApiException as e:
                if e.status == 404:
                    return
                raise
            if uid_of(fresh) != uid_of(vmi):
                return
            fins = list(fresh["metadata"].get("finalizers") or [])
            if STOP_FINALIZER not in fins:
                return
            fins.remove(STOP_FINALIZER)
            patch = [{"op": "test", "path": "/metadata/resourceVersion",
                      "value": fresh["metadata"]["resourceVersion"]},
                     {"op": "replace", "path": "/metadata/finalizers", "value": fins}]
            try:
                await patch_kubevirt(self._co, ns, VMI_PLURAL, name=name, body=patch, content_type=JSON_PATCH)
                return
            except ApiException as e:
                if e.status == 404:
                    return
                if e.status not in (409, 422):
                    raise

    # -- the VM loop (virt-controller) -----------------------------------------------------
    async def _reconcile(self, k: Key) -> None:
        vm = self.vms.store.get(k)
        if vm is None or is_deleting(vm):
            return  # the garbage collector removes VMIs of deleted VMs (ownerReference)
        vmi = self.vmis.store.get(k)
        if vmi is not None and controller_uid(vmi) != uid_of(vm):
            return  # not ours: orphan adoption is not modelled; never touch it
        if await self._ensure_firmware_uuid(vm):
            return  # the VM update event brings us back
        strategy = run_strategy(vm)
        await self._sync_run_strategy(vm, vmi, strategy)
        await self._update_vm_status(vm, vmi, strategy)

    async def _ensure_firmware_uuid(self, vm: Obj) -> bool:
        """vm/firmware.go: persist the stable firmware UUID on the VM template."""
        tmpl_spec = ((vm.get("spec") or {}).get("template") or {}).get("spec")
        if tmpl_spec is None:
            return False
        domain = tmpl_spec.get("domain")
        fw = (domain or {}).get("firmware")
        if fw and fw.get("uuid"):
            return False
        ns, name = key_of(vm)
        new_fw = {**(fw or {}), "uuid": firmware_uuid(name)}
        if domain is None:
            patch = [{"op": "add", "path": "/spec/template/spec/domain", "value": {"firmware": new_fw}}]
        elif fw is None:
            patch = [{"op": "add", "path": "/spec/template/spec/domain/firmware", "value": new_fw}]
        else:
            patch = [{"op": "replace", "path": "/spec/template/spec/domain/firmware", "value": new_fw}]
        try:
            updated = await patch_kubevirt(self._co, ns, VM_PLURAL, name=name, body=patch, content_type=JSON_PATCH)
        except ApiException as e:
            if e.status in (404, 409, 422):
                return True
            raise
        self.vms.store[(ns, name)] = updated
        return True

    async def _sync_run_strategy(self, vm: Obj, vmi: Obj | None, strategy: str) -> None:
        """vm.go syncRunStrategy."""
        if strategy == "Always":
            if vmi is not None:
                if has_stop_request_for(vm, vmi) or is_final(vmi):
                    await self._stop_vmi(vmi)
                return
            await self._start_vmi(vm)
        elif strategy == "RerunOnFailure":
            if vmi is not None:
                force = has_stop_request_for(vm, vmi)
                phase = (vmi.get("status") or {}).get("phase")
                if not is_deleting(vmi) and (force or phase in FINAL_PHASES):
                    await self._stop_vmi(vmi)
                    if phase == "Failed":
                        await self._patch_requests(vm, [*change_requests(vm), {"action": "Start"}])
                return
            if not has_start_request(vm) and (vm.get("status") or {}).get("runStrategy") == strategy:
                return
            await self._start_vmi(vm)
        elif strategy == "Manual":
            if vmi is not None:
                if has_stop_request_for(vm, vmi):
                    await self._stop_vmi(vmi)
            elif has_start_request(vm):
                await self._start_vmi(vm)
        elif strategy == "Halted":
            if vmi is not None:
                await self._stop_vmi(vmi)
        elif strategy == "Once" and vmi is None:
            await self._start_vmi(vm)

    async def _start_vmi(self, vm: Obj) -> None:
        """vm.go setupVMIFromVM + startVMI."""
        ns, name = key_of(vm)
        body = vmi_from_vm(vm, finalizers=[STOP_FINALIZER] if self.stop_delay > 0 else [])
        try:
            created = await self._co.create_namespaced_custom_object(GROUP, VERSION, ns, VMI_PLURAL, body)
        except ApiException as e:
            if e.status == 409:
                return  # our cache lags; the watch will tell us about the existing VMI
            raise
        # Expectation: remember the new VMI before its watch event arrives, as virt-controller does.
        self.vmis.store[(ns, name)] = created
        log.debug("simulator created vmi", namespace=ns, name=name, uid=uid_of(created))

    async def _stop_vmi(self, vmi: Obj) -> None:
        if is_deleting(vmi):
            return
        ns, name = key_of(vmi)
        try:
            await self._co.delete_namespaced_custom_object(
                GROUP, VERSION, ns, VMI_PLURAL, name,
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid_of(vmi))),
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    async def _patch_requests(self, vm: Obj, new: list[dict[str, Any]]) -> None:
        ns, name = key_of(vm)
        current = change_requests(vm)
        if not (vm.get("status") or {}):
            patch: list[dict[str, Any]] = [{"op": "add", "path": "/status", "value": {"stateChangeRequests": new}}]
        else:
            patch = [{"op": "test", "path": "/status/stateChangeRequests", "value": current or None}]
            if new:
                patch.append({"op": "add" if not current else "replace",
                              "path": "/status/stateChangeRequests", "value": new})
            else:
                patch.append({"op": "remove", "path": "/status/stateChangeRequests"})
        updated = await patch_kubevirt(self._co, ns, VM_PLURAL, name=name, body=patch, content_type=JSON_PATCH,
                                       status=True)
        self.vms.store[(ns, name)] = updated

    async def _update_vm_status(self, vm: Obj, vmi: Obj | None, strategy: str) -> None:
        """vm.go updateStatus: trim a handled change request, then created/ready/printableStatus."""
        ns, name = key_of(vm)
        current = self.vms.store.get((ns, name)) or vm
        if trim_first_request_needed(current, vmi):
            try:
                await self._patch_requests(current, change_requests(current)[1:])
            except ApiException as e:
                if e.status in (409, 422):  # a restart request raced us: look again
                    self._enqueue((ns, name))
                    return
                raise
            current = self.vms.store.get((ns, name)) or current
        ready = vmi is not None and is_ready(vmi) and not is_deleting(vmi)
        if vmi is None:
            printable = "Stopped"
        elif is_deleting(vmi):
            printable = "Stopping"
        elif ready or (vmi.get("status") or {}).get("phase") == "Running":
            printable = "Running"
        elif (vmi.get("status") or {}).get("phase") in FINAL_PHASES:
            printable = "Stopped" if (vmi.get("status") or {}).get("phase") == "Succeeded" else "Failed"
        else:
            printable = "Starting"
        want = {"created": vmi is not None, "ready": ready, "printableStatus": printable,
                "runStrategy": strategy}
        status = current.get("status") or {}
        if all(status.get(k) == v for k, v in want.items()):
            return
        try:
            updated = await patch_kubevirt(self._co, ns, VM_PLURAL, name=name, body={"status": want},
                                           content_type=MERGE, status=True)
            self.vms.store[(ns, name)] = updated
        except ApiException as e:
            if e.status != 404:
                raise
