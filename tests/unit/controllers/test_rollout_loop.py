"""The rollout loop (rollout_controller.py) against in-memory caches and KubeVirt: the order of its
writes, the live check of the target, the limits, the failure pause, and a restart after a crash
re-derived from the cluster alone. The pure planner has its own tests (test_rollout.py); the loop
runs against the real apiserver in tests/integration/test_rollout.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import random
import threading
from collections import Counter

import pytest

from licensectl.config import Settings
from licensectl.controllers.guests import MISSED_INTERVALS, GuestStore
from licensectl.controllers.rollout_loop import PlanInputs, RolloutController
from licensectl.core.model import (
    ANN_CLASS,
    ANN_RESTART_REVISION,
    ANN_RESTART_VMI_UID,
    ANN_REVISION,
    ANN_REVISION_TIME,
    ANN_ROLLOUT_PAUSED,
    ANN_ROLLOUT_RESUMED_AT,
    ANN_SOURCE_NAME,
    ANN_SOURCE_NAMESPACE,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    ObjectRef,
    ReplicaSecret,
    SourceSecret,
)
from licensectl.core.ports import RestartResult
from licensectl.core.rollout import Phase, RolloutPlan, VmiState
from licensectl.core.timecodec import format_micro_time
from licensectl.metrics import Metrics
from licensectl_dev.testkit.memory import ManualClock, MemoryCaches, MemoryEvents, MemoryKubevirt

SRC = ObjectRef("licensectl-system", "vws-token")
REPLICA = "license-vws"
REV = "a" * 64


class World:
    """VMs mounting one replica each, a revision made `age` seconds ago; one loop (a "process")."""

    def __init__(self, vms: list[tuple[str, str]], **settings: object) -> None:
        self.clock = ManualClock()
        self.caches = MemoryCaches()
        self.kubevirt = MemoryKubevirt(self.caches, self.clock)
        self.settings = Settings(**{"settle_seconds": 0.0, "max_unavailable": "1", **settings})  # type: ignore[arg-type]
        started = self.clock.now() - dt.timedelta(hours=1)
        self.revision_time = self.clock.now()
        for ns in sorted({ns for ns, _ in vms}):
            self.caches.replicas.put(replica(ns, REV, self.revision_time))
        for ns, name in vms:
            self.kubevirt.add(ns, name, secret_volumes=(REPLICA,), started=started)
        self.set_source()
        self.events = MemoryEvents()
        self.metrics = Metrics()
        self.clock.advance(3.0)  # past the minimum settle time
        self.loop = self.new_process()

    def new_process(self) -> RolloutController:
        """A fresh controller: no memory beyond what the cluster holds. Its guests report to it, and it
        has listened for a silence window already (the wait after a takeover is tested in test_rollout_no_harm)."""
        guests = GuestStore(60.0)
        guests.start_receiving(self.clock.now() - dt.timedelta(seconds=MISSED_INTERVALS * 60.0))
        return RolloutController(caches=self.caches, kubevirt=self.kubevirt, events=self.events,
                                 metrics=self.metrics, settings=self.settings, guests=guests,
                                 clock=self.clock.now, monotonic=self.clock.monotonic)

    def set_source(self, **annotations: str) -> None:
        self.caches.source_secrets[SRC] = SourceSecret(SRC.namespace, SRC.name, "uid-src", "1", {}, annotations)
        self.caches.ensure_sources([SRC])

    def states(self) -> dict[str, VmiState]:
        plan = self.loop.plan
        assert plan is not None
        return {vm: st.state for (_, vm), st in plan.vmi_states.items()}

    def phase(self) -> Phase:
        assert self.loop.plan is not None
        return self.loop.plan.sources[SRC].phase

    def restarts(self, result: str) -> float:
        value = self.metrics.registry.get_sample_value("licensectl_restarts_total", {"result": result})
        return value or 0.0


def replica(namespace: str, revision: str, at: dt.datetime) -> ReplicaSecret:
    return ReplicaSecret(namespace=namespace, name=REPLICA, uid=f"uid-{namespace}", resource_version="1",
                         labels={MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                         annotations={ANN_CLASS: "vws", ANN_REVISION: revision,
                                      ANN_REVISION_TIME: format_micro_time(at),
                                      ANN_SOURCE_NAMESPACE: SRC.namespace, ANN_SOURCE_NAME: SRC.name})


async def test_intent_is_written_before_the_restart_and_vmis_roll_one_at_a_time() -> None:
    w = World([("tenant-a", "vm1"), ("tenant-b", "vm2"), ("tenant-c", "vm3")])
    first_uid = w.kubevirt.vmis[("tenant-a", "vm1")].uid
    await w.loop.reconcile()
    # No live read: the VM shows no restart of ours that could have replaced the target (the intent
    # write, guarded by the planned resourceVersion, proved that view current).
    assert w.kubevirt.ops == [("annotate", "tenant-a", "vm1"), ("restart", "tenant-a", "vm1")]
    vm = w.kubevirt.vms[("tenant-a", "vm1")]
    assert vm.annotations[ANN_RESTART_REVISION] == REV and vm.annotations[ANN_RESTART_VMI_UID] == first_uid
    for _ in range(6):
        await w.loop.reconcile()
    assert w.kubevirt.restarted() == [("tenant-a", "vm1"), ("tenant-b", "vm2"), ("tenant-c", "vm3")]
    assert w.states() == {"vm1": VmiState.DONE, "vm2": VmiState.DONE, "vm3": VmiState.DONE}
    assert w.phase() is Phase.COMPLETE
    reasons = w.events.reasons()
    # Routine restarts are counted, not announced: the phase changes are the only Events.
    assert reasons == ["RolloutStarted", "RolloutCompleted"]
    assert w.metrics.registry.get_sample_value("licensectl_restarts_total", {"result": "issued"}) == 3
    assert w.metrics.registry.get_sample_value("licensectl_restarts_total", {"result": "done"}) == 3
    for _ in range(3):
        await w.loop.reconcile()
    assert len(w.kubevirt.restarted()) == 3  # complete: nothing more to do


class VmiWatchLags(MemoryKubevirt):
    """The VM watch delivers at once, the VMI watch only on `publish()` (cut, or far behind)."""

    def _changed(self) -> None:
        self._vm_cache.put(*self.vms.values())

    def effective(self) -> list[tuple[str, str, str]]:
        """(namespace, vm, revision of the VM's intent) for every call that replaced a running VMI."""
        return list(self.replaced)

    async def restart(self, *, namespace: str, vm: str, vmi_uid: str, run_strategy: str | None) -> RestartResult:
        key = (namespace, vm)
        before = self.vmis.get(key)
        res = await super().restart(namespace=namespace, vm=vm, vmi_uid=vmi_uid, run_strategy=run_strategy)
        after = self.vmis.get(key)
        if before is not None and after is not None and after.uid != before.uid:
            self.replaced.append((namespace, vm, self.vms[key].annotations[ANN_RESTART_REVISION]))
        return res

    replaced: list[tuple[str, str, str]]


def vmi_watch_lags(w: World) -> VmiWatchLags:
    """Swap in a KubeVirt whose VMI watch lags, over the same objects (and uid/rv counters)."""
    k = VmiWatchLags(w.caches, w.clock)
    k.vms, k.vmis, k._versions, k.replaced = w.kubevirt.vms, w.kubevirt.vmis, w.kubevirt._versions, []
    w.kubevirt = k
    w.loop = w.new_process()
    return k


async def test_a_reissue_reads_the_target_live_and_never_restarts_its_replacement() -> None:
    w = World([("tenant-a", "vm1")], restart_reissue_seconds=60.0)
    k = vmi_watch_lags(w)
    key = ("tenant-a", "vm1")
    first = k.vmis[key].uid
    await w.loop.reconcile()  # intent, restart: the VMI is replaced, but the VMI cache still shows it
    assert k.restarted() == [key] and k.vmis[key].uid != first
    assert w.caches.vmis is not None and w.caches.vmis.cache[key].uid == first
    for _ in range(3):
        await w.loop.reconcile()
    assert w.states() == {"vm1": VmiState.RESTARTING}
    # Past the re-issue delay the lagging cache still shows the target untouched: the call may have
    # been lost, so it is re-issued -- but only after the live read, which sees the replacement.
    w.clock.advance(61.0)
    k.ops.clear()
    await w.loop.reconcile()
    assert k.ops == [("annotate", "tenant-a", "vm1"), ("live-get", "tenant-a", "vm1")]
    assert k.restarted() == [] and k.effective() == [("tenant-a", "vm1", REV)]
    assert w.restarts(RestartResult.STALE_TARGET.value) == 1.0
    k.publish()
    for _ in range(3):
        await w.loop.reconcile()
    assert w.states() == {"vm1": VmiState.DONE}


async def test_a_first_restart_from_a_lagging_view_restarts_what_runs_exactly_once() -> None:
    # Someone else replaced the VMI in the lag of the VMI watch (not a restart of ours: the VM carries
    # no intent). The restart call meets the replacement: one restart, recorded and tracked as ours.
    w = World([("tenant-a", "vm1")])
    k = vmi_watch_lags(w)
    key = ("tenant-a", "vm1")
    k.vmis[key] = dataclasses.replace(k.vmis[key], uid="vmi-replaced-meanwhile")
    await w.loop.reconcile()
    assert ("live-get", "tenant-a", "vm1") not in k.ops
    assert k.effective() == [("tenant-a", "vm1", REV)]
    for _ in range(4):
        w.clock.advance(30.0)
        await w.loop.reconcile()
    k.publish()
    for _ in range(3):
        await w.loop.reconcile()
    assert k.effective() == [("tenant-a", "vm1", REV)]
    assert w.states() == {"vm1": VmiState.DONE}


async def test_a_forgiven_failure_seen_through_a_lagging_watch_is_not_restarted_twice() -> None:
    # The restart took effect, but the VMI watch never showed it: the restart times out as failed and
    # pauses the rollout; the hoster resumes, and the VM is planned afresh for the same revision.
    w = World([("tenant-a", "vm1")], max_failures=1, restart_timeout_seconds=30.0,
              restart_reissue_seconds=1000.0)
    k = vmi_watch_lags(w)
    await w.loop.reconcile()
    assert k.effective() == [("tenant-a", "vm1", REV)]
    w.clock.advance(31.0)
    await w.loop.reconcile()
    assert w.states() == {"vm1": VmiState.FAILED} and w.phase() is Phase.PAUSED
    w.set_source(**{ANN_ROLLOUT_RESUMED_AT: format_micro_time(w.clock.now())})
    w.clock.advance(1000.0)  # past the hold on the same target
    k.ops.clear()
    for _ in range(3):
        await w.loop.reconcile()
    assert ("live-get", "tenant-a", "vm1") in k.ops
    assert k.effective() == [("tenant-a", "vm1", REV)]  # the live read saw the replacement
    k.publish()
    for _ in range(3):
        await w.loop.reconcile()
    assert w.states() == {"vm1": VmiState.DONE}


@pytest.mark.parametrize("seed", range(12))
async def test_lagging_vmi_watch_lost_calls_and_crashes_never_restart_a_vmi_twice_per_revision(seed: int) -> None:
    rng = random.Random(seed)
    vms = [(f"tenant-{c}", f"vm{i}") for c in "abc" for i in range(2)]
    w = World(vms, max_unavailable="3", restart_reissue_seconds=5.0, restart_timeout_seconds=3600.0)
    k = vmi_watch_lags(w)
    revisions = [REV]
    for step in range(120):
        if step == 40:  # a second rotation while the first may still be under way
            revisions.append("b" * 64)
            for ns in sorted({ns for ns, _ in vms}):
                w.caches.replicas.put(replica(ns, revisions[-1], w.clock.now()))
            w.clock.advance(3.0)
        if rng.random() < 0.25:
            k.publish()  # the VMI watch catches up, now and then
        k.calls_lost = rng.random() < 0.15
        if rng.random() < 0.1:
            w.loop = w.new_process()  # a crash: only the cluster remembers
        with contextlib.suppress(ConnectionResetError):
            await w.loop.reconcile()
        w.clock.advance(rng.choice([0.5, 2.0, 6.0]))
    k.calls_lost = False
    for _ in range(40):  # the watch heals: the rollout completes
        k.publish()
        await w.loop.reconcile()
        w.clock.advance(6.0)
    per_revision = Counter(k.effective())
    assert per_revision and max(per_revision.values()) == 1, per_revision
    assert all((ns, vm, revisions[-1]) in per_revision for ns, vm in vms)
    assert set(w.states().values()) == {VmiState.DONE}


async def test_limits_hold_while_restarted_vmis_are_not_ready() -> None:
    w = World([("tenant-a", f"vm{i}") for i in range(4)] + [("tenant-b", "vm9")], max_unavailable="5")
    w.kubevirt.come_back_ready = False
    for _ in range(4):
        await w.loop.reconcile()
        w.clock.advance(1.0)
    # One unavailable VMI per namespace at a time, though the global limit would allow five.
    assert sorted(w.kubevirt.restarted()) == [("tenant-a", "vm0"), ("tenant-b", "vm9")]
    assert w.phase() is Phase.PROGRESSING


async def test_the_global_unavailability_limit_holds_across_namespaces() -> None:
    w = World([(f"tenant-{c}", "vm") for c in "abcd"], max_unavailable="2")
    w.kubevirt.come_back_ready = False
    for _ in range(4):
        await w.loop.reconcile()
    assert len(w.kubevirt.restarted()) == 2


async def test_failed_restarts_pause_the_rollout_until_resumed() -> None:
    w = World([(f"tenant-{c}", "vm") for c in "abcd"], max_failures=2, restart_timeout_seconds=30.0,
              restart_reissue_seconds=1000.0)
    w.kubevirt.stuck = set(w.kubevirt.vms)  # restart calls are accepted but never take effect
    for _ in range(6):
        await w.loop.reconcile()
        w.clock.advance(31.0)
    await w.loop.reconcile()
    assert w.kubevirt.restarted() == [("tenant-a", "vm"), ("tenant-b", "vm")]
    assert w.phase() is Phase.PAUSED
    assert w.restarts("failed") == 2.0
    assert "RolloutPaused" in w.events.reasons()
    # The hoster resumes: earlier failures are forgiven and the rollout goes on.
    w.kubevirt.stuck.clear()
    w.set_source(**{ANN_ROLLOUT_RESUMED_AT: format_micro_time(w.clock.now())})
    w.clock.advance(1.0)
    for _ in range(8):
        await w.loop.reconcile()
    assert w.kubevirt.restarted()[2:] == [("tenant-c", "vm"), ("tenant-d", "vm")]
    assert w.phase() is Phase.PROGRESSING
    # The failed ones are planned afresh once their earlier call can no longer be in flight.
    w.clock.advance(1000.0)
    for _ in range(6):
        await w.loop.reconcile()
    assert sorted(w.kubevirt.restarted()[4:]) == [("tenant-a", "vm"), ("tenant-b", "vm")]
    assert w.phase() is Phase.COMPLETE


async def test_a_manual_pause_stops_new_restarts() -> None:
    w = World([("tenant-a", "vm1"), ("tenant-b", "vm2")])
    w.set_source(**{ANN_ROLLOUT_PAUSED: "true"})
    for _ in range(3):
        await w.loop.reconcile()
    assert w.kubevirt.ops == []
    assert w.phase() is Phase.PAUSED


async def test_a_crash_between_intent_and_restart_never_restarts_twice() -> None:
    w = World([("tenant-a", "vm1")], restart_reissue_seconds=60.0)
    w.kubevirt.calls_lost = True  # the process dies after the intent, before the restart call
    await w.loop.reconcile()
    w.kubevirt.calls_lost = False
    assert w.kubevirt.vms[("tenant-a", "vm1")].annotations[ANN_RESTART_REVISION] == REV  # intent written
    assert w.kubevirt.restarted() == []
    # A new process finds the intent: the target may have been restarted already, so it waits.
    w.loop = w.new_process()
    w.kubevirt.ops.clear()
    await w.loop.reconcile()
    assert w.kubevirt.ops == []
    assert w.states() == {"vm1": VmiState.RESTARTING}
    # After the re-issue delay, one restart for the very VMI the intent names.
    w.clock.advance(61.0)
    await w.loop.reconcile()
    assert w.kubevirt.restarted() == [("tenant-a", "vm1")]
    for _ in range(3):
        await w.loop.reconcile()
    assert w.kubevirt.restarted() == [("tenant-a", "vm1")]
    assert w.states() == {"vm1": VmiState.DONE}


async def test_a_crash_after_the_restart_is_picked_up_as_done() -> None:
    w = World([("tenant-a", "vm1"), ("tenant-b", "vm2")])
    await w.loop.reconcile()
    assert w.kubevirt.restarted() == [("tenant-a", "vm1")]
    w.loop = w.new_process()  # died before recording the result
    for _ in range(4):
        await w.loop.reconcile()
    assert w.kubevirt.restarted() == [("tenant-a", "vm1"), ("tenant-b", "vm2")]
    assert w.states() == {"vm1": VmiState.DONE, "vm2": VmiState.DONE}


async def test_no_restart_while_the_webhook_is_not_seen_to_deliver_and_status_says_why() -> None:
    w = World([("tenant-a", "vm1")])
    ready = [False]
    w.loop = RolloutController(caches=w.caches, kubevirt=w.kubevirt, events=w.events, metrics=w.metrics,
                               settings=w.settings, guests=w.loop.guests, clock=w.clock.now,
                               monotonic=w.clock.monotonic, delivery_ready=lambda: ready[0])
    for _ in range(3):
        await w.loop.reconcile()
    assert w.kubevirt.restarted() == [] and w.phase() is Phase.PAUSED
    status = w.loop.status_dict()["sources"][str(SRC)]
    assert status["pause_reason"] == "webhook" and "admission webhook" in status["message"]
    paused = {s.labels: s.value for s in w.loop.samples() if s.name == "rollout_paused"}
    assert paused[(("source_namespace", SRC.namespace), ("source_name", SRC.name), ("reason", "webhook"))] == 1.0
    ready[0] = True
    await w.loop.reconcile()
    assert w.kubevirt.restarted() == [("tenant-a", "vm1")]


async def test_a_controller_that_just_took_over_waits_for_guest_evidence_before_judging_by_time() -> None:
    w = World([("tenant-a", "vm1")])
    guests = GuestStore(60.0)
    guests.start_receiving(w.clock.now())  # just became leader: heard from nobody yet
    w.loop = RolloutController(caches=w.caches, kubevirt=w.kubevirt, events=w.events, metrics=w.metrics,
                               settings=w.settings, guests=guests, clock=w.clock.now, monotonic=w.clock.monotonic)
    await w.loop.reconcile()
    assert w.kubevirt.restarted() == [] and w.states() == {"vm1": VmiState.AWAITING_EVIDENCE}
    (row,) = w.loop.status_dict()["vmis"]
    assert (row["state"], row["rule"]) == ("awaiting-evidence", "report")
    assert w.loop.plan is not None and w.loop.plan.next_wakeup == guests.evidence_complete_at()
    w.clock.advance(MISSED_INTERVALS * 60.0)  # a silent guest: judged by time after the window
    await w.loop.reconcile()
    assert w.kubevirt.restarted() == [("tenant-a", "vm1")]


async def test_the_plan_is_made_off_the_event_loop_which_keeps_serving_meanwhile() -> None:
    """A plan over a large fleet takes a second of CPU: made on the loop it would hold up Lease
    renewals, watch reads and guest reports. Here the plan waits until a task on the loop has run, which
    only works while the plan is made elsewhere; and a VM written while the plan is under way changes
    nothing in it (the plan is made from the copies gathered when the pass began)."""
    w = World([("tenant-a", "vm1"), ("tenant-b", "vm2")])
    loop_thread = threading.get_ident()
    loop_ran = threading.Event()
    planned_in: list[int] = []
    plan_from = w.loop.plan_from

    def slow_plan(inputs: PlanInputs) -> RolloutPlan:
        planned_in.append(threading.get_ident())
        assert loop_ran.wait(timeout=10), "the event loop did not run while the plan was being made"
        return plan_from(inputs)

    async def meanwhile() -> None:
        await asyncio.sleep(0)
        assert w.caches.vms is not None
        w.caches.vms.remove(("tenant-b", "vm2"))  # as the VM watch would show a deleted VM
        loop_ran.set()

    w.loop.plan_from = slow_plan  # type: ignore[method-assign]
    try:
        task = asyncio.create_task(meanwhile())
        plan = await w.loop.reconcile()
        await task
    finally:
        w.loop.close()
    assert plan is not None and planned_in and planned_in[0] != loop_thread
    assert set(plan.vmi_states) == {("tenant-a", "vm1"), ("tenant-b", "vm2")}
    assert plan.vmi_states[("tenant-b", "vm2")].state is not VmiState.BLOCKED  # its VM was in the gathered view
    assert w.loop.plan_cpu_seconds >= 0.0


def test_a_pass_copies_the_caches_only_when_they_changed() -> None:
    """The gather runs on the event loop: its copies of 50,000 VMIs and VMs and its scan of every replica
    are made again only when the cache's generation moved, and then they show the change."""
    w = World([("tenant-a", "vm1"), ("tenant-b", "vm2")])
    first, again = w.loop.gather(), w.loop.gather()
    assert first is not None and again is not None
    assert again.vmis is first.vmis and again.vms is first.vms and again.replicas is first.replicas
    assert {v.name for v in first.vmis} == {"vm1", "vm2"} and len(first.replicas) == 2

    assert w.caches.vms is not None and w.caches.vmis is not None
    w.caches.vms.remove(("tenant-b", "vm2"))
    w.caches.replicas.remove(("tenant-b", REPLICA))
    changed = w.loop.gather()
    assert changed is not None
    assert [v.name for v in changed.vms] == ["vm1"] and changed.vmis is first.vmis
    assert [r.namespace for r in changed.replicas] == ["tenant-a"]
    assert [v.name for v in first.vms] == ["vm1", "vm2"]  # a copy handed out earlier never changes
