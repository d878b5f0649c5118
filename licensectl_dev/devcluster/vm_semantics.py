"""KubeVirt VM semantics shared by the virt-controller and virt-api stand-ins (pure, no I/O).

Upstream (kubevirt/kubevirt):
- pkg/virt-controller/watch/vm/vm.go: `VirtualMachine.RunStrategy()`; `hasStopRequestForVMI` /
  `hasStartRequest` look only at stateChangeRequests[0]; `isTrimFirstChangeRequestNeeded` drops a
  Stop request once its VMI UID is gone and a Start request once a live VMI exists.
- pkg/virt-controller/watch/vm/firmware.go: a missing `spec.template.spec.domain.firmware.uuid` is
  uuid5(6a1a24a1-4061-4607-8bf4-a3963d0c5895, vm name), so the guest's SMBIOS UUID is stable across
  restarts of the same VM.
- pkg/virt-controller/watch/vm/vm.go `setupVMIFromVM`: the VMI a VM's template makes.
- pkg/virt-api/rest/lifecycle.go `getChangeRequestJson`: the JSON patch a restart applies.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from licensectl.kube.watch import Key

Obj = dict[str, Any]

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

__all__ = [
    "ANN_BOOT", "ANN_READY_DELAY", "FINAL_PHASES", "FIRMWARE_UUID_NAMESPACE", "GROUP", "JSON_PATCH", "MERGE",
    "STOP_FINALIZER", "SUBRESOURCE_GROUP", "VERSION", "VMI_PLURAL", "VM_PLURAL", "Key", "Obj",
    "change_request_patch", "change_requests", "controller_uid", "firmware_uuid", "has_start_request",
    "has_stop_request_for", "is_deleting", "is_final", "is_ready", "key_of", "run_strategy",
    "trim_first_request_needed", "uid_of", "vmi_from_vm",
]


def key_of(obj: Obj) -> Key:
    """(namespace, name) of an object."""
    md = obj.get("metadata") or {}
    return (str(md.get("namespace") or ""), str(md.get("name") or ""))


def firmware_uuid(vm_name: str) -> str:
    """KubeVirt's stable firmware UUID for a VM (vm/firmware.go CalculateLegacyFirmwareUUID)."""
    return str(uuid.uuid5(FIRMWARE_UUID_NAMESPACE, vm_name))


def run_strategy(vm: Obj) -> str:
    """VirtualMachine.RunStrategy(): spec.runStrategy, else legacy spec.running, else Halted."""
    spec = vm.get("spec") or {}
    if spec.get("runStrategy"):
        return str(spec["runStrategy"])
    return "Always" if spec.get("running") is True else "Halted"


def controller_uid(obj: Obj) -> str | None:
    """UID of the object's controller ownerReference, None for an orphan."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def uid_of(obj: Obj | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def is_final(vmi: Obj) -> bool:
    return (vmi.get("status") or {}).get("phase") in FINAL_PHASES


def is_deleting(obj: Obj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def is_ready(vmi: Obj) -> bool:
    for c in (vmi.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def vmi_from_vm(vm: Obj, *, finalizers: Sequence[str] = ()) -> Obj:
    """The VMI virt-controller creates for `vm` (vm.go setupVMIFromVM): the template's labels and spec,
    its annotations plus the VM generation it came from, owned by the VM, the firmware UUID filled in.

    One shape for the simulator's virt-controller and for callers that write running VMIs directly,
    so the controller under test sees the same objects either way.
    """
    ns, name = key_of(vm)
    tmpl = (vm.get("spec") or {}).get("template") or {}
    tmeta = dict(tmpl.get("metadata") or {})
    spec = json.loads(json.dumps(tmpl.get("spec") or {}))  # a deep copy: the VM's template stays as it is
    domain = spec.setdefault("domain", {})
    fw = domain.setdefault("firmware", {})
    fw.setdefault("uuid", firmware_uuid(name))
    metadata: Obj = {
        "name": name,
        "namespace": ns,
        "labels": tmeta.get("labels") or {},
        "annotations": {**(tmeta.get("annotations") or {}),
                        "kubevirt.io/vm-generation": str(vm["metadata"].get("generation", 1))},
        "ownerReferences": [{
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "VirtualMachine", "name": name,
            "uid": uid_of(vm), "controller": True, "blockOwnerDeletion": True,
        }],
    }
    if finalizers:
        metadata["finalizers"] = list(finalizers)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VirtualMachineInstance", "metadata": metadata, "spec": spec}


def change_requests(vm: Obj) -> list[dict[str, Any]]:
    return list((vm.get("status") or {}).get("stateChangeRequests") or [])


def has_start_request(vm: Obj) -> bool:
    reqs = change_requests(vm)
    return bool(reqs) and reqs[0].get("action") == "Start"


def has_stop_request_for(vm: Obj, vmi: Obj) -> bool:
    reqs = change_requests(vm)
    return bool(reqs) and reqs[0].get("action") == "Stop" and reqs[0].get("uid") == uid_of(vmi)


def trim_first_request_needed(vm: Obj, vmi: Obj | None) -> bool:
    """vm.go isTrimFirstChangeRequestNeeded."""
    reqs = change_requests(vm)
    if not reqs:
        return False
    first = reqs[0]
    if first.get("action") == "Stop":
        return vmi is None or not first.get("uid") or first.get("uid") != uid_of(vmi)
    if first.get("action") == "Start":
        return vmi is not None and not is_deleting(vmi) and not is_final(vmi)
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
