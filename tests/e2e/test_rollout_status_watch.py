"""`licensectl rollout status -w SRC -o json` tells the truth at every moment (docs/operations.md#rollout-status).

Two `licensectl run` processes (leader and standby) on the real apiserver and the KubeVirt simulator,
one fleet for four rotations in a row. For each, the leader is SIGKILLed, the hoster writes a new token
into the gap and starts the watcher, through a status Service that hands each request to any live
replica (so standbys and starting replicas answer too); once the watcher has printed the new leader's
view, the leader is SIGKILLed again. The watcher must exit exactly once, with the outcome's code:

1. complete (0): the candidate is promoted;
2. paused (4): `licensectl rollout pause` during the rotation;
3. undone (5): `licensectl rollout undo` during the rotation;
4. aborted (5): a VM whose new VMI never boots keeps the wave from passing until the analysis deadline;
   its rollback cannot finish either, yet the abort ends the watch, naming that VM.

From the second rotation on, that VM never boots again, so each rotation is still running when the
hoster acts. Every line parses, says who answered, and carries the code that look exits with (6 for a
standby or starting replica, 3 while in progress); only the last is final and its code is the
process's. `licensectl rollout history` then lists the four outcomes from what the cluster recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio.client import ApiClient, CustomObjectsApi

from licensectl.core.rotation import RotationPhase, content_revision
from licensectl_dev.devcluster.controlplane import LOOPBACK
from licensectl_dev.devcluster.vm_semantics import ANN_BOOT
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.process import run_licensectl
from licensectl_dev.testkit.proxy import ReverseProxy

from .support import Rig, controllers
from .test_rotation_kill import PODS, current_leader, read_record, start_pod

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]

# One step, no canary (no guests report here: the wave is judged on readiness); restarts wait a few
# seconds after each revision so the second kill lands while the rotation runs; a wave that cannot pass
# aborts after the deadline. The stuck VM's restart never times out within the test (a failed restart
# would pause its namespace, and this test is about the rotation's decisions).
SETTINGS: dict[str, Any] = {"canary": "0", "rollout_steps": "100%", "done_gate": "ready", "settle_seconds": 6,
                            "analysis_deadline_seconds": 45, "restart_timeout_seconds": 900}
WATCH_TIMEOUT = 240  # the watcher's own --timeout: a hang fails the test (exit 2), never blocks it


class StatusService(ReverseProxy):
    """The metrics Service in front of every replica's /v1/status: each request goes to the next live
    process in turn, as the apiserver's service proxy picks any ready endpoint (here `--url`, so the CLI
    asks once per look and takes what it gets: a standby's or a starting replica's answer too)."""

    def __init__(self, ctls: Sequence[ControllerProcess]) -> None:
        super().__init__(f"http://{LOOPBACK}", name="status-service")
        self.ctls = ctls
        self._turn = itertools.count()

    async def upstream_url(self, request: web.Request) -> str:
        alive = [c for c in self.ctls if c.alive()]
        if not alive:
            raise web.HTTPServiceUnavailable(text="no endpoints")
        c = alive[next(self._turn) % len(alive)]
        return f"http://{LOOPBACK}:{c.metrics_port}{request.raw_path}"

    async def respond(self, request: web.Request, up: aiohttp.ClientResponse) -> web.StreamResponse:
        return await self.buffered(up)


@dataclass
class Watch:
    """One `rollout status -w SRC -o json` process and every line it printed."""

    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    err: bytes = b""

    async def read(self) -> None:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        err = asyncio.create_task(self.proc.stderr.read())
        async for raw in self.proc.stdout:
            self.lines.append(raw.decode())
        self.err = await err

    def docs(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]


async def start_watch(src: str, url: str) -> tuple[Watch, asyncio.Task[None]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "licensectl", "rollout", "status", "-w", src, "-o", "json", "--url", url,
        "--timeout", str(WATCH_TIMEOUT), env=dict(os.environ),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    w = Watch(proc)
    return w, asyncio.create_task(w.read())


async def kill_leader(ctls: Sequence[ControllerProcess], then: Callable[[], Awaitable[None]] | None = None) -> None:
    """SIGKILL the leader; `then` runs at once, in the gap before the other process takes over; the
    killed one comes back as the standby (its container restarts)."""
    leader = await eventually(lambda: current_leader(ctls), timeout=30, interval=0.1, what="a leader")
    assert leader is not None
    await leader.kill()
    if then is not None:
        await then()
    new = await eventually(lambda: current_leader(ctls), timeout=30, interval=0.1, what="a new leader")
    assert new is not None and new is not leader
    await leader.start()
    await leader.wait_ready()


async def watch_rotation(rig: Rig, ctls: Sequence[ControllerProcess], url: str, n: int, written: list[bytes],
                         act: Callable[[], Awaitable[None]] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """Kill, write token `n` and start the watcher in the gap; kill again once it printed the leader's view
    of the new rotation; then `act` (the hoster); returns the watcher's exit code and its documents."""
    fl = rig.fleet
    src = f"{fl.source_ns}/{fl.source_name}"
    started: list[tuple[Watch, asyncio.Task[None]]] = []

    async def write_and_watch() -> None:
        written.append(await fl.rotate(n))
        started.append(await start_watch(src, url))

    await kill_leader(ctls, then=write_and_watch)
    watch, reading = started[0]
    cand = content_revision(written[-1], None)[:12]

    def leader_saw_it() -> bool:
        for d in watch.docs():
            rot = (d["sources"].get(src) or {}).get("rotation") or {}
            if d["authoritative"] and rot.get("candidate") == cand:
                return True
        return False

    try:
        try:
            await eventually(leader_saw_it, timeout=60, interval=0.2, what=f"the watcher saw the leader run token {n}")
        except AssertionError:
            raise AssertionError((watch.proc.returncode, watch.lines[-3:], watch.err[-2000:])) from None
        assert watch.proc.returncode is None, ("the rotation ended before the second kill", watch.lines)
        await kill_leader(ctls)
        if act is not None:
            await act()
        rc = await asyncio.wait_for(watch.proc.wait(), WATCH_TIMEOUT + 30)
        await reading
    finally:
        if watch.proc.returncode is None:
            watch.proc.kill()
            with contextlib.suppress(Exception):
                await watch.proc.wait()
        reading.cancel()
    assert b"Traceback" not in watch.err, watch.err.decode()
    return rc, watch.docs()


def assert_one_exit_every_line_true(rc: int, docs: list[dict[str, Any]], src: str) -> dict[str, Any]:
    """Every line parses (the caller parsed them), carries the code its look exits with, and only the last
    is final, with the process's exit code. Returns the last source document."""
    assert docs, "the watcher printed nothing"
    *before, last = docs
    assert last["final"] is True and last["exit_code"] == rc, (rc, last)
    assert last["authoritative"] and last["view"] == "leader", last
    for d in before:
        assert d["final"] is False, d
        # A standby or a starting replica: unknown (6); the leader: in progress (3). Never an end.
        assert d["exit_code"] == (3 if d["authoritative"] else 6), d
        assert d["view"] in ("leader", "standby", "unsynced"), d
    # The standby answered along the way (non-authoritative, marked so) and the watcher waited on.
    assert any(d["view"] == "standby" for d in before), [d["view"] for d in docs]
    one: dict[str, Any] = last["sources"][src]
    return one


async def test_rollout_status_watch_exits_once_with_the_outcome_through_leader_kills(
        api_client: ApiClient, rig: Rig) -> None:
    fl = rig.fleet
    src = f"{fl.source_ns}/{fl.source_name}"
    async with controllers() as started:
        ctls = [await start_pod(rig, started, PODS[0], **SETTINGS)]
        await ctls[0].wait_metric("licensectl_leader", 1)
        ctls.append(await start_pod(rig, started, PODS[1], **SETTINGS))
        vms = await fl.boot(per_tenant=2)
        await ctls[1].wait_metric("licensectl_ready", 1)
        written: list[bytes] = []
        service = StatusService(ctls)
        await service.start()
        try:
            url = f"http://{LOOPBACK}:{service.port}"

            # 1. complete: promoted, every VM restarted onto it.
            rc, docs = await watch_rotation(rig, ctls, url, 1, written)
            one = assert_one_exit_every_line_true(rc, docs, src)
            assert rc == 0 and one["phase"] == "complete" and one["rotation"]["phase"] == "promoted", one
            rec = await read_record(fl)
            assert rec is not None and rec.phase is RotationPhase.PROMOTED

            # From now on one VM's new VMI never boots: no rotation can pass its wave.
            stuck = vms[0]
            await CustomObjectsApi(api_client).patch_namespaced_custom_object(
                "kubevirt.io", "v1", stuck[0], "virtualmachines", stuck[1],
                {"spec": {"template": {"metadata": {"annotations": {ANN_BOOT: "hang"}}}}},
                _content_type="application/merge-patch+json")

            async def cli(*argv: str) -> None:
                r = await run_licensectl(*argv, src, kubeconfig=rig.kv.kubeconfig_path, env=fl.cli_env)
                assert r.code == 0, (argv, r)

            # 2. paused by the hoster mid-rotation: 4.
            rc, docs = await watch_rotation(rig, ctls, url, 2, written, act=lambda: cli("rollout", "pause"))
            one = assert_one_exit_every_line_true(rc, docs, src)
            assert rc == 4 and one["phase"] == "paused" and one["rotation"]["phase"] == "promoting", one
            await cli("rollout", "resume")

            # 3. undone by the hoster mid-rotation (the new token supersedes the paused one): 5.
            rc, docs = await watch_rotation(rig, ctls, url, 3, written, act=lambda: cli("rollout", "undo"))
            one = assert_one_exit_every_line_true(rc, docs, src)
            assert rc == 5 and one["rotation"]["phase"] == "undone", one

            # 4. aborted at the analysis deadline, the stuck VM unable to come back: 5, that VM named.
            rc, docs = await watch_rotation(rig, ctls, url, 4, written)
            one = assert_one_exit_every_line_true(rc, docs, src)
            assert rc == 5 and one["phase"] == "aborted" and one["rotation"]["phase"] == "aborted", one
            assert "analysis deadline passed" in one["rotation"]["reason"], one
            behind = {(v["namespace"], v["vmi"]): v["state"] for v in one["not_on_stable"]}
            assert stuck in behind and behind[stuck] not in ("current", "done"), behind
            rec = await read_record(fl)
            assert rec is not None and rec.phase is RotationPhase.ABORTED
            assert rec.candidate == content_revision(written[-1], None)
            assert not await fl.ready(*stuck)  # it really cannot come back

            # rollout history: the four outcomes, from what the leaders recorded through the kills.
            r = await run_licensectl("rollout", "history", src, "-o", "json", kubeconfig=rig.kv.kubeconfig_path,
                                     env=fl.cli_env)
            assert r.code == 0, r
            hist = json.loads(r.out)
            revs = [content_revision(t, None)[:12] for t in written]
            assert [(e["source_revision"], e["outcome"]) for e in hist["history"]] == list(zip(
                revs, ["promoted", "superseded", "undone", "aborted"], strict=True)), hist
            assert (hist["phase"], hist["stable"], hist["candidate"]) == ("aborted", revs[0], revs[3])
        finally:
            await service.stop()
