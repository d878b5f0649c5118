"""Who is entitled to which license: the tenant tree, the vgpu flags, GPU classes and claims.

Pure: it sees only model projections and returns decisions plus problems; the controller turns
problems into Events and metrics. Semantics follow docs/design.md#tenants,
docs/design.md#vgpu-flag and docs/design.md#gpu-contract:

* The root tenant is effective iff its vgpu label is "true". A non-root tenant's parent is its
  controller ownerReference of kind Namespace (authoritative); the namespace name and the
  `<prefix><ancestor>` labels must agree with it, and the owner uid must be the parent's uid.
  Cozystack builds them in cozystack/cozystack packages/apps/tenant/templates/namespace.yaml
  (name from `tenant.name` in _helpers.tpl: child `x` of the root is `tenant-x`, child `y` of
  `tenant-x` is `tenant-x-y`; labels from `tenant.ancestorTenantLabels`).
* Effective(ns) = label(ns) == "true" AND Effective(parent). Broken links are never guessed.
* (ns, class) is entitled iff ns is effective and not terminating, and ns holds a GPUClaim for a
  class in mode vgpu that names a license Secret. Passthrough classes are not replicated.

Problem reporting rule (bounded, deterministic): each namespace or class gets at most one Problem,
and each (namespace, missing class) pair at most one. A namespace whose *own* links are broken gets
a Problem; its descendants are not effective but get no Problem of their own (one typo must not
flood thousands of namespaces with Events) — `broken_by` names the nearest broken ancestor instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from licensectl.core.model import GpuClaim, GpuClass, GpuMode, Namespace, ObjectRef

# Cozystack's `tenant.name` helper names every child of the root `tenant-<word>` and fails on
# release names with more dashes (cozystack/cozystack packages/apps/tenant/templates/_helpers.tpl).
TENANT_NAME_PREFIX = "tenant-"

_MAX_NAMES_IN_MESSAGE = 3


@dataclass(frozen=True, slots=True)
class TenantSettings:
    """The tenant-model settings entitlement needs (see config.Settings for their meaning;
    licensectl.controllers.settings builds them from it)."""

    vgpu_label: str = "gpu.cozystack.io/vgpu"
    tenant_label_prefix: str = "tenant.cozystack.io/"
    root_tenant: str = "tenant-root"


class ProblemKind(StrEnum):
    CYCLE = "cycle"
    MISSING_PARENT = "missing_parent"
    LINK_MISMATCH = "link_mismatch"
    UNKNOWN_CLASS = "unknown_class"
    INVALID_CLASS = "invalid_class"


@dataclass(frozen=True, slots=True)
class Problem:
    """Something an operator must fix. `ref` is the object to attach an Event to."""

    kind: ProblemKind
    ref: ObjectRef
    message: str


@dataclass(frozen=True, slots=True)
class EntitlementResult:
    # Per tenant namespace (non-tenants are absent): does the vgpu flag hold up to the root?
    effective: Mapping[str, bool]
    # (namespace, class name) -> license source Secret: one replica per entry.
    entitled: Mapping[tuple[str, str], ObjectRef]
    problems: tuple[Problem, ...]
    # Tenant namespace -> the namespace whose Problem makes it ineffective (itself, or the
    # nearest broken ancestor). Only broken namespaces appear.
    broken_by: Mapping[str, str]


def _short_list(names: Iterable[str]) -> str:
    items = sorted(names)
    shown = ", ".join(items[:_MAX_NAMES_IN_MESSAGE])
    more = len(items) - _MAX_NAMES_IN_MESSAGE
    return shown + (f" and {more} more" if more > 0 else "")


class _Tree:
    """Memoized walk over the tenant tree (each namespace is resolved once: O(n * depth))."""

    def __init__(self, namespaces: Mapping[str, Namespace], settings: TenantSettings) -> None:
        self.ns = namespaces
        self.s = settings
        self.effective: dict[str, bool] = {}
        self.broken_by: dict[str, str] = {}
        self.problems: dict[str, Problem] = {}

    def is_tenant(self, n: Namespace) -> bool:
        if n.name == self.s.root_tenant or n.name.startswith(TENANT_NAME_PREFIX) or n.owner_name:
            return True
        return any(self._is_tenant_label(k) for k in n.labels)

    def _is_tenant_label(self, key: str) -> bool:
        return key.startswith(self.s.tenant_label_prefix) and key != self.s.vgpu_label

    def _flag(self, n: Namespace) -> bool:
        return n.labels.get(self.s.vgpu_label) == "true"

    def _break(self, name: str, kind: ProblemKind, message: str) -> None:
        self.effective[name] = False
        self.broken_by[name] = name
        self.problems[name] = Problem(kind, ObjectRef("", name), message)

    def resolve(self, start: str) -> None:
        """Resolve `start` and every unresolved ancestor, root-most first."""
        path: list[str] = []
        on_path: dict[str, int] = {}
        cur: str | None = start
        while cur is not None and cur not in self.effective:
            if cur in on_path:
                cycle = path[on_path[cur]:]
                chain = " -> ".join([*cycle, cur])
                for member in cycle:
                    self._break(member, ProblemKind.CYCLE,
                                f"namespace {member}: parent ownerReferences form a cycle ({chain})")
                break
            on_path[cur] = len(path)
            path.append(cur)
            n = self.ns[cur]
            if cur == self.s.root_tenant:
                break
            owner = self.ns.get(n.owner_name) if n.owner_name else None
            cur = owner.name if owner is not None and self.is_tenant(owner) else None
        for name in reversed(path):
            if name not in self.effective:
                self._resolve_one(self.ns[name])

    def _resolve_one(self, n: Namespace) -> None:
        if n.name == self.s.root_tenant:
            self.effective[n.name] = self._flag(n)
            return
        problem = self._local_problem(n)
        if problem is not None:
            self._break(n.name, *problem)
            return
        assert n.owner_name is not None  # _local_problem checked it
        parent = n.owner_name
        if parent in self.broken_by:
            self.effective[n.name] = False
            self.broken_by[n.name] = self.broken_by[parent]
            return
        self.effective[n.name] = self._flag(n) and self.effective[parent]

    def _local_problem(self, n: Namespace) -> tuple[ProblemKind, str] | None:
        """The first thing wrong with this namespace's own parent link, if any."""
        if not n.owner_name:
            return (ProblemKind.MISSING_PARENT,
                    f"namespace {n.name}: looks like a tenant but has no controller ownerReference "
                    "to a parent Namespace")
        parent = self.ns.get(n.owner_name)
        if parent is None:
            return (ProblemKind.MISSING_PARENT,
                    f"namespace {n.name}: parent namespace {n.owner_name} does not exist")
        if not self.is_tenant(parent):
            return (ProblemKind.LINK_MISMATCH,
                    f"namespace {n.name}: owner namespace {parent.name} is not a tenant")
        if n.owner_uid != parent.uid:
            return (ProblemKind.LINK_MISMATCH,
                    f"namespace {n.name}: ownerReference uid {n.owner_uid} is not the uid "
                    f"{parent.uid} of parent namespace {parent.name}")
        base = TENANT_NAME_PREFIX if parent.name == self.s.root_tenant else parent.name + "-"
        word = n.name[len(base):]
        if not n.name.startswith(base) or not word or "-" in word:
            return (ProblemKind.LINK_MISMATCH,
                    f"namespace {n.name}: name does not encode parent {parent.name} "
                    f"(expected {base}<name without dashes>)")
        # The name is now known to encode the owner chain, so the chain comes from the name.
        parts = n.name.split("-")
        required = {"-".join(parts[: i + 1]) for i in range(1, len(parts))}
        # Released Cozystack up to v1.5.x derived labels from the parent's name and so omitted the
        # root label at depth >= 2 (fixed by `tenant.ancestorTenantLabels`): tolerate its absence.
        allowed = required | {self.s.root_tenant}
        prefix = self.s.tenant_label_prefix
        present = {k[len(prefix):] for k in n.labels if self._is_tenant_label(k)}
        missing = required - present
        if missing:
            return (ProblemKind.LINK_MISMATCH,
                    f"namespace {n.name}: missing tenant labels for {_short_list(missing)}")
        extra = present - allowed
        if extra:
            return (ProblemKind.LINK_MISMATCH,
                    f"namespace {n.name}: tenant labels name non-ancestors {_short_list(extra)}")
        return None


def _class_problem(c: GpuClass) -> str | None:
    if c.mode not in (GpuMode.VGPU, GpuMode.PASSTHROUGH):
        return f"GPUClass {c.name}: mode {c.mode!r} is neither vgpu nor passthrough"
    if c.mode == GpuMode.VGPU and (c.secret_ref is None or not c.secret_ref.namespace
                                   or not c.secret_ref.name):
        return f"GPUClass {c.name}: vgpu mode needs spec.license.secretRef (namespace and name)"
    return None


def compute_entitlement(namespaces: Mapping[str, Namespace], classes: Mapping[str, GpuClass],
                        claims: Iterable[GpuClaim], *, settings: TenantSettings) -> EntitlementResult:
    """Decide effective flags and (namespace, class) entitlements; report broken inputs."""
    tree = _Tree(namespaces, settings)
    tenants = sorted(name for name, n in namespaces.items() if tree.is_tenant(n))
    for name in tenants:
        if name not in tree.effective:
            tree.resolve(name)

    problems: list[Problem] = list(tree.problems.values())
    for cname in sorted(classes):
        msg = _class_problem(classes[cname])
        if msg is not None:
            problems.append(Problem(ProblemKind.INVALID_CLASS, ObjectRef("", cname), msg))

    entitled: dict[tuple[str, str], ObjectRef] = {}
    unknown: dict[tuple[str, str], str] = {}  # (namespace, class name) -> first claim name
    for claim in claims:
        cname = claim.class_name or ""
        gpu_class = classes.get(cname) if cname else None
        if gpu_class is None:
            key = (claim.namespace, cname)
            if key not in unknown or claim.name < unknown[key]:
                unknown[key] = claim.name
            continue
        ns = namespaces.get(claim.namespace)
        if (ns is None or ns.terminating or not tree.effective.get(ns.name, False)
                or gpu_class.mode != GpuMode.VGPU or _class_problem(gpu_class) is not None):
            continue
        assert gpu_class.secret_ref is not None  # _class_problem checked it
        entitled[(ns.name, cname)] = gpu_class.secret_ref
    for (ns_name, cname), claim_name in unknown.items():
        what = f"class {cname} does not exist" if cname else "names no class"
        problems.append(Problem(ProblemKind.UNKNOWN_CLASS, ObjectRef(ns_name, claim_name),
                                f"GPUClaim {ns_name}/{claim_name}: {what}"))

    problems.sort(key=lambda p: (p.ref.namespace, p.ref.name, p.kind))
    return EntitlementResult(
        effective=MappingProxyType({k: tree.effective[k] for k in tenants}),
        entitled=MappingProxyType(dict(sorted(entitled.items()))),
        problems=tuple(problems),
        broken_by=MappingProxyType(dict(sorted(tree.broken_by.items()))),
    )


def customer_tenant(namespace: str, namespaces: Mapping[str, Namespace], settings: TenantSettings) -> str:
    """The top-level tenant (a child of the root tenant) that `namespace` belongs to: the hoster's
    customer, the `tenant` label of guest metrics (docs/operations.md#metrics-cardinality).

    `tenant-acme-ml` belongs to `tenant-acme`; the root tenant and a top-level tenant are their own.
    The walk follows the controller ownerReferences entitlement verified; a namespace outside the
    tree, or whose chain is broken or cyclic, is its own tenant (never guessed from its name).
    """
    cur = namespaces.get(namespace)
    seen: set[str] = set()
    while cur is not None and cur.name != settings.root_tenant and cur.name not in seen:
        seen.add(cur.name)
        parent = namespaces.get(cur.owner_name) if cur.owner_name else None
        if parent is None:
            break
        if parent.name == settings.root_tenant:
            return cur.name
        cur = parent
    return settings.root_tenant if cur is not None and cur.name == settings.root_tenant else namespace
