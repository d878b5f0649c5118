"""A parsed report at `now` to one `GuestState`: worst GPU state, earliest expiry, token freshness,
clock skew, and gridd's reason when the guest holds no license. Separate from parsing because it is the
only step that depends on the clock and on the current token; parsing depends on the bytes alone.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Final

from licensectl.core.guest_report import state as guest
from licensectl.core.guest_report.limits import SMI_MISSING

_REASON_OF_EVENT: Final = {
    guest.GriddEventKind.TOKEN_MISSING: guest.REASON_TOKEN_MISSING,
    guest.GriddEventKind.TOKEN_CORRUPT: guest.REASON_TOKEN_CORRUPT,
    guest.GriddEventKind.CONFIG_MISSING: guest.REASON_CONFIG_MISSING,
    guest.GriddEventKind.FAILED: guest.REASON_ACQUIRE_FAILED,
    guest.GriddEventKind.NOT_FOUND: guest.REASON_NOT_FOUND,
}
_LICENSE_HELD: Final = frozenset({guest.GriddEventKind.ACQUIRED, guest.GriddEventKind.RENEWED})


def unlicensed_reason(events: Sequence[guest.GriddEvent]) -> str:
    """gridd's cause for holding no license: the root cause among the failures logged since the
    last acquire/renew (a missing or corrupt token or gridd.conf outranks the "not found" warning
    and failed acquisitions it leads to); `unknown` when the log names none."""
    since = list(events)
    for i in range(len(since) - 1, -1, -1):
        if since[i].kind in _LICENSE_HELD:
            since = since[i + 1:]
            break
    found = {_REASON_OF_EVENT[e.kind] for e in since if e.kind in _REASON_OF_EVENT}
    for reason in (guest.REASON_TOKEN_CORRUPT, guest.REASON_TOKEN_MISSING, guest.REASON_CONFIG_MISSING,
                   guest.REASON_ACQUIRE_FAILED, guest.REASON_NOT_FOUND):
        if reason in found:
            return reason
    return guest.REASON_UNKNOWN


def _guest_gpu_state(g: guest.GpuLicense, now: dt.datetime) -> guest.LicenseState:
    if g.state is guest.LicenseState.LICENSED and g.expiry is not None and g.expiry < now:
        return guest.LicenseState.EXPIRED
    if g.state is guest.LicenseState.UNLICENSED and g.grace:
        return guest.LicenseState.GRACE
    return g.state


def evaluate(report: guest.GuestReport, *, current_token_sha256: str | None, now: dt.datetime) -> guest.GuestState:
    """Summarise a report at `now`: worst GPU state, earliest expiry, token freshness, clock skew,
    and gridd's reason when the guest holds no license."""
    # One pass over the GPUs (this runs once per report): the worst state (the first GPU among equally
    # bad ones), the earliest expiry, the first product and driver named, whether any is in grace.
    worst_state = guest.LicenseState.UNKNOWN
    worst_gpu: guest.GpuLicense | None = None
    worst = -1
    expiry: dt.datetime | None = None
    first_product: str | None = None
    driver: str | None = None
    grace = False
    for g in report.gpus:
        state = _guest_gpu_state(g, now)
        severity = state.severity
        if severity > worst:
            worst, worst_state, worst_gpu = severity, state, g
        if g.expiry is not None and (expiry is None or g.expiry < expiry):
            expiry = g.expiry
        if first_product is None and g.product:
            first_product = g.product
        if driver is None and g.driver_version:
            driver = g.driver_version
        if g.grace:
            grace = True
    if report.smi_status == SMI_MISSING:
        worst_state, worst_gpu = guest.LicenseState.DRIVER_MISSING, None
    reason = None
    if worst_state is guest.LicenseState.EXPIRED:
        reason = guest.REASON_LEASE_EXPIRED
    elif worst_state.no_license:
        reason = unlicensed_reason(report.events)
    product = worst_gpu.product if worst_gpu is not None else None
    if product is None:
        product = first_product
    last = report.events[-1] if report.events else None
    return guest.GuestState(
        uuid=report.uuid,
        hostname=report.hostname,
        state=worst_state,
        product=product,
        expiry=expiry,
        driver_version=driver,
        gpu_count=len(report.gpus),
        grace=grace,
        token_sha256=report.token_sha256,
        token_current=(current_token_sha256 is not None
                       and report.token_sha256 == current_token_sha256.lower()),
        clock_skew_seconds=(report.clock - now).total_seconds(),
        reported_at=now,
        last_event=last.kind if last else None,
        last_event_at=last.at if last else None,
        reason=reason,
    )
