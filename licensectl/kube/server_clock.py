"""Controller time aligned to the apiserver's clock.

Rollout decisions compare a replica's revision time (stamped by licensectl) with VMI start times
(stamped by the cluster). If the controller's clock is off, a VMI could look stale forever (restarted
again and again) or current too early (missed). So licensectl stamps and judges time on the
apiserver's clock: every response carries a `Date` header, and the median offset of recent responses
corrects the local clock. Without responses yet, the offset is 0.

One instance per process, owned by the App: the API client's request tracing feeds it
(kube/client.py `request_tracing`) and the App hands its `now` to whoever stamps or judges time.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time
from collections import deque
from email.utils import parsedate_to_datetime


class ServerClock:
    """The local clock corrected by the median offset of recent apiserver `Date` headers."""

    def __init__(self, window: int = 31, min_interval: float = 1.0) -> None:
        self._offsets: deque[float] = deque(maxlen=window)
        self._min_interval = min_interval
        self._last_local = float("-inf")
        self._offset = 0.0

    @property
    def offset(self) -> float:
        """Seconds to add to the local clock to get the apiserver's."""
        return self._offset

    def observe(self, date_header: str | None, local: float) -> None:
        """Take one response's Date header (RFC 7231, whole seconds) received at local epoch `local`."""
        if not date_header or local - self._last_local < self._min_interval:
            return
        try:
            server = parsedate_to_datetime(date_header).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return
        self._last_local = local
        # Date truncates to the second: the server's true time was in [server, server + 1).
        self._offsets.append(server + 0.5 - local)
        self._offset = statistics.median(self._offsets)

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(time.time() + self._offset, dt.UTC)
