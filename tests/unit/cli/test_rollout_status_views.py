"""`rollout status` and `status -o json` over recorded answer shapes: only the leader with synced caches
(or the labelled offline view) decides; a standby or a starting replica is "unknown, keep waiting", and
every output form parses with one snake_case schema (docs/operations.md#json-output)."""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from licensectl.cli import status as status_mod
from licensectl.cli.status import RolloutSnapshot, _rollout_status, _with_rotations, rollout_verdict
from licensectl.cli.status_fetch import controller_view, status_from_controller
from licensectl.cli.status_offline import ClusterView, labelled_offline, status_json
from licensectl.cli.status_render import status_document, status_table
from licensectl.core.entitlement import TenantSettings
from licensectl.core.model import KEY_TOKEN
from licensectl.core.replication import ReplicationInputs, plan_replication
from licensectl.core.rollout import RolloutPlan
from licensectl.core.rollout.view import RolloutExit
from licensectl_dev.testkit.local_http import serve
from licensectl_dev.testkit.process import run_licensectl
from tests.unit.cli.test_status_client import CONTROLLER_DOC

SRC = "licensectl-system/vws-token"
ROTATION = {"phase": "promoting", "wave": 1, "wave_number": 2, "waves": 3, "stable": "111111111111",
            "candidate": "abcdefabcdef", "canary": ["tenant-a"], "evidence": True, "reason": "",
            "wave_started_at": None, "wave_progress": [2, 2]}


def doc_of(**change: Any) -> dict[str, Any]:
    doc = copy.deepcopy(CONTROLLER_DOC)
    doc.update(change)
    return doc


# What a replica that has just restarted serves: its loops have not planned yet.
UNSYNCED = doc_of(replication={"synced": False}, rollout={"synced": False}, rotation={})
# A standby plans without probing the webhook: it calls a running rollout paused for the webhook.
STANDBY = doc_of(leader=False, identity="licensectl-1", rollout={"synced": True, "sources": {SRC: {
    **CONTROLLER_DOC["rollout"]["sources"][SRC], "phase": "paused", "pause_reason": "webhook",
    "message": "paused: waiting for the admission webhook"}}})
# The leader between two waves: every restart of the wave done, the rotation still promoting.
PROMOTING = doc_of(rotation={SRC: {**ROTATION, "waveStartedAt": None}})
COMPLETE = doc_of(rotation={SRC: {**ROTATION, "phase": "promoted"}})


def snapshot(doc: dict[str, Any]) -> RolloutSnapshot:
    rollout = doc.get("rollout") or {}
    return RolloutSnapshot(_with_rotations(rollout.get("sources") or {}, doc.get("rotation") or {}),
                           list(rollout.get("vmis") or []), controller_view(doc), doc.get("identity"))


def camel_keys(x: Any) -> Iterator[str]:
    if isinstance(x, dict):
        for k, v in x.items():
            if re.search(r"[A-Z]", str(k)) and "/" not in str(k):
                yield str(k)
            yield from camel_keys(v)
    elif isinstance(x, list):
        for v in x:
            yield from camel_keys(v)


def test_the_view_says_who_answered() -> None:
    assert [controller_view(d) for d in (CONTROLLER_DOC, UNSYNCED, STANDBY)] == ["leader", "unsynced", "standby"]
    # A controller of an earlier release says nothing about sync: its leader's answer counts.
    assert controller_view({k: v for k, v in CONTROLLER_DOC.items() if k != "rollout"}) == "leader"


@pytest.mark.parametrize(("doc", "source", "watch", "code"), [
    (UNSYNCED, SRC, False, RolloutExit.UNKNOWN),  # never "no rollout found"
    (UNSYNCED, None, False, RolloutExit.UNKNOWN),  # never COMPLETE from an empty snapshot
    (UNSYNCED, SRC, True, None),
    (STANDBY, SRC, False, RolloutExit.UNKNOWN),  # never "paused"
    (STANDBY, None, True, None),
    (PROMOTING, SRC, False, RolloutExit.PROGRESSING),
    (PROMOTING, SRC, True, None),
    (COMPLETE, SRC, True, RolloutExit.COMPLETE),
    (COMPLETE, "licensectl-system/nope", True, RolloutExit.ERROR),
])
def test_only_an_authoritative_answer_decides(doc: dict[str, Any], source: str | None, watch: bool,
                                              code: RolloutExit | None) -> None:
    v = rollout_verdict(snapshot(doc), source, watch=watch)
    assert v.code == code
    assert (v.error is not None) == (code == RolloutExit.ERROR)


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], docs: list[dict[str, Any]],
        *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr(status_mod, "WATCH_INTERVAL", 0.0)
    answers = iter(docs)
    args = argparse.Namespace(source=None, watch=False, timeout=0.0, output="text", vms=False)
    it = iter(argv)
    for a in it:
        if a == "-w":
            args.watch = True
        elif a == "-o":
            args.output = next(it)
        elif a == "--vms":
            args.vms = True
        else:
            args.source = a

    async def next_snapshot() -> RolloutSnapshot:
        return snapshot(next(answers))

    import asyncio

    code = asyncio.run(_rollout_status(args, next_snapshot))
    out, err = capsys.readouterr()
    return code, out, err


def test_watch_waits_through_a_restart_and_a_standby_and_exits_once(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(monkeypatch, capsys, [UNSYNCED, STANDBY, PROMOTING, UNSYNCED, COMPLETE], "-w", SRC)
    assert code == RolloutExit.COMPLETE and err == ""
    lines = out.splitlines()
    assert lines[0] == "UNSYNCED: licensectl-0 is starting and has not read the cluster yet: unknown"
    assert lines[1].startswith("STANDBY: licensectl-1 answered, not the leader")
    assert "paused" in lines[2] and lines[3].startswith(f"{SRC} promoting wave 2/3")
    assert lines[-1].startswith(f"{SRC} complete")


def test_watch_json_is_one_document_per_line(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(monkeypatch, capsys, [UNSYNCED, STANDBY, PROMOTING, COMPLETE], "-w", "-o", "json", SRC)
    docs = [json.loads(line) for line in out.splitlines()]
    assert [d["view"] for d in docs] == ["unsynced", "standby", "leader", "leader"]
    assert [d["authoritative"] for d in docs] == [False, False, True, True]
    # Each line: the code that look alone exits with; only the last is final, and it is the process's.
    assert [d["exit_code"] for d in docs] == [6, 6, 3, code] and code == 0
    assert [d["final"] for d in docs] == [False, False, False, True]
    promoting = docs[2]["sources"][SRC]
    # Top-level phase agrees with the rotation's; the planner's own is kept apart.
    assert promoting["phase"] == promoting["rotation"]["phase"] == "promoting"
    assert promoting["rollout_phase"] == "complete"
    assert all(not list(camel_keys(d)) for d in docs)


@pytest.mark.parametrize(("docs", "argv", "code"), [
    ([PROMOTING], (), RolloutExit.PROGRESSING),
    ([UNSYNCED], (SRC,), RolloutExit.UNKNOWN),
    ([STANDBY], (), RolloutExit.UNKNOWN),
    ([COMPLETE], ("--vms",), RolloutExit.COMPLETE),
])
@pytest.mark.parametrize("output", ["text", "json", "yaml"])
def test_every_output_form_parses_and_says_the_exit_code(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], docs: list[dict[str, Any]],
        argv: tuple[str, ...], code: RolloutExit, output: str) -> None:
    got, out, err = run(monkeypatch, capsys, docs, "-o", output, *argv)
    assert got == code and "Traceback" not in err
    if output == "text":
        assert ("UNKNOWN" if code == RolloutExit.UNKNOWN else "") in out.upper()
        return
    doc = json.loads(out) if output == "json" else yaml.safe_load(out)
    assert doc["exit_code"] == got
    assert doc["authoritative"] == (code != RolloutExit.UNKNOWN)
    assert not list(camel_keys(doc))


def test_status_json_says_where_it_came_from_in_snake_case() -> None:
    for raw, view in ((CONTROLLER_DOC, "leader"), (UNSYNCED, "unsynced"), (STANDBY, "standby"),
                      (PROMOTING, "leader")):
        doc = status_document(status_from_controller(raw))
        json.loads(json.dumps(doc))
        assert doc["view"] == view and doc["authoritative"] == (view == "leader")
        assert not list(camel_keys(doc)), list(camel_keys(doc))
    doc = status_document(status_from_controller(PROMOTING))
    assert doc["rollouts"][SRC]["phase"] == doc["rotations"][SRC]["phase"] == "promoting"
    assert "UNSYNCED" in status_table(status_from_controller(UNSYNCED)).splitlines()[0]
    assert "STANDBY" in status_table(status_from_controller(STANDBY)).splitlines()[0]


async def test_the_real_command_waits_through_unsynced_and_standby_answers(tmp_path: Path) -> None:
    """`licensectl rollout status -w -o json --url` against a listener that answers as a restarting
    replica, then a standby, then the leader: JSON Lines, one exit, exit_code on the last line."""
    answers: list[dict[str, Any] | None] = []
    served: list[int] = []

    async def status(_: web.Request) -> web.Response:
        served.append(1)
        answer = answers[min(len(served), len(answers)) - 1]
        # None: the Service in front answers for a replica being replaced.
        return web.Response(status=502) if answer is None else web.json_response(answer)

    app = web.Application()
    app.router.add_get("/v1/status", status)
    async with serve(app) as url:
        answers[:] = [UNSYNCED]  # the replica has just restarted
        once = await run_licensectl("rollout", "status", "--url", url, SRC, kubeconfig=tmp_path / "none")
        assert once.code == RolloutExit.UNKNOWN and "no rollout found" not in once.err, once
        assert once.out.startswith("UNSYNCED: licensectl-0 is starting"), once.out
        served.clear()
        # The first look (is anyone there?) gets a 502 from the Service: -w asks again, it does not give up.
        answers[:] = [None, UNSYNCED, STANDBY, PROMOTING, COMPLETE]
        r = await run_licensectl("rollout", "status", "-w", "-o", "json", "--url", url, SRC,
                                 kubeconfig=tmp_path / "none")
    docs = [json.loads(line) for line in r.out.splitlines()]
    assert r.code == RolloutExit.COMPLETE, r
    assert [d["view"] for d in docs] == ["unsynced", "standby", "leader", "leader"]
    assert [d["exit_code"] for d in docs] == [6, 6, 3, 0] and [d["final"] for d in docs] == [False] * 3 + [True]


def test_status_json_has_one_set_of_keys_from_the_controller_and_offline() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rep = plan_replication(ReplicationInputs(
        namespaces={}, classes={}, claims=[], sources={}, replicas={}, conflicts=frozenset(),
        credential_for=lambda ns: "", report_url="http://r.invalid", token_key=KEY_TOKEN, tenant=TenantSettings(),
        now=now))
    view = ClusterView(replication=rep, rollout=RolloutPlan(actions=(), vmi_states={}, next_wakeup=None, sources={}),
                       sources={}, now=now)
    offline = labelled_offline(status_json(view, None), "--offline given")
    online = status_document(status_from_controller(CONTROLLER_DOC))
    assert set(status_document(offline)) == set(online)
    assert (online["partial"], online["offline_reason"], online["rotation_records_read"]) == (False, None, True)


# An aborted rotation whose rollback cannot finish: one worker restarted for the candidate whose Node never
# came back keeps the rollout progressing (blocked, down) on stable's revision.
DOWN = {"namespace": "tenant-a", "vmi": "worker-1", "source": SRC, "state": "blocked",
        "replica_revision": "222222222222", "overdue": False,
        "reason": "worker restarted, its Node not back Ready with a new boot ID (BootTimeout)"}
ABORTED = doc_of(rotation={SRC: {**ROTATION, "phase": "aborted", "reason": "canary: analysis deadline passed"}},
                 rollout={**CONTROLLER_DOC["rollout"], "sources": {SRC: {
                     **CONTROLLER_DOC["rollout"]["sources"][SRC], "phase": "progressing", "blocked": 1}},
                     "vmis": [*CONTROLLER_DOC["rollout"].get("vmis", []), DOWN]})


@pytest.mark.parametrize("output", ["text", "json"])
def test_an_aborted_rotation_that_cannot_roll_back_ends_watch_with_5_naming_the_vm(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], output: str) -> None:
    code, out, err = run(monkeypatch, capsys, [PROMOTING, STANDBY, ABORTED, PROMOTING], "-w", "-o", output, SRC)
    assert code == RolloutExit.ABORTED and err == ""
    if output == "text":
        last = [line for line in out.splitlines() if line.startswith(f"{SRC} aborted")]
        assert last and "1 VMI(s) not back on stable: tenant-a/worker-1 (blocked: worker restarted" in last[-1]
        return
    docs = [json.loads(line) for line in out.splitlines()]
    assert [(d["exit_code"], d["final"]) for d in docs] == [(3, False), (6, False), (5, True)]
    one = docs[-1]["sources"][SRC]
    assert one["phase"] == "aborted" and one["rollout_phase"] == "progressing"
    assert [(v["namespace"], v["vmi"], v["state"]) for v in one["not_on_stable"]] == [
        ("tenant-a", "worker-1", "blocked")]


def test_a_timeout_under_watch_ends_with_a_document_saying_2(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(status_mod, "WATCH_INTERVAL", 0.0)
    args = argparse.Namespace(source=SRC, watch=True, timeout=0.05, output="json", vms=False)

    async def promoting() -> RolloutSnapshot:
        return snapshot(PROMOTING)

    import asyncio

    code = asyncio.run(_rollout_status(args, promoting))
    docs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == RolloutExit.TIMEOUT and docs[0]["exit_code"] == 3
    assert (docs[-1]["exit_code"], docs[-1]["final"]) == (2, True)
