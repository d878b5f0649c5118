"""Draining a tenant worker before its restart: identity and Node lookup, cluster-api's Pod filters, the
intent codec, every step of `next_step` (crash-resume included), and the per-cluster disruption limit;
then whole cycles driven through a small simulated tenant, with a crash after every single write."""

from __future__ import annotations

import ast
import dataclasses
import datetime as dt
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as hst

from licensectl.core import drain, drain_intent, drain_workers
from licensectl.core.drain import (
    ANN_CORDONED_BY,
    ANN_DRAIN_CORDONED,
    ANN_DRAIN_NODE,
    ANN_DRAIN_REASON,
    ANN_DRAIN_REVISION,
    ANN_DRAIN_STARTED_AT,
    ANN_DRAIN_STEP,
    ANN_DRAIN_STEP_AT,
    ANN_DRAIN_VMI_UID,
    ANN_MAX_DISRUPTED_WORKERS,
    ANN_RESTART_WITHOUT_DRAIN,
    INTENT_ANNOTATIONS,
    Action,
    Blocked,
    BlockReason,
    ClusterPolicy,
    Cordon,
    Done,
    DrainIntent,
    DrainSettings,
    Evict,
    IntentProblem,
    Observed,
    Restart,
    Role,
    SkipReason,
    Step,
    TenantNode,
    TenantPod,
    Uncordon,
    WaitBoot,
    WaitEvictions,
    WorkerIdentity,
    admit_workers,
    drain_timeout_for,
    in_progress_by_cluster,
    next_step,
    node_for,
    parse_annotations,
    pods_to_evict,
    worker_role,
)
from licensectl.core.model import LABEL_KUBEVIRT_MACHINE

NOW = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)
W = WorkerIdentity("tenant-a", "k8s-a-md-0-x1", "k8s-a", Role.WORKER, "k8s-a-md-0-x1")
CP = dataclasses.replace(W, vm="k8s-a-cp-1", role=Role.CONTROL_PLANE, machine="k8s-a-cp-1")
NODE = "k8s-a-md-0-x1"
SETTINGS = DrainSettings()
CAPK_WORKER = {"cluster.x-k8s.io/cluster-name": "k8s-a", "cluster.x-k8s.io/role": "worker"}


def node(**kw: object) -> TenantNode:
    base = TenantNode(NODE, W.provider_id, boot_id="boot-1")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


MINE = {"unschedulable": True, "cordoned_by": W.key}


def pod(name: str, **kw: object) -> TenantPod:
    base = TenantPod("app", name, NODE, controller_kind="ReplicaSet")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def seen(**kw: object) -> Observed:
    base = Observed(revision="r1", needed=True, vmi_uid="uid-1", node=node())
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def intent(step: Step, **kw: object) -> DrainIntent:
    base = DrainIntent(step, "r1", NOW - 60 * S, NOW - 30 * S, node=NODE, cordoned=True, boot_id="boot-1",
                       vmi_uid="uid-1" if step in (Step.RESTART, Step.WAIT_BOOT) else "")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def step(i: DrainIntent | IntentProblem | None, s: Observed, *, now: dt.datetime = NOW,
         settings: DrainSettings = SETTINGS, worker: WorkerIdentity = W) -> Action:
    return next_step(i, worker, s, now=now, settings=settings)


# -- identity, role, Node lookup -------------------------------------------------------------------

@pytest.mark.parametrize(("labels", "role"), [
    ({}, Role.NONE),
    ({"cluster.x-k8s.io/role": "worker"}, Role.NONE),  # no cluster: no CAPK machine
    (CAPK_WORKER, Role.WORKER),
    ({**CAPK_WORKER, "cluster.x-k8s.io/role": "control-plane"}, Role.CONTROL_PLANE),
    ({"cluster.x-k8s.io/cluster-name": "k8s-a"}, Role.CONTROL_PLANE),  # role unknown: never automatic
    ({**CAPK_WORKER, "cluster.x-k8s.io/role": "Worker"}, Role.CONTROL_PLANE),
    ({**CAPK_WORKER, "cluster.x-k8s.io/cluster-name": ""}, Role.NONE),
])
def test_worker_role(labels: dict[str, str], role: Role) -> None:
    assert worker_role(labels) is role


def test_identity_takes_the_provider_id_from_the_kubevirt_machine_name() -> None:
    plain = WorkerIdentity.from_vm("t", "vm-1", CAPK_WORKER)
    assert plain is not None and plain.provider_id == "kubevirt://vm-1" and plain.key == "t/vm-1"
    assert plain.cluster_key == "t/k8s-a" and plain.role is Role.WORKER
    # An assigned hostname names the VM; the providerID keeps the KubevirtMachine's name.
    renamed = WorkerIdentity.from_vm("t", "host-7", {**CAPK_WORKER, LABEL_KUBEVIRT_MACHINE: "kvm-1"})
    assert renamed is not None and renamed.provider_id == "kubevirt://kvm-1" and renamed.key == "t/host-7"
    assert WorkerIdentity.from_vm("t", "vm", {}) is None


def test_node_for_matches_the_provider_id_exactly_once() -> None:
    a, b = node(), node(name="other", provider_id="kubevirt://other")
    assert node_for(W.provider_id, [b, a]) == a
    assert node_for("kubevirt://missing", [a, b]) is None
    assert node_for(W.provider_id, [a, dataclasses.replace(a, name="dup")]) is None  # ambiguous: no guess
    assert node_for(W.provider_id, []) is None


# -- cluster-api's Pod filters -----------------------------------------------------------------------

@pytest.mark.parametrize(("p", "where"), [
    (pod("web"), "evict"),
    (pod("ds", controller_kind="DaemonSet"), SkipReason.DAEMONSET),
    (pod("ds-orphan", controller_kind="DaemonSet", controller_missing=True), "evict"),
    (pod("ds-done", controller_kind="DaemonSet", phase="Succeeded"), SkipReason.FINISHED),
    (pod("static", controller_kind="Node", is_mirror=True), SkipReason.MIRROR),
    (pod("job-ok", controller_kind="Job", phase="Succeeded"), SkipReason.FINISHED),
    (pod("job-failed", controller_kind="Job", phase="Failed"), SkipReason.FINISHED),
    (pod("scratch", has_empty_dir=True), "evict"),  # cluster-api deletes emptyDir data
    (pod("bare", controller_kind=None), "evict"),
    (pod("pending", phase="Pending"), "evict"),
    (pod("keep", drain_label="skip"), SkipReason.DRAIN_LABEL),
    (pod("keep2", drain_label="Skip"), SkipReason.DRAIN_LABEL),
    (pod("batch", drain_label="wait-completed"), "wait"),
    (pod("batch2", drain_label="WaitCompleted"), "wait"),
    (pod("batch-done", drain_label="wait-completed", phase="Succeeded"), SkipReason.FINISHED),
    (pod("odd", drain_label="sometimes"), "evict"),  # unknown value: drained, as cluster-api does
    (pod("going", deletion_timestamp=NOW - 600 * S), "terminating"),
    (pod("mirror-deleted", is_mirror=True, deletion_timestamp=NOW), SkipReason.MIRROR),
])
def test_pod_filters(p: TenantPod, where: object) -> None:
    plan = pods_to_evict([p], NODE, now=NOW)
    got: object = ("evict" if plan.evict else "terminating" if plan.terminating else "wait" if plan.wait_completed
                   else plan.skipped[0][1])
    assert got == where
    assert plan.drained is (where not in ("evict", "terminating", "wait"))


@pytest.mark.parametrize(("age", "skipped"), [(0, False), (1.9, False), (2, True), (300, True)])
def test_on_an_unreachable_node_pods_deleted_over_a_second_ago_are_not_waited_for(age: float, skipped: bool) -> None:
    p = pod("stuck", deletion_timestamp=NOW - dt.timedelta(seconds=age))
    plan = pods_to_evict([p], NODE, now=NOW, node_unreachable=True)
    assert (plan.skipped == ((p, SkipReason.DELETED_ON_UNREACHABLE_NODE),)) is skipped
    assert bool(plan.terminating) is not skipped
    assert pods_to_evict([p], NODE, now=NOW).terminating == (p,)  # a reachable Node is always waited for


def test_pod_plan_is_sorted_ignores_other_nodes_and_warns_like_cluster_api() -> None:
    pods = [pod("b", has_empty_dir=True, controller_kind=None), pod("a"), pod("elsewhere", node_name="n2"),
            pod("c", controller_kind="DaemonSet", controller_missing=True)]
    plan = pods_to_evict(pods, NODE, now=NOW)
    assert [p.name for p in plan.evict] == ["a", "b", "c"]
    assert [(p.name, w) for p, w in plan.warnings] == [
        ("b", "evicting Pod with local storage"), ("b", "evicting Pod that has no controller"),
        ("c", "evicting orphaned DaemonSet-managed Pod")]
    naive = pod("n", deletion_timestamp=(NOW - 10 * S).replace(tzinfo=None))  # naive times are UTC
    assert pods_to_evict([naive], NODE, now=NOW, node_unreachable=True).skipped


# -- the intent codec ----------------------------------------------------------------------------

@pytest.mark.parametrize("s", list(Step))
def test_intent_round_trips(s: Step) -> None:
    i = intent(s, reason=BlockReason.DRAIN_TIMEOUT if s is Step.BLOCKED else None, vmi_uid="uid-9")
    rendered = i.render_annotations()
    assert set(rendered) <= set(INTENT_ANNOTATIONS)
    assert parse_annotations({**rendered, "other/annotation": "x"}) == i


def test_render_omits_empty_fields_and_parse_forgives_whitespace() -> None:
    i = intent(Step.BLOCKED, node="", boot_id="", vmi_uid="", cordoned=False, reason=BlockReason.NODE_MISSING)
    rendered = i.render_annotations()
    assert drain.ANN_DRAIN_BOOT_ID not in rendered and ANN_DRAIN_NODE not in rendered
    assert parse_annotations({k: f" {v}\n" for k, v in rendered.items()}) == i


def good(s: Step = Step.DRAIN) -> dict[str, str]:
    return intent(s).render_annotations()


@pytest.mark.parametrize(("annotations", "kind"), [
    ({**good(), ANN_DRAIN_STEP: "evicting"}, "unknown-step"),
    ({**good(), ANN_DRAIN_STEP: ""}, "unknown-step"),
    ({**good(), ANN_DRAIN_STEP: 7}, "unknown-step"),
    ({k: v for k, v in good().items() if k != ANN_DRAIN_REVISION}, "missing-field"),
    ({k: v for k, v in good().items() if k != ANN_DRAIN_NODE}, "missing-field"),
    ({k: v for k, v in good(Step.RESTART).items() if k != ANN_DRAIN_VMI_UID}, "missing-field"),
    ({**good(), ANN_DRAIN_STARTED_AT: "yesterday"}, "bad-time"),
    ({**good(), ANN_DRAIN_STEP_AT: "2025-03-01T12:00:00"}, "bad-time"),  # no zone: ambiguous
    ({k: v for k, v in good().items() if k != ANN_DRAIN_STARTED_AT}, "bad-time"),
    ({**good(), ANN_DRAIN_CORDONED: "yes"}, "bad-flag"),
    ({**good(), ANN_DRAIN_REASON: "Tired"}, "bad-reason"),
    ({**good(), ANN_DRAIN_STEP: "blocked"}, "missing-field"),
])
def test_unreadable_intents_are_named_problems(annotations: dict[str, str], kind: str) -> None:
    problem = parse_annotations(annotations)
    assert isinstance(problem, IntentProblem) and problem.kind == kind


def test_no_step_annotation_is_no_intent() -> None:
    assert parse_annotations({}) is None
    assert parse_annotations({ANN_DRAIN_REVISION: "r1", ANN_DRAIN_NODE: "n"}) is None


@given(hst.dictionaries(hst.sampled_from(INTENT_ANNOTATIONS), hst.one_of(hst.text(max_size=40), hst.none())))
def test_parse_is_total(annotations: dict[str, str]) -> None:
    assert parse_annotations(annotations) is None or isinstance(parse_annotations(annotations),
                                                                (DrainIntent, IntentProblem))


# -- next_step: starting a cycle -------------------------------------------------------------------

def test_a_worker_starts_by_cordoning_with_the_intent_written_first() -> None:
    a = step(None, seen())
    assert isinstance(a, Cordon) and a.node == NODE
    assert a.intent == DrainIntent(Step.CORDON, "r1", NOW, NOW, node=NODE, cordoned=True)


def test_a_naive_clock_is_utc_and_the_intent_round_trips_unchanged() -> None:
    a = step(None, seen(), now=NOW.replace(tzinfo=None))
    assert isinstance(a, Cordon) and parse_annotations(a.intent.render_annotations()) == a.intent
    again = step(a.intent, seen(), now=NOW.replace(tzinfo=None) + S)
    assert again == a  # nothing to rewrite on the next pass


@pytest.mark.parametrize(("worker", "s", "expected"), [
    (CP, seen(), Blocked(BlockReason.CONTROL_PLANE_MANUAL, None)),
    (CP, seen(reachable=False), Blocked(BlockReason.CONTROL_PLANE_MANUAL, None)),
    (W, seen(needed=False), Done()),
    (W, seen(vmi_uid=None), Done()),
    (W, seen(vmi_deleting=True), Done()),
    (W, seen(reachable=False), Blocked(BlockReason.CLUSTER_UNREACHABLE, None)),
    (W, seen(node=None), Blocked(BlockReason.NODE_MISSING, None)),
])
def test_start_refusals_open_no_cycle(worker: WorkerIdentity, s: Observed, expected: Action) -> None:
    assert step(None, s, worker=worker) == expected


def test_control_plane_is_never_restarted_automatically_whatever_the_settings() -> None:
    for settings in (SETTINGS, DrainSettings(exclude_draining=True, restart_without_drain=True)):
        for s in (seen(), seen(reachable=False), seen(node=node(**MINE))):
            a = step(None, s, worker=CP, settings=settings)
            assert not isinstance(a, Restart | Cordon | Evict)


def test_unreachable_tenant_restarts_without_drain_only_when_opted_in() -> None:
    a = step(None, seen(reachable=False, node=None), settings=DrainSettings(restart_without_drain=True))
    assert isinstance(a, Restart) and a.vmi_uid == "uid-1"
    assert a.intent.step is Step.RESTART and not a.intent.cordoned and a.intent.boot_id == ""


def test_exclude_node_draining_restarts_without_cordon_or_drain() -> None:
    a = step(None, seen(pods=(pod("web"),)), settings=DrainSettings(exclude_draining=True))
    assert isinstance(a, Restart) and a.intent.boot_id == "boot-1" and not a.intent.cordoned


def test_a_node_cordoned_by_someone_else_is_drained_but_never_claimed() -> None:
    other = node(unschedulable=True)  # kubectl cordon by the tenant: no marker
    a = step(None, seen(node=other, pods=(pod("web"),)))
    assert isinstance(a, Evict) and not a.intent.cordoned and a.intent.step is Step.DRAIN
    done = step(a.intent, seen(node=other))
    assert isinstance(done, Restart) and not done.intent.cordoned


def test_a_marker_without_a_cycle_is_undone() -> None:
    a = step(None, seen(node=node(**MINE), needed=False))
    assert isinstance(a, Uncordon) and a.node == NODE and a.intent.step is Step.UNCORDON and a.intent.reason is None
    assert step(a.intent, seen(node=node())) == Done()
    assert step(None, seen(node=node(unschedulable=True, cordoned_by="tenant-a/other-vm"))) != a  # not ours


# -- next_step: cordon and drain -------------------------------------------------------------------

def test_crash_before_the_cordon_patch_cordons_again_without_rewriting_the_intent() -> None:
    i = intent(Step.CORDON)
    a = step(i, seen())
    assert a == Cordon(NODE, i)


@pytest.mark.parametrize(("n", "cordoned"), [(node(**MINE), True), (node(unschedulable=True), False),
                                             (node(unschedulable=True, cordoned_by="x/y"), False)])
def test_after_the_cordon_the_marker_says_who_cordoned(n: TenantNode, cordoned: bool) -> None:
    a = step(intent(Step.CORDON), seen(node=n, pods=(pod("web"),)))
    assert isinstance(a, Evict) and a.intent.step is Step.DRAIN and a.intent.cordoned is cordoned
    assert a.intent.step_at == NOW and a.intent.started_at == NOW - 60 * S


def test_drain_evicts_then_waits_for_terminating_and_wait_completed_pods() -> None:
    i = intent(Step.DRAIN)
    a = step(i, seen(node=node(**MINE), pods=(pod("web"), pod("ds", controller_kind="DaemonSet"))))
    assert isinstance(a, Evict) and [p.name for p in a.pods] == ["web"]
    assert a.intent == dataclasses.replace(i, evicted_at=NOW)  # the round's time, written before it is posted
    assert a.recheck_at == NOW + 20 * S
    gone = pod("web", deletion_timestamp=NOW)
    batch = pod("batch", drain_label="wait-completed")
    w = step(i, seen(node=node(**MINE), pods=(gone, batch)))
    assert isinstance(w, WaitEvictions) and {p.name for p in w.pods} == {"web", "batch"}


def test_a_drained_node_is_restarted_with_its_boot_id_and_vmi_recorded() -> None:
    a = step(intent(Step.DRAIN), seen(node=node(**MINE, boot_id="boot-7"), vmi_uid="uid-3"))
    assert isinstance(a, Restart) and a.vmi_uid == "uid-3"
    assert a.intent == intent(Step.RESTART, step_at=NOW, boot_id="boot-7", vmi_uid="uid-3")


def test_pdb_429_is_retried_until_the_drain_timeout_then_blocks_and_uncordons() -> None:
    i = intent(Step.DRAIN, started_at=NOW)
    protected = seen(node=node(**MINE), pods=(pod("db-0"),), pdb_refused=frozenset({"app/db-0"}))
    for t in (NOW + 20 * S, NOW + 14 * 60 * S, NOW + 15 * 60 * S - S):
        retry = step(i, protected, now=t)
        assert isinstance(retry, Evict) and retry.recheck_at <= NOW + 15 * 60 * S
    timeout = step(i, protected, now=NOW + 15 * 60 * S)
    assert isinstance(timeout, Uncordon) and timeout.intent.reason is BlockReason.PDB_BLOCKED
    closed = step(timeout.intent, seen(node=node()), now=NOW + 16 * 60 * S)
    assert isinstance(closed, Blocked) and closed.closed and closed.reason is BlockReason.PDB_BLOCKED
    assert closed.intent is not None and not closed.intent.cordoned
    # The rollout moves on: the same revision stays blocked, however often it is asked.
    assert step(closed.intent, seen(node=node()), now=NOW + 60 * 60 * S) == closed


def test_a_drain_timeout_without_429_is_named_drain_timeout() -> None:
    i = intent(Step.DRAIN, started_at=NOW - 16 * 60 * S)
    a = step(i, seen(node=node(**MINE), pods=(pod("slow", deletion_timestamp=NOW - 60 * S),)))
    assert isinstance(a, Uncordon) and a.intent.reason is BlockReason.DRAIN_TIMEOUT
    other = step(dataclasses.replace(i, cordoned=False), seen(node=node(unschedulable=True), pods=(pod("x"),)))
    assert isinstance(other, Blocked) and other.closed and other.reason is BlockReason.DRAIN_TIMEOUT


def test_the_machine_drain_timeout_is_used_when_set() -> None:
    short = DrainSettings(drain_timeout=drain_timeout_for(30, dt.timedelta(minutes=15)))
    a = step(intent(Step.DRAIN, started_at=NOW - 31 * S), seen(node=node(**MINE), pods=(pod("x"),)), settings=short)
    assert isinstance(a, Uncordon) and a.intent.reason is BlockReason.DRAIN_TIMEOUT


@pytest.mark.parametrize(("machine", "expected"), [(None, 900), (0, 900), (-5, 900), (30, 30), (3600.5, 3600.5)])
def test_drain_timeout_for(machine: float | None, expected: float) -> None:
    assert drain_timeout_for(machine, dt.timedelta(seconds=900)).total_seconds() == expected


def test_a_node_uncordoned_during_the_drain_is_cordoned_again() -> None:
    a = step(intent(Step.DRAIN), seen(node=node(), pods=(pod("web"),)))
    assert isinstance(a, Cordon) and a.intent.step is Step.DRAIN and a.intent.cordoned


@pytest.mark.parametrize("s", [intent(Step.CORDON), intent(Step.DRAIN)])
def test_a_worker_no_longer_needed_before_its_restart_is_undone(s: DrainIntent) -> None:
    a = step(s, seen(node=node(**MINE), needed=False))
    assert isinstance(a, Uncordon) and a.intent.reason is None and a.intent.step is Step.UNCORDON
    assert step(a.intent, seen(node=node(), needed=False)) == Done()
    assert step(s, seen(node=node(unschedulable=True), needed=False)) == Done()  # someone else's cordon stays
    role_changed = step(s, seen(node=node(unschedulable=True, cordoned_by=CP.key)), worker=CP)
    assert isinstance(role_changed, Uncordon)


def test_a_newer_decision_during_the_drain_is_served_by_the_same_cycle() -> None:
    a = step(intent(Step.DRAIN), seen(revision="r2", node=node(**MINE), pods=(pod("web"),)))
    assert isinstance(a, Evict) and a.intent.revision == "r2"


def test_unreachable_during_the_drain_holds_or_restarts_when_opted_in() -> None:
    i = intent(Step.DRAIN)
    assert step(i, seen(reachable=False)) == Blocked(BlockReason.CLUSTER_UNREACHABLE, i)
    a = step(i, seen(reachable=False), settings=DrainSettings(restart_without_drain=True))
    assert isinstance(a, Restart) and a.intent.cordoned  # the cordon is still to be undone later


def test_node_gone_during_the_drain_closes_the_cycle_without_restart() -> None:
    assert step(intent(Step.DRAIN), seen(node=None)) == Blocked(BlockReason.NODE_MISSING, None)


def test_exclude_annotation_added_during_the_drain_stops_draining() -> None:
    a = step(intent(Step.DRAIN), seen(node=node(**MINE), pods=(pod("web"),)),
             settings=DrainSettings(exclude_draining=True))
    assert isinstance(a, Restart) and a.intent.cordoned


@pytest.mark.parametrize("s", [seen(node=node(**MINE), vmi_uid=None), seen(node=node(**MINE), vmi_deleting=True)])
def test_a_vmi_gone_before_our_restart_is_waited_for_not_restarted(s: Observed) -> None:
    a = step(intent(Step.DRAIN), s)
    assert isinstance(a, WaitBoot) and a.intent.step is Step.WAIT_BOOT and a.until == NOW + 10 * 60 * S


def test_pods_on_an_unreachable_node_deleted_long_ago_do_not_hold_the_drain() -> None:
    stuck = pod("stuck", deletion_timestamp=NOW - 10 * S)
    a = step(intent(Step.DRAIN), seen(node=node(**MINE, ready=None), pods=(stuck,)))
    assert isinstance(a, Restart)


# -- next_step: restart, boot, uncordon ------------------------------------------------------------

def test_restart_not_yet_seen_waits_then_is_reissued_for_the_same_vmi_only() -> None:
    i = intent(Step.RESTART, step_at=NOW)
    w = step(i, seen(node=node(**MINE)), now=NOW + 10 * S)
    assert w == WaitBoot(NOW + 60 * S, i)
    again = step(i, seen(node=node(**MINE)), now=NOW + 61 * S)
    assert isinstance(again, Restart) and again.vmi_uid == "uid-1" and again.intent.step_at == NOW + 61 * S


@pytest.mark.parametrize("s", [seen(vmi_uid="uid-2"), seen(vmi_uid=None), seen(vmi_deleting=True),
                               seen(vmi_uid="uid-2", needed=False), seen(vmi_uid="uid-2", revision="r9"),
                               seen(vmi_uid="uid-2", node=node(ready=False))])
def test_a_replaced_vmi_is_never_restarted_again(s: Observed) -> None:
    a = step(intent(Step.RESTART), s, now=NOW + 3600 * S)
    assert not isinstance(a, Restart)
    assert a.intent is None or a.intent.step in (Step.WAIT_BOOT, Step.UNCORDON, Step.BLOCKED)


def test_a_new_boot_id_on_a_ready_node_ends_the_cycle() -> None:
    i = intent(Step.WAIT_BOOT, step_at=NOW)
    back = node(**MINE, boot_id="boot-2")
    a = step(i, seen(vmi_uid="uid-2", node=back))
    assert isinstance(a, Uncordon) and a.intent.reason is None
    assert step(a.intent, seen(vmi_uid="uid-2", node=node(boot_id="boot-2"))) == Done()
    assert step(dataclasses.replace(i, cordoned=False), seen(vmi_uid="uid-2", node=node(boot_id="b2"))) == Done()


@pytest.mark.parametrize("n", [node(**MINE), node(**MINE, boot_id="boot-2", ready=False),
                               node(**MINE, boot_id="boot-2", ready=None), node(**MINE, boot_id=""), None])
def test_waiting_for_boot(n: TenantNode | None) -> None:
    i = intent(Step.WAIT_BOOT, step_at=NOW)
    assert step(i, seen(vmi_uid="uid-2", node=n), now=NOW + 60 * S) == WaitBoot(NOW + 600 * S, i)


def test_boot_timeout_uncordons_then_blocks() -> None:
    i = intent(Step.WAIT_BOOT, step_at=NOW - 601 * S)
    a = step(i, seen(vmi_uid="uid-2", node=node(**MINE, ready=False)))
    assert isinstance(a, Uncordon) and a.intent.reason is BlockReason.BOOT_TIMEOUT
    b = step(i, seen(vmi_uid="uid-2", node=None))
    assert isinstance(b, Blocked) and b.closed and b.reason is BlockReason.BOOT_TIMEOUT


def test_unreachable_after_the_restart_holds_while_a_cordon_may_be_ours() -> None:
    i = intent(Step.WAIT_BOOT)
    opted = DrainSettings(restart_without_drain=True)
    assert step(i, seen(reachable=False), settings=opted) == Blocked(BlockReason.CLUSTER_UNREACHABLE, i)
    assert step(dataclasses.replace(i, cordoned=False), seen(reachable=False), settings=opted) == Done()
    free = dataclasses.replace(i, cordoned=False)
    assert step(free, seen(reachable=False)) == Blocked(BlockReason.CLUSTER_UNREACHABLE, free)


@pytest.mark.parametrize(("reason", "n", "expected"), [
    (None, node(**MINE), "uncordon"),
    (None, node(unschedulable=False, cordoned_by=W.key), "uncordon"),  # stale marker is removed too
    (None, node(), "done"),
    (None, None, "done"),
    (None, node(unschedulable=True), "done"),  # someone else cordoned it since: left alone
    (BlockReason.DRAIN_TIMEOUT, node(), "blocked"),
    (BlockReason.DRAIN_TIMEOUT, node(**MINE), "uncordon"),
])
def test_uncordon_step(reason: BlockReason | None, n: TenantNode | None, expected: str) -> None:
    a = step(intent(Step.UNCORDON, reason=reason), seen(node=n))
    got = {Uncordon: "uncordon", Done: "done", Blocked: "blocked"}[type(a)]
    assert got == expected
    if isinstance(a, Blocked):
        assert a.closed and a.reason is reason


def test_uncordon_waits_for_an_unreachable_tenant() -> None:
    i = intent(Step.UNCORDON)
    assert step(i, seen(reachable=False)) == Blocked(BlockReason.CLUSTER_UNREACHABLE, i)


def test_blocked_revisions_stay_blocked_and_a_new_revision_starts_over() -> None:
    b = intent(Step.BLOCKED, reason=BlockReason.PDB_BLOCKED, cordoned=False)
    assert step(b, seen()) == Blocked(BlockReason.PDB_BLOCKED, b)
    assert isinstance(step(b, seen(revision="r2")), Cordon)
    mine = step(b, seen(node=node(**MINE)))  # a cordon left over (hand edit): undone, still blocked
    assert isinstance(mine, Uncordon) and mine.intent.reason is BlockReason.PDB_BLOCKED


def test_an_unreadable_intent_is_never_a_restart() -> None:
    problem = IntentProblem("bad-time", "x")
    for s in (seen(), seen(vmi_uid="uid-2"), seen(node=node(unschedulable=True))):
        a = step(problem, s)
        assert isinstance(a, Blocked) and a.closed and a.reason is BlockReason.INTENT_UNREADABLE
        assert a.intent is not None and a.intent.revision == "r1"
    mine = step(problem, seen(node=node(**MINE)))
    assert isinstance(mine, Uncordon) and mine.intent.reason is BlockReason.INTENT_UNREADABLE
    held = step(problem, seen(reachable=False))
    assert isinstance(held, Blocked) and held.reason is BlockReason.CLUSTER_UNREACHABLE
    assert held.intent is not None and held.intent.step is Step.UNCORDON


# -- whole cycles in a simulated tenant, with crashes ------------------------------------------------

@dataclasses.dataclass
class Tenant:
    """One worker's world: the VM's annotations, its VMI, its Node and Pods. Eviction of a Pod in
    `pdb` gets a 429 that many times first; an evicted Pod is gone one pass later."""

    node: TenantNode = dataclasses.field(default_factory=node)
    pods: dict[str, TenantPod] = dataclasses.field(default_factory=dict)
    pdb: dict[str, int] = dataclasses.field(default_factory=dict)
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)
    vmi: str = "uid-1"
    restarts: int = 0
    refused: set[str] = dataclasses.field(default_factory=set)
    booting: int = 0  # passes until the new VMI's kubelet reports
    log: list[str] = dataclasses.field(default_factory=list)

    def observe(self, needed: bool) -> Observed:
        if self.booting:  # the new VMI boots: after a while the kubelet reports Ready with a new boot ID
            self.booting -= 1
            if not self.booting:
                self.node = dataclasses.replace(self.node, ready=True, boot_id=f"boot-{self.restarts + 1}")
        self.pods = {k: p for k, p in self.pods.items() if p.deletion_timestamp is None}
        return Observed("r1", needed and self.restarts == 0, self.vmi, node=self.node,
                        pods=tuple(self.pods.values()), pdb_refused=frozenset(self.refused))

    def write(self, action: Action) -> None:
        for key in INTENT_ANNOTATIONS:
            self.annotations.pop(key, None)
        if action.intent is not None:
            self.annotations.update(action.intent.render_annotations())

    def act(self, action: Action, now: dt.datetime) -> None:
        self.log.append(type(action).__name__)
        if isinstance(action, Cordon) and not self.node.unschedulable:
            self.node = dataclasses.replace(self.node, unschedulable=True, cordoned_by=W.key)
        elif isinstance(action, Evict):
            for p in action.pods:
                if self.pdb.get(p.key, 0) > 0:
                    self.pdb[p.key] -= 1
                    self.refused.add(p.key)
                else:
                    self.refused.discard(p.key)
                    self.pods[p.key] = dataclasses.replace(p, deletion_timestamp=now)
        elif isinstance(action, Restart) and action.vmi_uid == self.vmi:  # the shell's fresh-read guard
            self.restarts += 1
            self.vmi = f"uid-{self.restarts + 1}"
            self.node = dataclasses.replace(self.node, ready=False)
            self.booting = 3
        elif isinstance(action, Uncordon) and self.node.cordoned_by == W.key:
            self.node = dataclasses.replace(self.node, unschedulable=False, cordoned_by=None)


def run(t: Tenant, *, crash_at: int | None = None, needed: bool = True, passes: int = 60) -> Action:
    """Pass after pass until the cycle closes. At pass `crash_at` the intent is written and the
    controller dies before acting (intent is always written first, so that is every crash there is)."""
    now = NOW
    for n in range(passes):
        current = parse_annotations(t.annotations)
        action = next_step(current, W, t.observe(needed), now=now, settings=SETTINGS)
        t.write(action)
        if n != crash_at:
            t.act(action, now)
        if isinstance(action, Done) or (isinstance(action, Blocked) and (action.intent is None or action.closed)):
            return action
        now += 20 * S
    raise AssertionError(f"no end after {passes} passes: {t.log}")


def busy_tenant(**kw: object) -> Tenant:
    t = Tenant(**kw)  # type: ignore[arg-type]
    for p in (pod("web-1"), pod("web-2", has_empty_dir=True), pod("ds", controller_kind="DaemonSet"),
              pod("static", is_mirror=True), pod("job", phase="Succeeded"), pod("db-0", controller_kind="StatefulSet")):
        t.pods[p.key] = p
    t.pdb.setdefault("app/db-0", 2)  # two 429s, then the budget allows it
    return t


def test_a_full_cycle() -> None:
    t = busy_tenant()
    assert run(t) == Done()
    assert t.restarts == 1 and not t.node.unschedulable and t.node.cordoned_by is None
    assert t.annotations == {} and t.node.boot_id == "boot-2"
    assert t.log == ["Cordon", "Evict", "Evict", "Evict", "Restart", "WaitBoot", "WaitBoot", "Uncordon", "Done"]
    assert set(t.pods) == {"app/ds", "app/static", "app/job"}  # DaemonSet, mirror and finished Pods stay



@pytest.mark.parametrize("crash_at", range(10))
def test_a_crash_after_any_write_resumes_with_one_restart_and_no_cordon_left(crash_at: int) -> None:
    t = busy_tenant()
    assert run(t, crash_at=crash_at) == Done()
    assert t.restarts == 1 and not t.node.unschedulable and t.node.cordoned_by is None and t.annotations == {}


@pytest.mark.parametrize("crash_at", range(9))
def test_a_node_cordoned_by_someone_else_stays_cordoned(crash_at: int) -> None:
    t = busy_tenant(node=node(unschedulable=True))
    assert run(t, crash_at=crash_at) == Done()
    assert t.restarts == 1 and t.node.unschedulable and t.node.cordoned_by is None
    assert "Cordon" not in t.log and "Uncordon" not in t.log


@pytest.mark.parametrize("crash_at", range(48))
def test_a_pdb_that_never_allows_blocks_with_the_node_uncordoned(crash_at: int) -> None:
    t = busy_tenant()
    t.pdb["app/db-0"] = 10**6
    end = run(t, crash_at=crash_at, passes=200)
    assert isinstance(end, Blocked) and end.closed and end.reason is BlockReason.PDB_BLOCKED
    assert t.restarts == 0 and not t.node.unschedulable and t.node.cordoned_by is None
    assert parse_annotations(t.annotations) == end.intent


@pytest.mark.parametrize("crash_at", range(3))
def test_a_decision_withdrawn_mid_drain_is_undone(crash_at: int) -> None:
    t = busy_tenant()
    t.pdb["app/db-0"] = 10**6
    now = NOW
    for n in range(3):  # cordon, then a few eviction passes
        action = next_step(parse_annotations(t.annotations), W, t.observe(True), now=now, settings=SETTINGS)
        t.write(action)
        if n != crash_at:
            t.act(action, now)
        now += 20 * S
    assert run(t, needed=False) == Done()
    assert t.restarts == 0 and not t.node.unschedulable and t.node.cordoned_by is None and t.annotations == {}


def test_a_stale_cache_after_the_restart_never_restarts_twice() -> None:
    t = busy_tenant()
    now = NOW
    while "Restart" not in t.log:
        action = next_step(parse_annotations(t.annotations), W, t.observe(True), now=now, settings=SETTINGS)
        t.write(action)
        t.act(action, now)
        now += 20 * S
    stale = dataclasses.replace(t.observe(True), vmi_uid="uid-1", needed=True)  # the informer lags
    for _ in range(2):
        a = next_step(parse_annotations(t.annotations), W, stale, now=now, settings=SETTINGS)
        assert isinstance(a, WaitBoot)
        now += 20 * S
    late = next_step(parse_annotations(t.annotations), W, stale, now=now + 60 * S, settings=SETTINGS)
    assert isinstance(late, Restart)  # reissued, but only for uid-1, which the shell's fresh read refuses
    t.act(late, now)
    assert t.restarts == 1


# -- the per-cluster disruption limit --------------------------------------------------------------

def worker(vm: str, cluster: str = "k8s-a", ns: str = "tenant-a", role: Role = Role.WORKER) -> WorkerIdentity:
    return WorkerIdentity(ns, vm, cluster, role, vm)


def test_one_worker_per_cluster_at_a_time_by_default() -> None:
    cands = [worker("a1"), worker("a2"), worker("b1", "k8s-b"), worker("c1", ns="tenant-c")]
    assert [w.vm for w in admit_workers(cands, {})] == ["a1", "b1", "c1"]
    assert [w.vm for w in admit_workers(cands, {"tenant-a/k8s-a": 1})] == ["b1", "c1"]


def test_the_hoster_can_raise_a_clusters_limit() -> None:
    cands = [worker(f"a{i}") for i in range(5)]
    assert len(admit_workers(cands, {"tenant-a/k8s-a": 1}, limits={"tenant-a/k8s-a": 3})) == 2
    assert len(admit_workers(cands, {}, default_limit=0)) == 1  # never below one
    assert len(admit_workers(cands, {}, limits={"tenant-a/k8s-a": -4})) == 1


def test_admission_skips_control_plane_and_duplicates() -> None:
    cands = [worker("cp", role=Role.CONTROL_PLANE), worker("a1"), worker("a1"), worker("a2")]
    assert [w.vm for w in admit_workers(cands, {}, limits={"tenant-a/k8s-a": 5})] == ["a1", "a2"]


def test_open_cycles_are_counted_per_cluster() -> None:
    blocked = intent(Step.BLOCKED, reason=BlockReason.PDB_BLOCKED)
    counts = in_progress_by_cluster([
        (worker("a1"), intent(Step.DRAIN)), (worker("a2"), intent(Step.UNCORDON)), (worker("a3"), blocked),
        (worker("a4"), None), (worker("b1", "k8s-b"), IntentProblem("bad-time", "")),
    ])
    assert counts == {"tenant-a/k8s-a": 2, "tenant-a/k8s-b": 1}


@pytest.mark.parametrize(("annotations", "expected"), [
    ({}, ClusterPolicy(1, False)),
    ({ANN_MAX_DISRUPTED_WORKERS: "3", ANN_RESTART_WITHOUT_DRAIN: "true"}, ClusterPolicy(3, True)),
    ({ANN_MAX_DISRUPTED_WORKERS: " 2 ", ANN_RESTART_WITHOUT_DRAIN: "True"}, ClusterPolicy(2, True)),
    ({ANN_MAX_DISRUPTED_WORKERS: "0"}, ClusterPolicy(1, False)),
    ({ANN_MAX_DISRUPTED_WORKERS: "-1"}, ClusterPolicy(1, False)),
    ({ANN_MAX_DISRUPTED_WORKERS: "50%"}, ClusterPolicy(1, False)),
    ({ANN_MAX_DISRUPTED_WORKERS: "١٢"}, ClusterPolicy(1, False)),  # non-ASCII digits
    ({ANN_MAX_DISRUPTED_WORKERS: "100000"}, ClusterPolicy(1, False)),
    ({ANN_RESTART_WITHOUT_DRAIN: "yes"}, ClusterPolicy(1, False)),
])
def test_cluster_policy(annotations: dict[str, str], expected: ClusterPolicy) -> None:
    assert ClusterPolicy.from_annotations(annotations) == expected


# -- the module stays pure -------------------------------------------------------------------------

def _imports(module: object) -> set[str | None]:
    tree = ast.parse(Path(getattr(module, "__file__", "")).read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}


def test_drain_imports_only_the_standard_library_and_pure_core_modules() -> None:
    assert _imports(drain) == {"__future__", "datetime", "collections.abc", "dataclasses", "enum",
                               "licensectl.core.defaults", "licensectl.core.timecodec",
                               "licensectl.core.drain_intent", "licensectl.core.drain_workers"}
    assert _imports(drain_intent) == {"__future__", "datetime", "collections.abc", "dataclasses", "enum",
                                      "licensectl.core.model", "licensectl.core.timecodec"}
    assert _imports(drain_workers) == {"__future__", "collections.abc", "dataclasses", "enum",
                                       "licensectl.core.model", "licensectl.core.drain_intent"}


def test_intent_annotations_use_the_licensectl_prefix() -> None:
    assert all(k.startswith("licensectl.io/drain-") for k in INTENT_ANNOTATIONS)
    assert ANN_CORDONED_BY.startswith("licensectl.io/")
    assert {ANN_DRAIN_STEP, ANN_DRAIN_STEP_AT, ANN_DRAIN_CORDONED} <= set(INTENT_ANNOTATIONS)


# -- health-gated budgets: a worker restarted and not back, and Nodes down for any reason, count ----------

def test_a_boot_timeout_holds_its_cluster_until_the_node_is_back() -> None:
    down = intent(Step.BLOCKED, reason=BlockReason.BOOT_TIMEOUT, cordoned=False)
    assert down.down and down.holds_budget and not down.active
    pdb = intent(Step.BLOCKED, reason=BlockReason.PDB_BLOCKED, cordoned=False)
    assert not pdb.down and not pdb.holds_budget
    counts = in_progress_by_cluster([(worker("a1"), down), (worker("a2"), pdb), (worker("b1", "k8s-b"), None)])
    assert counts == {"tenant-a/k8s-a": 1}


def test_a_worker_down_after_its_restart_is_never_started_over_by_a_new_revision() -> None:
    down = intent(Step.BLOCKED, reason=BlockReason.BOOT_TIMEOUT, cordoned=False)
    for s in (seen(revision="r2"), seen(revision="r2", node=node(ready=None))):
        assert step(down, s) == Blocked(BlockReason.BOOT_TIMEOUT, down)


def test_budget_holders_are_read_back_from_the_vms_annotations() -> None:
    down = intent(Step.BLOCKED, reason=BlockReason.BOOT_TIMEOUT, cordoned=False).render_annotations()
    pdb = intent(Step.BLOCKED, reason=BlockReason.PDB_BLOCKED).render_annotations()
    vms = [("tenant-a", "w1", CAPK_WORKER, down), ("tenant-a", "w2", CAPK_WORKER, pdb),
           ("tenant-a", "w3", CAPK_WORKER, {ANN_DRAIN_STEP: "sideways"}), ("tenant-a", "w4", CAPK_WORKER, {}),
           ("tenant-a", "plain", {}, down), ("tenant-b", "w1", CAPK_WORKER, down)]
    assert [w.vm for w in drain.budget_holders(vms, "tenant-a/k8s-a")] == ["w1", "w3"]


def _worker_node(name: str, **kw: object) -> TenantNode:
    return dataclasses.replace(TenantNode(name, f"kubevirt://{name}", boot_id="b"), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(("nodes", "holders", "expected"), [
    ([_worker_node("w1"), _worker_node("w2")], [], 0),
    ([_worker_node("w1", ready=False), _worker_node("w2")], [], 1),  # a kubelet down, whoever's fault
    ([_worker_node("w1", ready=None), _worker_node("w2", unschedulable=True)], [], 2),  # Unknown; a cordon
    ([_worker_node("w1", ready=False)], ["w1"], 1),  # a record and its down Node: one worker
    ([_worker_node("w1")], ["w1", "gone"], 2),  # a record counts with or without its Node
    ([_worker_node("cp", ready=False, control_plane=True)], [], 0),  # not a worker
    ([_worker_node(NODE, ready=False)], [W.vm], 0),  # the candidate itself never counts
])
def test_disrupted_workers_counts_records_and_nodes_down_for_any_reason(
        nodes: list[TenantNode], holders: list[str], expected: int) -> None:
    assert drain.disrupted_workers(nodes, [worker(h) for h in holders], W) == expected


def test_a_spent_budget_holds_a_new_cycle_with_a_named_condition_and_an_open_one_goes_on() -> None:
    spent = seen(disrupted=1)
    assert step(None, spent) == Blocked(BlockReason.BUDGET_SPENT, None)
    assert isinstance(step(None, spent, settings=DrainSettings(max_disrupted=2)), Cordon)
    assert isinstance(step(intent(Step.DRAIN), seen(disrupted=1, node=node(**MINE), pods=(pod("p"),))), Evict)
    # The hold opens no cycle: nothing to write but the hold, no slot taken.
    assert not Blocked(BlockReason.BUDGET_SPENT, None).closed


# -- evictions on the documented cadence ------------------------------------------------------------------

def test_refused_evictions_are_posted_again_only_after_the_retry_interval_read_back_from_the_vm() -> None:
    protected = seen(node=node(**MINE), pods=(pod("db-0"),), pdb_refused=frozenset({"app/db-0"}))
    first = step(intent(Step.DRAIN, started_at=NOW), protected)
    assert isinstance(first, Evict) and first.intent.evicted_at == NOW
    record = parse_annotations(first.intent.render_annotations())  # what a new leader reads back
    assert record == first.intent
    for later in (NOW + S, NOW + 10 * S, NOW + 20 * S - dt.timedelta(microseconds=1)):  # every rollout pass
        wait = step(record, protected, now=later)
        assert isinstance(wait, WaitEvictions) and wait.recheck_at == NOW + 20 * S and wait.intent == record
    again = step(record, protected, now=NOW + 20 * S)
    assert isinstance(again, Evict) and again.intent.evicted_at == NOW + 20 * S
    # A round recorded in the future (a clock step back) or unreadable is no reason to wait: post now.
    ahead = dataclasses.replace(record, evicted_at=NOW + 60 * S)
    assert isinstance(step(ahead, protected, now=NOW + S), Evict)
    bad = {**record.render_annotations(), drain.ANN_DRAIN_EVICTED_AT: "yesterday"}
    unreadable = parse_annotations(bad)
    assert isinstance(unreadable, DrainIntent) and unreadable.evicted_at is None


def test_the_wait_between_rounds_never_passes_the_drain_timeout() -> None:
    i = dataclasses.replace(intent(Step.DRAIN, started_at=NOW - 15 * 60 * S + 5 * S), evicted_at=NOW)
    w = step(i, seen(node=node(**MINE), pods=(pod("db-0"),)), now=NOW + S)
    assert isinstance(w, WaitEvictions) and w.recheck_at == NOW + 5 * S
