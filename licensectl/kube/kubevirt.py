"""KubeVirt actions: record restart intent on a VM, restart it, and the optional delete fallback.

Restart goes through virt-api's `virtualmachines/{name}/restart` subresource, which is what
`virtctl restart` calls (kubevirt staging/src/kubevirt.io/client-go/kubecli/vm.go, Restart).
The intent annotation is written first, guarded by the VM's resourceVersion, so a controller that
dies between the two calls finds the intent on restart and never restarts a VMI twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from licensectl import logs
from licensectl.core.ports import RestartResult
from licensectl.kube.api import AnyClient, CustomObjectsApi, OutcomeUnknown, absent_on_404, as_kube
from licensectl.kube.errors import ApiException, Conflict, NotFound
from licensectl.kube.raw import RawApi, checked

log = logs.get(__name__)

KUBEVIRT_GROUP = "kubevirt.io"
KUBEVIRT_VERSION = "v1"
RESTART_PATH = "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}/restart"


class KubevirtClient:
    def __init__(self, api_client: AnyClient, *, dry_run: bool = False, fallback_delete: bool = False) -> None:
        self._kube = as_kube(api_client)
        self._custom: Any = RawApi(CustomObjectsApi(api_client))  # raw bodies, _content_type: untyped in stubs
        self._dry_run = dry_run
        self._fallback_delete = fallback_delete

    async def annotate_vm(self, *, namespace: str, name: str, resource_version: str,
                          annotations: Mapping[str, str | None]) -> bool:
        """Merge-patch annotations guarded by resourceVersion; False when the VM changed or is gone."""
        if self._dry_run:
            return True
        body: dict[str, Any] = {"metadata": {"resourceVersion": resource_version,
                                             "annotations": dict(annotations)}}
        try:
            await self._custom.patch_namespaced_custom_object(
                KUBEVIRT_GROUP, KUBEVIRT_VERSION, namespace, "virtualmachines", name, body,
                _content_type="application/merge-patch+json")
            return True
        except (NotFound, Conflict):
            return False

    async def restart(self, *, namespace: str, vm: str, vmi_uid: str, run_strategy: str | None) -> RestartResult:
        """Restart through virt-api; `vmi_uid` guards only the delete fallback (the subresource has no
        UID precondition, so the caller reads `live_vmi_uid` first where the plan asks: `check_live`).

        Never replayed: a restart whose answer was lost is ERROR, and the next pass reads the cluster
        (the intent annotation names the VMI it was for) instead of stopping the VMI it may have created."""
        if self._dry_run:
            return RestartResult.ISSUED
        try:
            await checked(self._kube.request("PUT", RESTART_PATH.format(namespace=quote(namespace, safe=""),
                                                                        name=quote(vm, safe="")), body={},
                                             replayable=False))
            return RestartResult.ISSUED
        except OutcomeUnknown as e:
            log.warning("restart outcome unknown: the connection broke before virt-api answered",
                        namespace=namespace, vm=vm, error=str(e))
            return RestartResult.ERROR
        except NotFound:
            if await self._vm_exists(namespace, vm):
                # The VM is there but the subresource is not: a cluster without virt-api's restart.
                if self._fallback_delete and run_strategy == "Always":
                    return await self._delete_vmi(namespace, vm, vmi_uid)
                return RestartResult.UNSUPPORTED
            return RestartResult.NOT_FOUND
        except Conflict:
            return RestartResult.CONFLICT
        except ApiException as e:
            log.warning("restart failed", namespace=namespace, vm=vm, status=e.status)
            return RestartResult.ERROR

    async def live_vmi_uid(self, namespace: str, name: str) -> str | None:
        """UID of the VMI running now, read live (not from the watch cache); None when absent or terminating.

        The restart subresource has no UID precondition: virt-api stops whatever VMI runs *now*
        (kubevirt pkg/virt-api/rest/lifecycle.go, RestartVMRequestHandler, takes the current VMI's
        UID). The rollout compares this with the VMI its plan targeted, so a plan made from a lagging
        watch cache (e.g. a re-issue while the VMI watch was cut) never restarts the VMI that already
        replaced the target: a second restart."""
        vmi = await absent_on_404(self._custom.get_namespaced_custom_object(
            KUBEVIRT_GROUP, KUBEVIRT_VERSION, namespace, "virtualmachineinstances", name))
        if vmi is None:
            return None
        meta = vmi.get("metadata") or {}
        uid = meta.get("uid")
        return str(uid) if uid and not meta.get("deletionTimestamp") else None

    async def _vm_exists(self, namespace: str, vm: str) -> bool:
        found = await absent_on_404(self._custom.get_namespaced_custom_object(
            KUBEVIRT_GROUP, KUBEVIRT_VERSION, namespace, "virtualmachines", vm))
        return found is not None

    async def _delete_vmi(self, namespace: str, name: str, uid: str) -> RestartResult:
        """Delete exactly the VMI that was planned (uid precondition); its VM (Always) recreates it."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            await self._custom.delete_namespaced_custom_object(
                KUBEVIRT_GROUP, KUBEVIRT_VERSION, namespace, "virtualmachineinstances", name, body=body)
            return RestartResult.FALLBACK_DELETE
        except (NotFound, Conflict):
            return RestartResult.NOT_FOUND
