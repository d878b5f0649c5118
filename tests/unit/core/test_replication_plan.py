"""The replication planner (licensectl/core/replication.py) on plain values: a GPUClass edited in place
holds its replicas instead of rolling every tenant (docs/design.md#decision-class-change), and every
class's FeatureType is checked against its profile (docs/design.md#feature-type)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping

from licensectl.core.entitlement import TenantSettings
from licensectl.core.model import (
    ANN_CLASS_LICENSE,
    ANN_REVISION_TIME,
    KEY_GRIDD_CONF,
    KEY_TOKEN,
    GpuClaim,
    GpuClass,
    ObjectRef,
    ReplicaSecret,
    SourceSecret,
)
from licensectl.core.profiles import CheckResult
from licensectl.core.render import DesiredReplica, ReplicaState, class_license, held_license, replica_name
from licensectl.core.replication import (
    LicenseChange,
    ReplicationInputs,
    ReplicationPlan,
    SourceRevisions,
    plan_replication,
)
from licensectl.core.rotation import RotationRecord
from tests.unit.controllers.test_replication_loop import ROOT, tenant

SRC = ObjectRef("licensing", "nls-token")
OTHER = ObjectRef("licensing", "nls-token-2")
VWS = GpuClass("vws", "uid-vws", "vgpu", SRC, 1)
REPLICA = replica_name("vws")
NOW = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
TENANTS = ["tenant-a", "tenant-b"]


def source(ref: ObjectRef = SRC, token: bytes = b"token-one\n") -> SourceSecret:
    return SourceSecret(namespace=ref.namespace, name=ref.name, uid=f"uid-{ref.name}", resource_version="1",
                        data={KEY_TOKEN: token})


def observed(d: DesiredReplica) -> ReplicaSecret:
    """The replica the kube layer sees after `d` was written."""
    return ReplicaSecret(namespace=d.namespace, name=d.name, uid=f"uid-{d.namespace}", resource_version="5",
                         labels=dict(d.labels), annotations=dict(d.annotations), data_digest=d.data_digest)


def without_record(r: ReplicaSecret) -> ReplicaSecret:
    """A replica as a release before the class-license record wrote it."""
    return dataclasses.replace(r, annotations={k: v for k, v in r.annotations.items() if k != ANN_CLASS_LICENSE})


@dataclasses.dataclass
class World:
    classes: dict[str, GpuClass] = dataclasses.field(default_factory=lambda: {"vws": VWS})
    tenants: list[str] = dataclasses.field(default_factory=lambda: list(TENANTS))
    claims: list[GpuClaim] = dataclasses.field(default_factory=list)
    sources: dict[ObjectRef, SourceSecret | None] = dataclasses.field(
        default_factory=lambda: {SRC: source(), OTHER: source(OTHER, b"token-two\n")})
    replicas: dict[tuple[str, str], ReplicaSecret] = dataclasses.field(default_factory=dict)
    rotations: Mapping[ObjectRef, SourceRevisions] | None = None

    def __post_init__(self) -> None:
        if not self.claims:
            self.claims = [GpuClaim(t, "gpu", "vws") for t in self.tenants]

    def plan(self) -> ReplicationPlan:
        return plan_replication(ReplicationInputs(
            namespaces={n.name: n for n in [tenant(ROOT), *(tenant(t) for t in self.tenants)]},
            classes=self.classes, claims=self.claims, sources=self.sources, replicas=self.replicas,
            conflicts=frozenset(), credential_for=lambda ns: f"cred-{ns}",
            report_url="http://reports.invalid/v1/reports", token_key=KEY_TOKEN, tenant=TenantSettings(),
            now=NOW, rotations=self.rotations))

    def apply(self, plan: ReplicationPlan) -> None:
        """Write the plan's creates and updates, as the loop and the apiserver would."""
        for d in [*plan.creates, *(d for _, d in plan.updates)]:
            self.replicas[(d.namespace, d.name)] = observed(d)
        for r in plan.deletes:
            del self.replicas[(r.namespace, r.name)]

    def converge(self) -> ReplicationPlan:
        self.apply(plan := self.plan())
        return plan

    def edit(self, **changes: object) -> None:
        self.classes["vws"] = dataclasses.replace(self.classes["vws"], **changes)  # type: ignore[arg-type]

    def record(self, ns: str) -> str | None:
        return self.replicas[(ns, REPLICA)].annotations.get(ANN_CLASS_LICENSE)

    def feature_type_in(self, ns: str, plan: ReplicationPlan) -> str:
        d = next(d for d in [*plan.creates, *(d for _, d in plan.updates)] if d.namespace == ns)
        return next(ln for ln in d.data[KEY_GRIDD_CONF].decode().splitlines() if ln.startswith("FeatureType="))


def writes(plan: ReplicationPlan) -> list[tuple[str, str]]:
    return sorted([("create", d.namespace) for d in plan.creates] + [("update", d.namespace) for _, d in plan.updates]
                  + [("delete", r.namespace) for r in plan.deletes])


def held(plan: ReplicationPlan) -> set[str]:
    return {ns for (ns, _), st in plan.states.items() if st == ReplicaState.HELD}


def all_namespaces(names: Iterable[str] = TENANTS) -> list[str]:
    return sorted(names)


# --- the record ------------------------------------------------------------------------------------------
def test_every_replica_records_the_class_license_fields_outside_the_revision() -> None:
    w = World()
    plan = w.converge()
    assert writes(plan) == [("create", ns) for ns in all_namespaces()]
    assert {w.record(ns) for ns in all_namespaces()} == {"licensing/nls-token:1"} == {class_license(VWS)}
    # The record is no input of the revision: the same license under another record has the same revision.
    again = World(classes={"vws": dataclasses.replace(VWS, accept_license_change="x")}).plan()
    assert {d.revision for d in plan.creates} == {d.revision for d in again.creates}
    assert w.plan().updates == () and w.plan().creates == ()


def test_class_license_is_readable_and_none_without_usable_fields() -> None:
    assert class_license(dataclasses.replace(VWS, feature_type=4)) == "licensing/nls-token:4"
    assert class_license(dataclasses.replace(VWS, secret_ref=OTHER)) == "licensing/nls-token-2:1"
    for broken in (dataclasses.replace(VWS, secret_ref=None), dataclasses.replace(VWS, feature_type=None),
                   dataclasses.replace(VWS, feature_type=True), dataclasses.replace(VWS, feature_type="1"),
                   dataclasses.replace(VWS, feature_type=3)):
        assert class_license(broken) is None


# --- hold ---------------------------------------------------------------------------------------------------
def test_a_feature_type_edited_in_place_holds_every_replica() -> None:
    w = World()
    w.converge()
    before = dict(w.replicas)
    w.edit(feature_type=4)
    plan = w.plan()
    assert writes(plan) == []  # no update: the revision (and so the VMs) stays as it is
    assert held(plan) == set(all_namespaces())
    assert plan.license_changes == {"vws": LicenseChange("vws", "licensing/nls-token:4", ("licensing/nls-token:1",), 2)}
    assert plan.state_counts()[ReplicaState.HELD.value] == 2
    w.apply(plan)
    assert w.replicas == before


def test_a_source_edited_in_place_holds_every_replica_and_names_both_secrets() -> None:
    w = World()
    w.converge()
    w.edit(secret_ref=OTHER)
    plan = w.plan()
    assert writes(plan) == [] and held(plan) == set(all_namespaces())
    change = plan.license_changes["vws"]
    assert (change.recorded, change.current) == (("licensing/nls-token:1",), "licensing/nls-token-2:1")


def test_a_source_change_with_identical_content_is_held_too() -> None:
    """The rule is about the class's fields, not the bytes: the hoster decides, even when nothing restarts."""
    w = World(sources={SRC: source(), OTHER: source(OTHER)})
    w.converge()
    w.edit(secret_ref=OTHER)
    plan = w.plan()
    assert writes(plan) == [] and held(plan) == set(all_namespaces())


def test_reverting_the_class_releases_the_hold_without_a_write() -> None:
    w = World()
    w.converge()
    w.edit(feature_type=4)
    assert held(w.converge())
    w.edit(feature_type=1)
    plan = w.plan()
    assert writes(plan) == [] and held(plan) == set() and plan.license_changes == {}
    assert set(plan.states.values()) == {ReplicaState.IN_SYNC.value}


def test_other_class_fields_hold_nothing() -> None:
    w = World()
    w.converge()
    w.edit(profile="L40S-2Q", uid="uid-other")
    plan = w.plan()
    assert writes(plan) == [] and held(plan) == set()


# --- accept ------------------------------------------------------------------------------------------------
def test_accepting_the_new_value_updates_every_replica() -> None:
    w = World()
    first = w.converge()
    w.edit(feature_type=4)
    w.converge()
    w.edit(accept_license_change="licensing/nls-token:4")
    plan = w.converge()
    assert writes(plan) == [("update", ns) for ns in all_namespaces()]
    assert all(w.feature_type_in(ns, plan) == "FeatureType=4" for ns in all_namespaces())
    assert {d.revision for _, d in plan.updates}.isdisjoint({d.revision for d in first.creates})  # the roll
    assert {w.record(ns) for ns in all_namespaces()} == {"licensing/nls-token:4"}
    assert held(plan) == set() and plan.license_changes == {}
    assert w.plan().updates == ()


def test_an_acceptance_naming_another_value_accepts_nothing() -> None:
    w = World()
    w.converge()
    w.edit(feature_type=4, accept_license_change="licensing/nls-token:2")
    plan = w.plan()
    assert writes(plan) == [] and held(plan) == set(all_namespaces())


def test_a_later_edit_after_an_acceptance_is_held_again() -> None:
    w = World()
    w.converge()
    w.edit(feature_type=4, accept_license_change="licensing/nls-token:4")
    w.converge()
    w.edit(secret_ref=OTHER)  # the annotation still names the change accepted before
    plan = w.plan()
    assert writes(plan) == [] and held(plan) == set(all_namespaces())
    assert plan.license_changes["vws"].recorded == ("licensing/nls-token:4",)
    assert plan.license_changes["vws"].current == "licensing/nls-token-2:4"


def test_held_license_rules() -> None:
    w = World()
    w.converge()
    r = w.replicas[("tenant-a", REPLICA)]
    changed = dataclasses.replace(VWS, feature_type=4)
    assert held_license(r, VWS) is None  # unchanged
    assert held_license(r, changed) == "licensing/nls-token:1"
    assert held_license(r, dataclasses.replace(changed, accept_license_change="licensing/nls-token:4")) is None
    assert held_license(None, changed) is None  # not written yet: created from the class as it is
    assert held_license(without_record(r), changed) is None
    foreign = dataclasses.replace(r, labels={})
    assert held_license(foreign, changed) is None  # not licensectl's: a conflict, never held
    assert held_license(r, dataclasses.replace(changed, name="other")) is None  # another class's replica
    assert held_license(r, dataclasses.replace(VWS, feature_type=3)) is None  # no usable fields: render refuses


# --- namespaces, old replicas, entitlement -------------------------------------------------------------
def test_a_namespace_entitled_while_the_class_is_changed_gets_the_class_as_it_is() -> None:
    w = World()
    w.converge()
    w.edit(feature_type=4)
    w.tenants.append("tenant-c")
    w.claims.append(GpuClaim("tenant-c", "gpu", "vws"))
    plan = w.converge()
    assert writes(plan) == [("create", "tenant-c")]
    assert w.feature_type_in("tenant-c", plan) == "FeatureType=4"
    assert w.record("tenant-c") == "licensing/nls-token:4"
    assert held(plan) == set(all_namespaces())  # the others stay held
    assert plan.license_changes["vws"].held == 2
    assert w.plan().creates == ()


def test_a_replica_without_a_record_is_not_held_and_gains_it_with_its_next_write() -> None:
    w = World()
    w.converge()
    w.replicas = {key: without_record(r) for key, r in w.replicas.items()}
    # In sync apart from the record: no write of its own at upgrade.
    assert writes(w.plan()) == []
    assert set(w.plan().states.values()) == {ReplicaState.IN_SYNC.value}
    # A class edit is not held for them: it rolls out as before, and the record comes with that write.
    w.edit(feature_type=4)
    plan = w.converge()
    assert writes(plan) == [("update", ns) for ns in all_namespaces()] and held(plan) == set()
    assert {w.record(ns) for ns in all_namespaces()} == {"licensing/nls-token:4"}


def test_a_replica_without_a_record_gains_it_with_a_token_rotation() -> None:
    w = World()
    w.converge()
    w.replicas = {key: without_record(r) for key, r in w.replicas.items()}
    w.sources[SRC] = source(token=b"token-rotated\n")
    plan = w.converge()
    assert writes(plan) == [("update", ns) for ns in all_namespaces()]
    assert {w.record(ns) for ns in all_namespaces()} == {"licensing/nls-token:1"}


def test_entitlement_ending_still_deletes_a_held_replica() -> None:
    w = World()
    w.converge()
    w.edit(feature_type=4)
    w.claims = [c for c in w.claims if c.namespace != "tenant-b"]
    plan = w.plan()
    assert writes(plan) == [("delete", "tenant-b")]
    assert held(plan) == set(all_namespaces(["tenant-a"]))


def test_a_changed_class_whose_new_source_is_missing_is_a_source_problem_first() -> None:
    w = World()
    w.converge()
    w.sources[OTHER] = None
    w.edit(secret_ref=OTHER)
    plan = w.plan()
    assert writes(plan) == [] and held(plan) == set()
    assert plan.source_problems["vws"].reason == "source_missing"
    w.sources[OTHER] = source(OTHER, b"token-two\n")
    assert held(w.plan()) == set(all_namespaces())


def test_a_held_replica_keeps_its_revision_time_and_content_across_passes() -> None:
    w = World()
    w.converge()
    before = {ns: w.replicas[(ns, REPLICA)].annotations[ANN_REVISION_TIME] for ns in all_namespaces()}
    w.edit(feature_type=4)
    for _ in range(3):
        w.converge()
    assert {ns: w.replicas[(ns, REPLICA)].annotations[ANN_REVISION_TIME] for ns in all_namespaces()} == before


def test_the_hold_applies_under_safe_rotation_too() -> None:
    """With revision stores the replica follows the stored stable bytes; a class edit is held all the same."""
    stores = {ref: SourceRevisions(RotationRecord(stable="s"), stable=source(ref, tok), candidate=None)
              for ref, tok in ((SRC, b"token-one\n"), (OTHER, b"token-two\n"))}
    w = World(rotations=stores)
    w.converge()
    w.edit(secret_ref=OTHER)
    plan = w.plan()
    assert writes(plan) == [] and held(plan) == set(all_namespaces())
    w.edit(accept_license_change="licensing/nls-token-2:1")
    assert writes(w.plan()) == [("update", ns) for ns in all_namespaces()]


def test_two_classes_one_changed() -> None:
    vcs = GpuClass("vcs", "uid-vcs", "vgpu", OTHER, 4)
    w = World(classes={"vws": VWS, "vcs": vcs})
    w.claims += [GpuClaim("tenant-a", "gpu2", "vcs")]
    w.converge()
    w.classes["vcs"] = dataclasses.replace(vcs, feature_type=1)
    plan = w.plan()
    assert held(plan) == {"tenant-a"} and set(plan.license_changes) == {"vcs"}
    assert plan.states[("tenant-a", REPLICA)] == ReplicaState.IN_SYNC.value


# --- FeatureType checks in the plan ------------------------------------------------------------------------
def test_every_class_gets_its_feature_type_check_and_a_mismatch_still_renders() -> None:
    classes = {
        "vws": dataclasses.replace(VWS, feature_type=4, profile="L40S-2Q"),  # Q needs 1 or 2
        "vcs": GpuClass("vcs", "u2", "vgpu", OTHER, 4, profile="nvidia.com/NVIDIA_A100-4C"),
        "plain": GpuClass("plain", "u3", "vgpu", SRC, 1),
        "odd": GpuClass("odd", "u4", "vgpu", SRC, 1, profile="not a type"),
        "pt": GpuClass("pt", "u5", "passthrough", None, 1),  # not entitled, checked all the same
    }
    w = World(classes=classes)
    plan = w.plan()
    assert {n: c.result for n, c in plan.feature_type_checks.items()} == {
        "vws": CheckResult.MISMATCH, "vcs": CheckResult.OK, "plain": CheckResult.NO_PROFILE,
        "odd": CheckResult.UNKNOWN_PROFILE, "pt": CheckResult.MISMATCH}
    # The class decides: its replicas are written with FeatureType 4 anyway.
    assert writes(plan) == [("create", ns) for ns in all_namespaces()]
    assert all(w.feature_type_in(ns, plan) == "FeatureType=4" for ns in all_namespaces())
    assert "vws" not in plan.source_problems


def test_feature_types_outside_the_accepted_set_stay_refused() -> None:
    w = World(classes={"vws": dataclasses.replace(VWS, feature_type=3, profile="L40S-2Q")})
    plan = w.plan()
    assert plan.feature_type_checks["vws"].mismatch
    assert plan.source_problems["vws"].reason == "invalid_feature_type" and writes(plan) == []
