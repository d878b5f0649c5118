"""Safe rotation on the real apiserver, the KubeVirt simulator and guests running the real probe.

Issue acceptance, in-process controller (the SIGKILL scenarios run two controller processes in
tests/e2e/test_rotation_kill.py):
  * good token: canary, analysis passes, steps promote, every VM restarted exactly once, every guest
    licensed with the candidate; a VM restarted by hand in a namespace not yet promoted boots with
    the stable token; `rollout undo` afterwards puts every VM back on stable exactly once more;
  * bad token (the guests' license server refuses it): abort after the canary, only canary VMs ever
    booted it, they are back on stable, nothing outside the canary restarted, the phase metric says
    aborted and the RolloutAborted Event names the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from licensectl.app import App
from licensectl.core.guest_report import LicenseState
from licensectl.core.model import ANN_SOURCE_REVISION, ObjectRef
from licensectl.core.ports import RestartResult
from licensectl.core.rotation import RotationPhase, RotationRecord, parse_steps
from licensectl.kube.kubevirt import KubevirtClient
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.guest_fleet import GuestFleet, licensed_unless
from licensectl_dev.devcluster.prometheus import Prometheus
from licensectl_dev.testkit.process import run_licensectl
from licensectl_dev.testkit.world import World, token_for

from ..conftest import KubevirtEnv
from .support import events_for, eventually, make_world, metric, read_secret, running_app, settings_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

STEPS = "50%,100%"
TENANTS, PER_TENANT = 4, 2


@dataclasses.dataclass
class Rig:
    w: World
    kv: KubevirtEnv
    app: App
    gf: GuestFleet
    vms: list[tuple[str, str]]

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(*self.w.source)

    def record(self) -> RotationRecord | None:
        store = self.app.rotation.stores().get(self.ref)
        return None if store is None else RotationRecord.from_annotations(store.annotations)

    async def phase(self, *want: RotationPhase, timeout: float = 120.0) -> RotationRecord:
        async def reached() -> RotationRecord | None:
            rec = self.record()
            return rec if rec is not None and rec.phase in want else None
        return await eventually(reached, timeout=timeout, interval=0.2, what=f"rotation phase in {want}")

    def restarts(self, ns: str, vm: str) -> int:
        return len(self.kv.record.restarts_for(ns, vm))

    def licensed(self, ns: str, vm: str) -> bool:
        g = self.app.guests.get(ns, vm)
        return g is not None and g.state is LicenseState.LICENSED and g.token_current

    async def cli(self, *argv: str) -> tuple[int, str]:
        r = await run_licensectl(*argv, kubeconfig=self.kv.kubeconfig_path, env=self.w.cli_env)
        return r.code, r.out

    async def replicas_follow(self, rec: RotationRecord) -> None:
        """Every replica carries what the decision says for its namespace (none on a revision that
        matches no decision)."""
        for ns in self.w.tenants:
            s = await read_secret(self.w.api, ns, self.w.replica)
            assert s is not None
            assert (s.metadata.annotations or {}).get(ANN_SOURCE_REVISION) == rec.revision_for(
                ns, parse_steps(STEPS)), ns


@pytest.fixture
async def rig(api_client: ApiClient, kubevirt: KubevirtEnv, namespace_factory: Any, cleanup: Any,
              request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    bad: set[bytes] = getattr(request, "param", set())
    w = await make_world(api_client, namespace_factory, cleanup)
    for _ in range(TENANTS):
        await w.tenant(claim=True)
    settings = settings_for(
        kubevirt.kubeconfig_path, w.controller_ns, root_tenant=w.root_name, canary="2", rollout_steps=STEPS,
        settle_seconds=2.0, report_interval_seconds=1.0, analysis_deadline_seconds=120.0, max_unavailable="2",
        max_per_namespace=1, restart_timeout_seconds=90.0, done_gate="ready-licensed")
    async with running_app(settings) as app:
        url = f"https://127.0.0.1:{app.reports_port}/v1/reports"
        for ns in w.tenants:
            await eventually(lambda ns=ns: w.replica_revision(ns), what=f"replica in {ns}")
        await asyncio.sleep(1.1)  # VMs start after their replicas (one-second timestamps)
        async with GuestFleet(api_client, url, profile_for=licensed_unless(bad), interval_seconds=0.5) as gf:
            vms = []
            for ns in w.tenants:
                for i in range(PER_TENANT):
                    await fleet.create_vm(api_client, ns, f"vm{i}", gpu_claims=["gpu"])
                    gf.add(ns, f"vm{i}")
                    vms.append((ns, f"vm{i}"))
            r = Rig(w, kubevirt, app, gf, vms)
            await eventually(lambda: all(r.licensed(ns, vm) for ns, vm in vms), timeout=90, what="fleet licensed")
            rec = await r.phase(RotationPhase.STABLE)
            assert rec.candidate == "" and not kubevirt.record.restarts
            await asyncio.sleep(1.1)  # the rotation comes a moment after the fleet is up
            yield r


async def test_good_token_canary_steps_promote_then_undo(rig: Rig) -> None:
    r = rig
    stable = r.record()
    assert stable is not None
    started = time.monotonic()
    good = await r.w.rotate(1)
    canary = await r.phase(RotationPhase.CANARY, timeout=30)
    assert canary.stable == stable.stable and canary.candidate and len(canary.canary) == 1  # 2 VMs per tenant
    assert canary.evidence, "every guest reports: the canary is judged on guest evidence"
    outside = sorted(ns for ns in r.w.tenants if not canary.on_candidate(ns, parse_steps(STEPS)))
    assert len(outside) == TENANTS - 1

    # A VM restarted by hand in a namespace not yet promoted boots with the stable token.
    hand_ns = outside[0]
    first = r.gf.last_boot(hand_ns, "vm0")
    assert first is not None
    assert await KubevirtClient(r.app.api).restart(namespace=hand_ns, vm="vm0", vmi_uid=first.vmi_uid,
                                                   run_strategy="Always") is RestartResult.ISSUED
    await eventually(lambda: len(r.gf.boots(hand_ns, "vm0")) >= 2, timeout=60, what="hand restart booted")
    hand_boot = r.gf.boots(hand_ns, "vm0")[1]
    assert hand_boot.source_revision == canary.stable, "a namespace not yet promoted keeps the stable token"
    assert hand_boot.token_sha256 == hashlib.sha256(r.w.token).hexdigest()

    promoted = await r.phase(RotationPhase.PROMOTED, timeout=180)
    elapsed = time.monotonic() - started
    await eventually(lambda: all(r.licensed(ns, vm) for ns, vm in r.vms), timeout=60, what="all licensed")
    print(f"\nsafe rotation of {len(r.vms)} VMs in {TENANTS} tenants (canary 2, steps {STEPS}): "
          f"{elapsed:.1f} s from the source write to promoted")
    for ns, vm in r.vms:
        by_hand = 1 if (ns, vm) == (hand_ns, "vm0") else 0
        assert r.restarts(ns, vm) == 1 + by_hand, f"{ns}/{vm} restarted {r.restarts(ns, vm)}x"
        last = r.gf.last_boot(ns, vm)
        assert last is not None and last.source_revision == promoted.candidate
        assert last.token_sha256 == hashlib.sha256(good).hexdigest()
    await r.replicas_follow(promoted)
    reasons = [e.reason for e in await events_for(r.w.api, r.w.source_ns, r.w.source_name)]
    for want in ("RotationStarted", "RotationStepStarted", "RotationPromoted"):
        assert want in reasons, reasons
    assert "RolloutAborted" not in reasons
    assert metric(r.app, "licensectl_rotation_phase", {"phase": "promoted"}) == 1.0
    assert metric(r.app, "licensectl_rotation_namespaces", {"slot": "candidate"}) == float(TENANTS)

    # Undo after full promotion: every VM back on the stable revision, exactly once more.
    code, out = await r.cli("rollout", "undo", f"{r.w.source_ns}/{r.w.source_name}")
    assert code == 0, out
    undone = await r.phase(RotationPhase.UNDONE, timeout=30)
    assert undone.stable == stable.stable

    async def all_back() -> bool:
        return all(r.restarts(ns, vm) == (3 if (ns, vm) == (hand_ns, "vm0") else 2)
                   and (b := r.gf.last_boot(ns, vm)) is not None and b.source_revision == stable.stable
                   and r.licensed(ns, vm) for ns, vm in r.vms)
    await eventually(all_back, timeout=180, interval=0.5, what="every VM back on stable")
    await r.replicas_follow(undone)
    await asyncio.sleep(3)  # nothing else moves
    assert all(r.restarts(ns, vm) == (3 if (ns, vm) == (hand_ns, "vm0") else 2) for ns, vm in r.vms)
    assert metric(r.app, "licensectl_rotation_phase", {"phase": "undone"}) == 1.0


BAD = token_for(200, rotation="wrong-server")


@pytest.mark.parametrize("rig", [{BAD}], indirect=True)
async def test_bad_token_aborts_after_the_canary(rig: Rig) -> None:
    r = rig
    stable = r.record()
    assert stable is not None
    await r.w.put_token(BAD)  # a token from another license server instance
    canary = await r.phase(RotationPhase.CANARY, timeout=30)
    aborted = await r.phase(RotationPhase.ABORTED, timeout=120)
    assert aborted.wave == 0 and "canary" in aborted.reason and "acquire_failed" in aborted.reason, aborted.reason
    in_canary = [(ns, vm) for ns, vm in r.vms if ns in canary.canary]
    assert in_canary and len(in_canary) < len(r.vms)

    async def canary_back() -> bool:
        return all((b := r.gf.last_boot(ns, vm)) is not None and b.source_revision == stable.stable
                   and r.licensed(ns, vm) for ns, vm in in_canary)
    await eventually(canary_back, timeout=120, interval=0.5, what="canary back on stable and licensed")
    await asyncio.sleep(3)  # nothing else moves until the hoster acts
    bad_sha = hashlib.sha256(BAD).hexdigest()
    on_bad = 0
    for ns, vm in r.vms:
        boots = r.gf.boots(ns, vm)
        if (ns, vm) in in_canary:
            # Onto the candidate and back; or never reached before the abort (maxPerNamespace 1): then
            # its guest's licensed reports with the stable token prove it current, and it stays.
            pattern = [b.token_sha256 == bad_sha for b in boots]
            assert (r.restarts(ns, vm), pattern) in ((2, [False, True, False]), (0, [False])), (ns, vm, pattern)
            on_bad += pattern == [False, True, False]
        else:
            assert r.restarts(ns, vm) == 0, f"{ns}/{vm} restarted outside the canary"
            assert all(b.token_sha256 != bad_sha for b in boots)
    assert on_bad >= 1, "the abort came from a canary guest that booted the bad token"
    await r.replicas_follow(aborted)
    events = [e for e in await events_for(r.w.api, r.w.source_ns, r.w.source_name) if e.reason == "RolloutAborted"]
    assert events and events[0].type == "Warning" and "acquire_failed" in events[0].message
    assert metric(r.app, "licensectl_rotation_phase", {"phase": "aborted"}) == 1.0
    # The shipped rule, on a real Prometheus scraping this controller: the alert is raised (pending for
    # its `for:` minute, then firing) and names the source.
    prom = Prometheus([f"127.0.0.1:{r.app.metrics_port}"])
    await asyncio.to_thread(prom.start)
    try:
        async def raised() -> list[dict[str, Any]] | None:
            alerts = await asyncio.to_thread(prom.alerts)
            hit = [a for a in alerts if a["labels"]["alertname"] == "LicensectlRolloutAborted"]
            return hit or None
        [alert] = await eventually(raised, timeout=60, interval=1.0, what="LicensectlRolloutAborted raised")
        assert alert["state"] in ("pending", "firing")
        assert (alert["labels"]["source_namespace"], alert["labels"]["source_name"]) == r.w.source
    finally:
        await asyncio.to_thread(prom.stop)
    # No token bytes of any revision anywhere the controller speaks.
    doc = str(r.app.status()) + "".join(e.message for e in await events_for(
        r.w.api, r.w.source_ns, r.w.source_name))
    for tok in (BAD, r.w.token):
        assert tok.decode() not in doc

