"""The restart pre-flight's wire side: the VMI a VM's template makes, dry-run created (dryRun=All).

What the VMI looks like follows KubeVirt's VM controller (pkg/virt-controller/watch/vm/vm.go
`setupVMIFromVM`): the template's metadata and spec, named and namespaced as the VM, owned by it, the
annotation `kubevirt.io/vm-generation`, and the stable firmware UUID (pkg/virt-controller/watch/vm/firmware.go)
when the template has none. The ownerReference carries no `blockOwnerDeletion`: the
OwnerReferencesPermissionEnforcement admission plugin would otherwise ask for a permission on the VM's
finalizers that licensectl does not hold, and refuse the probe for a reason the real create never meets.

The create goes through the apiserver's whole admission chain and no further (nothing is stored); the answer
becomes a `core.preflight.Admission` here, so no caller sees HTTP.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from licensectl.core.preflight import Admission, bounded
from licensectl.kube.api import AnyClient, KubeClient, as_kube
from licensectl.kube.contract import KUBEVIRT_GROUP, KUBEVIRT_VERSION
from licensectl.kube.errors import ApiException, Conflict, TooManyRequests

VM_PATH = "/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}"
VMI_PATH = "/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances"
ANN_VM_GENERATION = "kubevirt.io/vm-generation"
# pkg/virt-controller/watch/vm/firmware.go: uuid5 of this namespace and the VM name (legacy firmware UUID).
FIRMWARE_UUID_NAMESPACE = uuid.UUID("6a1a24a1-4061-4607-8bf4-a3963d0c5895")
REQUEST_TIMEOUT = 10.0


def vmi_for(vm: Mapping[str, Any]) -> dict[str, Any]:
    """The VMI KubeVirt's VM controller would create for `vm` now (a fresh object; `vm` is not changed)."""
    meta = vm.get("metadata") or {}
    name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
    tmpl = (vm.get("spec") or {}).get("template") or {}
    tmeta = tmpl.get("metadata") or {}
    spec = copy.deepcopy(tmpl.get("spec") or {})
    domain = spec.setdefault("domain", {})
    if isinstance(domain, dict):
        firmware = domain.setdefault("firmware", {})
        if isinstance(firmware, dict) and not firmware.get("uuid"):
            firmware["uuid"] = str(uuid.uuid5(FIRMWARE_UUID_NAMESPACE, name))
    annotations = {**(tmeta.get("annotations") or {}), ANN_VM_GENERATION: str(meta.get("generation", 1))}
    return {
        "apiVersion": f"{KUBEVIRT_GROUP}/{KUBEVIRT_VERSION}", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(tmeta.get("labels") or {}),
                     "annotations": annotations,
                     "ownerReferences": [{"apiVersion": f"{KUBEVIRT_GROUP}/{KUBEVIRT_VERSION}",
                                          "kind": "VirtualMachine", "name": name, "uid": str(meta.get("uid") or ""),
                                          "controller": True}]},
        "spec": spec,
    }


def _status_message(raw: bytes) -> str:
    """The `message` of a metav1.Status body (the apiserver's words for a refusal); "" when none."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return ""
    return str(doc.get("message") or "") if isinstance(doc, dict) else ""


class VmPreflightApi:
    """`core.ports.RestartPreflight` over the apiserver: read the VM live, dry-run create its next VMI."""

    def __init__(self, api: AnyClient, *, request_timeout: float = REQUEST_TIMEOUT) -> None:
        self._kube: KubeClient = as_kube(api)
        self._timeout = request_timeout

    async def admits(self, namespace: str, vm: str) -> Admission:
        try:
            status, raw = await self._call("GET", VM_PATH.format(namespace=quote(namespace, safe=""),
                                                                  name=quote(vm, safe="")))
            if status != 200:
                return Admission(False, f"reading the VirtualMachine: HTTP {status}", answered=False)
            body = vmi_for(json.loads(raw))
            status, raw = await self._call("POST", VMI_PATH.format(namespace=quote(namespace, safe="")), body=body,
                                           query=(("dryRun", "All"),))
        except (ApiException, aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            return Admission(False, f"dry-run create not answered: {type(e).__name__}", answered=False)
        return classify(status, _status_message(raw))

    async def _call(self, method: str, path: str, *, body: Any = None,
                    query: tuple[tuple[str, str], ...] = ()) -> tuple[int, bytes]:
        resp = await self._kube.request(method, path, body=body, query=query, request_timeout=self._timeout)
        try:
            return resp.status, await resp.read()
        finally:
            resp.release()


def classify(status: int | None, message: str) -> Admission:
    """An HTTP answer to the dry-run create, as an `Admission`.

    2xx: admitted. 409 AlreadyExists: admitted too -- the apiserver runs mutating and validating admission
    before it looks for the name in storage, and the running VMI holds the VM's name. Other 4xx (403 from a
    webhook or RBAC, 422 from a policy or validation, 400): refused, an answer. 408, 429 and 5xx (a webhook
    that could not be called with failurePolicy Fail says 500) and no status at all: unanswered. Either kind
    of refusal holds the restart: a VMI whose creation is not known to pass is never deleted for it."""
    if status is not None and 200 <= status < 300:
        return Admission(True)
    if status == Conflict.STATUS:
        return Admission(True, message)
    answered = status is not None and 400 <= status < 500 and status not in (408, TooManyRequests.STATUS)
    return Admission(False, bounded(message) or f"HTTP {status}", answered=answered)
