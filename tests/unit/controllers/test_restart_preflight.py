"""The restart pre-flight in the rollout loop, against in-memory caches and KubeVirt and a scripted admission
answer: a VM whose new VMI would be refused is never restarted and holds no slot, the refusal is recorded on
the VM (a new process reads it), said in an Event, the status and a gauge, and asked about again later. The
dry-run wire call itself runs on the real apiserver in tests/e2e/test_restart_preflight.py."""

from __future__ import annotations

from licensectl.controllers.restart_preflight import RestartGate
from licensectl.controllers.rollout_loop import RolloutController
from licensectl.core import preflight
from licensectl.core.model import Vm
from licensectl.core.ports import RestartResult
from licensectl.core.preflight import Admission
from licensectl.core.rollout import Phase, RestartVm, RolloutPlan, VmiState
from licensectl.core.timecodec import format_micro_time
from licensectl.metrics import Metrics
from licensectl_dev.testkit.memory import ManualClock, MemoryCaches, MemoryEvents, MemoryKubevirt

from .test_rollout_loop import World

DENIAL = ('admission webhook "vmi-boot-image.licensectl.io" denied the request: licensectl: the boot image is '
          'not marked as carrying the NVIDIA vGPU guest driver')


class Admission_:
    """Scripted answers: VMs in `refused` are refused with DENIAL (or `unanswered`), the rest admitted."""

    def __init__(self, refused: set[tuple[str, str]], *, answered: bool = True) -> None:
        self.refused = refused
        self.answered = answered
        self.asked: list[tuple[str, str]] = []

    async def admits(self, namespace: str, vm: str) -> Admission:
        self.asked.append((namespace, vm))
        if (namespace, vm) in self.refused:
            return Admission(False, DENIAL if self.answered else "dry-run create not answered: TimeoutError",
                             answered=self.answered)
        return Admission(True)


def gated(w: World, check: Admission_) -> RolloutController:
    """A fresh process (nothing but the cluster in memory) whose restarts are pre-flighted by `check`."""
    loop = w.new_process()
    gate = RestartGate(check, kubevirt=w.kubevirt, events=w.events, metrics=w.metrics, clock=w.clock.now)
    return RolloutController(caches=w.caches, kubevirt=w.kubevirt, events=w.events, metrics=w.metrics,
                             settings=w.settings, guests=loop.guests, clock=w.clock.now,
                             monotonic=w.clock.monotonic, preflight=gate)


def preflights(w: World, result: str) -> float:
    return w.metrics.registry.get_sample_value("licensectl_restart_preflights_total", {"result": result}) or 0.0


async def test_a_refused_vm_is_never_restarted_holds_no_slot_and_the_rest_completes() -> None:
    w = World([("tenant-a", "vm1"), ("tenant-a", "vm2"), ("tenant-b", "vm3")])  # max_unavailable 1
    check = Admission_({("tenant-a", "vm1")})
    w.loop = gated(w, check)
    held_uid = w.kubevirt.vmis[("tenant-a", "vm1")].uid
    for _ in range(10):
        await w.loop.reconcile()
    assert ("tenant-a", "vm1") not in w.kubevirt.restarted()
    assert sorted(w.kubevirt.restarted()) == [("tenant-a", "vm2"), ("tenant-b", "vm3")]
    assert w.kubevirt.vmis[("tenant-a", "vm1")].uid == held_uid
    assert w.states() == {"vm1": VmiState.BLOCKED, "vm2": VmiState.DONE, "vm3": VmiState.DONE}
    assert w.phase() is Phase.COMPLETE  # held is not in progress
    ann = w.kubevirt.vms[("tenant-a", "vm1")].annotations
    assert ann[preflight.ANN_PREFLIGHT_DENIED] == DENIAL and ann[preflight.ANN_PREFLIGHT_VMI_UID] == held_uid
    (row,) = [r for r in w.loop.status_dict()["vmis"] if r["vmi"] == "vm1"]
    assert row["state"] == "blocked" and DENIAL in row["reason"]
    (ev,) = [e for e in w.events.emitted if e[2] == "RestartPreflightDenied"]
    assert (ev[0].kind, ev[0].namespace, ev[0].name) == ("VirtualMachine", "tenant-a", "vm1") and DENIAL in ev[3]
    assert check.asked.count(("tenant-a", "vm1")) == 1  # the recorded hold is not asked about again meanwhile
    assert preflights(w, "denied") == 1 and preflights(w, "admitted") == 2
    assert w.loop.preflight is not None
    held = {s.labels: s.value for s in w.loop.preflight.samples(w.loop.plan, w.caches.vms.cache)}
    assert held == {(("namespace", "tenant-a"),): 1.0}


async def test_a_new_leader_holds_from_the_record_and_asks_again_only_after_the_recheck_time() -> None:
    w = World([("tenant-a", "vm1")])
    check = Admission_({("tenant-a", "vm1")})
    w.loop = gated(w, check)
    await w.loop.reconcile()
    assert check.asked == [("tenant-a", "vm1")] and w.kubevirt.restarted() == []
    # A new process knows only the cluster: it holds from the VM's record, without asking.
    check.asked.clear()
    w.loop = gated(w, check)
    for _ in range(3):
        await w.loop.reconcile()
    assert check.asked == [] and w.states() == {"vm1": VmiState.BLOCKED}
    plan = w.loop.plan
    assert plan is not None and plan.next_wakeup is not None
    hold = preflight.hold_of(w.kubevirt.vms[("tenant-a", "vm1")].annotations)
    assert hold is not None and plan.next_wakeup == hold.recheck_at
    # The hoster fixes the cause; at the recheck time the VM is asked about again, admitted, restarted, and
    # the intent write drops the record.
    check.refused.clear()
    w.clock.advance(preflight.RECHECK_SECONDS)
    for _ in range(4):
        await w.loop.reconcile()
    assert w.kubevirt.restarted() == [("tenant-a", "vm1")]
    assert not set(preflight.HOLD_ANNOTATIONS) & set(w.kubevirt.vms[("tenant-a", "vm1")].annotations)
    assert w.states() == {"vm1": VmiState.DONE}


async def test_a_leader_killed_before_the_refusal_was_recorded_leaves_a_successor_that_asks_and_holds() -> None:
    w = World([("tenant-a", "vm1")])
    check = Admission_({("tenant-a", "vm1")})
    w.loop = gated(w, check)
    real = w.kubevirt.annotate_vm

    async def killed(**kw: object) -> bool:
        raise RuntimeError("the process died between the answer and the record")

    w.kubevirt.annotate_vm = killed  # type: ignore[method-assign]
    await w.loop.reconcile()  # one VM's trouble is logged, the pass goes on: nothing was written
    w.kubevirt.annotate_vm = real  # type: ignore[method-assign]
    assert w.kubevirt.restarted() == [] and not set(preflight.HOLD_ANNOTATIONS) & set(
        w.kubevirt.vms[("tenant-a", "vm1")].annotations)
    w.loop = gated(w, check)
    for _ in range(3):
        await w.loop.reconcile()
    assert w.kubevirt.restarted() == [] and len(check.asked) == 2 and w.states() == {"vm1": VmiState.BLOCKED}


async def test_an_unanswered_preflight_holds_too_and_says_it_could_not_check() -> None:
    w = World([("tenant-a", "vm1")])
    w.loop = gated(w, Admission_({("tenant-a", "vm1")}, answered=False))
    await w.loop.reconcile()
    await w.loop.reconcile()
    assert w.kubevirt.restarted() == [] and w.states() == {"vm1": VmiState.BLOCKED}
    (ev,) = [e for e in w.events.emitted if e[2] == "RestartPreflightDenied"]
    assert "could not be checked" in ev[3] and preflights(w, "unanswered") == 1


async def test_a_refused_reissue_is_not_made_and_the_vm_counts_as_held() -> None:
    w = World([("tenant-a", "vm1")], restart_reissue_seconds=10.0)
    check = Admission_(set())
    w.loop = gated(w, check)
    lost = w.kubevirt.restart

    async def lost_call(**kw: object) -> RestartResult:
        return RestartResult.ISSUED  # the intent went out, the call was lost: the VMI runs on untouched

    w.kubevirt.restart = lost_call  # type: ignore[method-assign]
    await w.loop.reconcile()
    w.kubevirt.restart = lost  # type: ignore[method-assign]
    check.refused.add(("tenant-a", "vm1"))
    w.clock.advance(11.0)
    for _ in range(3):
        await w.loop.reconcile()
    assert w.kubevirt.restarted() == [] and w.states() == {"vm1": VmiState.BLOCKED}
    assert check.asked == [("tenant-a", "vm1")] * 2  # the first restart, then its re-issue
    assert w.phase() is Phase.COMPLETE


async def test_only_workers_not_yet_in_a_drain_cycle_are_screened_before_their_cordon() -> None:
    clock = ManualClock()
    events = MemoryEvents()
    kubevirt = MemoryKubevirt(MemoryCaches(), clock)
    check = Admission_({("ns", "w1"), ("ns", "w2")})
    gate = RestartGate(check, kubevirt=kubevirt, events=events, metrics=Metrics(), clock=clock.now)
    now = clock.now()
    picks = [RestartVm("ns", name, f"uid-{name}", "r1", "lic", now, now, drained=True) for name in ("w1", "w2", "w3")]
    plain = RestartVm("ns", "plain", "uid-p", "r1", "lic", now, now)
    plan = RolloutPlan(actions=(*picks, plain), vmi_states={}, sources={}, next_wakeup=None)
    vms = {("ns", "w1"): Vm("ns", "w1", "Always"),
           ("ns", "w2"): Vm("ns", "w2", "Always", {"licensectl.io/drain-step": "drain",
                                                   "licensectl.io/drain-step-at": format_micro_time(now)}),
           ("ns", "w3"): Vm("ns", "w3", "Always"), ("ns", "plain"): Vm("ns", "plain", "Always")}
    screened = await gate.screen_workers(plan, vms)
    assert [(r.vm) for r in screened.restarts] == ["w2", "w3", "plain"]
    assert check.asked == [("ns", "w1"), ("ns", "w3")]  # w2's cycle is open; the plain VM is asked at its restart
    assert [r.vm for r in plan.restarts] == ["w1", "w2", "w3", "plain"]  # the plan itself is not changed
