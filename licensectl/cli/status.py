"""`licensectl status` and `licensectl rollout status`: read-only views of what the controller decided.

The source of truth is the running controller's own `GET /v1/status`: it holds the deployed settings,
the guest reports and the rollout's guest evidence, none of which a workstation can reconstruct. The
CLI reaches it through the Kubernetes API service proxy (`services/proxy` on the metrics Service in
licensectl's namespace; the caller needs `get` on `services/proxy` there) or a direct `--url` (e.g. a
`kubectl port-forward`). The apiserver picks a random ready endpoint per proxied request, so with
two replicas the CLI asks again until the leader answers (only it holds guest states).

Only when the controller cannot be reached does the CLI recompute the state offline (one paged
LIST per resource, the same pure planners and the same rotation records from the revision stores, but
this workstation's settings and no guest states), and it says plainly that this is a partial view and
how to reach the controller. The commands that write live in `licensectl.cli.actions` and
`licensectl.cli.keys`.

This module is the two commands; the jobs they share are modules of their own: reaching the
controller (`status_fetch`), the offline recomputation (`status_offline`) and the text (`status_render`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from licensectl import config
from licensectl.cli.errors import api_error
from licensectl.cli.status_fetch import (
    DECISIVE_VIEWS,
    VIEW_LEADER,
    VIEW_OFFLINE,
    ControllerUnreachable,
    controller_view,
    fetch_controller_status,
    snake_rotation,
    status_from_controller,
    target_from,
    view_marker,
)
from licensectl.cli.status_offline import (
    WatchedCluster,
    labelled_offline,
    offline_rotations,
    offline_source_revision,
    read_cluster,
    status_json,
)
from licensectl.cli.status_render import (
    attention_vmis,
    offline_note,
    rollout_document,
    status_document,
    status_table,
    vms_table,
)
from licensectl.core.rollout.view import (
    RolloutExit,
    not_on_stable,
    progress_line,
    rollout_exit,
    rollout_json,
    vmis_json,
)
from licensectl.kube.api import ApiException
from licensectl.kube.client import make_api_client, request_tracing
from licensectl.kube.errors import Forbidden
from licensectl.kube.server_clock import ServerClock

# `rollout status --watch` polls one small document (or an in-memory watch cache) this often.
WATCH_INTERVAL = 1.0


async def status_main(args: Any, settings: config.Settings) -> int:
    target = target_from(args, settings)
    direct = bool(target.url)
    clock = ServerClock()
    api = None if direct and not args.offline else await make_api_client(
        settings, trace_configs=[request_tracing(clock=clock)])
    try:
        doc: dict[str, Any] | None = None
        reason = "--offline given"
        if not args.offline:
            try:
                doc = status_from_controller(await fetch_controller_status(api, target))
            except ControllerUnreachable as e:
                reason = str(e)
                if direct:
                    print(f"licensectl status: {reason}", file=sys.stderr)
                    return 1
        if doc is None:
            assert api is not None
            try:
                doc = labelled_offline(status_json(await read_cluster(api, settings, now=clock.now()), None),
                                       reason)
            except ApiException as e:
                why = api_error(e) if isinstance(e, Forbidden) else f"HTTP {e.status} {e.reason}"
                print("licensectl status: " + (f"the offline recomputation failed: {why}" if args.offline else
                      f"controller unreachable ({reason}), and the offline recomputation failed too: {why}"),
                      file=sys.stderr)
                return 1
    finally:
        if api is not None:
            await api.close()
    sys.stdout.write(json.dumps(status_document(doc), indent=2) + "\n" if args.output == "json"
                     else status_table(doc))
    return 0


@dataclass
class RolloutSnapshot:
    """One look at the selected sources: per source the rollout with its `rotation`, and the VMIs;
    `view` says who answered (status_fetch.VIEW_*): only a decisive one ends `rollout status`."""

    rollouts: dict[str, Any]
    vmis: list[dict[str, Any]]
    view: str = VIEW_LEADER
    identity: str | None = None


def _with_rotations(rollouts: Mapping[str, Any], rotations: Mapping[str, Any]) -> dict[str, Any]:
    return {src: {**r, "rotation": snake_rotation(rotations.get(src))} for src, r in rollouts.items()}


def _with_rollback(src: str, r: Mapping[str, Any], vmis: list[dict[str, Any]]) -> dict[str, Any]:
    """An aborted or undone rotation's source with the VMIs not back on stable named (`not_on_stable`):
    its exit does not wait for them, so the output says who is still behind."""
    if str((r.get("rotation") or {}).get("phase") or "") not in ("aborted", "undone"):
        return dict(r)
    return {**r, "not_on_stable": not_on_stable(vmis, src)}


@dataclass(frozen=True)
class Verdict:
    """What one snapshot says for `rollout status` (pure, `rollout_verdict`): the selected sources,
    the exit code it ends with (None: go on watching) and an error line (exit 1)."""

    found: dict[str, Any]
    code: RolloutExit | None
    error: str | None = None
    # Whether the command exits with `code`; a -w line before the last carries the code that look
    # alone would exit with (3 in progress, 6 unknown) and final False.
    final: bool = True


def rollout_verdict(snap: RolloutSnapshot, source: str | None, *, watch: bool) -> Verdict:
    """A standby's or a starting replica's answer is unknown: never "no rollout found", never final;
    without --watch it ends with UNKNOWN. Otherwise the rollout's own exit (kubectl-like), and
    PROGRESSING without --watch while it goes on."""
    found = {src: _with_rollback(src, r, snap.vmis) for src, r in snap.rollouts.items() if not source or src == source}
    if snap.view not in DECISIVE_VIEWS:
        return Verdict(found, None if watch else RolloutExit.UNKNOWN)
    if source and not found:
        return Verdict(found, RolloutExit.ERROR, f"no rollout found for source {source} (no GPUClass names it, "
                                                 f"or it licenses no VMI)")
    code = rollout_exit(found)
    if code is None and not watch:
        code = RolloutExit.PROGRESSING
    return Verdict(found, code)


async def rollout_status_main(args: Any, settings: config.Settings) -> int:
    target = target_from(args, settings)
    clock = ServerClock()
    api = None if target.url else await make_api_client(settings, trace_configs=[request_tracing(clock=clock)])
    watched: WatchedCluster | None = None
    try:
        reason = "--offline given" if args.offline else ""
        controller = not args.offline
        if controller:
            try:
                await fetch_controller_status(api, target)
            except ControllerUnreachable as e:
                # With --watch, a --url that answers with an error status (a Service or proxy whose replica is
                # being replaced) is asked again like any later look; nothing listening is an error.
                if target.url and not (args.watch and e.http_status is not None):
                    print(f"licensectl rollout status: {e}", file=sys.stderr)
                    return RolloutExit.ERROR
                if not target.url:
                    controller, reason = False, str(e)
        if not controller:
            assert api is not None
            print(offline_note(reason), file=sys.stderr)
            if args.watch:
                watched = WatchedCluster(api, settings, clock.now)
                await watched.start()

        async def snapshot() -> RolloutSnapshot:
            if controller:  # the controller's own view, including guest evidence for the done gate
                doc = await fetch_controller_status(api, target)
                rollout = doc.get("rollout") or {}
                return RolloutSnapshot(_with_rotations(rollout.get("sources") or {}, doc.get("rotation") or {}),
                                       list(rollout.get("vmis") or []), controller_view(doc), doc.get("identity"))
            if watched is not None:
                got = watched.rollouts()
                rotations = offline_rotations(watched.records(), settings)
                return RolloutSnapshot(_with_rotations(got, rotations),
                                       vmis_json(watched.plan) if watched.plan else [], VIEW_OFFLINE)
            assert api is not None
            view = await read_cluster(api, settings, now=clock.now())
            return RolloutSnapshot(_with_rotations(
                {str(ref): rollout_json(st, offline_source_revision((view.records or {}).get(ref)))
                 for ref, st in view.rollout.sources.items()}, offline_rotations(view.records, settings)),
                vmis_json(view.rollout), VIEW_OFFLINE)

        return await _rollout_status(args, snapshot)
    finally:
        if watched is not None:
            await watched.stop()
        if api is not None:
            await api.close()


async def _rollout_status(args: Any, snapshot: Callable[[], Awaitable[RolloutSnapshot]]) -> int:
    output = getattr(args, "output", "text")
    tty = sys.stdout.isatty() and output == "text"
    deadline = time.monotonic() + args.timeout if args.timeout else None
    last = ""
    shown: tuple[RolloutSnapshot, Verdict, list[Mapping[str, Any]] | None] | None = None
    while True:
        snap: RolloutSnapshot | None
        try:
            snap = await snapshot()
        except (ControllerUnreachable, aiohttp.ClientError, TimeoutError) as e:
            # e.g. the leader is being replaced: try again next tick
            print(f"controller unreachable: {e}", file=sys.stderr)
            snap = None
        if snap is not None:
            verdict = rollout_verdict(snap, args.source, watch=args.watch)
            if verdict.error is not None:
                print(f"licensectl rollout status: {verdict.error}", file=sys.stderr)
                return RolloutExit.ERROR
            vmis = attention_vmis(snap.vmis, set(verdict.found)) if args.vms else None
            if verdict.code is None:  # -w goes on: the line says what this look alone would exit with
                verdict = dataclasses.replace(verdict, code=rollout_verdict(snap, args.source, watch=False).code,
                                              final=False)
            shown = (snap, verdict, vmis)
            text = rollout_text(snap, verdict, vmis, output=output, tty=tty, watch=args.watch)
            if text != last:
                print(("\r" if tty and "\n" not in text else "") + text, flush=True)
                last = text
            if verdict.final and verdict.code is not None:
                if output == "text" and snap.view in DECISIVE_VIEWS:
                    for src, r in sorted(verdict.found.items()):
                        if r["message"]:
                            print(f"{src}: {r['message']}")
                return verdict.code
        if not args.watch:
            return RolloutExit.ERROR
        if deadline is not None and time.monotonic() > deadline:
            print("licensectl rollout status: timed out waiting for the rollout", file=sys.stderr)
            if shown is not None and output != "text":  # the last document carries the exit code too
                snap, verdict, vmis = shown
                print(rollout_text(snap, dataclasses.replace(verdict, code=RolloutExit.TIMEOUT, final=True), vmis,
                                   output=output, tty=tty, watch=args.watch), flush=True)
            return RolloutExit.TIMEOUT
        await asyncio.sleep(WATCH_INTERVAL)


def rollout_text(snap: RolloutSnapshot, verdict: Verdict, vmis: list[Mapping[str, Any]] | None, *,
                 output: str, tty: bool, watch: bool) -> str:
    """One look as printed (pure): progress lines under a STANDBY/UNSYNCED marker when the answer is
    not authoritative; `-o json` one document, on one line with --watch (JSON Lines); `-o yaml` one
    document of a YAML stream."""
    if output == "text":
        marker = view_marker(snap.view, snap.identity)
        lines = [marker] if marker else []
        lines += [progress_line(src, r, tty) for src, r in sorted(verdict.found.items())]
        text = "\n".join(lines)
        return text + "\n" + vms_table(vmis) if vmis is not None else text
    assert verdict.code is not None  # _rollout_status gives every printed look its code
    doc = rollout_document(verdict.found, vmis, verdict.code, view=snap.view, final=verdict.final)
    if output == "yaml":
        import yaml

        return "---\n" + yaml.safe_dump(doc, sort_keys=False).rstrip("\n")
    return json.dumps(doc) if watch else json.dumps(doc, indent=2)
