"""`licensectl rollout retry-worker|skip-worker NAMESPACE/VM`: the hoster's ways out of a worker in BootTimeout.

A worker licensectl restarted whose Node did not come back holds its cluster's disruption budget until the
Node is Ready with a new boot ID (docs/design.md#tenant-worker-drain). `retry-worker` (its cause fixed) asks the
drain to restart it once more with a fresh boot window; `skip-worker` gives it up: closed for its revision
(`Skipped`), no longer counted as down (its Node, while not Ready, counts as any such Node). Each reads the VM,
refuses unless its drain record says BootTimeout (and no such request is pending), then writes
`licensectl.io/drain-retry-at` or `drain-skip-at` (the apiserver's time) guarded by the resourceVersion it
read, and one Event on the VM. The controller acts on it (core/drain.py), once, whichever replica leads.
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


# verb -> (annotation, Event reason, what is done, Event message)
VERBS = {
    "retry-worker": (drain.ANN_DRAIN_RETRY_AT, Reason.WORKER_RETRY_REQUESTED,
                     "licensectl restarts it once more and waits for its Node again",
                     "The hoster asked to retry this worker after BootTimeout (licensectl rollout retry-worker)"),
    "skip-worker": (drain.ANN_DRAIN_SKIP_AT, Reason.WORKER_SKIP_REQUESTED,
                    "licensectl no longer counts it as down and does not restart it for this revision",
                    "The hoster gave this worker up after BootTimeout (licensectl rollout skip-worker)"),
}


def refusal(verb: str, worker: str, annotations: dict[str, str]) -> str | None:
    """Why `verb` cannot be done to `worker` now (None: it can)."""
    intent = drain.parse_annotations(annotations)
    if not isinstance(intent, drain.DrainIntent) or not intent.down:
        return (f"{worker} is not a tenant worker down after its restart (drain reason "
                f"{drain.BlockReason.BOOT_TIMEOUT.value}): nothing to {verb.removesuffix('-worker')}")
    if intent.retry_requested or intent.skip_requested:
        return f"a retry or skip of {worker} is already pending"
    return None


async def worker_action_main(args: Any, settings: config.Settings) -> int:
    verb, worker = args.rollout_command, args.worker
    annotation, reason, outcome, message = VERBS[verb]
    ns, _, name = worker.partition("/")
    if not ns or not name or "/" in name:
        print(f"licensectl rollout {verb}: WORKER must be NAMESPACE/VM", file=sys.stderr)
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
        why = refusal(verb, worker, meta.get("annotations") or {})
        if why is not None:
            raise CliError(why)
        now = clock.now()
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                              "annotations": {annotation: format_micro_time(now)}}}
        try:
            await custom.patch_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachines", name, patch,
                                                        _content_type="application/merge-patch+json")
        except Conflict:
            raise CliError(f"VirtualMachine {worker} changed while this command read it; run it again") from None
        except ApiException as e:
            raise CliError(api_error(e, f"patching VirtualMachine {worker}")) from None
        print(f"{verb.removesuffix('-worker')} of worker {worker} requested: {outcome}")
        obj = InvolvedObject("kubevirt.io/v1", "VirtualMachine", ns, name, str(meta.get("uid") or ""))
        ts = format_time(now)
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": event_name(obj, reason, f"{message}@{ts}"), "namespace": ns},
                "involvedObject": obj.as_dict(), "type": EventType.NORMAL.value,
                "reason": reason.value, "message": message,
                "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
                "reportingInstance": COMPONENT, "firstTimestamp": ts, "lastTimestamp": ts, "count": 1}
        try:
            await RawApi(CoreV1Api(api)).create_namespaced_event(ns, body)
        except ApiException as e:
            print(f"licensectl rollout {verb}: the annotation is written, but its Event on {worker} is not: "
                  f"{api_error(e)}", file=sys.stderr)
        return 0
    finally:
        await api.close()
