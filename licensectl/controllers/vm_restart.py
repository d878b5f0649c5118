"""The one way licensectl restarts a VM: only the VMI a decision was made about, never its successor.

Both the rollout and the worker drain restart VMs; both must re-read the running VMI first (the
restart call stops whatever VMI runs now, and the watch cache may lag) and say the same thing when
the cluster cannot restart at all, so they share this.
"""

from __future__ import annotations

from licensectl import logs
from licensectl.core.ports import EventSink, InvolvedObject, KubevirtApi, RestartResult
from licensectl.core.reasons import EventType, Reason
from licensectl.kube.api import ApiException

log = logs.get("licensectl.restart")

UNSUPPORTED_TEXT = ("The cluster has no virtualmachines/restart subresource and the delete fallback is off (or "
                    "the VM's runStrategy is not Always)")


def vm_object(namespace: str, name: str, uid: str = "") -> InvolvedObject:
    return InvolvedObject("kubevirt.io/v1", "VirtualMachine", namespace, name, uid)


def vmi_object(namespace: str, name: str, uid: str = "") -> InvolvedObject:
    return InvolvedObject("kubevirt.io/v1", "VirtualMachineInstance", namespace, name, uid)


async def restart_vmi(kubevirt: KubevirtApi, events: EventSink, *, namespace: str, vm: str, vmi_uid: str,
                      run_strategy: str | None, check_live: bool = True) -> RestartResult:
    """Restart `vm` only while VMI `vmi_uid` is the one running (read live unless `check_live` is off,
    which the caller may do only when nothing of ours can have replaced it since its guarded write)."""
    if vmi_uid and check_live:
        try:
            live = await kubevirt.live_vmi_uid(namespace, vm)
        except ApiException as e:
            log.warning("restart target check failed", namespace=namespace, vm=vm, status=e.status)
            return RestartResult.ERROR
        if live != vmi_uid:
            return RestartResult.STALE_TARGET
    res = await kubevirt.restart(namespace=namespace, vm=vm, vmi_uid=vmi_uid, run_strategy=run_strategy)
    if res is RestartResult.UNSUPPORTED:
        await events.emit(vm_object(namespace, vm), EventType.WARNING, Reason.RESTART_FAILED, UNSUPPORTED_TEXT)
    return res
