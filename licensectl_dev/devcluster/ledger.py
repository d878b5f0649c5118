"""The test ledger: everything the KubeVirt stand-ins saw or did, for tests to assert on.

The virt-controller stand-in records VMI lifecycle events and VM availability; the virt-api
stand-in records every restart request and its answer. Timestamps are `time.monotonic()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from licensectl.kube.watch import Key


@dataclass(frozen=True)
class RestartRecord:
    at: float  # time.monotonic()
    namespace: str
    vm: str
    vmi_uid: str  # "" when there was no VMI
    status: int  # HTTP status returned
    reason: str  # "" on success, else the Status message
    grace_period_seconds: int | None = None


@dataclass(frozen=True)
class VmiEvent:
    at: float  # time.monotonic()
    kind: str  # created | deleting | deleted | ready | failed
    namespace: str
    name: str
    uid: str


@dataclass
class Interval:
    namespace: str
    vm: str
    start: float
    end: float | None = None


@dataclass
class SimulatorRecord:
    """Everything the simulator saw or did, with monotonic timestamps."""

    restarts: list[RestartRecord] = field(default_factory=list)
    vmi_events: list[VmiEvent] = field(default_factory=list)
    # A VM is "unavailable" from the moment it loses a Ready VMI (restart accepted, or its VMI
    # deleted) until a VMI of it is Ready again. First boots do not count.
    unavailable: list[Interval] = field(default_factory=list)
    _open: dict[Key, Interval] = field(default_factory=dict)
    _was_up: set[Key] = field(default_factory=set)

    def restarts_for(self, namespace: str, vm: str, *, accepted_only: bool = True) -> list[RestartRecord]:
        return [
            r for r in self.restarts
            if r.namespace == namespace and r.vm == vm and (r.status == 202 or not accepted_only)
        ]

    def events_for(self, namespace: str, name: str, kind: str | None = None) -> list[VmiEvent]:
        return [
            e for e in self.vmi_events
            if e.namespace == namespace and e.name == name and (kind is None or e.kind == kind)
        ]

    def vmi_uids(self, namespace: str, name: str) -> list[str]:
        """UIDs of every VMI created under this name, oldest first."""
        return [e.uid for e in self.events_for(namespace, name, "created")]

    def max_concurrent_unavailable(self, namespace: str | None = None) -> int:
        """The most VMs that were unavailable at the same moment (optionally in one namespace).

        The simulator is cluster-wide like virt-controller: pass `namespace` to keep other tests'
        VMs (e.g. namespaces still terminating) out of the count."""
        points: list[tuple[float, int]] = []
        for iv in self.unavailable:
            if namespace is not None and iv.namespace != namespace:
                continue
            points.append((iv.start, 1))
            points.append((iv.end if iv.end is not None else float("inf"), -1))
        best = cur = 0
        for _, d in sorted(points, key=lambda p: (p[0], p[1])):  # ends before starts at a tie
            cur += d
            best = max(best, cur)
        return best

    max_concurrent_unready = max_concurrent_unavailable

    def currently_unavailable(self) -> list[Key]:
        return sorted(self._open)

    # -- mutation (called by the stand-ins) ----------------------------------------------------
    def vm_down(self, ns: str, vm: str, at: float) -> None:
        """The VM lost its Ready VMI; counts only if it had been up (a first boot does not)."""
        k = (ns, vm)
        if k in self._was_up and k not in self._open:
            iv = Interval(ns, vm, at)
            self._open[k] = iv
            self.unavailable.append(iv)

    def vm_gone(self, ns: str, vm: str, at: float) -> None:
        """The VM is deleted (or being deleted): it is no longer tracked, so never unavailable."""
        self._was_up.discard((ns, vm))
        self._close((ns, vm), at)

    def vm_up(self, ns: str, vm: str, at: float) -> None:
        """A VMI of the VM is Ready."""
        self._was_up.add((ns, vm))
        self._close((ns, vm), at)

    def _close(self, k: Key, at: float) -> None:
        iv = self._open.pop(k, None)
        if iv is not None:
            iv.end = at
