"""Hoster actions that write to the cluster: `licensectl rollout pause|resume|retry|undo` (`keys rotate`: keys.py).

Kept apart from `licensectl.cli.status` (which only reads) so that what can change a cluster is visible
from the module name alone. Each action reads first (the Secret it was pointed at, the GPUClasses that
name it, the source's rotation record), refuses what makes no sense like kubectl does
(core/rollout/actions.py), then makes one annotation patch guarded by the resourceVersion it read and
writes one Event on the source Secret. The controller reacts to the annotation.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from typing import Any

from licensectl import config
from licensectl.cli.errors import CliError, api_error
from licensectl.core.model import ObjectRef
from licensectl.core.ports import InvolvedObject
from licensectl.core.rollout import actions as ra
from licensectl.core.rotation import RotationRecord
from licensectl.core.timecodec import format_time
from licensectl.kube import contract
from licensectl.kube import revision_store as rs
from licensectl.kube.api import AnyClient, ApiException, CoreV1Api, CustomObjectsApi, VersionApi
from licensectl.kube.client import make_api_client, request_tracing
from licensectl.kube.errors import Conflict, Forbidden, NotFound
from licensectl.kube.events import event_name
from licensectl.kube.raw import RawApi, checked
from licensectl.kube.server_clock import ServerClock

COMPONENT = "licensectl-cli"


def rollout_action_annotations(verb: str, server_now: dt.datetime) -> dict[str, str | None]:
    """The annotation patch for `rollout pause|resume|retry|undo` (core/rollout/actions.py)."""
    return ra.patch_annotations(ra.Verb(verb), server_now)


async def _is_class_source(api: AnyClient, settings: config.Settings, ref: ObjectRef) -> bool | None:
    """Whether a GPUClass names `ref` as its license source; None when the classes cannot be listed
    (no permission, or no GPUClass API here): then only the Secret's own marks are checked."""
    from licensectl.cli.status_offline import list_all
    from licensectl.kube import projections

    try:
        classes = await list_all(contract.gpu_class_lister(CustomObjectsApi(api), settings),
                                 projections.gpu_class_from)
    except (Forbidden, NotFound):
        return None
    return any(c.secret_ref == ref for c in classes)


async def _record(raw: RawApi, settings: config.Settings, ref: ObjectRef) -> RotationRecord | None:
    """The source's rotation record from its revision store in licensectl's namespace; None if none."""
    try:
        store = await raw.read_namespaced_secret(rs.store_name(ref), settings.namespace)
    except NotFound:
        return None
    except ApiException as e:
        raise CliError(api_error(e, f"reading the revision store of {ref} in {settings.namespace}")) from None
    return RotationRecord.from_annotations((store.get("metadata") or {}).get("annotations") or {})


def _event_body(secret: dict[str, Any], verb: ra.Verb, record: RotationRecord | None,
                now: dt.datetime) -> dict[str, Any]:
    meta = secret.get("metadata") or {}
    obj = InvolvedObject("v1", "Secret", meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", ""))
    type_, reason, message = ra.event(verb, record)
    ts = format_time(now)
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name(obj, reason, f"{message}@{ts}"), "namespace": obj.namespace},
        "involvedObject": obj.as_dict(), "type": type_, "reason": reason.value, "message": message,
        "source": {"component": COMPONENT}, "reportingComponent": COMPONENT, "reportingInstance": COMPONENT,
        "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
    }


async def rollout_action_main(args: Any, settings: config.Settings) -> int:
    """Pause, resume, retry or undo the rollout of one source Secret (`args.rollout_command`)."""
    verb, source = ra.Verb(args.rollout_command), args.source
    ns, _, name = source.partition("/")
    if not ns or not name or "/" in name:
        print(f"licensectl rollout {verb}: SOURCE must be NAMESPACE/NAME", file=sys.stderr)
        return 2
    if getattr(args, "namespace", None):
        settings = dataclasses.replace(settings, namespace=args.namespace)
    ref = ObjectRef(ns, name)
    clock = ServerClock()
    api = await make_api_client(settings, trace_configs=[request_tracing(clock=clock)])
    try:
        raw = RawApi(CoreV1Api(api))
        # One cheap request first (GET /version, allowed to every authenticated user): its response's
        # Date header sets the clock the annotations are stamped with.
        await checked(VersionApi(api).get_code(_preload_content=False))
        try:
            secret = await raw.read_namespaced_secret(name, ns)
        except NotFound:
            raise CliError(f"Secret {source} not found") from None
        except ApiException as e:
            raise CliError(api_error(e, f"reading Secret {source}")) from None
        meta = secret.get("metadata") or {}
        target = ra.Target(ref=ref, labels=meta.get("labels") or {}, annotations=meta.get("annotations") or {},
                           is_class_source=await _is_class_source(api, settings, ref),
                           record=await _record(raw, settings, ref))
        why = ra.refusal(verb, target)
        if why is not None:
            raise CliError(why)
        now = clock.now()
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                              "annotations": ra.patch_annotations(verb, now)}}
        try:
            await raw.patch_namespaced_secret(name, ns, patch)
        except Conflict:
            raise CliError(f"Secret {source} changed while this command read it; run it again") from None
        except ApiException as e:
            raise CliError(api_error(e, f"patching Secret {source}")) from None
        print(ra.done_text(verb, source, target.record))
        try:
            await raw.create_namespaced_event(ns, _event_body(secret, verb, target.record, now))
        except ApiException as e:
            print(f"licensectl rollout {verb}: the annotation is written, but its Event on {source} is not: "
                  f"{api_error(e)}", file=sys.stderr)
        return 0
    finally:
        await api.close()
