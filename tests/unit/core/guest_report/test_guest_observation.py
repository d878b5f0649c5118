"""Guests over time: a new VMI is not judged while it may still be booting, and the lease length a
guest's expiry implies (docs/design.md#lease-renewal)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from licensectl.controllers.guests import GuestStore
from licensectl.core.guest_report import GuestState, LicenseState
from licensectl.core.guest_report.observation import (
    BOOT_ALLOWANCE_SECONDS,
    MISSED_INTERVALS,
    awaiting_first_report,
    lease_seconds,
)
from tests.unit.controllers.test_guest_metrics import INTERVAL, T0, by_name, report
from tests.unit.controllers.test_guest_metrics import report as licensed_report

S = dt.timedelta(seconds=1)
WINDOW = MISSED_INTERVALS * INTERVAL * S
BOOT = BOOT_ALLOWANCE_SECONDS * S


@pytest.mark.parametrize(
    ("receiving_since", "vmi_started", "now", "patient"),
    [
        (None, None, T0, True),  # a standby judges nobody
        (T0, None, T0 + WINDOW, True),  # just took over
        (T0, None, T0 + WINDOW + S, False),
        (T0 - dt.timedelta(days=1), T0, T0 + BOOT + WINDOW, True),  # a new VMI, still within boot + intervals
        (T0 - dt.timedelta(days=1), T0, T0 + BOOT + WINDOW + S, False),
        (T0 - dt.timedelta(days=1), T0 - dt.timedelta(days=1), T0, False),  # an old VMI never reported
        (T0, T0 - dt.timedelta(days=1), T0 + S, True),  # takeover patience still applies to old VMIs
    ],
)
def test_awaiting_first_report(receiving_since: dt.datetime | None, vmi_started: dt.datetime | None,
                               now: dt.datetime, patient: bool) -> None:
    assert awaiting_first_report(now, receiving_since=receiving_since, vmi_started=vmi_started,
                                 interval_seconds=INTERVAL) is patient


def test_a_new_vmi_is_not_unknown_while_it_boots() -> None:
    store = GuestStore(INTERVAL)
    store.start_receiving(T0 - dt.timedelta(days=1))
    key = ("tenant-a", "new")
    now = T0 + dt.timedelta(minutes=4)
    assert store.views(now, [key], {key: T0}) == []  # booting: not judged, no series
    assert store.views(now, [key]) != []  # without its start time it would already be unknown
    late = T0 + BOOT + WINDOW + S
    (v,) = store.views(late, [key], {key: T0})
    assert v.state == LicenseState.UNKNOWN.value
    store.record(*key, report(at=now))
    (v,) = store.views(now, [key], {key: T0})
    assert v.state == LicenseState.LICENSED.value


def test_lease_seconds_rules() -> None:
    exp = T0 + dt.timedelta(days=1)
    # First seen: expiry minus report time.
    assert lease_seconds(previous_expiry=None, previous_lease=None, expiry=exp, reported_at=T0) == 86400
    # Unchanged expiry keeps the estimate (time passing does not shrink the lease).
    later = T0 + dt.timedelta(hours=3)
    assert lease_seconds(previous_expiry=exp, previous_lease=86400, expiry=exp, reported_at=later) == 86400
    # A renewal seen 60 s late: an underestimate by 60 s.
    renewed = exp + dt.timedelta(hours=3.6)
    assert lease_seconds(previous_expiry=exp, previous_lease=86400, expiry=renewed,
                         reported_at=T0 + dt.timedelta(hours=3.6, seconds=60)) == 86400 - 60
    assert lease_seconds(previous_expiry=exp, previous_lease=86400, expiry=None, reported_at=T0) is None
    assert lease_seconds(previous_expiry=None, previous_lease=None, expiry=T0 - S, reported_at=T0) is None


def test_store_exports_the_observed_lease() -> None:
    store = GuestStore(INTERVAL)
    store.start_receiving(T0)
    key = ("tenant-a", "vm")
    exp = T0 + dt.timedelta(minutes=15)
    # Lease series are detail (docs/operations.md#metrics-cardinality): this guest, on an old token, shows them.
    def report(state: LicenseState = LicenseState.LICENSED, **kw: Any) -> GuestState:
        return dataclasses.replace(licensed_report(state, **kw), token_current=False)

    store.record(*key, report(at=T0, expiry=exp))
    store.record(*key, report(at=T0 + dt.timedelta(minutes=1), expiry=exp))
    lease = by_name(list(store.samples(T0 + dt.timedelta(minutes=1), [key])), "guest_license_lease_seconds")
    assert [s.value for s in lease] == [900.0]
    store.record(*key, report(at=T0 + dt.timedelta(minutes=3), expiry=exp + dt.timedelta(minutes=2, seconds=30)))
    lease = by_name(list(store.samples(T0 + dt.timedelta(minutes=3), [key])), "guest_license_lease_seconds")
    assert [s.value for s in lease] == [870.0]
    store.record(*key, report(LicenseState.UNLICENSED, at=T0 + dt.timedelta(minutes=4)))
    assert by_name(list(store.samples(T0 + dt.timedelta(minutes=4), [key])), "guest_license_lease_seconds") == []
