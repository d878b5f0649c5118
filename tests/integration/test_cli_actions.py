"""`licensectl rollout pause|resume|retry|undo` and `status` against the real apiserver and a running controller.

Issue acceptance (docs/operations.md#cli-exit-codes): each misuse is refused with its exact message and
exit 1 and writes nothing; each action that makes sense writes its annotation and exactly one Event;
`status` offline and from the controller agree on a fleet in mid-rotation (the offline view says it is
partial); `rollout status` exits 4 on a paused canary, prints `-o json|yaml` and `--vms`; and no
output surface (CLI text and JSON, the run's Event messages, /metrics labels) shows an unlabelled hash.
A real `python -m licensectl` process each time; the controller runs in-process (`--url` reaches it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio.client import ApiClient, CoreV1Api

from licensectl.app import App
from licensectl.core.model import ANN_ROLLOUT_PAUSED, ObjectRef
from licensectl.core.rotation import ANN_RETRY_AT, ANN_UNDO_AT, RotationPhase, RotationRecord
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.controlplane import ControlPlane, render_kubeconfig
from licensectl_dev.testkit.process import run_licensectl
from licensectl_dev.testkit.revision_grep import json_unlabeled, metrics_unlabeled, text_unlabeled, yaml_unlabeled
from licensectl_dev.testkit.world import World

from ..conftest import KubevirtEnv
from .support import events_for, eventually, make_world, running_app, settings_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

CANARY, STEPS = "1", "50%,100%"


@dataclass
class Rig:
    w: World
    kv: KubevirtEnv
    app: App
    outputs: list[tuple[str, str]]  # (kind, text) of every CLI output, for the unlabelled-hash grep

    @property
    def src(self) -> str:
        return "/".join(self.w.source)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.app.metrics_port}"

    async def cli(self, *argv: str, kind: str = "text", kubeconfig: Path | None = None) -> tuple[int, str, str]:
        # The workstation's settings match the deployed ones, so the offline view can agree.
        env = {**self.w.cli_env, "LICENSECTL_CANARY": CANARY, "LICENSECTL_ROLLOUT_STEPS": STEPS,
               "LICENSECTL_SETTLE_SECONDS": "0", "LICENSECTL_DONE_GATE": "ready"}
        r = await run_licensectl(*argv, kubeconfig=kubeconfig or self.kv.kubeconfig_path, env=env)
        self.outputs += [(kind, r.out), ("text", r.err)]
        return r.code, r.out, r.err

    def record(self) -> RotationRecord | None:
        store = self.app.rotation.stores().get(ObjectRef(*self.w.source))
        return None if store is None else RotationRecord.from_annotations(store.annotations)

    async def phase(self, want: RotationPhase) -> RotationRecord:
        async def reached() -> RotationRecord | None:
            rec = self.record()
            return rec if rec is not None and rec.phase is want else None
        return await eventually(reached, timeout=60, interval=0.2, what=f"rotation {want}")

    async def source_annotations(self) -> dict[str, str]:
        s = await CoreV1Api(self.w.api).read_namespaced_secret(self.w.source_name, self.w.source_ns)
        return dict(s.metadata.annotations or {})

    async def reasons(self) -> list[str]:
        return [e.reason for e in await events_for(self.w.api, self.w.source_ns, self.w.source_name)]


@pytest.fixture
async def rig(api_client: ApiClient, kubevirt: KubevirtEnv, namespace_factory: Any,
              cleanup: Any) -> AsyncIterator[Rig]:
    w = await make_world(api_client, namespace_factory, cleanup)
    for _ in range(3):
        await w.tenant(claim=True)
    settings = settings_for(kubevirt.kubeconfig_path, w.controller_ns, root_tenant=w.root_name, canary=CANARY,
                            rollout_steps=STEPS, analysis_deadline_seconds=600.0, done_gate="ready")
    async with running_app(settings) as app:
        for ns in w.tenants:
            await eventually(lambda ns=ns: w.replica_revision(ns), what=f"replica in {ns}")
        await asyncio.sleep(1.1)  # VMs start after their replicas (one-second timestamps)
        for ns in w.tenants:
            await fleet.create_vm(api_client, ns, "vm0", gpu_claims=["gpu"])
        r = Rig(w, kubevirt, app, [])
        await r.phase(RotationPhase.STABLE)
        yield r


async def test_actions_refuse_misuse_and_write_one_event_each(rig: Rig) -> None:
    r, src = rig, rig.src
    stable = await r.phase(RotationPhase.STABLE)
    before = await r.source_annotations()

    # A stable source: nothing to undo, retry or resume; nothing written.
    code, out, err = await r.cli("rollout", "undo", src)
    assert (code, out) == (1, "") and err.strip() == (
        f"licensectl rollout undo: no rollout history found for source {src}: it is stable on source revision "
        f"{stable.stable[:12]}, there is no candidate to undo")
    code, _, err = await r.cli("rollout", "retry", src)
    assert code == 1 and "no rollout history found" in err and "no candidate to retry" in err
    code, _, err = await r.cli("rollout", "resume", src)
    assert code == 1 and err.strip() == f"licensectl rollout resume: source {src} is not paused"
    assert await r.source_annotations() == before, "a refused action wrote something"
    assert not {ANN_UNDO_AT, ANN_RETRY_AT} & set(before)
    # rollout history of a stable source: nothing ended yet; of a Secret no class names: no record.
    code, out, err = await r.cli("rollout", "history", src)
    assert code == 0 and out == (f"no candidate has ended yet for {src}\n"
                                 f"now: stable, stable source revision {stable.stable[:12]}\n"), err
    code, out, err = await r.cli("rollout", "history", f"{r.w.source_ns}/no-such-source")
    assert (code, out) == (1, "") and err.startswith(
        f"licensectl rollout history: no rollout history found for source {r.w.source_ns}/no-such-source: "), err

    # A tenant's replica is no source.
    tenant = r.w.tenants[0]
    code, _, err = await r.cli("rollout", "pause", f"{tenant}/{r.w.replica}")
    assert code == 1 and err.strip() == (
        f"licensectl rollout pause: {tenant}/{r.w.replica} is a license replica licensectl writes into a tenant "
        f"namespace, not a license source; act on its source: licensectl rollout pause {src}")
    code, _, err = await r.cli("rollout", "undo", f"{tenant}/{r.w.replica}")
    assert code == 1 and "is a license replica" in err
    code, _, err = await r.cli("rollout", "pause", f"{tenant}/no-such-secret")
    assert code == 1 and err.strip() == f"licensectl rollout pause: Secret {tenant}/no-such-secret not found"

    # Pause: written once, one Event; twice: refused.
    code, out, err = await r.cli("rollout", "pause", src)
    assert code == 0 and out.strip() == f"rollout of {src} paused", err
    assert (await r.source_annotations()).get(ANN_ROLLOUT_PAUSED) == "true"
    code, _, err = await r.cli("rollout", "pause", src)
    assert code == 1 and err.strip() == f"licensectl rollout pause: source {src} is already paused"
    assert (await r.reasons()).count("RolloutPauseRequested") == 1

    # A new token while paused: the canary starts (its replicas change) but nothing restarts.
    await r.w.rotate(1)
    canary = await r.phase(RotationPhase.CANARY)
    code, _, err = await r.cli("rollout", "retry", src)
    assert code == 1 and err.strip() == (
        f"licensectl rollout retry: source {src}: candidate source revision {canary.candidate[:12]} is canary, "
        f"not aborted or undone; nothing to retry")

    await _status_agrees_offline_and_from_the_controller(r, canary)

    # rollout status on a paused canary: exits 4 at once, with and without -w.
    code, out, _ = await r.cli("rollout", "status", src, "--url", r.url)
    assert code == 4 and f"{src} paused" in out, out
    code, out, _ = await r.cli("rollout", "status", "-w", "--timeout", "30", src, "--url", r.url)
    assert code == 4, out
    code, out, _ = await r.cli("rollout", "status", src, "--url", r.url, "-o", "json", "--vms", kind="json")
    doc = json.loads(out)
    assert code == 4 and doc["exit_code"] == 4
    one = doc["sources"][src]
    assert one["rotation"]["phase"] == "canary" and one["rotation"]["candidate"] == canary.candidate[:12]
    assert one["source_revision"] in (canary.stable[:12], canary.candidate[:12])
    assert all(v["state"] in ("failed", "blocked", "manual", "restarting") for v in doc["vmis"])
    code, out, _ = await r.cli("rollout", "status", src, "--url", r.url, "-o", "yaml", kind="yaml")
    assert code == 4 and yaml.safe_load(out)["sources"][src]["phase"] == "paused"

    # Undo the candidate: one Event from the CLI, then the controller's RolloutUndone; twice: refused.
    code, out, err = await r.cli("rollout", "undo", src)
    assert code == 0, err
    assert out.strip() == (f"undo of candidate source revision {canary.candidate[:12]} of {src} requested: the "
                           f"controller returns every namespace to stable source revision {canary.stable[:12]}")
    await r.phase(RotationPhase.UNDONE)
    code, _, err = await r.cli("rollout", "undo", src)
    assert code == 1 and "is already undone" in err
    code, _, err = await r.cli("rollout", "retry", src)
    assert code == 0, err
    await r.phase(RotationPhase.CANARY)
    # rollout history: the undone candidate, from the record the controller wrote; then retried (still paused).
    code, out, err = await r.cli("rollout", "history", src, "-o", "json", kind="json")
    doc = json.loads(out)
    assert code == 0 and doc["source"] == src and doc["phase"] == "canary", err
    assert [(e["source_revision"], e["outcome"]) for e in doc["history"]] == [(canary.candidate[:12], "undone")]
    assert (doc["stable"], doc["candidate"]) == (canary.stable[:12], canary.candidate[:12])
    code, out, _ = await r.cli("rollout", "history", src)
    rows = out.splitlines()
    assert code == 0 and rows[0].split() == ["SOURCE", "REVISION", "OUTCOME", "AT"]
    assert rows[1].split()[:2] == [canary.candidate[:12], "undone"] and rows[2] == ""
    assert rows[3] == (f"now: canary, stable source revision {canary.stable[:12]}, candidate source revision "
                       f"{canary.candidate[:12]}")

    code, out, err = await r.cli("rollout", "resume", src)
    assert code == 0 and out.strip() == f"rollout of {src} resumed", err

    async def one_each() -> list[str] | None:
        reasons = await r.reasons()
        return reasons if "RolloutUndone" in reasons else None
    reasons = await eventually(one_each, what="RolloutUndone")
    for reason in ("RolloutPauseRequested", "RolloutUndoRequested", "RolloutRetryRequested",
                   "RolloutResumeRequested"):
        assert reasons.count(reason) == 1, (reason, reasons)

    await _no_unlabelled_hash_anywhere(r)


async def _status_agrees_offline_and_from_the_controller(r: Rig, canary: RotationRecord) -> None:
    """Mid-rotation (canary replicas written, restarts paused): the offline recomputation reads the same
    rotation record and plans the same replicas and rollout as the controller, and says it is partial."""
    async def controller_view() -> dict[str, Any] | None:
        code, out, _ = await r.cli("status", "-o", "json", "--url", r.url, kind="json")
        doc = json.loads(out) if code == 0 else None
        ok = doc is not None and doc["replicas"].get("drifted") == 0 and doc["replicas"].get("missing") == 0 and \
            (doc["rotations"].get(r.src) or {}).get("phase") == "canary"
        return doc if ok else None

    live = await eventually(controller_view, timeout=30, what="controller view settled in the canary")
    code, out, err = await r.cli("status", "-o", "json", "--offline", kind="json")
    assert code == 0, err
    off = json.loads(out)
    assert off["from"] == "offline" and off["partial"] is True and live["from"] == "controller"
    assert off["replicas"] == live["replicas"], (off["replicas"], live["replicas"])
    assert off["sources"][0]["source_revision"] == live["sources"][0]["source_revision"] == canary.candidate[:12]
    keys = ("phase", "wave", "wave_number", "waves", "stable", "candidate", "canary")
    assert {k: off["rotations"][r.src][k] for k in keys} == {k: live["rotations"][r.src][k] for k in keys}
    keys = ("phase", "affected", "current", "stale", "source_revision")
    assert {k: off["rollouts"][r.src][k] for k in keys} == {k: live["rollouts"][r.src][k] for k in keys}
    code, table, _ = await r.cli("status", "--offline")
    assert code == 0 and table.startswith("OFFLINE, PARTIAL VIEW")
    code, table, _ = await r.cli("status", "--url", r.url)
    assert code == 0 and "ROTATIONS" in table


async def _no_unlabelled_hash_anywhere(r: Rig) -> None:
    for kind, text in r.outputs:
        if text.strip():
            found = {"json": json_unlabeled, "yaml": yaml_unlabeled}.get(kind, text_unlabeled)(text)
            assert found == [], (kind, text)
    namespaces = (r.w.source_ns, r.w.controller_ns, *r.w.tenants)
    messages = [e.message for ns in namespaces for e in (await CoreV1Api(r.w.api).list_namespaced_event(ns)).items]
    assert any("source revision" in m for m in messages)
    assert [m for m in messages if text_unlabeled(m)] == []
    async with aiohttp.ClientSession() as http, http.get(f"{r.url}/metrics") as resp:
        scrape = await resp.text()
    assert "licensectl_source_revision_info" in scrape
    assert metrics_unlabeled(scrape) == []


async def test_forbidden_is_one_line(rig: Rig, control_plane: ControlPlane, tmp_path: Path) -> None:
    """A user without permissions: one line naming what was refused, exit 1, no traceback."""
    ns = rig.w.controller_ns
    core = CoreV1Api(rig.w.api)
    await core.create_namespaced_service_account(ns, {"metadata": {"name": "nobody"}})
    token = (await core.create_namespaced_service_account_token(
        "nobody", ns, {"spec": {"expirationSeconds": 600}})).status.token
    kubeconfig = tmp_path / "nobody.kubeconfig"
    kubeconfig.write_text(render_kubeconfig(control_plane.server, control_plane.ca_pem, token=token, user="nobody"))
    code, _, err = await rig.cli("rollout", "pause", rig.src, kubeconfig=kubeconfig)
    assert code == 1 and err.strip() == (
        f"licensectl rollout pause: forbidden (HTTP 403) reading Secret {rig.src}: the kubeconfig's user lacks a "
        f"permission this command needs (docs/operations.md#permissions)")
    code, _, err = await rig.cli("status", "--offline", kubeconfig=kubeconfig)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "HTTP 403" in err, err
