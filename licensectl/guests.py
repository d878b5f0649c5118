"""What guests last reported, and the metrics and rollout evidence derived from it.

Guest state is observation, not decision state: after a restart the store is empty and fills again
within one report interval. A guest silent for three intervals becomes `unknown`; a guest whose
VMI is gone disappears (series included) — both judged at read time with the clock passed in.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from licensectl.guest_report import GuestState, LicenseState
from licensectl.metrics import GaugeSample
from licensectl.rollout import GuestGate

STATES: tuple[str, ...] = tuple(s.value for s in LicenseState)
MISSED_INTERVALS = 3


@dataclass(frozen=True, slots=True)
class GuestView:
    namespace: str
    vmi: str
    state: str  # LicenseState value, after staleness and expiry are applied
    report: GuestState | None  # None: an affected VMI that never reported


def effective_state(g: GuestState, now: dt.datetime, interval_seconds: float) -> str:
    if (now - g.reported_at).total_seconds() > MISSED_INTERVALS * interval_seconds:
        return LicenseState.UNKNOWN.value
    if g.state is LicenseState.LICENSED and g.expiry is not None and g.expiry < now:
        return LicenseState.EXPIRED.value
    return g.state.value


class GuestStore:
    def __init__(self, interval_seconds: float, max_guests: int = 200_000) -> None:
        self.interval_seconds = interval_seconds
        self.max_guests = max_guests
        self._states: dict[tuple[str, str], GuestState] = {}

    def record(self, namespace: str, vmi: str, state: GuestState) -> None:
        if len(self._states) >= self.max_guests and (namespace, vmi) not in self._states:
            return  # bounded: the VMI cache caps real guests far below this
        self._states[(namespace, vmi)] = state

    def prune(self, live: Iterable[tuple[str, str]]) -> None:
        keep = set(live)
        for key in [k for k in self._states if k not in keep]:
            del self._states[key]

    def get(self, namespace: str, vmi: str) -> GuestState | None:
        return self._states.get((namespace, vmi))

    def views(self, now: dt.datetime, live: Iterable[tuple[str, str]] | None = None) -> list[GuestView]:
        """One view per guest; with `live` (the VMIs that carry a license volume) exactly those,
        silent ones as unknown, so a guest that never reports is visible too."""
        keys = sorted(self._states) if live is None else sorted(set(live))
        out: list[GuestView] = []
        for ns, vmi in keys:
            g = self._states.get((ns, vmi))
            state = LicenseState.UNKNOWN.value if g is None else effective_state(g, now, self.interval_seconds)
            out.append(GuestView(ns, vmi, state, g))
        return out

    def gates(self) -> Mapping[tuple[str, str], GuestGate]:
        """Rollout evidence: licensed + token current, with the report time."""
        return {k: GuestGate(licensed=g.state is LicenseState.LICENSED, token_sha256_current=g.token_current,
                             reported_at=g.reported_at) for k, g in self._states.items()}

    def samples(self, now: dt.datetime, live: Iterable[tuple[str, str]] | None = None) -> Iterable[GaugeSample]:
        agg: Counter[tuple[str, str]] = Counter()
        for v in self.views(now, live):
            base = (("namespace", v.namespace), ("vmi", v.vmi), ("tenant", v.namespace))
            for s in STATES:
                yield GaugeSample("guest_license_state", (*base, ("state", s)), 1.0 if s == v.state else 0.0)
            r = v.report
            if r is not None:
                if r.expiry is not None:
                    yield GaugeSample("guest_license_expiry_timestamp_seconds", base, r.expiry.timestamp())
                yield GaugeSample("guest_last_report_timestamp_seconds", base, r.reported_at.timestamp())
                yield GaugeSample("guest_token_current", base, 1.0 if r.token_current else 0.0)
                yield GaugeSample("guest_clock_skew_seconds", base, r.clock_skew_seconds)
            agg[(v.state, v.namespace)] += 1
        for (state, tenant), n in sorted(agg.items()):
            yield GaugeSample("guests", (("state", state), ("tenant", tenant)), float(n))

    def counts(self, now: dt.datetime, live: Iterable[tuple[str, str]] | None = None) -> dict[str, int]:
        c = Counter(v.state for v in self.views(now, live))
        return {s: c.get(s, 0) for s in STATES}
