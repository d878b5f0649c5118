"""Safe rotation while the leader crashes: two `licensectl run` processes (leader and warm standby)
against the real apiserver and the KubeVirt simulator, simulated guests that license according to the
token they boot with, and the leader SIGKILLed at random moments while a candidate moves through its
canary and steps (docs/design.md#safe-rotation).

The record in the revision store is the only memory of a rotation. Whatever moment the leader dies
at, the next one re-derives the next decision from the cluster: every VM is restarted exactly as often
as the decisions require, and no replica ever carries a revision that no written decision gave its
namespace.

The good rotation also carries the hoster's hand: a VM in a namespace not yet on the candidate is
restarted by hand during the canary (it boots with the stable token), and once promoted `licensectl
rollout undo` runs with one more leader kill in it (every VM back on stable, restarted exactly once more).

The kill moments come from a seed that every test prints (`LICENSECTL_ROTATION_KILL_SEED=N` re-runs
one); the long mode (`LICENSECTL_LONG_KILLS=N`) kills the leader N times during the good rotation
(the undo always has one kill).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api

from licensectl.core.model import ANN_SOURCE_REVISION, ObjectRef
from licensectl.core.ports import RestartResult
from licensectl.core.rotation import (
    ACTIVE,
    RotationPhase,
    RotationRecord,
    content_revision,
    parse_steps,
    wave_members,
)
from licensectl.kube.kubevirt import KubevirtClient
from licensectl.kube.revision_store import store_name
from licensectl_dev.devcluster.guest_fleet import Boot, GuestFleet, ProfileFor, always_licensed, licensed_unless
from licensectl_dev.devcluster.kubeapi import api_client_from_kubeconfig
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.process import run_licensectl
from licensectl_dev.testkit.world import token_for

from .support import Fleet, Rig, controllers, start_controller

# Starts `licensectl run` processes itself: cluster tier even if its fixtures change.
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]

# Leader kills during the good rotation; the long mode raises it.
KILLS = int(os.environ.get("LICENSECTL_LONG_KILLS", "0")) or 2
SEED = int(os.environ.get("LICENSECTL_ROTATION_KILL_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)

PODS = ("licensectl-a", "licensectl-b")
PER_TENANT = 2
REPORT_INTERVAL = 2.0
LEASE: dict[str, Any] = {"lease_duration_seconds": 3, "renew_deadline_seconds": 2, "retry_period_seconds": 0.5}
STEPS_FLAG = "50%,100%"
STEPS = parse_steps(STEPS_FLAG)
ROTATION: dict[str, Any] = {"settle_seconds": 2, "canary": "2", "rollout_steps": STEPS_FLAG,
                            "analysis_deadline_seconds": 90, "analysis_max_unlicensed": 1,
                            "done_gate": "ready-licensed"}
# Two restarts at once, both may be in one namespace: the canary namespace's two VMs take the candidate
# together, so with a bad token both boot it before the first failure report aborts the rotation.
# A leader killed between a restart's intent and its call leaves the call to be re-issued after
# `restart_reissue_seconds` (KubeVirt refuses a second stop of the same VMI, so re-issuing is safe):
# 10 s instead of the shipped 60 s keeps a kill at that moment within the test's patience.
ROLLOUT: dict[str, Any] = {"max_unavailable": "2", "max_per_namespace": 2, "restart_timeout_seconds": 60,
                           "restart_reissue_seconds": 10}


# -- the controllers -------------------------------------------------------------------------------
async def start_pod(rig: Rig, started: list[ControllerProcess], pod: str, **overrides: Any) -> ControllerProcess:
    """One controller pod as shipped (leader election, reports through the Service), with the rotation
    settings of these tests (`overrides` replace some) and a short report interval."""
    kubeconfig = rig.tmp / f"{pod}.kubeconfig"
    kubeconfig.write_text(rig.proxies[pod].kubeconfig(rig.cp.admin_token))
    kubeconfig.chmod(0o600)
    fl = rig.fleet
    c = await start_controller(
        pod, kubeconfig, fl.controller_ns, rig.tmp, pod_name=pod, leader_elect=True, root_tenant=fl.root_name,
        report_url=rig.service.url, reports_plain_http=True, report_interval_seconds=REPORT_INTERVAL,
        webhook_api=fl.api, **{**LEASE, **ROTATION, **ROLLOUT, **overrides})
    started.append(c)
    rig.service.endpoints[pod] = c
    return c


async def current_leader(ctls: Sequence[ControllerProcess]) -> ControllerProcess | None:
    """The one live process that says it leads (None while none or both do)."""
    leaders = []
    for c in ctls:
        s = await c.scrape() if c.alive() else None
        if s is not None and s.value("licensectl_leader") == 1.0:
            leaders.append(c)
    return leaders[0] if len(leaders) == 1 else None


# -- the cluster as the assertions read it ---------------------------------------------------------
def store_of(fl: Fleet) -> str:
    return store_name(ObjectRef(fl.source_ns, fl.source_name))


async def read_record(fl: Fleet) -> RotationRecord | None:
    try:
        s = await CoreV1Api(fl.api).read_namespaced_secret(store_of(fl), fl.controller_ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return RotationRecord.from_annotations(s.metadata.annotations or {})


async def source_revisions(fl: Fleet) -> dict[str, str | None]:
    """Per tenant: the source revision its replica carries (None: no replica)."""
    core = CoreV1Api(fl.api)
    out: dict[str, str | None] = {}
    for ns in fl.tenants:
        try:
            s = await core.read_namespaced_secret(fl.replica, ns)
        except ApiException as e:
            if e.status != 404:
                raise
            out[ns] = None
            continue
        out[ns] = (s.metadata.annotations or {}).get(ANN_SOURCE_REVISION, "")
    return out


async def source_events(fl: Fleet, reason: str) -> list[Any]:
    events = await CoreV1Api(fl.api).list_namespaced_event(
        fl.source_ns, field_selector=f"involvedObject.name={fl.source_name}")
    return [e for e in events.items if e.reason == reason and e.involved_object.kind == "Secret"]


def busy_waves(record: RotationRecord, namespaces: Sequence[str]) -> list[int]:
    """The waves of `record`'s candidate that put namespaces on it (so restart VMs): the canary, and
    each step whose share adds a namespace."""
    out = [0]
    before = set(record.canary)
    for w in range(1, len(STEPS) + 1):
        now = set(wave_members(replace(record, phase=RotationPhase.PROMOTING, wave=w), namespaces, STEPS))
        if now - before:
            out.append(w)
        before = now
    return out


def last_to_join(record: RotationRecord, namespaces: Sequence[str]) -> str:
    """The namespace that takes `record`'s candidate at the latest wave: a VM restarted there during the
    canary boots long before its replica changes."""
    def joins(ns: str) -> int:
        return next(w for w in range(len(STEPS) + 1)
                    if replace(record, phase=RotationPhase.PROMOTING if w else RotationPhase.CANARY,
                               wave=w).on_candidate(ns, STEPS))
    return max(sorted(namespaces), key=joins)


async def restart_by_hand(rig: Rig, guests: GuestFleet, ns: str, vm: str) -> Boot:
    """The hoster restarts `ns/vm` through virt-api (the simulator's restart subresource), as an admin
    would with virtctl; returns the boot it restarted from."""
    first = guests.last_boot(ns, vm)
    assert first is not None, (ns, vm)
    admin = await api_client_from_kubeconfig(rig.kv.kubeconfig_path)
    try:
        result = await KubevirtClient(admin).restart(namespace=ns, vm=vm, vmi_uid=first.vmi_uid,
                                                     run_strategy="Always")
    finally:
        await admin.close()
    assert result is RestartResult.ISSUED, result
    return first


async def undo(fl: Fleet, kubeconfig: Any) -> None:
    """`licensectl rollout undo` as the hoster runs it."""
    r = await run_licensectl("rollout", "undo", f"{fl.source_ns}/{fl.source_name}", kubeconfig=kubeconfig,
                             env=fl.cli_env)
    assert r.code == 0 and "undo of candidate source revision" in r.out, (r.code, r.out, r.err)


async def _wave_reached(fl: Fleet, wave: int) -> bool:
    """The record is at wave `wave` or later (promoted counts as later)."""
    rec = await read_record(fl)
    if rec is None:
        return False
    return rec.phase is RotationPhase.PROMOTED or (rec.phase in ACTIVE and rec.wave >= wave)


async def _phase_is(fl: Fleet, phase: RotationPhase) -> RotationRecord | None:
    rec = await read_record(fl)
    return rec if rec is not None and rec.phase is phase else None


def sha(token: bytes) -> str:
    return hashlib.sha256(token).hexdigest()


# A replica written from a decision is read back here no earlier than the watch delivers that decision,
# give or take the two connections' delivery delays.
WATCH_SLACK_SECONDS = 1.0


@dataclass
class Observer:
    """Every record written to the store (a watch sees each write) and replica samples taken meanwhile:
    each sample must match, for every namespace, a decision written before it was taken."""

    fl: Fleet
    records: list[RotationRecord] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)  # time.monotonic() each record was seen
    samples: list[tuple[float, dict[str, str | None]]] = field(default_factory=list)
    unreadable: int = 0

    async def run(self) -> None:
        await asyncio.gather(self._watch_store(), self._sample())

    def _seen(self, annotations: dict[str, str] | None) -> None:
        rec = RotationRecord.from_annotations(annotations or {})
        if rec is None:
            self.unreadable += 1
        elif not self.records or self.records[-1] != rec:
            self.records.append(rec)
            self.arrived.append(time.monotonic())

    async def _watch_store(self) -> None:
        core = CoreV1Api(self.fl.api)
        name = store_of(self.fl)
        first = await core.read_namespaced_secret(name, self.fl.controller_ns)
        self._seen(first.metadata.annotations)
        rv = first.metadata.resource_version
        while True:
            w = watch.Watch()
            async with w.stream(core.list_namespaced_secret, self.fl.controller_ns,
                                field_selector=f"metadata.name={name}", resource_version=rv,
                                timeout_seconds=120) as stream:
                async for ev in stream:
                    obj = ev["object"]
                    rv = obj.metadata.resource_version
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self._seen(obj.metadata.annotations)

    async def _sample(self) -> None:
        while True:
            self.samples.append((time.monotonic(), await source_revisions(self.fl)))
            await asyncio.sleep(0.2)

    def strays(self) -> list[tuple[str, str | None]]:
        """(namespace, revision) pairs a replica carried that no decision written before gave that namespace."""
        out: list[tuple[str, str | None]] = []
        for t, sample in self.samples:
            for ns, rev in sample.items():
                allowed = {r.revision_for(ns, STEPS) for r, at in zip(self.records, self.arrived, strict=True)
                           if at <= t + WATCH_SLACK_SECONDS}
                if rev not in allowed and (ns, rev) not in out:
                    out.append((ns, rev))
        return out


@contextlib.asynccontextmanager
async def observing(fl: Fleet) -> Any:
    obs = Observer(fl)
    task = asyncio.create_task(obs.run())
    try:
        yield obs
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# -- setup shared by both scenarios ----------------------------------------------------------------
async def up(rig: Rig, started: list[ControllerProcess], profile_for: ProfileFor, per_tenant: int,
             **settings: Any) -> tuple[list[ControllerProcess], GuestFleet, list[tuple[str, str]]]:
    """Leader and standby with `settings`, `per_tenant` VMs per tenant booted through the webhook, every
    guest reporting licensed to the leader (so a canary is chosen among guests that give evidence)."""
    fl = rig.fleet
    a = await start_pod(rig, started, PODS[0], **settings)
    await a.wait_metric("licensectl_leader", 1)
    b = await start_pod(rig, started, PODS[1], **settings)
    guests = GuestFleet(rig.api, rig.service.url, profile_for=profile_for, interval_seconds=REPORT_INTERVAL)
    for ns in fl.tenants:
        for i in range(per_tenant):
            guests.add(ns, f"vm{i}")
    await guests.start()
    vms = await fl.boot(per_tenant=per_tenant)
    await b.wait_metric("licensectl_ready", 1)
    await a.wait_metric("licensectl_guest_license_state", len(vms), timeout=60, state="licensed")
    return [a, b], guests, vms


async def up_and_reporting(rig: Rig, started: list[ControllerProcess], profile_for: ProfileFor) -> tuple[
        list[ControllerProcess], GuestFleet, list[tuple[str, str]]]:
    """`up` with these tests' settings, the store holding the first revision as stable."""
    fl = rig.fleet
    ctls, guests, vms = await up(rig, started, profile_for, PER_TENANT)
    rec = await read_record(fl)
    assert rec is not None and rec.phase is RotationPhase.STABLE, rec
    assert rec.stable == content_revision(fl.token, None)
    assert set((await source_revisions(fl)).values()) == {rec.stable}
    return ctls, guests, vms


async def kill_leader(ctls: Sequence[ControllerProcess], *, rng: random.Random, fl: Fleet,
                      log: list[str]) -> RotationRecord | None:
    """SIGKILL whichever process leads now; once the other one has taken over (the Lease expired), bring
    the killed one back a moment later as the standby (the pod's container restarts). Returns the
    record as it was just before the kill."""
    leader = await eventually(lambda: current_leader(ctls), timeout=30, interval=0.1, what="a leader")
    assert leader is not None
    rec = await read_record(fl)
    await leader.kill()
    killed = time.monotonic()
    new = await eventually(lambda: current_leader(ctls), timeout=30, interval=0.1, what="a new leader")
    assert new is not None and new is not leader
    pause = rng.uniform(0.0, 1.5)
    log.append(f"killed {leader.name} at phase={rec.phase.value if rec else None} "
               f"wave={rec.wave if rec else None}; {new.name} led after {time.monotonic() - killed:.1f}s; "
               f"{leader.name} back {pause:.2f}s later")
    await asyncio.sleep(pause)
    await leader.start()
    await leader.wait_ready()
    return rec


def assert_no_token_in_logs(ctls: Sequence[ControllerProcess], tokens: Sequence[bytes]) -> None:
    """Neither the raw token, its signed payload part, nor its base64 form is in any controller log."""
    for c in ctls:
        text = c.log_path.read_bytes()
        assert text, f"{c.name} wrote no log"
        for token in tokens:
            payload = token.split(b".")[1]
            for needle in (token, payload, base64.b64encode(token)):
                assert needle not in text, f"{c.name}'s log holds token bytes"


def restarts(rig: Rig, vms: Sequence[tuple[str, str]]) -> dict[str, int]:
    return {f"{ns}/{name}": len(rig.kv.record.restarts_for(ns, name)) for ns, name in vms}


# -- the scenarios ----------------------------------------------------------------------------------
async def test_good_candidate_promoted_then_undone_through_leader_kills_each_vm_restarted_once_a_decision(
        api_client: ApiClient, rig: Rig) -> None:
    rng = random.Random(f"good:{SEED}")
    print(f"rotation kill seed {SEED} (LICENSECTL_ROTATION_KILL_SEED), kills {KILLS} + 1 in the undo")
    fl = rig.fleet
    kills: list[str] = []
    async with controllers() as started:
        ctls, guests, vms = await up_and_reporting(rig, started, always_licensed)
        stable = content_revision(fl.token, None)
        try:
            async with observing(fl) as obs:
                good = await fl.rotate(1)
                candidate = content_revision(good, None)
                # Each kill lands a random moment into a random wave that restarts VMs (the canary, or a step
                # adding namespaces; a step adding none passes at once): a new leader waits one silence window
                # before it judges, so kills at fixed intervals would all hit the canary.
                started_rec = await eventually(lambda: _phase_is(fl, RotationPhase.CANARY), timeout=30,
                                               interval=0.1, what="the canary decision")
                assert started_rec is not None
                # The hoster restarts a VM by hand in the namespace that takes the candidate last, while the
                # canary runs (before any kill): it must boot with what its replica still carries, stable.
                hand = (last_to_join(started_rec, fl.tenants), "vm0")
                assert not started_rec.on_candidate(hand[0], STEPS), started_rec
                hand_from = await restart_by_hand(rig, guests, *hand)
                hand_rec = await read_record(fl)
                assert hand_rec is not None and hand_rec.phase is RotationPhase.CANARY, hand_rec
                busy = busy_waves(started_rec, fl.tenants)
                targets = sorted(rng.choice(busy) for _ in range(KILLS))
                kills.append(f"waves restarting VMs: {busy}; {hand[0]}/{hand[1]} restarted by hand in the canary")
                for i, target in enumerate(targets):
                    await eventually(functools.partial(_wave_reached, fl, target), timeout=120, interval=0.1,
                                     what=f"wave {target} (seed {SEED}: {kills})")
                    delay = rng.uniform(0.0, 2.5)
                    kills.append(f"kill {i + 1}: {delay:.2f}s into wave {target} or later")
                    await asyncio.sleep(delay)
                    rec = await kill_leader(ctls, rng=rng, fl=fl, log=kills)
                    # A kill after the promotion would not be a kill during the rotation.
                    assert rec is None or rec.phase is not RotationPhase.PROMOTED, (SEED, kills)
                rec = await eventually(lambda: _phase_is(fl, RotationPhase.PROMOTED), timeout=300, interval=0.25,
                                       what=f"candidate promoted (seed {SEED}: {kills})")
                assert rec is not None
                assert rec.candidate == candidate and rec.stable == stable, rec
                promoted = rec

                hand_boots = guests.boots(*hand)
                assert len(hand_boots) == 3 and hand_boots[0] == hand_from, (hand, hand_boots)
                assert (hand_boots[1].source_revision, hand_boots[1].token_sha256, hand_boots[1].profile) == (
                    stable, sha(fl.token), "licensed"), ("restarted by hand in the canary", hand, hand_boots)
                finals = await source_revisions(fl)
                assert finals == {ns: rec.revision_for(ns, STEPS) for ns in fl.tenants} == dict.fromkeys(
                    fl.tenants, candidate)
                by_hand = {f"{ns}/{name}": int((ns, name) == hand) for ns, name in vms}
                assert restarts(rig, vms) == {k: 1 + n for k, n in by_hand.items()}, (SEED, kills)
                for ns, name in vms:
                    boot = guests.last_boot(ns, name)
                    assert boot is not None and len(guests.boots(ns, name)) == 2 + by_hand[f"{ns}/{name}"], (
                        ns, name, guests.boots(ns, name))
                    assert (boot.source_revision, boot.token_sha256, boot.profile, boot.install_rc) == (
                        candidate, sha(good), "licensed", 0), (ns, name, boot)
                leader = await eventually(lambda: current_leader(ctls), timeout=30, what="a leader")
                assert leader is not None
                await leader.wait_metric("licensectl_guest_license_state", len(vms), timeout=6 * REPORT_INTERVAL,
                                         state="licensed")
                assert await source_events(fl, "RotationPromoted")
                assert not await source_events(fl, "RolloutAborted")

                # Undo after full promotion, the leader killed once at a random moment of it: every VM back on
                # stable, restarted exactly once more.
                undo_started = time.monotonic()
                await undo(fl, rig.kv.kubeconfig_path)
                delay = rng.uniform(0.0, 4.0)
                kills.append(f"undo kill: {delay:.2f}s after `rollout undo` returned")
                await asyncio.sleep(delay)
                before_kill = restarts(rig, vms)
                rec = await kill_leader(ctls, rng=rng, fl=fl, log=kills)
                assert rec is not None and rec.phase in (RotationPhase.PROMOTED, RotationPhase.UNDONE), (SEED, kills)
                want = {k: 2 + n for k, n in by_hand.items()}
                back = sum(before_kill.values()) - sum(want.values()) + len(vms)
                kills.append(f"undo kill landed with {back} of {len(vms)} VMs restarted back")
                # A kill once every VM was back would not be a kill during the undo.
                assert before_kill != want, (SEED, kills, before_kill)
                print("\n".join(kills))
                undone = await eventually(lambda: _phase_is(fl, RotationPhase.UNDONE), timeout=60, interval=0.25,
                                          what=f"rotation undone (seed {SEED}: {kills})")
                assert undone is not None
                assert (undone.stable, undone.candidate) == (stable, candidate), undone

                async def all_back() -> bool:
                    if restarts(rig, vms) != want:
                        return False
                    return all((b := guests.last_boot(ns, name)) is not None and b.source_revision == stable
                               for ns, name in vms)
                await eventually(all_back, timeout=180, interval=0.25,
                                 what=f"every VM back on stable (seed {SEED}: {kills})")
                leader = await eventually(lambda: current_leader(ctls), timeout=30, what="a leader")
                assert leader is not None
                await leader.wait_metric("licensectl_guest_license_state", len(vms), timeout=6 * REPORT_INTERVAL,
                                         state="licensed")
                print(f"undo of {len(vms)} VMs with one leader kill: {time.monotonic() - undo_started:.1f}s "
                      "from `rollout undo` to every VM back and licensed")
                # Quiet for a while: no VM restarts twice for the undo decision.
                await asyncio.sleep(3 * REPORT_INTERVAL)
            assert restarts(rig, vms) == want, (SEED, kills)
            for ns, name in vms:
                boots = guests.boots(ns, name)
                assert len(boots) == 3 + by_hand[f"{ns}/{name}"], (ns, name, boots)
                assert (boots[-1].source_revision, boots[-1].token_sha256, boots[-1].profile,
                        boots[-1].install_rc) == (stable, sha(fl.token), "licensed", 0), (ns, name, boots[-1])
            assert obs.unreadable == 0
            assert obs.records[-1] == undone
            assert promoted in obs.records
            assert obs.strays() == [], (SEED, kills, obs.strays())
            # The decisions went through every wave in order, none skipped, none aborted, then the undo.
            phases = [(r.phase, r.wave) for r in obs.records]
            assert phases == [(RotationPhase.STABLE, 0), (RotationPhase.CANARY, 0),
                              *((RotationPhase.PROMOTING, w) for w in range(1, len(STEPS) + 1)),
                              (RotationPhase.PROMOTED, len(STEPS)), (RotationPhase.UNDONE, len(STEPS))], (
                SEED, kills, phases)
            assert await source_revisions(fl) == {ns: undone.revision_for(ns, STEPS) for ns in fl.tenants} \
                == dict.fromkeys(fl.tenants, stable)
            # One Event for the one undo decision (a kill between the store write and the Event may lose it).
            assert len(await source_events(fl, "RolloutUndone")) <= 1
        finally:
            await guests.stop()
            guests.cleanup()
        assert sum(c.kills for c in ctls) == KILLS + 1
        for c in ctls:
            assert await c.stop() == 0, c.log_tail()
        assert_no_token_in_logs(ctls, fl.tokens)


async def test_bad_candidate_aborts_through_a_leader_kill_and_only_the_canary_ever_ran_it(
        api_client: ApiClient, rig: Rig) -> None:
    rng = random.Random(f"bad:{SEED}")
    print(f"rotation kill seed {SEED} (LICENSECTL_ROTATION_KILL_SEED)")
    fl = rig.fleet
    bad = token_for(200, rotation="bad")
    kills: list[str] = []
    async with controllers() as started:
        ctls, guests, vms = await up_and_reporting(rig, started, licensed_unless({bad}))
        stable = content_revision(fl.token, None)
        try:
            async with observing(fl) as obs:
                await fl.put_token(bad)
                delay = rng.uniform(0.5, 8.0)
                kills.append(f"kill after {delay:.2f}s")
                await asyncio.sleep(delay)
                await kill_leader(ctls, rng=rng, fl=fl, log=kills)
                print("\n".join(kills))
                rec = await eventually(lambda: _phase_is(fl, RotationPhase.ABORTED), timeout=180, interval=0.25,
                                       what=f"candidate aborted (seed {SEED}: {kills})")
                assert rec is not None
                assert rec.candidate == content_revision(bad, None) and rec.stable == stable, rec
                assert "acquire_failed" in rec.reason, rec.reason
                canary = set(rec.canary)
                assert canary and canary <= set(fl.tenants), rec
                canary_vms = [(ns, name) for ns, name in vms if ns in canary]
                others = [(ns, name) for ns, name in vms if ns not in canary]
                stable_replica = await eventually(fl.revision, timeout=30, what="every replica on one revision")
                assert stable_replica is not None
                await eventually(lambda: fl.all_done(canary_vms, stable_replica), timeout=120, interval=0.25,
                                 what=f"canary VMs back on stable (seed {SEED}: {kills})")
                # Quiet for a while: nothing else restarts afterwards.
                await asyncio.sleep(3 * REPORT_INTERVAL)
            assert obs.unreadable == 0
            assert obs.records[-1] == rec
            assert obs.strays() == [], (SEED, kills, obs.strays())
            phases = [(r.phase, r.wave) for r in obs.records]
            assert phases == [(RotationPhase.STABLE, 0), (RotationPhase.CANARY, 0), (RotationPhase.ABORTED, 0)], \
                (SEED, kills, phases)
            assert await source_revisions(fl) == {ns: rec.revision_for(ns, STEPS) for ns in fl.tenants} \
                == dict.fromkeys(fl.tenants, stable)

            counts = restarts(rig, vms)
            assert counts == {f"{ns}/{name}": 2 if ns in canary else 0 for ns, name in vms}, (SEED, kills, counts)
            bad_sha = sha(bad)
            ran_bad = [(ns, name) for ns, name in vms if any(b.token_sha256 == bad_sha for b in guests.boots(ns, name))]
            assert ran_bad and set(ran_bad) <= set(canary_vms), (ran_bad, canary_vms)
            for ns, name in canary_vms:
                boot = guests.last_boot(ns, name)
                assert boot is not None and (boot.source_revision, boot.token_sha256, boot.profile) == (
                    stable, sha(fl.token), "licensed"), (ns, name, guests.boots(ns, name))
            for ns, name in others:
                assert [b.source_revision for b in guests.boots(ns, name)] == [stable], (ns, name)
            aborted = await source_events(fl, "RolloutAborted")
            assert len(aborted) == 1 and aborted[0].type == "Warning", aborted
            assert rec.candidate[:12] in aborted[0].message
        finally:
            await guests.stop()
            guests.cleanup()
        assert sum(c.kills for c in ctls) == 1
        for c in ctls:
            assert await c.stop() == 0, c.log_tail()
        assert_no_token_in_logs(ctls, fl.tokens)
