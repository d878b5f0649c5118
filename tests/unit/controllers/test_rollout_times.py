"""Rollout times: the duration histogram measures revision written -> rollout complete (not "since the
last progress"), and `rollout resume` stamps `resumed-at` on the apiserver's clock, not the
workstation's."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from licensectl.cli.actions import rollout_action_annotations, rollout_action_main
from licensectl.config import Settings
from licensectl.controllers.rollout_loop import rollout_started_at
from licensectl.core.model import ANN_ROLLOUT_PAUSED, ANN_ROLLOUT_RESUMED_AT, ObjectRef
from licensectl.core.rollout import Phase, ReplicaRevision
from licensectl.core.timecodec import parse_time
from licensectl_dev.testkit.local_http import serve
from tests.unit.controllers.test_rollout_loop import REV, SRC, World, replica
from tests.unit.kube.test_server_clock import SKEW, header, kubeconfig_for


def duration(w: World) -> tuple[float, float]:
    """(count, sum) of licensectl_rollout_duration_seconds."""
    reg = w.metrics.registry
    return (reg.get_sample_value("licensectl_rollout_duration_seconds_count") or 0.0,
            reg.get_sample_value("licensectl_rollout_duration_seconds_sum") or 0.0)


async def roll_to_completion(w: World, step: float) -> dt.datetime:
    """Reconcile, `step` seconds apart, until the rollout is complete; returns the completion time."""
    for _ in range(20):
        await w.loop.reconcile()
        if w.phase() is Phase.COMPLETE:
            return w.clock.now()
        w.clock.advance(step)
    raise AssertionError("rollout did not complete")


async def test_duration_runs_from_the_revision_time_to_completion() -> None:
    w = World([("tenant-a", "vm1"), ("tenant-b", "vm2"), ("tenant-c", "vm3")])
    w.clock.advance(40.0)  # noticed late: the rollout started 43 s after the revision was written
    completed = await roll_to_completion(w, step=7.0)
    count, total = duration(w)
    assert count == 1.0
    assert total == (completed - w.revision_time).total_seconds()
    # "Now minus the last progress" would be at most one step: the histogram must not measure that.
    assert total > 43.0 + 7.0
    for _ in range(3):  # complete stays complete: observed once per revision
        w.clock.advance(5.0)
        await w.loop.reconcile()
    assert duration(w) == (1.0, total)


async def test_a_new_leader_mid_rollout_still_measures_from_the_revision_time() -> None:
    w = World([("tenant-a", "vm1"), ("tenant-b", "vm2")])
    await w.loop.reconcile()
    w.clock.advance(30.0)
    w.loop = w.new_process()  # failover: the new process never saw the rollout start
    completed = await roll_to_completion(w, step=5.0)
    assert duration(w) == (1.0, (completed - w.revision_time).total_seconds())


def test_the_start_is_the_earliest_stamp_of_the_newest_revision() -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    other = ObjectRef("ns", "other")
    revs = [ReplicaRevision.from_secret(replica(ns, rev, t0 + dt.timedelta(seconds=s)))
            for ns, rev, s in (("a", "old", 0), ("b", "new", 12), ("c", "new", 10), ("d", "old", 1))]
    assert all(revs)
    parsed = [r for r in revs if r is not None]
    assert rollout_started_at(parsed, SRC) == ("new", t0 + dt.timedelta(seconds=10))
    assert rollout_started_at(parsed, other) is None
    assert REV != "new"


# -- rollout resume on the apiserver's clock --------------------------------------------------------
@contextlib.asynccontextmanager
async def apiserver_an_hour_ahead(patches: list[dict[str, Any]],
                                  events: list[dict[str, Any]]) -> AsyncIterator[str]:
    """/version, a paused source Secret, its PATCH and Events endpoints, every response dated SKEW
    ahead of this machine (GPUClasses and the revision store: 404, so only the Secret is judged)."""

    def dated(resp: web.StreamResponse) -> web.StreamResponse:
        resp.headers["Date"] = header(time.time() + SKEW)
        return resp

    async def version(_request: web.Request) -> web.StreamResponse:
        return dated(web.json_response({"major": "1", "minor": "35", "gitVersion": "v1.35.4"}))

    async def patch(request: web.Request) -> web.StreamResponse:
        patches.append(await request.json())
        return dated(web.json_response({"kind": "Secret", "apiVersion": "v1", "metadata": {
            "name": request.match_info["name"], "namespace": request.match_info["ns"]}}))

    app = web.Application()
    app.router.add_get("/version/", version)
    app.router.add_get("/version", version)
    async def paused_source(request: web.Request) -> web.StreamResponse:  # `resume` reads it first
        if request.match_info["name"] != "vws-token":
            return dated(web.json_response({"kind": "Status", "code": 404}, status=404))
        return dated(web.json_response({"kind": "Secret", "apiVersion": "v1", "metadata": {
            "name": "vws-token", "namespace": request.match_info["ns"], "resourceVersion": "7",
            "annotations": {ANN_ROLLOUT_PAUSED: "true"}}}))

    async def event(request: web.Request) -> web.StreamResponse:
        events.append(await request.json())
        return dated(web.json_response({}, status=201))

    app.router.add_patch("/api/v1/namespaces/{ns}/secrets/{name}", patch)
    app.router.add_get("/api/v1/namespaces/{ns}/secrets/{name}", paused_source)
    app.router.add_post("/api/v1/namespaces/{ns}/events", event)
    async with serve(app) as url:
        yield url


async def test_resume_stamps_the_apiserver_time_not_the_workstation_time(tmp_path: Path) -> None:
    patches: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    async with apiserver_an_hour_ahead(patches, events) as server:
        settings = Settings(kubeconfig=str(kubeconfig_for(server, tmp_path / "kc")))
        args = argparse.Namespace(rollout_command="resume", source="licensectl-system/vws-token")
        local = time.time()
        assert await rollout_action_main(args, settings) == 0
    assert len(patches) == 1 and len(events) == 1 and events[0]["reason"] == "RolloutResumeRequested"
    assert patches[0]["metadata"]["resourceVersion"] == "7"  # guarded by what it read
    ann = patches[0]["metadata"]["annotations"]
    assert ann[ANN_ROLLOUT_PAUSED] is None
    stamped = parse_time(ann[ANN_ROLLOUT_RESUMED_AT])
    assert stamped is not None
    # The Date header has whole seconds (the clock centres it): within 2 s of the server's time.
    assert abs(stamped.timestamp() - (local + SKEW)) < 2.0


def test_pause_sets_only_the_switch() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert rollout_action_annotations("pause", now) == {ANN_ROLLOUT_PAUSED: "true"}
    resumed = rollout_action_annotations("resume", now)
    assert resumed[ANN_ROLLOUT_PAUSED] is None and parse_time(resumed[ANN_ROLLOUT_RESUMED_AT] or "") == now
