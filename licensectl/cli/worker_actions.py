"""`licensectl rollout retry-worker NAMESPACE/VM`: the hoster's way out of a tenant worker in BootTimeout.

A worker licensectl restarted whose Node did not come back holds its cluster's disruption budget until the
Node is Ready with a new boot ID (docs/design.md#tenant-worker-drain). Once the hoster has fixed what kept it
down, this asks the drain to restart it once more with a fresh boot window: it reads the VM, refuses unless
its drain record says BootTimeout (and no retry is pending), then writes `licensectl.io/drain-retry-at` (the
apiserver's time) guarded by the resourceVersion it read, and one Event on the VM. The controller acts on it
(core/drain.py), once, whichever replica leads.
"""

from __future__ import annotations

import sys
from typing import Any

from licensectl import config
from licensectl.cli.errors import CliError, api_error
from licensectl.core import drain
from licensectl.core.ports import InvolvedObject
from licensectl.core.reasons import EventType, Reason
from licensectl.core.timecodec import format_micro_time, format_time
from licensectl.kube.api import ApiException, CoreV1Api, CustomObjectsApi, VersionApi
from licensectl.kube.client import make_api_client, request_tracing
from licensectl.kube.errors import Conflict, NotFound
from licensectl.kube.events import event_name
from licensectl.kube.raw import RawApi, checked
from licensectl.kube.server_clock import ServerClock

COMPONENT = "licensectl-cli"


def refusal(worker: str, annotations: dict[str, str]) -> str | None:
    """Why `worker` cannot be retried now (None: it can)."""
    intent = drain.parse_annotations(annotations)
    if not isinstance(intent, drain.DrainIntent) or not intent.down:
        return (f"{worker} is not a tenant worker down after its restart (drain reason "
                f"{drain.BlockReason.BOOT_TIMEOUT.value}): nothing to retry")
    if intent.retry_requested:
        return f"a retry of {worker} is already pending"
    return None


async def retry_worker_main(args: Any, settings: config.Settings) -> int:
    worker = args.worker
    ns, _, name = worker.partition("/")
    if not ns or not name or "/" in name:
        print("licensectl rollout retry-worker: WORKER must be NAMESPACE/VM", file=sys.stderr)
        return 2
    clock = ServerClock()
    api = await make_api_client(settings, trace_configs=[request_tracing(clock=clock)])
    try:
        custom: Any = RawApi(CustomObjectsApi(api))
        await checked(VersionApi(api).get_code(_preload_content=False))  # the Date header sets the clock
        try:
            vm = await custom.get_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachines", name)
        except NotFound:
            raise CliError(f"VirtualMachine {worker} not found") from None
        except ApiException as e:
            raise CliError(api_error(e, f"reading VirtualMachine {worker}")) from None
        meta = vm.get("metadata") or {}
        why = refusal(worker, meta.get("annotations") or {})
        if why is not None:
            raise CliError(why)
        now = clock.now()
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                              "annotations": {drain.ANN_DRAIN_RETRY_AT: format_micro_time(now)}}}
        try:
            await custom.patch_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachines", name, patch,
                                                        _content_type="application/merge-patch+json")
        except Conflict:
            raise CliError(f"VirtualMachine {worker} changed while this command read it; run it again") from None
        except ApiException as e:
            raise CliError(api_error(e, f"patching VirtualMachine {worker}")) from None
        print(f"retry of worker {worker} requested: licensectl restarts it once more and waits for its Node again")
        obj = InvolvedObject("kubevirt.io/v1", "VirtualMachine", ns, name, str(meta.get("uid") or ""))
        message = "The hoster asked to retry this worker after BootTimeout (licensectl rollout retry-worker)"
        ts = format_time(now)
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": event_name(obj, Reason.WORKER_RETRY_REQUESTED, f"{message}@{ts}"),
                             "namespace": ns},
                "involvedObject": obj.as_dict(), "type": EventType.NORMAL.value,
                "reason": Reason.WORKER_RETRY_REQUESTED.value, "message": message,
                "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
                "reportingInstance": COMPONENT, "firstTimestamp": ts, "lastTimestamp": ts, "count": 1}
        try:
            await RawApi(CoreV1Api(api)).create_namespaced_event(ns, body)
        except ApiException as e:
            print(f"licensectl rollout retry-worker: the annotation is written, but its Event on {worker} is not: "
                  f"{api_error(e)}", file=sys.stderr)
        return 0
    finally:
        await api.close()
