"""What the last replication pass saw and did, and how it shows: the gauges of /metrics and the
replication part of /v1/status (`licensectl status`). Read-only views of the status record, kept apart
from the reconcile that writes it."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from licensectl.core import tokeninfo
from licensectl.core.entitlement import ProblemKind
from licensectl.core.model import ANN_ACCEPT_LICENSE_CHANGE, ObjectRef
from licensectl.core.ports import ReplicationCaches
from licensectl.core.render import ReplicaState
from licensectl.core.replication import ReplicationPlan
from licensectl.core.revision_text import short
from licensectl.metrics import GaugeSample

# Label values of the metrics that export one series per enum value, zeros included, so a new
# value is exported as soon as the enum has it: `replicas{state}` and `tenant_problems{kind}`.
REPLICA_STATES: tuple[str, ...] = tuple(s.value for s in ReplicaState)
TENANT_PROBLEM_KINDS: tuple[str, ...] = tuple(k.value for k in ProblemKind)


@dataclass
class ReplicationStatus:
    """What the last pass saw and did; feeds metrics and `licensectl status`."""

    plan: ReplicationPlan | None = None
    deferred_deletions: int = 0
    # Names held by foreign Secrets -> when that was last seen (monotonic). Foreign Secrets are not
    # watched (only licensectl's own are), so a conflict is re-checked by a write attempt after
    # replication_loop.CONFLICT_RECHECK_SECONDS: once the tenant removes the Secret, the replica appears.
    conflicts: dict[tuple[str, str], float] = field(default_factory=dict)
    token_expiry: dict[ObjectRef, dt.datetime | None] = field(default_factory=dict)
    token_format: dict[ObjectRef, tokeninfo.TokenFormat] = field(default_factory=dict)
    # Per source: is its token readable, unreadable (a source problem) or knowingly opaque.
    token_readability: dict[ObjectRef, tokeninfo.Readability] = field(default_factory=dict)
    last_pass: dt.datetime | None = None


def class_status(plan: ReplicationPlan) -> dict[str, dict[str, Any]]:
    """Per class: its FeatureType check and any held license change, as `licensectl status` shows them."""
    out: dict[str, dict[str, Any]] = {}
    for name, check in sorted(plan.feature_type_checks.items()):
        change = plan.license_changes.get(name)
        out[name] = {
            "feature_type_check": check.result.value,
            "feature_type_message": check.message or None,
            "license_change": None if change is None else {
                "from": list(change.recorded), "to": change.current, "held": change.held,
                "accept": f"{ANN_ACCEPT_LICENSE_CHANGE}={change.current}"},
        }
    return out


def token_readability(status: ReplicationStatus, caches: ReplicationCaches, class_name: str) -> tokeninfo.Readability:
    """Whether the token of the class's source was readable in the last pass (readable when unknown)."""
    gc = caches.classes.snapshot().get(("", class_name))
    ref = gc.secret_ref if gc is not None else None
    return status.token_readability.get(ref, tokeninfo.Readability.READABLE) if ref else \
        tokeninfo.Readability.READABLE


def samples(status: ReplicationStatus, caches: ReplicationCaches) -> Iterable[GaugeSample]:
    """The replication gauges, from the last pass's status and the caches."""
    plan = status.plan
    for inf in caches.all:
        yield GaugeSample("informer_synced", (("resource", inf.name),), 1.0 if inf.synced and inf.healthy else 0.0)
        stale = getattr(inf, "stale_seconds", None)
        if stale is not None:
            yield GaugeSample("watch_stale_seconds", (("resource", inf.name),), round(stale, 1))
    if plan is None:
        return
    for ref, n in sorted(plan.entitled_per_source().items(), key=lambda kv: str(kv[0])):
        yield GaugeSample("entitled_namespaces", (("source_namespace", ref.namespace), ("source_name", ref.name)),
                          float(n))
    states = Counter(plan.states.values())
    for state in REPLICA_STATES:
        yield GaugeSample("replicas", (("state", state),), float(states.get(state, 0)))
    classes = {k[1]: v for k, v in caches.classes.snapshot().items()}
    for class_name in sorted(set(plan.licenses) | set(plan.source_problems)):
        gc = classes.get(class_name)
        ref = gc.secret_ref if gc and gc.secret_ref else ObjectRef("", "")
        valid = class_name in plan.licenses
        yield GaugeSample("source_valid", (("class", class_name), ("source_namespace", ref.namespace),
                                           ("source_name", ref.name)), 1.0 if valid else 0.0)
        if valid:
            yield GaugeSample("source_revision_info",
                              (("class", class_name), ("source_namespace", ref.namespace),
                               ("source_name", ref.name),
                               ("revision", short(plan.licenses[class_name].source_revision))),
                              1.0)
        else:
            yield GaugeSample("source_problem", (("class", class_name),
                                                 ("reason", plan.source_problems[class_name].reason.value)), 1.0)
    for ref, exp in sorted(status.token_expiry.items(), key=lambda kv: str(kv[0])):
        labels = (("source_namespace", ref.namespace), ("source_name", ref.name))
        yield GaugeSample("token_expiry_known", labels, 0.0 if exp is None else 1.0)
        fmt = status.token_format.get(ref)
        if fmt is not None:
            yield GaugeSample("token_format", (*labels, ("format", fmt.value)), 1.0)
        readable = status.token_readability.get(ref)
        if readable is not None:
            yield GaugeSample("source_token_unreadable", labels,
                              1.0 if readable is tokeninfo.Readability.UNREADABLE else 0.0)
        if exp is not None:
            yield GaugeSample("token_expiry_timestamp_seconds", labels, exp.timestamp())
    for class_name, check in sorted(plan.feature_type_checks.items()):
        by_class = (("class", class_name),)
        yield GaugeSample("class_feature_type_mismatch", by_class, 1.0 if check.mismatch else 0.0)
        yield GaugeSample("class_license_changed", by_class, 1.0 if class_name in plan.license_changes else 0.0)
    kinds: dict[str, int] = {}
    for p in plan.tenant_problems:
        kinds[p.kind.value] = kinds.get(p.kind.value, 0) + 1
    for kind in TENANT_PROBLEM_KINDS:
        yield GaugeSample("tenant_problems", (("kind", kind),), float(kinds.get(kind, 0)))
    yield GaugeSample("deletions_deferred", (), float(status.deferred_deletions))


def status_dict(status: ReplicationStatus, caches: ReplicationCaches) -> dict[str, Any]:
    """The replication part of /v1/status."""
    plan = status.plan
    if plan is None:
        return {"synced": False}
    return {
        "synced": True,
        "entitled": [{"namespace": ns, "class": cls, "source": str(ref)}
                     for (ns, cls), ref in sorted((plan.entitlement.entitled if plan.entitlement else {}).items())],
        "replicas": [{"namespace": ns, "name": name, "state": st}
                     for (ns, name), st in sorted(plan.states.items())],
        "replica_counts": dict(plan.state_counts()),
        "sources": {cls: {"source_revision": short(lic.source_revision), "valid": True,
                          "token": token_readability(status, caches, cls).value}
                    for cls, lic in plan.licenses.items()}
        | {cls: {"valid": False, "reason": sp.reason.value, "message": sp.message}
           for cls, sp in plan.source_problems.items()},
        "tenant_problems": [{"kind": p.kind.value, "object": str(p.ref), "message": p.message}
                            for p in plan.tenant_problems],
        "classes": class_status(plan),
        "deferred_deletions": status.deferred_deletions,
        "token_expiry": {str(k): (v.isoformat() if v else None) for k, v in status.token_expiry.items()},
    }
