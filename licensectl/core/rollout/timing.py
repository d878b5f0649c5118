"""Time for the rollout rules: the settle delay, a VMI's start time, and `_Now`, the clock an evaluation reads,
which remembers the earliest later time it was compared with. Separate because that remembered time is what
`memo` relies on: an evaluation cannot change before it unless its inputs do.
"""

from __future__ import annotations

import datetime as dt

from licensectl.core import model
from licensectl.core.rollout.inputs import RolloutSettings


def _secs(seconds: float) -> dt.timedelta:
    return dt.timedelta(seconds=seconds)


# Kubernetes timestamps have one-second resolution and revision times are truncated to the second.
# A restart issued at least this long after the revision time yields a VMI whose start time is
# strictly later, so it can never be mistaken for a stale one (which would restart it again).
MIN_SETTLE_SECONDS = 2.0


def _settle(st: RolloutSettings) -> float:
    return max(st.settle_seconds, MIN_SETTLE_SECONDS)


def _started(vmi: model.Vmi) -> dt.datetime:
    return vmi.running_since or vmi.created


class _Now:
    """``now`` for one evaluation, remembering the earliest later time it was compared with: the
    evaluation cannot change before that time unless its inputs do (what `PlanMemo` relies on)."""

    __slots__ = ("evidence_at", "horizon", "now")

    def __init__(self, now: dt.datetime, evidence_at: dt.datetime | None = None) -> None:
        self.now = now
        self.horizon: dt.datetime | None = None
        # Before this time a guest without a report may have reported to the previous leader.
        self.evidence_at = evidence_at

    def evidence_pending(self) -> bool:
        """Whether "no report" still means "no report yet" (docs/design.md#evidence-after-takeover)."""
        return self.evidence_at is not None and not self.reached(self.evidence_at)

    def reached(self, t: dt.datetime) -> bool:
        if t <= self.now:
            return True
        if self.horizon is None or t < self.horizon:
            self.horizon = t
        return False
