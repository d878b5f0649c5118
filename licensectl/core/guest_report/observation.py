"""Judging guests over time, from what they said and when: patience before a silent guest counts as
silent, and the lease length a guest's expiry implies. Pure (the clock is passed in); the guest
store applies these at read time (docs/design.md#lease-renewal).
"""

from __future__ import annotations

import datetime as dt
from typing import Final

from licensectl.core import defaults

# A guest silent for this many report intervals is `unknown`.
MISSED_INTERVALS: Final = 3
# What a VMI may take from its start until the probe's first report: firmware, OS boot, the license
# unit and the probe's timer (the default timer's first run is 2 minutes after boot). Bounded, so a
# guest whose probe never runs is still called out a few minutes after it started.
BOOT_ALLOWANCE_SECONDS: Final = defaults.GUEST_BOOT_ALLOWANCE_SECONDS


def awaiting_first_report(now: dt.datetime, *, receiving_since: dt.datetime | None, vmi_started: dt.datetime | None,
                          interval_seconds: float, boot_seconds: float = BOOT_ALLOWANCE_SECONDS) -> bool:
    """True while a guest that never reported to this replica may still be within its chance.

    Two clocks, either grants patience: since this replica started receiving reports (a replica that just
    took over has heard from nobody yet), MISSED_INTERVALS intervals; since the VMI started (a new VM is
    still booting), the boot allowance plus MISSED_INTERVALS intervals. A standby (`receiving_since`
    None) judges nobody.
    """
    if receiving_since is None:
        return True
    window = MISSED_INTERVALS * interval_seconds
    if (now - receiving_since).total_seconds() <= window:
        return True
    return vmi_started is not None and (now - vmi_started).total_seconds() <= boot_seconds + window


def lease_seconds(*, previous_expiry: dt.datetime | None, previous_lease: float | None, expiry: dt.datetime | None,
                  reported_at: dt.datetime) -> float | None:
    """The lease length a report implies, for judging time left relative to it.

    When the expiry is first seen or moves (an acquisition or renewal), `expiry - reported_at` is the
    lease length minus the time since that renewal (at most one report interval for a guest that
    reports throughout): an underestimate, so time left / lease is never judged lower than it is and a
    healthy guest never looks like it is running out. An unchanged expiry keeps the estimate. The
    guest's own log times are not used: Windows guests log local time without a zone.
    """
    if expiry is None:
        return None
    if previous_expiry is not None and expiry == previous_expiry and previous_lease is not None:
        return previous_lease
    left = (expiry - reported_at).total_seconds()
    return left if left > 0 else None
