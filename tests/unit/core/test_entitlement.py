"""Entitlement: the tenant tree, flags, classes and claims -> who gets which license replica."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from licensectl.core.entitlement import (
    EntitlementResult,
    Problem,
    ProblemKind,
    TenantSettings,
    compute_entitlement,
)
from licensectl.core.model import GpuClaim, GpuClass, Namespace, ObjectRef

S = TenantSettings()
ROOT = "tenant-root"
PREFIX = S.tenant_label_prefix
SRC = ObjectRef("licensectl-system", "vws-token")
SRC2 = ObjectRef("licensectl-system", "vcs-token")

VGPU = GpuClass("vws", "uid-vws", "vgpu", SRC, 1)
VGPU2 = GpuClass("vcs", "uid-vcs", "vgpu", SRC2, 1)
PASSTHROUGH = GpuClass("vws-pt", "uid-vws-pt", "passthrough", SRC, 2)
CLASSES = {c.name: c for c in (VGPU, VGPU2, PASSTHROUGH)}


def uid(name: str) -> str:
    return f"uid-{name}"


def tenant_labels(name: str, flag: bool | None) -> dict[str, str]:
    """Labels Cozystack's `tenant.ancestorTenantLabels` puts on a tenant, plus the vgpu flag."""
    labels = {PREFIX + ROOT: ""}
    parts = name.split("-")
    for i in range(1, len(parts)):
        labels[PREFIX + "-".join(parts[: i + 1])] = ""
    if flag is not None:
        labels[S.vgpu_label] = "true" if flag else "false"
    return labels


def ns(name: str, flag: bool | None = True, *, parent: str | None = "auto", owner_uid: str | None = None,
       labels: Mapping[str, str] | None = None, terminating: bool = False) -> Namespace:
    """A well-formed tenant namespace unless overridden; the parent is derived from the name."""
    if parent == "auto":
        if name == ROOT:
            parent = None
        else:
            head = name.rsplit("-", 1)[0]
            parent = ROOT if head == "tenant" else head
    return Namespace(
        name=name, uid=uid(name),
        labels=dict(labels) if labels is not None else tenant_labels(name, flag),
        owner_name=parent,
        owner_uid=owner_uid if owner_uid is not None else (uid(parent) if parent else None),
        terminating=terminating,
    )


def index(*items: Namespace) -> dict[str, Namespace]:
    return {n.name: n for n in items}


def claims_for(names: Iterable[str], class_name: str = "vws") -> list[GpuClaim]:
    return [GpuClaim(n, f"claim-{class_name}", class_name) for n in names]


def run(namespaces: Mapping[str, Namespace], claims: Iterable[GpuClaim] = (),
        classes: Mapping[str, GpuClass] = CLASSES) -> EntitlementResult:
    return compute_entitlement(namespaces, classes, claims, settings=S)


def kinds(r: EntitlementResult) -> dict[str, ProblemKind]:
    return {p.ref.name: p.kind for p in r.problems}


# --- the flag chain ---------------------------------------------------------------------------

CHAIN = [ROOT, "tenant-a", "tenant-a-b", "tenant-a-b-c"]


@pytest.mark.parametrize("flags", list(itertools.product([True, False], repeat=4)))
def test_chain_flags_all_combinations(flags: tuple[bool, ...]) -> None:
    namespaces = index(*(ns(n, f) for n, f in zip(CHAIN, flags, strict=True)))
    r = run(namespaces, claims_for(CHAIN))
    for depth, name in enumerate(CHAIN):
        want = all(flags[: depth + 1])
        assert r.effective[name] is want, (name, flags)
        assert ((name, "vws") in r.entitled) is want
    assert r.problems == ()
    assert dict(r.broken_by) == {}


def test_flag_revoked_on_middle_tenant_cuts_the_subtree_only() -> None:
    namespaces = index(ns(ROOT), ns("tenant-a"), ns("tenant-a-b", False), ns("tenant-a-b-c"),
                       ns("tenant-a-b-c-d"), ns("tenant-a-x"), ns("tenant-z"))
    r = run(namespaces, claims_for(namespaces))
    assert {n for n, _ in r.entitled} == {ROOT, "tenant-a", "tenant-a-x", "tenant-z"}
    assert not r.effective["tenant-a-b-c-d"]
    assert r.problems == ()


@pytest.mark.parametrize("value", ["True", "yes", "1", "", "true "])
def test_only_the_exact_string_true_grants(value: str) -> None:
    labels = tenant_labels("tenant-a", None) | {S.vgpu_label: value}
    r = run(index(ns(ROOT), ns("tenant-a", labels=labels)), claims_for(["tenant-a"]))
    assert r.effective == {ROOT: True, "tenant-a": False}
    assert r.entitled == {}


def test_root_without_flag_entitles_nobody() -> None:
    namespaces = index(ns(ROOT, None), ns("tenant-a"), ns("tenant-a-b"))
    r = run(namespaces, claims_for(namespaces))
    assert r.entitled == {}
    assert set(r.effective.values()) == {False}


def test_configured_label_names_are_used() -> None:
    custom = TenantSettings(vgpu_label="example.org/gpu", tenant_label_prefix="t.example.org/",
                            root_tenant=ROOT)
    labels = {"t.example.org/tenant-a": "", "example.org/gpu": "true"}
    namespaces = index(ns(ROOT, labels={"example.org/gpu": "true"}), ns("tenant-a", labels=labels))
    r = compute_entitlement(namespaces, CLASSES, claims_for(["tenant-a"]), settings=custom)
    assert ("tenant-a", "vws") in r.entitled and r.problems == ()


# --- claims and classes -----------------------------------------------------------------------

def test_claim_added_then_removed() -> None:
    namespaces = index(ns(ROOT), ns("tenant-a"))
    assert run(namespaces).entitled == {}
    with_claim = run(namespaces, claims_for(["tenant-a"]))
    assert dict(with_claim.entitled) == {("tenant-a", "vws"): SRC}
    assert run(namespaces, []).entitled == {}


def test_passthrough_class_is_not_replicated_and_switching_is_a_new_class() -> None:
    namespaces = index(ns(ROOT), ns("tenant-a"))
    before = run(namespaces, claims_for(["tenant-a"], "vws"))
    after = run(namespaces, claims_for(["tenant-a"], "vws-pt"))
    assert dict(before.entitled) == {("tenant-a", "vws"): SRC}
    assert after.entitled == {} and after.problems == ()


def test_two_classes_with_different_secrets_give_two_entitlements() -> None:
    namespaces = index(ns(ROOT), ns("tenant-a"))
    claims = [*claims_for(["tenant-a"], "vws"), *claims_for(["tenant-a"], "vcs"),
              GpuClaim("tenant-a", "second-vws-claim", "vws")]
    r = run(namespaces, claims)
    assert dict(r.entitled) == {("tenant-a", "vcs"): SRC2, ("tenant-a", "vws"): SRC}


def test_unknown_class_is_reported_once_per_namespace_and_class() -> None:
    namespaces = index(ns(ROOT), ns("tenant-a"))
    claims = [GpuClaim("tenant-a", "z", "gone"), GpuClaim("tenant-a", "b", "gone"),
              GpuClaim("tenant-a", "c", None), *claims_for(["tenant-a"])]
    r = run(namespaces, claims)
    assert dict(r.entitled) == {("tenant-a", "vws"): SRC}
    unknown = [p for p in r.problems if p.kind is ProblemKind.UNKNOWN_CLASS]
    assert [p.ref for p in unknown] == [ObjectRef("tenant-a", "b"), ObjectRef("tenant-a", "c")]
    assert "gone" in unknown[0].message and "tenant-a/b" in unknown[0].message
    assert "names no class" in unknown[1].message


@pytest.mark.parametrize("bad", [
    GpuClass("odd", "u", "mig", SRC, 1),
    GpuClass("odd", "u", None, SRC, 1),
    GpuClass("odd", "u", "vgpu", None, 1),
    GpuClass("odd", "u", "vgpu", ObjectRef("", "token"), 1),
])
def test_invalid_class_is_a_problem_and_never_entitles(bad: GpuClass) -> None:
    namespaces = index(ns(ROOT), ns("tenant-a"))
    r = run(namespaces, claims_for(["tenant-a"], "odd"), {**CLASSES, "odd": bad})
    assert r.entitled == {}
    assert [(p.kind, p.ref) for p in r.problems] == [(ProblemKind.INVALID_CLASS, ObjectRef("", "odd"))]
    assert "odd" in r.problems[0].message


def test_valid_passthrough_class_without_secret_is_fine() -> None:
    pt = GpuClass("pt", "u", "passthrough", None, 4)
    r = run(index(ns(ROOT)), claims_for([ROOT], "pt"), {"pt": pt})
    assert r.problems == () and r.entitled == {}


def test_claims_in_unknown_namespaces_are_ignored() -> None:
    r = run(index(ns(ROOT)), claims_for(["tenant-ghost"]))
    assert r.entitled == {} and r.problems == ()


def test_terminating_namespace_gets_no_replica() -> None:
    namespaces = index(ns(ROOT), ns("tenant-a", terminating=True), ns("tenant-b"))
    r = run(namespaces, claims_for(namespaces))
    assert set(r.entitled) == {(ROOT, "vws"), ("tenant-b", "vws")}


# --- non-tenants ------------------------------------------------------------------------------

def test_non_tenant_namespaces_are_never_entitled_and_not_problems() -> None:
    plain = [Namespace("default", "u1"), Namespace("kube-system", "u2", {S.vgpu_label: "true"}),
             Namespace("cozy-system", "u3", {"app": "x"})]
    namespaces = index(ns(ROOT), *plain)
    r = run(namespaces, claims_for(namespaces))
    assert set(r.entitled) == {(ROOT, "vws")}
    assert r.problems == ()
    assert set(r.effective) == {ROOT}


# --- broken links -----------------------------------------------------------------------------

def test_missing_parent() -> None:
    namespaces = index(ns(ROOT), ns("tenant-a-b"), ns("tenant-a-b-c"))
    r = run(namespaces, claims_for(namespaces))
    assert kinds(r) == {"tenant-a-b": ProblemKind.MISSING_PARENT}
    assert "tenant-a" in r.problems[0].message
    assert set(r.entitled) == {(ROOT, "vws")}
    assert dict(r.broken_by) == {"tenant-a-b": "tenant-a-b", "tenant-a-b-c": "tenant-a-b"}


def test_tenant_named_namespace_without_owner_reference() -> None:
    r = run(index(ns(ROOT), ns("tenant-a", parent=None)), claims_for(["tenant-a"]))
    assert kinds(r) == {"tenant-a": ProblemKind.MISSING_PARENT}
    assert r.entitled == {}


def test_missing_root_breaks_depth_one_tenants() -> None:
    r = run(index(ns("tenant-a"), ns("tenant-a-b")), claims_for(["tenant-a", "tenant-a-b"]))
    assert kinds(r) == {"tenant-a": ProblemKind.MISSING_PARENT}
    assert r.entitled == {}


def test_owner_uid_mismatch() -> None:
    namespaces = index(ns(ROOT), ns("tenant-a", owner_uid="uid-of-an-older-root"), ns("tenant-a-b"))
    r = run(namespaces, claims_for(namespaces))
    assert kinds(r) == {"tenant-a": ProblemKind.LINK_MISMATCH}
    assert "uid-of-an-older-root" in r.problems[0].message
    assert set(r.entitled) == {(ROOT, "vws")}
    assert r.broken_by["tenant-a-b"] == "tenant-a"


@pytest.mark.parametrize(("name", "parent"), [
    ("tenant-x-y", "tenant-a"),      # name encodes another parent
    ("tenant-a-b", ROOT),            # depth-2 name under the root
    ("tenant-root-y", ROOT),         # root's name is not a prefix for its children
    ("tenant-q", "tenant-a-b"),      # child name shorter than parent's
    ("tenant-a-", "tenant-a"),       # empty tenant word
])
def test_name_prefix_mismatch(name: str, parent: str) -> None:
    namespaces = index(ns(ROOT), ns("tenant-a"), ns("tenant-a-b"), ns(name, parent=parent))
    r = run(namespaces, claims_for([name]))
    assert kinds(r)[name] is ProblemKind.LINK_MISMATCH
    assert (name, "vws") not in r.entitled


def test_owner_that_is_not_a_tenant() -> None:
    namespaces = index(ns(ROOT), Namespace("default", "uid-default"),
                       ns("default-x", labels={PREFIX + "default-x": ""}, parent="default"))
    r = run(namespaces, claims_for(["default-x"]))
    assert kinds(r) == {"default-x": ProblemKind.LINK_MISMATCH}
    assert "default" not in r.effective


@pytest.mark.parametrize("drop", ["tenant-a", "tenant-a-b"])
def test_missing_ancestor_or_self_label(drop: str) -> None:
    labels = tenant_labels("tenant-a-b", True)
    del labels[PREFIX + drop]
    namespaces = index(ns(ROOT), ns("tenant-a"), ns("tenant-a-b", labels=labels), ns("tenant-a-b-c"))
    r = run(namespaces, claims_for(namespaces))
    assert kinds(r) == {"tenant-a-b": ProblemKind.LINK_MISMATCH}
    assert drop in r.problems[0].message
    assert set(r.entitled) == {(ROOT, "vws"), ("tenant-a", "vws")}


def test_root_label_may_be_absent_below_depth_one() -> None:
    """Cozystack <= v1.5.x omitted the root label at depth >= 2; that must not revoke licenses."""
    labels = tenant_labels("tenant-a-b", True)
    del labels[PREFIX + ROOT]
    r = run(index(ns(ROOT), ns("tenant-a"), ns("tenant-a-b", labels=labels)), claims_for(["tenant-a-b"]))
    assert r.problems == () and ("tenant-a-b", "vws") in r.entitled


def test_label_naming_a_non_ancestor_is_a_mismatch() -> None:
    labels = tenant_labels("tenant-a-b", True) | {PREFIX + "tenant-z": ""}
    r = run(index(ns(ROOT), ns("tenant-a"), ns("tenant-z"), ns("tenant-a-b", labels=labels)),
            claims_for(["tenant-a-b"]))
    assert kinds(r) == {"tenant-a-b": ProblemKind.LINK_MISMATCH}
    assert "tenant-z" in r.problems[0].message


def test_two_node_cycle_and_its_descendants() -> None:
    namespaces = index(ns(ROOT), ns("tenant-a", parent="tenant-b"), ns("tenant-b", parent="tenant-a"),
                       ns("tenant-a-c"), ns("tenant-d"))
    r = run(namespaces, claims_for(namespaces))
    assert kinds(r) == {"tenant-a": ProblemKind.CYCLE, "tenant-b": ProblemKind.CYCLE}
    assert "tenant-a -> tenant-b -> tenant-a" in r.problems[0].message
    assert set(r.entitled) == {(ROOT, "vws"), ("tenant-d", "vws")}
    assert r.broken_by["tenant-a-c"] == "tenant-a"


def test_self_loop() -> None:
    r = run(index(ns(ROOT), ns("tenant-a", parent="tenant-a"), ns("tenant-a-b")),
            claims_for(["tenant-a", "tenant-a-b"]))
    assert kinds(r) == {"tenant-a": ProblemKind.CYCLE}
    assert r.entitled == {}


def test_problems_are_bounded_and_deterministic() -> None:
    """One broken tenant with a large subtree gives one namespace Problem, in any input order."""
    names = [ROOT, "tenant-a"] + [f"tenant-a-{w}" for w in "bcdefghijk"]
    namespaces = [ns(n) for n in names if n != "tenant-a"] + [ns("tenant-a", owner_uid="stale")]
    claims = [*claims_for(names), GpuClaim("tenant-a-b", "q", "gone"), GpuClaim(ROOT, "q", "gone")]
    first = run(index(*namespaces), claims)
    rng = random.Random(7)
    for _ in range(5):
        rng.shuffle(namespaces)
        rng.shuffle(claims)
        again = run(index(*namespaces), claims)
        assert again == first
        assert list(again.entitled) == list(first.entitled)
    assert [(p.kind, p.ref) for p in first.problems] == [
        (ProblemKind.LINK_MISMATCH, ObjectRef("", "tenant-a")),
        (ProblemKind.UNKNOWN_CLASS, ObjectRef("tenant-a-b", "q")),
        (ProblemKind.UNKNOWN_CLASS, ObjectRef(ROOT, "q")),
    ]
    assert all(isinstance(p, Problem) for p in first.problems)


# --- property: a random tree against a naive oracle -------------------------------------------

@st.composite
def random_trees(draw: st.DrawFn) -> tuple[list[int | None], list[bool], list[bool]]:
    """parents[i] < i (node 0 is the root), a flag per node and a 'broken uid' mark per node."""
    n = draw(st.integers(1, 30))
    parents: list[int | None] = [None] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    flags = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    broken = [False, *draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))]
    return parents, flags, broken


@settings(max_examples=300, deadline=None)
@given(random_trees())
def test_random_tree_matches_naive_oracle(tree: tuple[list[int | None], list[bool], list[bool]]) -> None:
    parents, flags, broken = tree
    names: list[str] = []
    for i, p in enumerate(parents):
        if p is None:
            names.append(ROOT)
        else:
            names.append(f"tenant-n{i}" if p == 0 else f"{names[p]}-n{i}")
    namespaces = index(*(
        ns(name, flags[i], owner_uid="stale" if broken[i] else None) for i, name in enumerate(names)))
    r = run(namespaces, claims_for(names))

    def path(i: int) -> list[int]:
        out = [i]
        while (p := parents[out[-1]]) is not None:
            out.append(p)
        return out

    for i, name in enumerate(names):
        ok = all(flags[j] and not broken[j] for j in path(i))
        assert r.effective[name] is ok
        assert ((name, "vws") in r.entitled) is ok
        nearest_broken = next((names[j] for j in path(i) if broken[j]), None)
        assert r.broken_by.get(name) == nearest_broken
    assert {p.ref.name for p in r.problems} == {names[i] for i in range(len(names)) if broken[i]}


# --- scale ------------------------------------------------------------------------------------

def test_five_thousand_namespaces_and_claims() -> None:
    """A bushy tree at the benchmarks' scale is decided whole (its time is measured in benchmarks/, not here)."""
    namespaces: dict[str, Namespace] = {ROOT: ns(ROOT)}
    frontier = [ROOT]
    i = 0
    while len(namespaces) < 5000:  # a bushy tree, depth up to ~6
        parent = frontier[i % len(frontier)]
        i += 1
        child = (f"tenant-w{i}" if parent == ROOT else f"{parent}-w{i}")
        namespaces[child] = ns(child)
        if child.count("-") < 6:
            frontier.append(child)
    claims = claims_for(namespaces)
    r = run(namespaces, claims)
    assert len(r.entitled) == 5000
    assert r.problems == ()
