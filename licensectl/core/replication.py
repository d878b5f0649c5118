"""Replication planning: cluster snapshot in, the exact writes to make out. Pure.

Composes entitlement (who may hold which license) and rendering (what a replica must contain)
into a diff against the replicas that exist. The shell applies the plan; everything a pass needs
is in its inputs, so the same cluster state always yields the same plan (restart-safe).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from licensectl.core.entitlement import EntitlementResult, Problem, TenantSettings, compute_entitlement
from licensectl.core.model import GpuClaim, GpuClass, Namespace, ObjectRef, ReplicaSecret, SourceSecret
from licensectl.core.profiles import ProfileCheck, check_feature_type
from licensectl.core.render import (
    DesiredReplica,
    RenderedLicense,
    ReplicaAction,
    ReplicaState,
    SourceProblem,
    class_license,
    held_license,
    render_license,
    render_replica,
    replica_diff,
    replica_name,
    replica_state,
)
from licensectl.core.rotation import RotationRecord


@dataclass(frozen=True)
class ReplicationInputs:
    namespaces: Mapping[str, Namespace]
    classes: Mapping[str, GpuClass]
    claims: Iterable[GpuClaim]
    # Sources whose cache is synced: a SourceSecret, or None when confirmed absent. A source that is not
    # in this mapping is *unknown* (cache not synced) and is treated as "change nothing".
    sources: Mapping[ObjectRef, SourceSecret | None]
    replicas: Mapping[tuple[str, str], ReplicaSecret]  # owned replicas by (namespace, name)
    conflicts: frozenset[tuple[str, str]]  # names held by foreign Secrets, learned from writes
    credential_for: Callable[[str], str]
    report_url: str
    token_key: str
    tenant: TenantSettings
    now: dt.datetime
    report_ca: bytes = b""  # CA bundle of the reports listener; b"" over plain HTTP or until loaded
    # Safe rotation (docs/design.md#safe-rotation): per source, the record and the bytes it names.
    # None: replicas follow the live source (no rotation). A source missing from the mapping is
    # unknown (its store not written yet): its replicas are kept as they are.
    rotations: Mapping[ObjectRef, SourceRevisions] | None = None
    steps: tuple[float, ...] = (100.0,)
    # Id of the signing key `credential_for` derives from (docs/design.md#key-ring); "" writes no annotation.
    credential_key: str = ""
    # The signing-key revocation (KeyRing.revocation): part of every revision, so a revocation restarts VMs.
    credential_epoch: str = ""


@dataclass(frozen=True)
class SourceRevisions:
    """What the replicas of one source may carry: the stable bytes, and the candidate's if any."""

    record: RotationRecord
    stable: SourceSecret
    candidate: SourceSecret | None


@dataclass(frozen=True, slots=True)
class LicenseChange:
    """A class whose license fields were edited in place, holding replicas (docs/design.md#decision-class-change)."""

    class_name: str
    current: str  # the class's license fields now: the value its accept annotation must name
    recorded: tuple[str, ...]  # what the held replicas were rendered from, sorted
    held: int  # replicas held


@dataclass(frozen=True)
class ReplicationPlan:
    creates: tuple[DesiredReplica, ...] = ()
    updates: tuple[tuple[ReplicaSecret, DesiredReplica], ...] = ()
    deletes: tuple[ReplicaSecret, ...] = ()
    # (namespace, replica name) -> a ReplicaState value
    states: Mapping[tuple[str, str], str] = field(default_factory=dict)
    source_problems: Mapping[str, SourceProblem] = field(default_factory=dict)  # by class name
    licenses: Mapping[str, RenderedLicense] = field(default_factory=dict)  # by class name (live source)
    # Every license a replica may carry now, by its revision (stable and candidate of each class):
    # what a guest mounting a replica of that revision must hold.
    by_revision: Mapping[str, RenderedLicense] = field(default_factory=dict)
    entitlement: EntitlementResult | None = None
    # Classes edited in place whose replicas are held, by class name.
    license_changes: Mapping[str, LicenseChange] = field(default_factory=dict)
    # Every class's FeatureType against its profile (docs/design.md#feature-type), by class name.
    feature_type_checks: Mapping[str, ProfileCheck] = field(default_factory=dict)

    @property
    def tenant_problems(self) -> tuple[Problem, ...]:
        return self.entitlement.problems if self.entitlement else ()

    def entitled_per_source(self) -> Mapping[ObjectRef, int]:
        if self.entitlement is None:
            return {}
        return dict(Counter(self.entitlement.entitled.values()))

    def namespaces_per_source(self) -> Mapping[ObjectRef, frozenset[str]]:
        """Entitled namespaces by the source their classes name."""
        out: dict[ObjectRef, set[str]] = {}
        for (ns, _cls), ref in (self.entitlement.entitled.items() if self.entitlement else ()):
            out.setdefault(ref, set()).add(ns)
        return {ref: frozenset(nss) for ref, nss in out.items()}

    def state_counts(self) -> Mapping[str, int]:
        c = Counter(self.states.values())
        return {s.value: c.get(s.value, 0) for s in ReplicaState}


def plan_replication(inp: ReplicationInputs) -> ReplicationPlan:
    ent = compute_entitlement(inp.namespaces, inp.classes, inp.claims, settings=inp.tenant)

    # One render per class whose source is known; a problem keeps that class's replicas as they are.
    licenses: dict[str, RenderedLicense] = {}
    problems: dict[str, SourceProblem] = {}
    unknown: set[str] = set()
    # class -> (stable license, candidate license or None, record)
    rotated: dict[str, tuple[RenderedLicense, RenderedLicense | None, RotationRecord]] = {}
    by_revision: dict[str, RenderedLicense] = {}
    for class_name in sorted({c for _, c in ent.entitled}):
        gpu_class = inp.classes[class_name]
        ref = gpu_class.secret_ref
        if ref is None or ref not in inp.sources:
            unknown.add(class_name)
            continue
        rendered = render_license(inp.sources[ref], gpu_class, inp.token_key, credential_epoch=inp.credential_epoch)
        if isinstance(rendered, SourceProblem):
            problems[class_name] = rendered
            continue
        licenses[class_name] = rendered
        if inp.rotations is None:
            by_revision[rendered.revision] = rendered
            continue
        rot = inp.rotations.get(ref)
        if rot is None:
            unknown.add(class_name)
            continue
        stable = render_license(rot.stable, gpu_class, inp.token_key, credential_epoch=inp.credential_epoch)
        cand = None if rot.candidate is None else render_license(rot.candidate, gpu_class, inp.token_key,
                                                                 credential_epoch=inp.credential_epoch)
        if isinstance(stable, SourceProblem) or isinstance(cand, SourceProblem):
            unknown.add(class_name)  # stored bytes the class cannot render: keep replicas, change nothing
            continue
        rotated[class_name] = (stable, cand, rot.record)
        by_revision[stable.revision] = stable
        if cand is not None:
            by_revision[cand.revision] = cand

    creates: list[DesiredReplica] = []
    updates: list[tuple[ReplicaSecret, DesiredReplica]] = []
    states: dict[tuple[str, str], str] = {}
    held: dict[str, Counter[str]] = {}  # class -> recorded class license -> replicas held on it
    keep: set[tuple[str, str]] = set()
    for (ns, class_name), ref in sorted(ent.entitled.items()):
        name = replica_name(class_name)
        key = (ns, name)
        keep.add(key)
        existing = inp.replicas.get(key)
        lic: RenderedLicense | None = None if class_name in unknown else licenses.get(class_name)
        source_revision = ""
        if class_name in rotated:
            stable, cand, record = rotated[class_name]
            on_candidate = cand is not None and record.on_candidate(ns, inp.steps)
            lic = cand if on_candidate and cand is not None else stable
            source_revision = record.candidate if on_candidate else record.stable
        source = inp.sources.get(ref)
        if key in inp.conflicts and existing is None:
            states[key] = "conflict"
            continue
        if lic is None or source is None:
            # Invalid or unknown source: existing replicas are kept as they are, nothing new is written.
            states[key] = "missing" if existing is None else "in_sync"
            continue
        recorded = held_license(existing, inp.classes[class_name])
        if recorded is not None:
            # The class was edited in place and the hoster has not accepted it: writing would restart
            # every VM of every tenant of the class at once, so the replica stays exactly as it is.
            states[key] = ReplicaState.HELD.value
            held.setdefault(class_name, Counter())[recorded] += 1
            continue
        desired = render_replica(lic, namespace=ns, gpu_class=inp.classes[class_name], source=source,
                                 report_url=inp.report_url, credential=inp.credential_for(ns),
                                 existing=existing, now=inp.now, report_ca=inp.report_ca,
                                 source_revision=source_revision, credential_key=inp.credential_key)
        action = replica_diff(existing, desired)
        states[key] = replica_state(existing, desired).value
        if action is ReplicaAction.CREATE:
            creates.append(desired)
        elif action is ReplicaAction.UPDATE and existing is not None:
            updates.append((existing, desired))

    deletes = tuple(r for key, r in sorted(inp.replicas.items()) if key not in keep and r.owned)
    changes = {name: LicenseChange(class_name=name, current=class_license(inp.classes[name]) or "",
                                   recorded=tuple(sorted(by_value)), held=sum(by_value.values()))
               for name, by_value in sorted(held.items())}
    checks = {name: check_feature_type(c.mode, c.profile, c.feature_type) for name, c in sorted(inp.classes.items())}
    return ReplicationPlan(creates=tuple(creates), updates=tuple(updates), deletes=deletes, states=states,
                           source_problems=problems, licenses=licenses, by_revision=by_revision, entitlement=ent,
                           license_changes=changes, feature_type_checks=checks)
