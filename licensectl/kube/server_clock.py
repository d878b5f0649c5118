"""Controller time aligned to the apiserver's clock.

Rollout decisions compare a replica's revision time (stamped by licensectl) with VMI start times
(stamped by the cluster). If the controller's clock is off, a VMI could look stale forever (restarted
again and again) or current too early (missed). So licensectl stamps and judges time on the
apiserver's clock: every response carries a `Date` header (whole seconds), and each response bounds
the offset between the clocks: the server's time was in [Date, Date + 1) while the request was in
flight. The median of recent responses picks out the consistent ones (a wild header is ignored);
the intersection of their bounds, which narrows as responses land at different fractions of a
second, gives the offset (its middle) and the latest the apiserver's clock can read (its upper end).
Without responses yet, the offset is 0.

One instance per process, owned by the App: the API client's request tracing feeds it
(kube/client.py `request_tracing`) and the App hands its `now` to whoever stamps or judges time, and
`latest` to the one stamp that must never be early: a replica's revision time
(docs/design.md#decision-stale-rule).
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from collections import deque
from email.utils import parsedate_to_datetime

# An observation farther than this from the median is a wild header (or a stepped clock): not intersected.
INLIER_SECONDS = 1.0


class ServerClock:
    """The local clock corrected by recent apiserver `Date` headers."""

    def __init__(self, window: int = 31, min_interval: float = 0.1) -> None:
        self._bounds: deque[tuple[float, float]] = deque(maxlen=window)  # (low, high) offset per response
        self._min_interval = min_interval
        self._last_local = float("-inf")
        self._offset = 0.0
        self._upper = 0.0

    @property
    def offset(self) -> float:
        """Seconds to add to the local clock to get the apiserver's."""
        return self._offset

    @property
    def upper(self) -> float:
        """The largest offset the responses allow: the apiserver's clock reads at most local + upper."""
        return self._upper

    def observe(self, date_header: str | None, local: float, sent: float | None = None) -> None:
        """Take one response's Date header (RFC 7231, whole seconds) received at local epoch `local`, for
        a request sent at `sent` (None: unknown, taken as `local`)."""
        if not date_header or local - self._last_local < self._min_interval:
            return
        try:
            server = parsedate_to_datetime(date_header).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return
        self._last_local = local
        start = local if sent is None or sent > local else sent
        # The server stamped Date between `start` and `local` (local clock), truncating to the second.
        self._bounds.append((server - local, server + 1.0 - start))
        self._offset, self._upper = offset_bounds(self._bounds)

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(time.time() + self._offset, dt.UTC)

    def latest(self) -> dt.datetime:
        """The latest time the apiserver's clock can read now: a stamp that must not be early."""
        return dt.datetime.fromtimestamp(time.time() + self._upper, dt.UTC)


def offset_bounds(bounds: deque[tuple[float, float]] | list[tuple[float, float]]) -> tuple[float, float]:
    """(offset, upper) from per-response (low, high) bounds: the middle and the top of the intersection
    of those near the median; where even they disagree (a clock stepped), the median and median + 0.5."""
    median = statistics.median((lo + hi) / 2 for lo, hi in bounds)
    near = [(lo, hi) for lo, hi in bounds if lo - INLIER_SECONDS <= median <= hi + INLIER_SECONDS] or [
        min(bounds, key=lambda b: abs((b[0] + b[1]) / 2 - median))]
    low = max(lo for lo, _ in near)
    high = min(hi for _, hi in near)
    if low <= high:
        return (low + high) / 2, high
    return median, median + 0.5

