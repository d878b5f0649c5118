"""Hoster actions that write to the cluster: `licensectl rollout pause|resume|retry|undo`, `keys rotate`.

Kept apart from `licensectl.cli.status` (which only reads) so that what can change a cluster is visible
from the module name alone. Each action is one small write; the controller reacts to it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from typing import Any

from licensectl import config
from licensectl.core.model import ANN_ROLLOUT_PAUSED, ANN_ROLLOUT_RESUMED_AT
from licensectl.core.rotation import ANN_RETRY_AT, ANN_UNDO_AT
from licensectl.core.timecodec import format_micro_time
from licensectl.kube.api import ApiException, CoreV1Api, VersionApi
from licensectl.kube.client import make_api_client, request_tracing
from licensectl.kube.raw import RawApi, checked
from licensectl.kube.server_clock import ServerClock
from licensectl.kube.signing_key import SECRET_NAME, SigningKeyStore


def rollout_action_annotations(verb: str, server_now: dt.datetime) -> dict[str, str | None]:
    """The annotation patch for `rollout pause|resume|retry|undo`; `server_now` must be the apiserver's time.

    The controller compares `resumed-at` with restart times it stamped on the apiserver's clock
    (docs/design.md), so a workstation clock that is off would reset or extend the failure budget.
    """
    if verb == "resume":
        return {ANN_ROLLOUT_PAUSED: None, ANN_ROLLOUT_RESUMED_AT: format_micro_time(server_now)}
    if verb == "retry":  # an aborted or undone candidate starts again from the canary
        return {ANN_RETRY_AT: format_micro_time(server_now)}
    if verb == "undo":  # every namespace back on the stable revision (docs/design.md#safe-rotation)
        return {ANN_UNDO_AT: format_micro_time(server_now)}
    return {ANN_ROLLOUT_PAUSED: "true"}


async def rollout_action_main(args: Any, settings: config.Settings) -> int:
    """Pause, resume, retry or undo the rollout of one source Secret by annotating it (`args.rollout_command`)."""
    verb, source = args.rollout_command, args.source
    ns, _, name = source.partition("/")
    if not ns or not name:
        print(f"licensectl rollout {verb}: SOURCE must be NAMESPACE/NAME", file=sys.stderr)
        return 2
    clock = ServerClock()
    api = await make_api_client(settings, trace_configs=[request_tracing(clock=clock)])
    try:
        raw = RawApi(CoreV1Api(api))
        try:
            # One cheap request first (GET /version, allowed to every authenticated user): its
            # response's Date header sets the clock; the Secret itself is never read.
            await checked(VersionApi(api).get_code(_preload_content=False))
            ann = rollout_action_annotations(verb, clock.now())
            await raw.patch_namespaced_secret(name, ns, {"metadata": {"annotations": ann}})
        except ApiException as e:
            print(f"licensectl rollout {verb}: {source}: HTTP {e.status} {e.reason}", file=sys.stderr)
            return 1
        done = {"pause": "paused", "resume": "resumed", "retry": "retried from the canary",
                "undo": "undone: every namespace returns to the stable revision"}[verb]
        print(f"rollout of {source} {done}")
        return 0
    finally:
        await api.close()


async def keys_rotate_main(args: Any, settings: config.Settings) -> int:
    """Rotate the report signing key. The controller rewrites every replica's credential (no
    revision change, so no VM restart); guests keep reporting with the previous credential until
    their next restart, accepted for LICENSECTL_KEY_GRACE_SECONDS."""
    if args.namespace:
        settings = dataclasses.replace(settings, namespace=args.namespace)
    api = await make_api_client(settings)
    try:
        store = SigningKeyStore(api, settings.namespace, grace=dt.timedelta(seconds=settings.key_grace_seconds))
        try:
            ring = await store.rotate()
        except (RuntimeError, ApiException, ValueError) as e:
            print(f"licensectl keys rotate: {e}", file=sys.stderr)
            return 1
        print(f"signing key rotated in {settings.namespace}/{SECRET_NAME} at {ring.rotated_at:%Y-%m-%dT%H:%M:%SZ}; "
              f"the previous key is accepted for {settings.key_grace_seconds:g} s")
        return 0
    finally:
        await api.close()
