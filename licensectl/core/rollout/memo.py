"""`PlanMemo`: the last pass's per-guest evaluations, reused while a guest's inputs are the same and no
time it was compared with has come. Separate because it only saves work, under one invariant -- a plan
made with the memo equals the plan made without it -- that is easiest to check when it is not
interleaved with the rules.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from licensectl.core import model
from licensectl.core.rollout.evaluation import _Eval, _evaluate
from licensectl.core.rollout.inputs import GuestGate, ReplicaRevision, RolloutSettings, SourceControl
from licensectl.core.rollout.outputs import VmiRolloutState
from licensectl.core.rollout.slots import _collect_slots, _Slot
from licensectl.core.rollout.timing import _Now

MAX_SHARED_STATES = 4096


@dataclass(slots=True)
class _Memo:
    """One guest's evaluation and what it was made from: its slot (VMI, VM, replica, missing volumes,
    stamp, blocker) is the one the evaluation holds, `ev.slot`, not a copy of its fields."""

    key: tuple[str, str]  # (namespace, name), one tuple per guest for as long as it is remembered
    guest: GuestGate | None
    control: SourceControl
    until: dt.datetime | None  # the evaluation holds before this time (None: until an input changes)
    ev: _Eval
    state: VmiRolloutState | None = None


class PlanMemo:
    """The last pass's per-guest evaluations, for `plan_rollout` to reuse (incremental planning).

    A guest's evaluation depends only on its VMI and VM (cache objects, replaced on every change),
    its governing replica, missing volumes, guest report, source switches, the settings, and on
    ``now`` only through the times it was compared with; it is reused while all of these are the
    same and the earliest such time still lies ahead. During a rollout most guests do not change
    between two passes, so a pass re-evaluates only the few that did. Owned by one caller; a plan
    made with a memo equals the plan made without one (tested).

    One pass: `collect` its slots, `evaluate` them, then take each guest's `state_of`.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Memo] = {}
        # One instance per distinct VMI state: most of 50,000 guests are in a few (docs/design.md#plans-off-the-loop).
        self._states: dict[VmiRolloutState, VmiRolloutState] = {}
        self._settings: RolloutSettings | None = None
        self._now: dt.datetime | None = None
        self._evidence_at: dt.datetime | None = None
        self.hits = 0  # evaluations reused, for tests and benchmarks

    def collect(self, replicas: Mapping[tuple[str, str], ReplicaRevision], vmis: Iterable[model.Vmi],
                vms: Iterable[model.Vm], *, wanted: Mapping[tuple[str, str], tuple[str, ...]]) -> list[_Slot]:
        """This pass's slots (`_collect_slots`), handing out the last pass's where nothing in them changed.
        Call it before `evaluate`: it reads the last pass's slots, which `evaluate` replaces."""
        return _collect_slots(replicas, vmis, vms, wanted, self.last_slot, self.held_key)

    def evaluate(self, slots: Iterable[_Slot], settings: RolloutSettings, guests: Mapping[tuple[str, str], GuestGate],
                 *, control_of: Callable[[_Slot], SourceControl], now: dt.datetime,
                 evidence_at: dt.datetime | None = None) -> list[_Eval]:
        """Every slot's evaluation at ``now``, reusing the last pass's where its inputs are the same; this
        pass's replace the last pass's (guests gone since are forgotten)."""
        self._begin(settings, now, evidence_at)
        keep: dict[tuple[str, str], _Memo] = {}
        evals = [self._evaluate(s, settings, guests, control_of(s), now, keep).ev for s in slots]
        self._entries = keep
        return evals

    def state_of(self, ev: _Eval,
                 make: Callable[[_Eval], VmiRolloutState]) -> tuple[tuple[str, str], VmiRolloutState]:
        """The guest's key and state, for an evaluation of the last `evaluate`. Both are the ones the memo
        already holds where nothing changed (a plan then keeps no new object per unchanged guest), and a
        new state (``make(ev)``) is the shared instance equal to it: most of 50,000 guests are in a
        handful of states."""
        key = (ev.slot.namespace, ev.slot.name)
        m = self._entries.get(key)
        if m is not None:
            key = m.key
            if m.state is not None:
                return key, m.state
        state = self._shared_state(make(ev))
        if m is not None:
            m.state = state
        return key, state

    def last_slot(self, namespace: str, name: str) -> _Slot | None:
        """The guest's slot of the last pass, for `_collect_slots` to hand out again where nothing in it
        changed (a pass over 50,000 unchanged guests then makes no new slot) and to take a VM's parsed
        intent from where the VM is the same object: cache objects are replaced on every change, and
        parsing every VM's two timestamps each pass was a third of a pass at 2,000 VMIs."""
        m = self._entries.get((namespace, name))
        return m.ev.slot if m is not None else None

    def held_key(self, namespace: str, name: str) -> tuple[str, str]:
        """The guest's key tuple the memo holds (a new one for a guest it does not know)."""
        key = (namespace, name)
        m = self._entries.get(key)
        return m.key if m is not None else key

    def _begin(self, settings: RolloutSettings, now: dt.datetime, evidence_at: dt.datetime | None = None) -> None:
        if (settings != self._settings or (self._now is not None and now < self._now)
                or evidence_at != self._evidence_at):
            # New knobs, a clock stepped back, or a new leader term: nothing is known to hold.
            self._entries.clear()
        if len(self._states) > MAX_SHARED_STATES:  # distinct retry times and reasons pile up: start over
            self._states.clear()
        self._settings, self._now, self._evidence_at = settings, now, evidence_at

    def _shared_state(self, state: VmiRolloutState) -> VmiRolloutState:
        """The one instance equal to `state` (states are frozen: sharing one changes nothing)."""
        return self._states.setdefault(state, state)

    def _evaluate(self, slot: _Slot, st: RolloutSettings, guests: Mapping[tuple[str, str], GuestGate],
                  control: SourceControl, now: dt.datetime, keep: dict[tuple[str, str], _Memo]) -> _Memo:
        key = (slot.namespace, slot.name)
        guest = guests.get(key)
        # Taken out of the last pass's entries, not looked up: a guest whose evaluation is replaced frees
        # the old one here rather than at the end of the pass, so a rotation, which changes every guest's
        # inputs, does not hold two evaluations per guest at its peak.
        m = self._entries.pop(key, None)
        if m is not None:
            key = m.key  # the tuple held since the guest was first seen, not this pass's copy
        was = m.ev.slot if m is not None else None
        if (m is not None and was is not None and was.vmi is slot.vmi and was.vm is slot.vm
                and was.replica == slot.replica and was.missing == slot.missing and was.stamp == slot.stamp
                and was.blocker == slot.blocker and was.blocked_volume == slot.blocked_volume
                and m.guest == guest and m.control == control
                and (m.until is None or now < m.until)):
            self.hits += 1
        else:
            clock = _Now(now, self._evidence_at)
            m = _Memo(key, guest, control, None, _evaluate(slot, st, guests, control, clock))
            m.until = clock.horizon
        keep[key] = m
        return m
