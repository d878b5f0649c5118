"""The rollout planner and tenant-cluster machines: control planes are manual, workers drain first, at most
the cluster's limit disrupted at once, a blocked drain closes its revision, a hold spends no budget."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from licensectl.core import drain, model
from licensectl.core.model import Vm, Vmi, frozen_map
from licensectl.core.rollout import PlanMemo, RolloutPlan, RolloutSettings, VmiState, plan_rollout
from tests.unit.core.rollout.test_rollout import ST, at, rep, vmi

WIDE = RolloutSettings(settle_seconds=60, max_unavailable="10", max_per_namespace=10, max_failures=3,
                       restart_timeout_seconds=600, manual_deadline_seconds=3600, done_gate="ready",
                       reissue_after_seconds=60)


def machine(ns: str, name: str, cluster: str, role: str = "worker", ann: Mapping[str, str] | None = None) -> Vm:
    labels = {model.LABEL_CAPI_CLUSTER_NAME: cluster, model.LABEL_CAPI_ROLE: role}
    return Vm(ns, name, "Always", frozen_map(ann), resource_version="7", labels=frozen_map(labels))


def open_cycle(step: drain.Step = drain.Step.DRAIN, rev: str = "r2", t: float = 100) -> dict[str, str]:
    return drain.DrainIntent(step, rev, at(t), at(t), node="n", cordoned=True,
                             vmi_uid="u" if step is drain.Step.RESTART else "").render_annotations()


def blocked(rev: str, reason: drain.BlockReason = drain.BlockReason.PDB_BLOCKED) -> dict[str, str]:
    return drain.DrainIntent(drain.Step.BLOCKED, rev, at(100), at(200), reason=reason).render_annotations()


def held(t: float, reason: drain.BlockReason = drain.BlockReason.CLUSTER_UNREACHABLE) -> dict[str, str]:
    return drain.Held(reason, at(t)).render_annotations()


def fleet(vms: Sequence[Vm]) -> tuple[list[Vmi], list[Vm]]:
    """Every VM runs a VMI started before revision r2 (t=0): all stale once it settles."""
    return [vmi(v.namespace, v.name) for v in vms], list(vms)


def plan(vms: Sequence[Vm], now: float = 300, *, st: RolloutSettings = WIDE,
         limits: Mapping[str, int] | None = None, memo: PlanMemo | None = None) -> RolloutPlan:
    vmis, vm_list = fleet(vms)
    replicas = [rep(ns, rev="r2") for ns in sorted({v.namespace for v in vms})]
    return plan_rollout(replicas=replicas, vmis=vmis, vms=vm_list, guests={}, sources={}, settings=st,
                        now=at(now), worker_limits=limits, memo=memo)


def picked(p: RolloutPlan) -> list[str]:
    return sorted(r.vm for r in p.restarts)


def test_a_control_plane_machine_is_manual_with_its_deadline_and_never_restarted() -> None:
    p = plan([machine("t-a", "cp-0", "k1", "control-plane")])
    st = p.vmi_states[("t-a", "cp-0")]
    assert st.state is VmiState.MANUAL and "control-plane machine of tenant cluster k1" in st.reason
    assert picked(p) == []
    late = plan([machine("t-a", "cp-0", "k1", "control-plane")], now=3700)
    assert late.vmi_states[("t-a", "cp-0")].overdue


def test_any_role_but_worker_counts_as_control_plane() -> None:
    p = plan([machine("t-a", "m", "k1", "etcd")])
    assert p.vmi_states[("t-a", "m")].state is VmiState.MANUAL and picked(p) == []


def test_one_worker_per_cluster_at_a_time_by_default() -> None:
    p = plan([machine("t-a", "w1", "k1"), machine("t-a", "w2", "k1"), machine("t-a", "v1", "k2"),
              Vm("t-a", "plain", "Always", resource_version="7")])
    assert picked(p) == ["plain", "v1", "w1"]
    # The drain shell restarts the machines; the rollout itself only the plain VM.
    assert {r.vm: r.drained for r in p.restarts} == {"plain": False, "v1": True, "w1": True}


def test_the_limit_is_per_cluster_of_a_namespace() -> None:
    p = plan([machine("t-a", "w1", "k1"), machine("t-b", "w1", "k1")])
    assert sorted((r.namespace, r.vm) for r in p.restarts) == [("t-a", "w1"), ("t-b", "w1")]


def test_a_hoster_raises_one_clusters_limit() -> None:
    vms = [machine("t-a", f"w{i}", "k1") for i in range(4)] + [machine("t-a", f"x{i}", "k2") for i in range(3)]
    p = plan(vms, limits={"t-a/k1": 3})
    assert picked(p) == ["w0", "w1", "w2", "x0"]


def test_the_default_limit_comes_from_the_settings() -> None:
    st = RolloutSettings(settle_seconds=60, max_unavailable="10", max_per_namespace=10, max_failures=3,
                         restart_timeout_seconds=600, manual_deadline_seconds=3600, done_gate="ready",
                         reissue_after_seconds=60, max_disrupted_workers=2)
    vms = [machine("t-a", f"w{i}", "k1") for i in range(4)]
    assert picked(plan(vms, st=st)) == ["w0", "w1"]


def test_an_open_cycle_is_draining_holds_a_slot_and_its_cluster() -> None:
    vms = [machine("t-a", "w1", "k1", ann=open_cycle()), machine("t-a", "w2", "k1"), machine("t-a", "v1", "k2")]
    p = plan(vms)
    assert p.vmi_states[("t-a", "w1")].state is VmiState.DRAINING
    assert picked(p) == ["v1"]  # w2 waits for w1's cycle; another cluster does not
    assert p.sources[rep().source].unavailable == 2  # the draining worker and v1's new pick
    assert p.sources[rep().source].phase.value == "progressing"
    assert set(p.drains) == {("t-a", "w1")}
    r = p.drains[("t-a", "w1")]
    assert (r.revision, r.replica, r.vm_resource_version) == ("r2", "nvidia-license", "7")


def test_a_cycle_past_its_restart_still_holds_its_cluster() -> None:
    # The restart step's VMI was replaced: the rollout tracks the restart; the cycle waits for the boot.
    vms = [machine("t-a", "w1", "k1", ann=open_cycle(drain.Step.WAIT_BOOT)), machine("t-a", "w2", "k1")]
    assert picked(plan(vms)) == []


def test_max_unavailable_counts_draining_workers() -> None:
    st = RolloutSettings(settle_seconds=60, max_unavailable="1", max_per_namespace=10, max_failures=3,
                         restart_timeout_seconds=600, manual_deadline_seconds=3600, done_gate="ready",
                         reissue_after_seconds=60)
    vms = [machine("t-a", "w1", "k1", ann=open_cycle()), Vm("t-a", "plain", "Always", resource_version="7")]
    assert picked(plan(vms, st=st)) == []


def test_a_held_cycle_spends_no_restart_budget() -> None:
    st = RolloutSettings(settle_seconds=60, max_unavailable="1", max_per_namespace=10, max_failures=3,
                         restart_timeout_seconds=600, manual_deadline_seconds=3600, done_gate="ready",
                         reissue_after_seconds=60)
    vms = [machine("t-a", "w1", "k1", ann={**open_cycle(), **held(250)}),
           Vm("t-a", "plain", "Always", resource_version="7")]
    p = plan(vms, st=st)
    assert p.vmi_states[("t-a", "w1")].state is VmiState.DRAINING
    assert "held: ClusterUnreachable" in p.vmi_states[("t-a", "w1")].reason
    assert picked(p) == ["plain"]


def test_a_drain_blocked_for_this_revision_is_blocked_and_frees_its_cluster() -> None:
    vms = [machine("t-a", "w1", "k1", ann=blocked("r2")), machine("t-a", "w2", "k1")]
    p = plan(vms)
    st = p.vmi_states[("t-a", "w1")]
    assert st.state is VmiState.BLOCKED and "PDBBlocked" in st.reason
    assert picked(p) == ["w2"]


def test_a_drain_blocked_for_an_older_revision_is_planned_again() -> None:
    p = plan([machine("t-a", "w1", "k1", ann=blocked("r1"))])
    assert picked(p) == ["w1"]


def test_a_held_worker_waits_out_the_hold_then_is_planned_again() -> None:
    vms = [machine("t-a", "w1", "k1", ann=held(280))]
    early = plan(vms, now=300)
    assert picked(early) == []
    assert early.vmi_states[("t-a", "w1")].state is VmiState.STALE
    assert "held (ClusterUnreachable)" in early.vmi_states[("t-a", "w1")].reason
    assert early.next_wakeup == at(280 + WIDE.drain_hold_seconds)
    assert picked(plan(vms, now=280 + WIDE.drain_hold_seconds)) == ["w1"]


def test_an_unreadable_cycle_is_draining_so_the_shell_resolves_it() -> None:
    p = plan([machine("t-a", "w1", "k1", ann={drain.ANN_DRAIN_STEP: "sideways"}), machine("t-a", "w2", "k1")])
    assert p.vmi_states[("t-a", "w1")].state is VmiState.DRAINING
    assert picked(p) == []  # an unreadable record counts as open: its Node may be cordoned


def test_the_memo_changes_nothing_for_machines() -> None:
    vms = [machine("t-a", "w1", "k1", ann=held(280)), machine("t-a", "w2", "k2", ann=open_cycle()),
           machine("t-a", "cp", "k1", "control-plane"), machine("t-a", "w3", "k3", ann=blocked("r2"))]
    memo = PlanMemo()
    vmis, vm_list = fleet(vms)
    replicas = [rep("t-a", rev="r2")]
    for now in (100, 300, 339, 340, 341, 4000):
        kw = {"replicas": replicas, "vmis": vmis, "vms": vm_list, "guests": {}, "sources": {}, "settings": WIDE,
              "now": at(now)}
        with_memo, without = plan_rollout(**kw, memo=memo), plan_rollout(**kw)  # type: ignore[arg-type]
        assert with_memo.vmi_states == without.vmi_states
        assert with_memo.restarts == without.restarts
        assert with_memo.drains == without.drains


def test_only_capk_labels_are_kept_on_a_vm() -> None:
    from licensectl.kube.projections import vm_from
    obj = {"metadata": {"namespace": "t-a", "name": "w1", "resourceVersion": "3",
                        "labels": {model.LABEL_CAPI_CLUSTER_NAME: "k1", model.LABEL_CAPI_ROLE: "worker",
                                   "app": "x", model.LABEL_KUBEVIRT_MACHINE: ""}},
           "spec": {"runStrategy": "Always"}}
    got = vm_from(obj)
    assert got is not None and dict(got.labels) == {model.LABEL_CAPI_CLUSTER_NAME: "k1",
                                                    model.LABEL_CAPI_ROLE: "worker"}
    assert vm_from({"metadata": {"namespace": "a", "name": "b"}, "spec": {}}).labels == {}  # type: ignore[union-attr]


def test_a_plain_fleet_plans_as_before() -> None:
    vms = [Vm("t-a", f"vm{i}", "Always", resource_version="7") for i in range(3)]
    p = plan(vms, st=ST)
    assert picked(p) == ["vm0", "vm1", "vm2"] and not p.drains


def down(rev: str = "r2") -> dict[str, str]:
    """A worker restarted by its drain whose Node never came back Ready with a new boot ID."""
    return drain.DrainIntent(drain.Step.BLOCKED, rev, at(100), at(200), boot_id="b1",
                             reason=drain.BlockReason.BOOT_TIMEOUT).render_annotations()


def test_a_worker_down_after_its_restart_is_blocked_holds_its_cluster_and_the_source_is_not_complete() -> None:
    # Its VMI was restarted (started after the revision): current by every rule, but its Node is not back.
    w1 = machine("t-a", "w1", "k1", ann=down())
    vms = [w1, machine("t-a", "w2", "k1"), machine("t-a", "w3", "k1"), machine("t-a", "v1", "k2")]
    vmis = [vmi("t-a", "w1", started=250), *(vmi(v.namespace, v.name) for v in vms[1:])]
    p = plan_rollout(replicas=[rep("t-a", rev="r2")], vmis=vmis, vms=vms, guests={}, sources={}, settings=WIDE,
                     now=at(300))
    st = p.vmi_states[("t-a", "w1")]
    assert st.state is VmiState.BLOCKED and "BootTimeout" in st.reason
    assert picked(p) == ["v1"]  # no other worker of k1, whatever the revision
    for name in ("w2", "w3"):
        waiting = p.vmi_states[("t-a", name)]
        assert waiting.state is VmiState.STALE and "DisruptionBudgetSpent" in waiting.reason
        assert "k1 has 1 of 1 workers disrupted" in waiting.reason
    # Everything else done: still not complete while w1 is down.
    done = plan_rollout(replicas=[rep("t-a", rev="r2")], vmis=[vmi("t-a", "w1", started=250)], vms=[w1],
                        guests={}, sources={}, settings=WIDE, now=at(300))
    assert done.vmi_states[("t-a", "w1")].state is VmiState.BLOCKED
    assert done.sources[rep().source].phase.value == "progressing"
    assert done.sources[rep().source].counts[VmiState.BLOCKED] == 1


def test_a_worker_down_for_an_older_revision_still_holds_its_cluster() -> None:
    p = plan([machine("t-a", "w1", "k1", ann=down("r1")), machine("t-a", "w2", "k1")])
    assert p.vmi_states[("t-a", "w1")].state is VmiState.BLOCKED
    assert picked(p) == []


def test_the_memo_changes_nothing_for_a_worker_down() -> None:
    vms = [machine("t-a", "w1", "k1", ann=down()), machine("t-a", "w2", "k1")]
    memo = PlanMemo()
    vmis, vm_list = fleet(vms)
    for now in (100, 300, 4000):
        kw = {"replicas": [rep("t-a", rev="r2")], "vmis": vmis, "vms": vm_list, "guests": {}, "sources": {},
              "settings": WIDE, "now": at(now)}
        with_memo, without = plan_rollout(**kw, memo=memo), plan_rollout(**kw)  # type: ignore[arg-type]
        assert with_memo.vmi_states == without.vmi_states and with_memo.restarts == without.restarts


ONE_PER_NS = RolloutSettings(settle_seconds=60, max_unavailable="1", max_per_namespace=1, max_failures=3,
                             restart_timeout_seconds=600, manual_deadline_seconds=3600, done_gate="ready",
                             reissue_after_seconds=60)


def test_a_held_or_blocked_worker_occupies_no_restart_slot_of_its_namespace_or_source() -> None:
    # One restart at a time, per namespace and per source. Beside each worker whose VMI is not Ready (held
    # without a cycle, or blocked after its restart), a plain VM: it is restarted all the same.
    for ann in (held(280), down()):
        w1 = machine("t-a", "w1", "k1", ann=ann)
        vms = [w1, Vm("t-a", "plain", "Always", resource_version="7")]
        vmis = [vmi("t-a", "w1", ready=False, started=250 if ann == down() else -1000), vmi("t-a", "plain")]
        p = plan_rollout(replicas=[rep("t-a", rev="r2")], vmis=vmis, vms=vms, guests={}, sources={},
                         settings=ONE_PER_NS, now=at(300))
        assert picked(p) == ["plain"], (ann, p.vmi_states[("t-a", "w1")])
        assert p.sources[rep().source].unavailable == 1  # the plain VM's restart alone


def test_a_cluster_whose_task_has_not_answered_gets_no_new_pick_and_takes_no_slot() -> None:
    # The worker sorts first in its namespace; while its cluster's task is busy (a hung tenant API) it is
    # not picked again, so the plain VM beside it takes the namespace's only slot.
    vms = [machine("t-a", "a-w1", "k1"), Vm("t-a", "plain", "Always", resource_version="7"),
           machine("t-b", "w1", "k2")]
    vmis, vm_list = fleet(vms)
    kw = {"replicas": [rep("t-a", rev="r2"), rep("t-b", rev="r2")], "vmis": vmis, "vms": vm_list, "guests": {},
          "sources": {}, "settings": dataclasses.replace(ONE_PER_NS, max_unavailable="2"), "now": at(300)}
    free = plan_rollout(**kw)  # type: ignore[arg-type]
    assert sorted((r.namespace, r.vm) for r in free.restarts) == [("t-a", "a-w1"), ("t-b", "w1")]
    busy = plan_rollout(**kw, busy_clusters=frozenset({"t-a/k1"}))  # type: ignore[arg-type]
    assert sorted((r.namespace, r.vm) for r in busy.restarts) == [("t-a", "plain"), ("t-b", "w1")]
    waiting = busy.vmi_states[("t-a", "a-w1")]
    assert waiting.state is VmiState.STALE and "k1 has not answered" in waiting.reason
