"""The restart pre-flight's shell: ask before each restart, record a refusal on the VM, say so.

`core.preflight` decides what an answer means and how long a refusal holds; the rollout plans a held VM
as blocked. This module makes the call (through the `RestartPreflight` port) right before the restart
intent is written, for plain VMs and for tenant-cluster workers before their drain starts (the cordon is
the first disruption a worker sees), and for re-issues, so no path restarts a VM whose new VMI would be
refused (docs/design.md#restart-preflight).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

from licensectl import logs
from licensectl.controllers.vm_restart import vm_object
from licensectl.core import drain, preflight
from licensectl.core.model import Vm
from licensectl.core.ports import EventSink, KubevirtApi, RestartPreflight, WallClock
from licensectl.core.reasons import EventType, Reason
from licensectl.core.revision_text import replica_revision
from licensectl.core.rollout import RestartVm, RolloutPlan, VmiState
from licensectl.metrics import GaugeSample, Metrics

log = logs.get(__name__)

Expect = Callable[[str, str, str], None]


class RestartGate:
    """Pre-flight of each restart the rollout (or the drain) is about to make."""

    def __init__(self, check: RestartPreflight, *, kubevirt: KubevirtApi, events: EventSink, metrics: Metrics,
                 clock: WallClock) -> None:
        self._check = check
        self._kubevirt = kubevirt
        self._events = events
        self._metrics = metrics
        self._clock = clock
        self._expect: Expect = lambda _ns, _vm, _rv: None
        self._held: tuple[RolloutPlan, dict[str, int]] | None = None
        for r in preflight.RESULTS:
            metrics.restart_preflights.labels(r)

    def set_expect(self, expect: Expect) -> None:
        """Called with (namespace, vm, resourceVersion before) after the hold write (the rollout's expectations)."""
        self._expect = expect

    async def admits(self, r: RestartVm) -> bool:
        """True when the VM's new VMI would be admitted now; else the refusal is recorded on the VM (guarded by
        the planned resourceVersion), an Event names the VM and the refusal, and nothing is restarted."""
        answer = await self._check.admits(r.namespace, r.vm)
        self._metrics.restart_preflights.labels(answer.result).inc()
        if answer.admitted:
            return True
        hold = preflight.PreflightHold(r.revision, r.vmi_uid, self._clock(), answer.message)
        log.warning("restart held: pre-flight refused", namespace=r.namespace, vm=r.vm, result=answer.result,
                    message=hold.render_annotations()[preflight.ANN_PREFLIGHT_DENIED])
        if await self._kubevirt.annotate_vm(namespace=r.namespace, name=r.vm, resource_version=r.vm_resource_version,
                                            annotations=hold.render_annotations()):
            self._expect(r.namespace, r.vm, r.vm_resource_version)
        what = "would be refused" if answer.answered else "could not be checked"
        await self._events.emit(
            vm_object(r.namespace, r.vm), EventType.WARNING, Reason.RESTART_PREFLIGHT_DENIED,
            f"Not restarted for {replica_revision(r.revision)}: a dry-run create of its new VMI {what} "
            f"({preflight.bounded(answer.message)}); the running VMI is kept and the restart is asked about again "
            f"in {preflight.RECHECK_SECONDS:g}s")
        return False

    async def screen_workers(self, plan: RolloutPlan, vms: Mapping[tuple[str, str], Vm]) -> RolloutPlan:
        """The plan without the workers picked this pass whose pre-flight is refused: a worker's disruption
        starts with its cordon, so it is asked before its drain cycle opens (a cycle already open goes on)."""
        refused: set[tuple[str, str]] = set()
        for r in plan.restarts:
            vm = vms.get((r.namespace, r.vm))
            if (r.drained and not r.reissue and vm is not None and drain.ANN_DRAIN_STEP not in vm.annotations
                    and not await self.admits(r)):
                refused.add((r.namespace, r.vm))
        if not refused:
            return plan
        return dataclasses.replace(plan, actions=tuple(
            a for a in plan.actions if not (isinstance(a, RestartVm) and (a.namespace, a.vm) in refused)))

    def samples(self, plan: RolloutPlan | None, vms: Mapping[tuple[str, str], Vm]) -> Iterable[GaugeSample]:
        """VMs held by a refused pre-flight, per namespace (once per plan: a scrape reads the counts)."""
        if plan is None:
            return
        if self._held is None or self._held[0] is not plan:
            held: dict[str, int] = {}
            for key, st in plan.vmi_states.items():
                vm = vms.get(key) if st.state is VmiState.BLOCKED else None
                hold = preflight.hold_of(vm.annotations) if vm is not None else None
                if hold is not None and hold.revision == st.revision:
                    held[key[0]] = held.get(key[0], 0) + 1
            self._held = (plan, held)
        for ns, n in sorted(self._held[1].items()):
            yield GaugeSample("vms_restart_held", (("namespace", ns),), float(n))
