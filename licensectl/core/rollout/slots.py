"""The guests a pass judges: one slot per VMI (VMI, owning VM, governing replica, parsed intent, missing
volumes, webhook stamp, delivery blocker), and one per VM whose VMI is gone while a restart is in flight.
Separate from `evaluation` because it joins the cluster view across objects, where evaluation looks at one
slot at a time.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from licensectl.core import model
from licensectl.core.delivery import delivery_refusal
from licensectl.core.rollout.constants import RESULT_DONE
from licensectl.core.rollout.inputs import ReplicaRevision, RestartIntent


@dataclass(frozen=True, slots=True)
class _Slot:
    """One guest: its VMI (None while being recreated), its VM (None if standalone), the governing
    replica and the parsed intent. Keyed by (namespace, VMI name) == (namespace, VM name)."""

    namespace: str
    name: str
    vmi: model.Vmi | None
    vm: model.Vm | None
    replica: ReplicaRevision
    intent: RestartIntent | None
    missing: tuple[str, ...] = ()  # wanted replica volumes the VMI does not carry (backstop)
    # The webhook's stamp against the mounted replicas: True all stamped ones match, False one does not,
    # None the governing replica is not stamped (the time rule judges).
    stamp: bool | None = None
    blocker: str | None = None  # missing, and the webhook cannot add it to this spec (delivery.Skip value)
    blocked_volume: str = ""  # with `blocker`: the license volume name the webhook refuses


def stamp_matches(vmi: model.Vmi, mounted: Iterable[ReplicaRevision], governing: ReplicaRevision) -> bool | None:
    """The webhook stamp against the replicas the VMI mounts: None when the governing replica is not
    stamped (an unstamped VMI, admitted before the stamp existed or while the webhook was away)."""
    stamps = dict(vmi.delivered_revisions)
    if governing.name not in stamps:
        return None
    return all(stamps[r.name] == r.revision for r in mounted if r.name in stamps)


def _vm_intent(vm: model.Vm | None) -> RestartIntent | None:
    return RestartIntent.from_annotations(vm.annotations) if vm is not None else None


_NAME = operator.attrgetter("name")
_NAMESPACE = operator.attrgetter("namespace")


def _collect_slots(
    replicas: Mapping[tuple[str, str], ReplicaRevision],
    vmis: Iterable[model.Vmi],
    vms: Iterable[model.Vm],
    wanted: Mapping[tuple[str, str], tuple[str, ...]],
    last: Callable[[str, str], _Slot | None] | None = None,
    key_of: Callable[[str, str], tuple[str, str]] | None = None,
) -> list[_Slot]:
    """Every guest to judge. ``last(namespace, name)``: the guest's slot of the last pass (`PlanMemo`
    keeps it), handed out again where this pass's would be equal, so a pass over unchanged guests
    makes no new slot; a VM seen before as the same object keeps its parsed intent. ``key_of``: the
    `(namespace, name)` tuple already held for a guest, so the VM index makes none of its own."""
    if key_of is None:
        vm_by_key = {(m.namespace, m.name): m for m in vms}
    else:
        vm_by_key = {key_of(m.namespace, m.name): m for m in vms}
    by_ns: dict[str, list[ReplicaRevision]] = defaultdict(list)
    for r in replicas.values():
        by_ns[r.namespace].append(r)
    slots: list[_Slot] = []
    # VMs no VMI names as its owner, found by taking the owned ones out of a copy: its keys are the
    # ones `vm_by_key` holds, where a set of owners would make a new tuple per VMI (a pass's peak).
    unowned = dict.fromkeys(vm_by_key)
    for v in vmis:
        if v.owner_vm:
            unowned.pop((v.namespace, v.owner_vm), None)
        want = wanted.get((v.namespace, v.name), ())
        missing: tuple[str, ...] = ()
        blocker: str | None = None
        blocked_volume = ""
        if not want and len(v.secret_volumes) == 1:  # the common case, without the general one's allocations
            one = replicas.get((v.namespace, v.secret_volumes[0]))
            if one is None:
                continue
            governing = one
            stamp = stamp_matches(v, (one,), one) if v.delivered_revisions else None
        else:
            names = dict.fromkeys(v.secret_volumes + want)
            refs = [replicas[(v.namespace, s)] for s in names if (v.namespace, s) in replicas]
            if not refs:
                continue
            missing = tuple(s for s in want if s not in v.secret_volumes and (v.namespace, s) in replicas)
            governing = max(refs, key=lambda r: (r.revision_time, r.name))
            stamp = stamp_matches(v, refs, governing) if v.delivered_revisions else None
            if missing:
                refused = delivery_refusal(v, want)
                if refused is not None:
                    blocker, blocked_volume = str(refused[0].value), refused[1]
        vm = vm_by_key.get((v.namespace, v.owner_vm)) if v.owner_vm else None
        prev = last(v.namespace, v.name) if last is not None else None
        if prev is not None and prev.vm is vm:
            if (prev.vmi is v and prev.replica == governing and prev.missing == missing and prev.stamp == stamp
                    and prev.blocker == blocker and prev.blocked_volume == blocked_volume):
                slots.append(prev)
                continue
            intent = prev.intent
        else:
            intent = _vm_intent(vm)
        slots.append(_Slot(v.namespace, v.name, v, vm, governing, intent, missing, stamp, blocker, blocked_volume))
    # VMs whose VMI is gone: a restart in flight (or a stopped VM, which is not our business).
    for key in sorted(unowned):
        vm = vm_by_key[key]
        if vm.run_strategy == "Halted":
            continue
        prev = last(vm.namespace, vm.name) if last is not None else None
        intent = prev.intent if prev is not None and prev.vm is vm else _vm_intent(vm)
        if intent is None or intent.result == RESULT_DONE:
            continue
        replica: ReplicaRevision | None = None
        if intent.replica:
            replica = replicas.get((vm.namespace, intent.replica))
        else:
            matching = sorted((r for r in by_ns.get(vm.namespace, ()) if r.revision == intent.revision),
                              key=lambda r: r.name)
            replica = matching[0] if matching else None
        if replica is not None:
            slots.append(_Slot(vm.namespace, vm.name, None, vm, replica, intent))
    # By (namespace, name) in two stable sorts: a key tuple per slot would be a pass's peak at 50,000.
    slots.sort(key=_NAME)
    slots.sort(key=_NAMESPACE)
    return slots
