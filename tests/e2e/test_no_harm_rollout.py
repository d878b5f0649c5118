"""No harm on ordinary events (docs/design.md#evidence-after-takeover, #supersede, #decision-stale-rule):
two `licensectl run` processes (leader and warm standby) against the real apiserver, its admission chain
and the KubeVirt simulator, with simulated guests that license according to the token they boot with.

* a bad-token canary with the leader SIGKILLed three times during the canary and the abort: VMs that never
  booted the bad revision are never restarted, those that did at most twice, and no namespace outside the
  canary ever sees its replica change;
* a second token written during the first's canary: no VM restarts more than twice, and a
  `RotationSuperseded` Event names both source revisions;
* a VMI that turned Running a moment before a rotation is restarted onto the new revision.

Restarts are counted from cluster state: the restart calls the simulated virt-api accepted and the boots
(VMI UIDs) the guests saw, never from controller logs.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, ApiException, CustomObjectsApi

from licensectl.core.rotation import RotationPhase, content_revision
from licensectl_dev.devcluster import fleet as devfleet
from licensectl_dev.devcluster.guest_fleet import GuestFleet, always_licensed, licensed_unless
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.world import token_for

from .support import Rig, controllers
from .test_rotation_kill import (
    REPORT_INTERVAL,
    _phase_is,
    assert_no_token_in_logs,
    kill_leader,
    observing,
    read_record,
    restarts,
    sha,
    source_events,
    source_revisions,
    up,
)

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]


def booted(guests: GuestFleet, ns: str, name: str, token: bytes) -> bool:
    return any(b.token_sha256 == sha(token) for b in guests.boots(ns, name))



async def stop_cleanly(ctls: Sequence[ControllerProcess], tokens: Sequence[bytes]) -> None:
    """Every controller exits 0 on SIGTERM, and no token byte reached any of their logs."""
    for c in ctls:
        assert await c.stop() == 0, c.log_tail()
    assert_no_token_in_logs(ctls, tokens)

async def test_bad_canary_with_three_leader_kills_restarts_only_vms_that_ran_it(
        api_client: ApiClient, rig: Rig) -> None:
    fl = rig.fleet
    canary_ns = fl.tenants[0]
    bad = token_for(200, rotation="bad")
    rng = random.Random(22)
    kills: list[str] = []
    # One canary namespace of three VMs restarted one at a time: the first guest's failure aborts the
    # canary while its other VMs still run stable -- exactly the VMs a new leader must leave alone.
    settings = {"canary": f"namespaces:{canary_ns}", "rollout_steps": "100%", "settle_seconds": 3,
                "max_unavailable": "1", "max_per_namespace": 1, "analysis_deadline_seconds": 120}
    async with controllers() as started:
        ctls, guests, vms = await up(rig, started, licensed_unless({bad}), 3, **settings)
        stable = content_revision(fl.token, None)
        canary_vms = [(ns, n) for ns, n in vms if ns == canary_ns]
        try:
            async with observing(fl) as obs:
                await fl.put_token(bad)
                assert await eventually(lambda: _phase_is(fl, RotationPhase.CANARY), timeout=30, interval=0.1,
                                        what="the canary decision")
                await kill_leader(ctls, rng=rng, fl=fl, log=kills)  # 1: canary, before any restart

                async def first_bad_boot_or_abort() -> bool:
                    rec = await read_record(fl)
                    return (rec is not None and rec.phase is RotationPhase.ABORTED) or any(
                        booted(guests, ns, n, bad) for ns, n in canary_vms)
                await eventually(first_bad_boot_or_abort, timeout=90, interval=0.1, what="a canary VM on the bad token")
                await kill_leader(ctls, rng=rng, fl=fl, log=kills)  # 2: canary, a guest on the bad token
                rec = await eventually(lambda: _phase_is(fl, RotationPhase.ABORTED), timeout=120, interval=0.1,
                                       what=f"candidate aborted ({kills})")
                assert rec is not None
                await kill_leader(ctls, rng=rng, fl=fl, log=kills)  # 3: the abort, restarts back under way

                ran_bad = [(ns, n) for ns, n in vms if booted(guests, ns, n, bad)]

                async def back_on_stable() -> bool:
                    return all((b := guests.last_boot(ns, n)) is not None and b.source_revision == stable
                               for ns, n in vms)
                await eventually(back_on_stable, timeout=120, interval=0.25, what=f"every VM on stable ({kills})")
                await asyncio.sleep(4 * REPORT_INTERVAL)  # quiet: nothing else restarts afterwards
            assert sum(c.kills for c in ctls) == 3, kills
            assert ran_bad and set(ran_bad) <= set(canary_vms), (ran_bad, kills)
            counts = restarts(rig, vms)
            for ns, n in vms:
                key = f"{ns}/{n}"
                if (ns, n) in ran_bad:
                    assert 1 <= counts[key] <= 2, (key, counts, kills)
                else:
                    assert counts[key] == 0, (key, counts, guests.boots(ns, n), kills)
                    assert len({b.vmi_uid for b in guests.boots(ns, n)}) == 1, (key, guests.boots(ns, n))
            # No namespace outside the canary ever saw its replica change; none carried what no decision gave it.
            outside = [ns for ns in fl.tenants if ns != canary_ns]
            assert obs.samples and all(sample[ns] == stable for _, sample in obs.samples for ns in outside)
            assert obs.strays() == [], (kills, obs.strays())
            assert [r.phase for r in obs.records] == [RotationPhase.STABLE, RotationPhase.CANARY,
                                                      RotationPhase.ABORTED], (kills, obs.records)
        finally:
            await guests.stop()
            guests.cleanup()
        await stop_cleanly(ctls, fl.tokens)


async def test_a_second_token_during_the_canary_supersedes_it_with_at_most_two_restarts_per_vm(
        api_client: ApiClient, rig: Rig) -> None:
    fl = rig.fleet
    canary_ns = fl.tenants[0]
    settings = {"canary": f"namespaces:{canary_ns}", "rollout_steps": "100%", "settle_seconds": 2,
                "max_unavailable": "3", "max_per_namespace": 1, "analysis_deadline_seconds": 120}
    async with controllers() as started:
        ctls, guests, vms = await up(rig, started, always_licensed, 3, **settings)
        canary_vms = [(ns, n) for ns, n in vms if ns == canary_ns]
        try:
            first = await fl.rotate(1)
            # The second token comes while the canary runs: one canary VM on the first, the others not yet.
            await eventually(lambda: any(booted(guests, ns, n, first) for ns, n in canary_vms), timeout=60,
                             interval=0.05, what="a canary VM on the first token")
            second = await fl.rotate(2)
            c1, c2 = content_revision(first, None), content_revision(second, None)
            rec = await eventually(lambda: _phase_is(fl, RotationPhase.PROMOTED), timeout=120, interval=0.25,
                                   what="the second candidate promoted")
            assert rec is not None and rec.candidate == c2, rec

            async def all_on_second() -> bool:
                return all((b := guests.last_boot(ns, n)) is not None and b.token_sha256 == sha(second)
                           for ns, n in vms)
            await eventually(all_on_second, timeout=120, interval=0.25, what="every VM on the second token")
            await asyncio.sleep(3 * REPORT_INTERVAL)
            counts = restarts(rig, vms)
            ran_first = {(ns, n) for ns, n in vms if booted(guests, ns, n, first)}
            assert ran_first and ran_first <= set(canary_vms), ran_first

            def stamp_lag(ns: str, n: str) -> bool:
                """The one extra restart docs/design.md#decision-stale-rule admits: the restart for the first
                candidate was admitted (stamped) with it, but the replica was rewritten to the second before
                the mount, so the VMI it stopped next had already booted the second token."""
                recs = rig.kv.record.restarts_for(ns, n)
                boots = {b.vmi_uid: b.token_sha256 for b in guests.boots(ns, n)}
                return len(recs) == 2 and boots.get(recs[1].vmi_uid) == sha(second)

            assert counts == {f"{ns}/{n}": 2 if (ns, n) in ran_first or stamp_lag(ns, n) else 1
                              for ns, n in vms}, counts
            assert all(v <= 2 for v in counts.values())
            assert await source_revisions(fl) == dict.fromkeys(fl.tenants, c2)
            (ev,) = await source_events(fl, "RotationSuperseded")
            assert f"source revision {c1[:12]}" in ev.message and f"source revision {c2[:12]}" in ev.message, ev.message
        finally:
            await guests.stop()
            guests.cleanup()
        await stop_cleanly(ctls, fl.tokens)


async def test_a_vmi_running_since_just_before_a_rotation_is_restarted_onto_it(
        api_client: ApiClient, rig: Rig) -> None:
    fl = rig.fleet
    ns = fl.tenants[0]
    settings = {"canary": "0", "rollout_steps": "100%", "settle_seconds": 2, "max_unavailable": "4",
                "done_gate": "ready"}
    async with controllers() as started:
        ctls, guests, vms = await up(rig, started, always_licensed, 1, **settings)
        try:
            guests.add(ns, "late")
            await devfleet.create_vm(fl.api, ns, "late", gpu_claims=["gpu"])
            co: Any = CustomObjectsApi(fl.api)

            async def running() -> bool:
                try:
                    vmi = await co.get_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances",
                                                                "late")
                except ApiException:
                    return False
                return (vmi.get("status") or {}).get("phase") == "Running"
            await eventually(running, timeout=30, interval=0.02, what="the late VMI running")
            t_running = time.monotonic()
            new = await fl.rotate(1)
            assert time.monotonic() - t_running < 1.0  # the rotation lands within a second of the VMI's start
            before = guests.boots(ns, "late")
            everyone = [*vms, (ns, "late")]

            async def all_on_new() -> bool:
                return all((b := guests.last_boot(k, n)) is not None and b.token_sha256 == sha(new)
                           for k, n in everyone)
            await eventually(all_on_new, timeout=90, interval=0.25, what="every VM, the late one too, on the new token")
            await asyncio.sleep(3 * REPORT_INTERVAL)
            assert len(before) <= 1, before  # it had booted (at most) once before the rotation
            assert restarts(rig, everyone) == {f"{k}/{n}": 1 for k, n in everyone}
        finally:
            await guests.stop()
            guests.cleanup()
        await stop_cleanly(ctls, fl.tokens)
