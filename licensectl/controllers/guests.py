"""What guests last reported, and the metrics and rollout evidence derived from it.

Guest state is observation, not decision state: after a restart the store is empty and fills again
within one report interval. A guest silent for three intervals becomes `unknown`; a guest whose
VMI is gone disappears (series included) — both judged at read time with the clock passed in. A VMI
that never reported is judged only once its patience is over (core/guest_report/observation.py).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from licensectl.core.guest_report import (
    REASON_LEASE_EXPIRED,
    REASON_UNKNOWN,
    GuestState,
    LicenseState,
    observation,
    wrong_product,
)
from licensectl.core.guest_report.observation import MISSED_INTERVALS as MISSED_INTERVALS
from licensectl.core.rollout import GuestGate
from licensectl.metrics import GaugeSample

STATES: tuple[str, ...] = tuple(s.value for s in LicenseState)
Started = Mapping[tuple[str, str], dt.datetime | None]  # (namespace, VMI) -> when the VMI started
TokenShaFor = Callable[[str, str], str | None]  # (namespace, VMI) -> SHA-256 of its replica's token now


def _token_current(g: GuestState | None, token_sha_for: TokenShaFor | None, namespace: str, vmi: str) -> bool | None:
    """The report's token against the replica's now; the report's own judgement when that is unknown."""
    if g is None:
        return None
    want = token_sha_for(namespace, vmi) if token_sha_for is not None else None
    return g.token_current if want is None else g.token_sha256 == want


@dataclass(frozen=True, slots=True)
class GuestView:
    namespace: str
    vmi: str
    state: str  # LicenseState value, after staleness and expiry are applied
    report: GuestState | None  # None: an affected VMI that never reported
    wrong_product: bool | None = None  # holds another product than its class implies; None: cannot tell
    # The reported token is the one the VMI's replica holds now (None: no report). Judged when viewed, not
    # when the report came: a replica rewritten since is not "current" until a report shows its token.
    token_current: bool | None = None

    @property
    def reason(self) -> str | None:
        """gridd's reason (one of guest_report.UNLICENSED_REASONS) while the guest holds no license."""
        if not LicenseState(self.state).no_license:
            return None
        if self.state == LicenseState.EXPIRED.value:
            return REASON_LEASE_EXPIRED
        return (self.report.reason if self.report else None) or REASON_UNKNOWN


# Detail series of a guest that needs a look (docs/operations.md#metrics-cardinality): a clock this far off,
# or a lease with less than this share left (gridd renews at half, so a healthy lease is in (0.5, 1]).
SKEW_DETAIL_SECONDS = 60.0
LEASE_DETAIL_SHARE = 0.6


def needs_detail(v: GuestView, lease: float | None, now: dt.datetime) -> bool:
    """Whether a reporting guest gets its detail series (lease, last report, token, clock skew, reason,
    wrong product): any state but licensed, an old token, a skewed clock, the wrong product, or a lease
    near its renewal deadline. A healthy guest has its state and its expiry only: two series."""
    r = v.report
    if r is None:
        return False
    if v.state != LicenseState.LICENSED.value or not v.token_current or v.wrong_product:
        return True
    if abs(r.clock_skew_seconds) >= SKEW_DETAIL_SECONDS:
        return True
    return (lease is not None and r.expiry is not None
            and (r.expiry - now).total_seconds() < LEASE_DETAIL_SHARE * lease)


def effective_state(g: GuestState, now: dt.datetime, interval_seconds: float) -> str:
    if (now - g.reported_at).total_seconds() > MISSED_INTERVALS * interval_seconds:
        return LicenseState.UNKNOWN.value
    if g.state is LicenseState.LICENSED and g.expiry is not None and g.expiry < now:
        return LicenseState.EXPIRED.value
    return g.state.value


class GuestStore:
    def __init__(self, interval_seconds: float, max_guests: int = 200_000,
                 boot_allowance_seconds: float = observation.BOOT_ALLOWANCE_SECONDS) -> None:
        self.interval_seconds = interval_seconds
        self.boot_allowance_seconds = boot_allowance_seconds
        self.max_guests = max_guests
        self._states: dict[tuple[str, str], GuestState] = {}
        self._feature_types: dict[tuple[str, str], int | None] = {}
        self._leases: dict[tuple[str, str], float] = {}  # lease length as observed (observation.lease_seconds)
        # When this replica started receiving reports (became leader, or runs alone); None while a
        # standby. Silence is judged from here, not from process start: a replica that just took
        # over has heard from nobody yet and must not call the whole fleet "not reporting".
        self.receiving_since: dt.datetime | None = None

    def copy(self) -> GuestStore:
        """A copy to read from another thread (a scrape's per-guest walk) while reports keep arriving here:
        the maps are copied, the states in them are never changed in place."""
        twin = GuestStore(self.interval_seconds, self.max_guests, self.boot_allowance_seconds)
        twin._states, twin._feature_types, twin._leases = dict(self._states), dict(self._feature_types), dict(
            self._leases)
        twin.receiving_since = self.receiving_since
        return twin

    def start_receiving(self, now: dt.datetime) -> None:
        """Reports now come to this replica (the reports Service selects the leader's pod)."""
        if self.receiving_since is None:
            self.receiving_since = now

    def stop_receiving(self) -> None:
        """A standby gets no reports: forget what it heard, or a later term would show old states."""
        self.receiving_since = None
        self._states.clear()
        self._feature_types.clear()
        self._leases.clear()

    def awaiting_first_report(self, now: dt.datetime, vmi_started: dt.datetime | None = None) -> bool:
        """True while a guest that never reported to this replica may still be within its chance."""
        return observation.awaiting_first_report(now, receiving_since=self.receiving_since, vmi_started=vmi_started,
                                                 interval_seconds=self.interval_seconds,
                                                 boot_seconds=self.boot_allowance_seconds)

    def evidence_complete_at(self) -> dt.datetime:
        """From when "no report" means "never reported" rather than "not yet" (the rollout's and the
        rotation's one wait after a takeover, docs/design.md#evidence-after-takeover): one silence
        window after this replica started receiving; never while a standby."""
        since = self.receiving_since
        if since is None:
            return dt.datetime.max.replace(tzinfo=dt.UTC)
        return since + dt.timedelta(seconds=MISSED_INTERVALS * self.interval_seconds)

    def record(self, namespace: str, vmi: str, state: GuestState, *, feature_type: int | None = None) -> None:
        """Keep the latest report; `feature_type` is the FeatureType of the class whose replica the
        VMI mounts (None: unknown), what the held product is checked against."""
        if len(self._states) >= self.max_guests and (namespace, vmi) not in self._states:
            return  # bounded: the VMI cache caps real guests far below this
        key = (namespace, vmi)
        prev = self._states.get(key)
        lease = observation.lease_seconds(previous_expiry=prev.expiry if prev else None,
                                          previous_lease=self._leases.get(key), expiry=state.expiry,
                                          reported_at=state.reported_at)
        if lease is None:
            self._leases.pop(key, None)
        else:
            self._leases[key] = lease
        self._states[key] = state
        self._feature_types[key] = feature_type

    def prune(self, live: Iterable[tuple[str, str]]) -> None:
        keep = set(live)
        for key in [k for k in self._states if k not in keep]:
            del self._states[key]
            self._feature_types.pop(key, None)
            self._leases.pop(key, None)

    def get(self, namespace: str, vmi: str) -> GuestState | None:
        return self._states.get((namespace, vmi))

    def views(self, now: dt.datetime, live: Iterable[tuple[str, str]] | None = None,
              started: Started | None = None, *, token_sha_for: TokenShaFor | None = None) -> list[GuestView]:
        """One view per guest; with `live` (the VMIs that carry a license volume) exactly those,
        silent ones as unknown, so a guest that never reports is visible too -- but only once it
        had its chance: a guest that has not reported is left out (not judged) while this replica
        only just started receiving, or while its VMI (`started`) may still be booting
        (observation.awaiting_first_report). With `token_sha_for` (the token the VMI's replica holds now,
        read by key from the live caches) "token current" is judged now; without, as the report was."""
        keys = sorted(self._states) if live is None else sorted(set(live))
        starts = started or {}
        out: list[GuestView] = []
        for ns, vmi in keys:
            g = self._states.get((ns, vmi))
            if g is None and self.awaiting_first_report(now, starts.get((ns, vmi))):
                continue
            state = LicenseState.UNKNOWN.value if g is None else effective_state(g, now, self.interval_seconds)
            wrong = None
            if g is not None and state != LicenseState.UNKNOWN.value:
                wrong = wrong_product(g.product, self._feature_types.get((ns, vmi)))
            out.append(GuestView(ns, vmi, state, g, wrong, _token_current(g, token_sha_for, ns, vmi)))
        return out

    def states(self) -> dict[tuple[str, str], GuestState]:
        """A copy of the last report per guest (states are replaced, never changed): what `gates_of` reads
        from a worker thread while reports keep arriving on the event loop."""
        return dict(self._states)

    def samples(self, now: dt.datetime, live: Iterable[tuple[str, str]] | None = None, *,
                tenant_of: Callable[[str], str] | None = None, per_vmi: bool = True,
                started: Started | None = None, token_sha_for: TokenShaFor | None = None) -> Iterable[GaugeSample]:
        """Per-VMI series (docs/operations.md#metrics-cardinality) plus the per-tenant aggregate
        `guests{state, tenant}`. `tenant_of` maps a namespace to its Cozystack tenant label (the
        customer: see `entitlement.customer_tenant`); `per_vmi=False` keeps only the aggregate."""
        agg: Counter[tuple[str, str]] = Counter()
        tokens: Counter[tuple[str, str]] = Counter()
        tenants: dict[str, str] = {}
        for v in self.views(now, live, started, token_sha_for=token_sha_for):
            tenant = tenants.get(v.namespace)
            if tenant is None:
                tenant = tenants[v.namespace] = tenant_of(v.namespace) if tenant_of else v.namespace
            agg[(v.state, tenant)] += 1
            r = v.report
            if r is not None and v.state != LicenseState.UNKNOWN.value:
                tokens[("current" if v.token_current else "stale", tenant)] += 1
            if not per_vmi:
                continue
            base = (("namespace", v.namespace), ("vmi", v.vmi), ("tenant", tenant))
            # One series per guest, its state a label (docs/operations.md#metrics-cardinality).
            yield GaugeSample("guest_license_state", (*base, ("state", v.state)), 1.0)
            if r is not None and r.expiry is not None:
                yield GaugeSample("guest_license_expiry_timestamp_seconds", base, r.expiry.timestamp())
            lease = self._leases.get((v.namespace, v.vmi))
            if r is None or not needs_detail(v, lease, now):
                continue
            if lease is not None:
                yield GaugeSample("guest_license_lease_seconds", base, lease)
            yield GaugeSample("guest_last_report_timestamp_seconds", base, r.reported_at.timestamp())
            yield GaugeSample("guest_token_current", base, 1.0 if v.token_current else 0.0)
            yield GaugeSample("guest_clock_skew_seconds", base, r.clock_skew_seconds)
            if v.reason is not None:
                yield GaugeSample("guest_unlicensed_reason", (*base, ("reason", v.reason)), 1.0)
            if v.wrong_product:
                yield GaugeSample("guest_wrong_product", base, 1.0)
        for (state, tenant), n in sorted(agg.items()):
            yield GaugeSample("guests", (("state", state), ("tenant", tenant)), float(n))
        for (token, tenant), n in sorted(tokens.items()):
            yield GaugeSample("guests_reporting", (("tenant", tenant), ("token", token)), float(n))

    def counts(self, now: dt.datetime, live: Iterable[tuple[str, str]] | None = None,
               started: Started | None = None) -> dict[str, int]:
        c = Counter(v.state for v in self.views(now, live, started))
        return {s: c.get(s, 0) for s in STATES}


def gates_of(states: Mapping[tuple[str, str], GuestState],
             token_sha_for: Callable[[str, str], str | None] | None = None) -> dict[tuple[str, str], GuestGate]:
    """Rollout evidence: licensed + token current, with the report time; built in the rollout's planner
    thread from `GuestStore.states()`. With `token_sha_for` (what the VMI's replica holds *now*), "current"
    is judged when the plan is made, not when the report came: a report judged against a replica the cache
    had not yet seen rewritten would otherwise pass for evidence of the new token (docs/design.md#safe-rotation)."""
    def current(k: tuple[str, str], g: GuestState) -> bool:
        if token_sha_for is None:
            return g.token_current
        return g.token_sha256 is not None and g.token_sha256 == token_sha_for(*k)

    return {k: GuestGate(licensed=g.state is LicenseState.LICENSED, token_sha256_current=current(k, g),
                         reported_at=g.reported_at) for k, g in states.items()}
