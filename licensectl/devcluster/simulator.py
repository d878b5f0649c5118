"""A KubeVirt stand-in for tests and the demo: virt-controller's VM loop plus a restart API.

`KubevirtSimulator` plays virt-controller (and the part of virt-handler that boots a VMI) against
the real apiserver, driven by watches. `RestartProxy` plays virt-api's
`PUT .../virtualmachines/{name}/restart` in front of the apiserver and forwards everything else,
so the controller under test talks to something shaped like a KubeVirt cluster.

Upstream semantics encoded here (kubevirt/kubevirt):
- pkg/virt-controller/watch/vm/vm.go `syncRunStrategy`: per runStrategy, when to create/delete
  the VMI; `hasStopRequestForVMI` / `hasStartRequest` look only at stateChangeRequests[0];
  `isTrimFirstChangeRequestNeeded` drops a Stop request once its VMI UID is gone and a Start
  request once a live VMI exists; `setupVMIFromVM` names the VMI after the VM, copies the template
  metadata (labels, annotations) and spec, and sets a controller ownerReference.
- pkg/virt-controller/watch/vm/firmware.go: a missing `spec.template.spec.domain.firmware.uuid`
  is patched onto the VM as uuid5(6a1a24a1-4061-4607-8bf4-a3963d0c5895, vm name), so the guest's
  SMBIOS UUID is stable across restarts of the same VM.
- pkg/virt-api/rest/lifecycle.go `RestartVMRequestHandler` + `getChangeRequestJson`: see
  RestartProxy.

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
import json
import os
import ssl
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.rest import ApiException

from licensectl.devcluster.controlplane import LOOPBACK, render_kubeconfig
from licensectl.devcluster.informer import Informer, Key, Obj, key_of

log = structlog.get_logger(__name__)

GROUP, VERSION = "kubevirt.io", "v1"
SUBRESOURCE_GROUP = "subresources.kubevirt.io"
VM_PLURAL, VMI_PLURAL = "virtualmachines", "virtualmachineinstances"
FIRMWARE_UUID_NAMESPACE = uuid.UUID("6a1a24a1-4061-4607-8bf4-a3963d0c5895")  # vm/firmware.go
ANN_READY_DELAY = "devcluster.licensectl.io/ready-delay"
ANN_BOOT = "devcluster.licensectl.io/boot"
STOP_FINALIZER = "devcluster.licensectl.io/graceful-stop"
FINAL_PHASES = ("Succeeded", "Failed")
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def firmware_uuid(vm_name: str) -> str:
    """KubeVirt's stable firmware UUID for a VM (vm/firmware.go CalculateLegacyFirmwareUUID)."""
    return str(uuid.uuid5(FIRMWARE_UUID_NAMESPACE, vm_name))


def run_strategy(vm: Obj) -> str:
    """VirtualMachine.RunStrategy(): spec.runStrategy, else legacy spec.running, else Halted."""
    spec = vm.get("spec") or {}
    if spec.get("runStrategy"):
        return str(spec["runStrategy"])
    return "Always" if spec.get("running") is True else "Halted"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _controller_uid(obj: Obj) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _uid(obj: Obj | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def _is_final(vmi: Obj) -> bool:
    return (vmi.get("status") or {}).get("phase") in FINAL_PHASES


def _deleting(obj: Obj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _is_ready(vmi: Obj) -> bool:
    for c in (vmi.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


async def _patch(co: Any, ns: str, plural: str, name: str, body: Any, content_type: str,
                 *, status: bool = False) -> Obj:
    """PATCH a kubevirt.io object (or its status) with an explicit patch type.

    The generated client's stubs do not declare `_content_type`, hence the untyped `co`."""
    fn = co.patch_namespaced_custom_object_status if status else co.patch_namespaced_custom_object
    result: Obj = await fn(GROUP, VERSION, ns, plural, name, body, _content_type=content_type)
    return result


def _requests(vm: Obj) -> list[dict[str, Any]]:
    return list((vm.get("status") or {}).get("stateChangeRequests") or [])


def has_start_request(vm: Obj) -> bool:
    reqs = _requests(vm)
    return bool(reqs) and reqs[0].get("action") == "Start"


def has_stop_request_for(vm: Obj, vmi: Obj) -> bool:
    reqs = _requests(vm)
    return bool(reqs) and reqs[0].get("action") == "Stop" and reqs[0].get("uid") == _uid(vmi)


def trim_first_request_needed(vm: Obj, vmi: Obj | None) -> bool:
    """vm.go isTrimFirstChangeRequestNeeded."""
    reqs = _requests(vm)
    if not reqs:
        return False
    first = reqs[0]
    if first.get("action") == "Stop":
        return vmi is None or not first.get("uid") or first.get("uid") != _uid(vmi)
    if first.get("action") == "Start":
        return vmi is not None and not _deleting(vmi) and not _is_final(vmi)
    return False


def change_request_patch(vm: Obj, changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """lifecycle.go getChangeRequestJson: a JSON patch that appends `changes`, guarded by a test.

    Raises ValueError("unable to complete request: stop/start already underway") like upstream.
    """
    status = vm.get("status") or {}
    if not status:
        return [{"op": "add", "path": "/status", "value": {"stateChangeRequests": changes}}]
    current = status.get("stateChangeRequests") or []
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/status/stateChangeRequests", "value": current or None}
    ]
    if not current:
        ops.append({"op": "add", "path": "/status/stateChangeRequests", "value": changes})
    elif len(changes) == 1 and changes[0].get("action") == "Stop":
        ops.append({"op": "replace", "path": "/status/stateChangeRequests", "value": changes})
    else:
        raise ValueError("unable to complete request: stop/start already underway")
    if status.get("startFailure") is not None:
        ops.append({"op": "remove", "path": "/status/startFailure"})
    return ops


# ---------------------------------------------------------------------------------------------
# The record tests assert on
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RestartRecord:
    at: float  # time.monotonic()
    namespace: str
    vm: str
    vmi_uid: str  # "" when there was no VMI
    status: int  # HTTP status returned
    reason: str  # "" on success, else the Status message
    grace_period_seconds: int | None = None


@dataclass(frozen=True)
class VmiEvent:
    at: float  # time.monotonic()
    kind: str  # created | deleting | deleted | ready | failed
    namespace: str
    name: str
    uid: str


@dataclass
class Interval:
    namespace: str
    vm: str
    start: float
    end: float | None = None


@dataclass
class SimulatorRecord:
    """Everything the simulator saw or did, with monotonic timestamps."""

    restarts: list[RestartRecord] = field(default_factory=list)
    vmi_events: list[VmiEvent] = field(default_factory=list)
    # A VM is "unavailable" from the moment it loses a Ready VMI (restart accepted, or its VMI
    # deleted) until a VMI of it is Ready again. First boots do not count.
    unavailable: list[Interval] = field(default_factory=list)
    _open: dict[Key, Interval] = field(default_factory=dict)
    _was_up: set[Key] = field(default_factory=set)

    def restarts_for(self, namespace: str, vm: str, *, accepted_only: bool = True) -> list[RestartRecord]:
        return [
            r for r in self.restarts
            if r.namespace == namespace and r.vm == vm and (r.status == 202 or not accepted_only)
        ]

    def events_for(self, namespace: str, name: str, kind: str | None = None) -> list[VmiEvent]:
        return [
            e for e in self.vmi_events
            if e.namespace == namespace and e.name == name and (kind is None or e.kind == kind)
        ]

    def vmi_uids(self, namespace: str, name: str) -> list[str]:
        """UIDs of every VMI created under this name, oldest first."""
        return [e.uid for e in self.events_for(namespace, name, "created")]

    def max_concurrent_unavailable(self, namespace: str | None = None) -> int:
        """The most VMs that were unavailable at the same moment (optionally in one namespace).

        The simulator is cluster-wide like virt-controller: pass `namespace` to keep other tests'
        VMs (e.g. namespaces still terminating) out of the count."""
        points: list[tuple[float, int]] = []
        for iv in self.unavailable:
            if namespace is not None and iv.namespace != namespace:
                continue
            points.append((iv.start, 1))
            points.append((iv.end if iv.end is not None else float("inf"), -1))
        best = cur = 0
        for _, d in sorted(points, key=lambda p: (p[0], p[1])):  # ends before starts at a tie
            cur += d
            best = max(best, cur)
        return best

    max_concurrent_unready = max_concurrent_unavailable

    def currently_unavailable(self) -> list[Key]:
        return sorted(self._open)

    # -- mutation (simulator internals) ----------------------------------------------------
    def _down(self, ns: str, vm: str, at: float) -> None:
        k = (ns, vm)
        if k in self._was_up and k not in self._open:
            iv = Interval(ns, vm, at)
            self._open[k] = iv
            self.unavailable.append(iv)

    def _gone(self, ns: str, vm: str, at: float) -> None:
        k = (ns, vm)
        self._was_up.discard(k)
        iv = self._open.pop(k, None)
        if iv is not None:
            iv.end = at

    def _up(self, ns: str, vm: str, at: float) -> None:
        k = (ns, vm)
        self._was_up.add(k)
        iv = self._open.pop(k, None)
        if iv is not None:
            iv.end = at


# ---------------------------------------------------------------------------------------------
# virt-controller (VM loop) + the VMI boot part of virt-handler
# ---------------------------------------------------------------------------------------------
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
        self.vms = Informer(api, GROUP, VERSION, VM_PLURAL, self._on_vm)
        self.vmis = Informer(api, GROUP, VERSION, VMI_PLURAL, self._on_vmi)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._worker = asyncio.create_task(self._work(), name="kubevirt-sim-worker")
        self.vms.start()
        self.vmis.start()
        await asyncio.wait_for(asyncio.gather(self.vms.synced.wait(), self.vmis.synced.wait()), 30)
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
        if typ == "DELETED" or _deleting(vm):
            self.record._gone(k[0], k[1], time.monotonic())  # a deleted VM is not "unavailable"
        self._enqueue(k)

    def _counts(self, ns: str, name: str) -> bool:
        """Whether availability of this VM is tracked: it exists and is not being deleted."""
        vm = self.vms.store.get((ns, name))
        return vm is not None and not _deleting(vm)

    def _on_vmi(self, typ: str, vmi: Obj) -> None:
        ns, name = key_of(vmi)
        uid = _uid(vmi)
        now = time.monotonic()
        owned = _controller_uid(vmi) is not None and self._counts(ns, name)
        rec = self.record
        if uid not in self._seen:
            self._seen.add(uid)
            rec.vmi_events.append(VmiEvent(now, "created", ns, name, uid))
        if typ == "DELETED":
            rec.vmi_events.append(VmiEvent(now, "deleted", ns, name, uid))
            self._booting.discard(uid)
            if owned:
                rec._down(ns, name, now)
        elif _deleting(vmi):
            if uid not in self._stopping:
                self._stopping.add(uid)
                rec.vmi_events.append(VmiEvent(now, "deleting", ns, name, uid))
                if owned:
                    rec._down(ns, name, now)
                if STOP_FINALIZER in ((vmi.get("metadata") or {}).get("finalizers") or []):
                    self._spawn(self._graceful_stop(vmi))
        else:
            phase = (vmi.get("status") or {}).get("phase") or ""
            if phase in ("", "Pending", "Scheduling", "Scheduled") and uid not in self._booting:
                self._booting.add(uid)
                self._spawn(self._boot(vmi))
            if _is_ready(vmi):
                if uid not in self._ready:
                    self._ready.add(uid)
                    rec.vmi_events.append(VmiEvent(now, "ready", ns, name, uid))
                if owned:
                    rec._up(ns, name, now)
        if owned:
            self._enqueue((ns, name))

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
            await _patch(self._co, ns, VMI_PLURAL, name, body, MERGE, status=True)
            return True
        except ApiException as e:
            if e.status in (404, 409, 422):  # gone, or a successor with another UID (immutable uid)
                return False
            raise

    async def _boot(self, vmi: Obj) -> None:
        ns, name = key_of(vmi)
        uid = _uid(vmi)
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
        uid = _uid(vmi)
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
        if _uid(current) == uid:
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
            if _uid(fresh) != _uid(vmi):
                return
            fins = list(fresh["metadata"].get("finalizers") or [])
            if STOP_FINALIZER not in fins:
                return
            fins.remove(STOP_FINALIZER)
            patch = [{"op": "test", "path": "/metadata/resourceVersion",
                      "value": fresh["metadata"]["resourceVersion"]},
                     {"op": "replace", "path": "/metadata/finalizers", "value": fins}]
            try:
                await _patch(self._co, ns, VMI_PLURAL, name, patch, JSON_PATCH)
                return
            except ApiException as e:
                if e.status == 404:
                    return
                if e.status not in (409, 422):
                    raise

    # -- the VM loop (virt-controller) -----------------------------------------------------
    async def _reconcile(self, k: Key) -> None:
        vm = self.vms.store.get(k)
        if vm is None or _deleting(vm):
            return  # the garbage collector removes VMIs of deleted VMs (ownerReference)
        vmi = self.vmis.store.get(k)
        if vmi is not None and _controller_uid(vmi) != _uid(vm):
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
            updated = await _patch(self._co, ns, VM_PLURAL, name, patch, JSON_PATCH)
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
                if has_stop_request_for(vm, vmi) or _is_final(vmi):
                    await self._stop_vmi(vmi)
                return
            await self._start_vmi(vm)
        elif strategy == "RerunOnFailure":
            if vmi is not None:
                force = has_stop_request_for(vm, vmi)
                phase = (vmi.get("status") or {}).get("phase")
                if not _deleting(vmi) and (force or phase in FINAL_PHASES):
                    await self._stop_vmi(vmi)
                    if phase == "Failed":
                        await self._patch_requests(vm, [*_requests(vm), {"action": "Start"}])
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
        tmpl = (vm.get("spec") or {}).get("template") or {}
        tmeta = dict(tmpl.get("metadata") or {})
        spec = json.loads(json.dumps(tmpl.get("spec") or {}))
        domain = spec.setdefault("domain", {})
        fw = domain.setdefault("firmware", {})
        fw.setdefault("uuid", firmware_uuid(name))
        finalizers = [STOP_FINALIZER] if self.stop_delay > 0 else []
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": ns,
            "labels": tmeta.get("labels") or {},
            "annotations": {**(tmeta.get("annotations") or {}),
                            "kubevirt.io/vm-generation": str(vm["metadata"].get("generation", 1))},
            "ownerReferences": [{
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "VirtualMachine", "name": name,
                "uid": _uid(vm), "controller": True, "blockOwnerDeletion": True,
            }],
        }
        if finalizers:
            metadata["finalizers"] = finalizers
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VirtualMachineInstance",
                "metadata": metadata, "spec": spec}
        try:
            created = await self._co.create_namespaced_custom_object(GROUP, VERSION, ns, VMI_PLURAL, body)
        except ApiException as e:
            if e.status == 409:
                return  # our cache lags; the watch will tell us about the existing VMI
            raise
        # Expectation: remember the new VMI before its watch event arrives, as virt-controller does.
        self.vmis.store[(ns, name)] = created
        log.debug("simulator created vmi", namespace=ns, name=name, uid=_uid(created))

    async def _stop_vmi(self, vmi: Obj) -> None:
        if _deleting(vmi):
            return
        ns, name = key_of(vmi)
        try:
            await self._co.delete_namespaced_custom_object(
                GROUP, VERSION, ns, VMI_PLURAL, name,
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=_uid(vmi))),
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    async def _patch_requests(self, vm: Obj, new: list[dict[str, Any]]) -> None:
        ns, name = key_of(vm)
        current = _requests(vm)
        if not (vm.get("status") or {}):
            patch: list[dict[str, Any]] = [{"op": "add", "path": "/status", "value": {"stateChangeRequests": new}}]
        else:
            patch = [{"op": "test", "path": "/status/stateChangeRequests", "value": current or None}]
            if new:
                patch.append({"op": "add" if not current else "replace",
                              "path": "/status/stateChangeRequests", "value": new})
            else:
                patch.append({"op": "remove", "path": "/status/stateChangeRequests"})
        updated = await _patch(self._co, ns, VM_PLURAL, name, patch, JSON_PATCH, status=True)
        self.vms.store[(ns, name)] = updated

    async def _update_vm_status(self, vm: Obj, vmi: Obj | None, strategy: str) -> None:
        """vm.go updateStatus: trim a handled change request, then created/ready/printableStatus."""
        ns, name = key_of(vm)
        current = self.vms.store.get((ns, name)) or vm
        if trim_first_request_needed(current, vmi):
            try:
                await self._patch_requests(current, _requests(current)[1:])
            except ApiException as e:
                if e.status in (409, 422):  # a restart request raced us: look again
                    self._enqueue((ns, name))
                    return
                raise
            current = self.vms.store.get((ns, name)) or current
        ready = vmi is not None and _is_ready(vmi) and not _deleting(vmi)
        if vmi is None:
            printable = "Stopped"
        elif _deleting(vmi):
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
            updated = await _patch(self._co, ns, VM_PLURAL, name, {"status": want}, MERGE, status=True)
            self.vms.store[(ns, name)] = updated
        except ApiException as e:
            if e.status != 404:
                raise


# ---------------------------------------------------------------------------------------------
# virt-api's restart subresource, in front of the real apiserver
# ---------------------------------------------------------------------------------------------
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})


def _status(code: int, reason: str, message: str, *, kind: str = "virtualmachines", name: str = "") -> web.Response:
    body = {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
        "details": {"name": name, "group": "kubevirt.io", "kind": kind} if name else {},
    }
    return web.json_response(body, status=code)


class RestartProxy:
    """HTTP(S) reverse proxy on 127.0.0.1 that adds KubeVirt's VM restart subresource.

    Everything else (all verbs, streaming watches, chunked bodies) is forwarded to the apiserver
    with the caller's own credentials. Upgrade requests (exec/port-forward) are not supported.
    Set `restart_enabled = False` to look like a cluster without the subresource (404).
    """

    def __init__(
        self,
        simulator: KubevirtSimulator,
        *,
        upstream: str,
        ca_path: str | os.PathLike[str],
        token: str,
        restart_enabled: bool = True,
        tls: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
    ) -> None:
        """`tls` = (cert, key) signed by the cluster CA makes the proxy serve HTTPS; Go clients
        (kubectl, client-go) need it, as they never send a bearer token over plain HTTP."""
        self.simulator = simulator
        self.record = simulator.record
        self.upstream = upstream.rstrip("/")
        self._ca_path = os.fspath(ca_path)
        self._token = token
        self.restart_enabled = restart_enabled
        self._tls = tls
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._co = client.CustomObjectsApi(simulator.api)

    def __repr__(self) -> str:
        return f"RestartProxy(url={self.url!r}, upstream={self.upstream!r})"

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://{LOOPBACK}:{self.port}"

    def kubeconfig_for(self, token: str) -> str:
        """A kubeconfig that reaches the cluster through this proxy with the given bearer token."""
        ca = Path(self._ca_path).read_bytes() if self._tls else None
        return render_kubeconfig(self.url, ca, token=token, name="licensectl-dev-kubevirt")

    @property
    def kubeconfig_path(self) -> Path:
        """A kubeconfig (admin credential) pointing at the proxy."""
        if self._tmp is None:
            raise RuntimeError("proxy not started")
        return Path(self._tmp.name) / "kubeconfig"

    async def start(self) -> None:
        ctx = ssl.create_default_context(cafile=self._ca_path)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx, limit=0),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route(
            "PUT", "/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}/restart",
            self._restart,
        )
        app.router.add_route("GET", "/apis/subresources.kubevirt.io/v1", self._discovery)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        server_ctx: ssl.SSLContext | None = None
        if self._tls:
            server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            server_ctx.load_cert_chain(os.fspath(self._tls[0]), os.fspath(self._tls[1]))
        await web.TCPSite(self._runner, LOOPBACK, 0, ssl_context=server_ctx).start()
        self.port = int(self._runner.addresses[0][1])
        self._tmp = tempfile.TemporaryDirectory(prefix="licensectl-kv-proxy-")
        self.kubeconfig_path.write_text(self.kubeconfig_for(self._token))
        self.kubeconfig_path.chmod(0o600)
        log.info("restart proxy started", url=self.url, upstream=self.upstream)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def __aenter__(self) -> RestartProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- forwarding ------------------------------------------------------------------------
    def _upstream_headers(self, request: web.Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        if request.headers.get("Upgrade"):
            return web.Response(status=501, text="upgrade requests are not proxied")
        body = await request.read()
        url = self.upstream + request.raw_path
        async with self._session.request(
            request.method, url, headers=self._upstream_headers(request), data=body or None,
            allow_redirects=False,
        ) as up:
            resp = web.StreamResponse(status=up.status, reason=up.reason)
            for k, v in up.headers.items():
                if k.lower() not in _HOP_BY_HOP:
                    resp.headers.add(k, v)
            await resp.prepare(request)
            try:
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
            except (aiohttp.ClientPayloadError, ConnectionResetError, aiohttp.ClientConnectionError):
                pass  # upstream or client went away mid-stream (e.g. a watch being cancelled)
            with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionError):
                await resp.write_eof()
            return resp

    async def _discovery(self, request: web.Request) -> web.StreamResponse:
        if not self.restart_enabled:
            return await self._forward(request)
        return web.json_response({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{SUBRESOURCE_GROUP}/v1",
            "resources": [{"name": "virtualmachines/restart", "singularName": "", "namespaced": True,
                           "kind": "RestartOptions", "verbs": ["update"]}],
        })

    async def _authorized(self, request: web.Request, ns: str, name: str) -> web.Response | None:
        """virt-api authorizer.go: a SubjectAccessReview for update on virtualmachines/restart.

        Done as a SelfSubjectAccessReview with the caller's own credentials (the proxy sees the
        bearer token, not the aggregator's identity headers)."""
        assert self._session is not None
        review = {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {
                "namespace": ns, "verb": "update", "group": SUBRESOURCE_GROUP, "version": "v1",
                "resource": "virtualmachines", "subresource": "restart", "name": name}},
        }
        headers = {k: v for k, v in self._upstream_headers(request).items()
                   if k.lower() in ("authorization",) or k.lower().startswith("impersonate-")}
        headers["Content-Type"] = "application/json"
        async with self._session.post(
            self.upstream + "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            json=review, headers=headers,
        ) as r:
            if r.status == 401:
                return _status(401, "Unauthorized", "Unauthorized")
            if r.status >= 300:
                return _status(r.status, "InternalError", f"access review failed: HTTP {r.status}")
            result = await r.json()
        if not (result.get("status") or {}).get("allowed"):
            msg = (f'virtualmachines.{SUBRESOURCE_GROUP} "{name}" is forbidden: User cannot update '
                   f'resource "virtualmachines/restart" in API group "{SUBRESOURCE_GROUP}" in the '
                   f'namespace "{ns}"')
            return _status(403, "Forbidden", msg, name=name)
        return None

    async def _restart(self, request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if not self.restart_enabled:
            return await self._forward(request)
        denied = await self._authorized(request, ns, name)
        if denied is not None:
            self._log(ns, name, "", denied.status, denied.text or "", None)
            return denied
        resp, vmi_uid, grace = await self._do_restart(request, ns, name)
        body = resp.text if resp.status != 202 else ""
        reason = ""
        if resp.status != 202 and body:
            with contextlib.suppress(ValueError):
                reason = str(json.loads(body).get("message", ""))
        self._log(ns, name, vmi_uid, resp.status, reason, grace)
        return resp

    def _log(self, ns: str, name: str, vmi_uid: str, status: int, reason: str, grace: int | None) -> None:
        self.record.restarts.append(RestartRecord(time.monotonic(), ns, name, vmi_uid, status, reason, grace))
        if status == 202:
            self.record._down(ns, name, time.monotonic())
        log.info("restart request", namespace=ns, vm=name, vmi_uid=vmi_uid, status=status, reason=reason)

    async def _do_restart(self, request: web.Request, ns: str, name: str) -> tuple[web.Response, str, int | None]:
        """lifecycle.go RestartVMRequestHandler, step by step."""
        grace: int | None = None
        raw = await request.read()
        if raw.strip():
            try:
                opts = json.loads(raw)
            except ValueError as e:
                return _status(400, "BadRequest", f"Can not unmarshal Request body to struct: {e}"), "", None
            g = opts.get("gracePeriodSeconds") if isinstance(opts, dict) else None
            if g is not None:
                grace = int(g)
                if grace > 0:
                    return _status(400, "BadRequest",
                                   "For force restart, only gracePeriod=0 is supported for now"), "", grace
                if grace < 0:
                    return _status(400, "BadRequest", "gracePeriod has to be greater or equal to 0"), "", grace
        try:
            vm = await self._co.get_namespaced_custom_object(GROUP, VERSION, ns, VM_PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return _status(404, "NotFound", f'virtualmachines.kubevirt.io "{name}" not found', name=name), "", grace
            raise
        strategy = run_strategy(vm)
        if strategy in ("Halted", "Once"):
            return _status(409, "Conflict", f'Operation cannot be fulfilled on virtualmachine.kubevirt.io "{name}": '
                           f"RunStategy {strategy} does not support manual restart requests", name=name), "", grace
        try:
            vmi = await self._co.get_namespaced_custom_object(GROUP, VERSION, ns, VMI_PLURAL, name)
        except ApiException as e:
            if e.status != 404:
                raise
            return _status(409, "Conflict", f'Operation cannot be fulfilled on virtualmachine.kubevirt.io "{name}": '
                           "VM is not running: Halted", name=name), "", grace
        vmi_uid = _uid(vmi)
        try:
            patch = change_request_patch(vm, [{"action": "Stop", "uid": vmi_uid}, {"action": "Start"}])
        except ValueError as e:
            # Upstream wraps this in NewInternalError: HTTP 500, not 409.
            return _status(500, "InternalError", f"Internal error occurred: {e}", name=name), vmi_uid, grace
        try:
            await _patch(self._co, ns, VM_PLURAL, name, patch, JSON_PATCH, status=True)
        except ApiException as e:
            if e.status in (409, 422):  # jsonpatch test failed: a concurrent change request
                return _status(409, "Conflict", f'Operation cannot be fulfilled on virtualmachine.kubevirt.io '
                               f'"{name}": jsonpatch test operation does not apply', name=name), vmi_uid, grace
            return _status(500, "InternalError", f"Internal error occurred: HTTP {e.status}", name=name), vmi_uid, grace
        if grace == 0:
            self.simulator.force_stop(vmi_uid)
        return web.Response(status=202), vmi_uid, grace

