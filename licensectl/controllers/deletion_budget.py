"""The deletion cap of replication: a sliding-window rate held in memory (docs/design.md#decision-deletions)."""

from __future__ import annotations

from collections import deque


class DeletionBudget:
    """At most `per_minute` deletions in any sliding 60 s window (in memory: a rate, not state)."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._times: deque[float] = deque()

    def take(self, wanted: int, now: float) -> int:
        while self._times and now - self._times[0] >= 60.0:
            self._times.popleft()
        allowed = max(0, min(wanted, self.per_minute - len(self._times)))
        self._times.extend([now] * allowed)
        return allowed

    def settle(self, count: int, now: float) -> None:
        """Re-stamp the newest `count` deletions with `now`, once they have been carried out.

        A large batch admitted at t can take tens of seconds to execute; counting it from its
        completion keeps the deletions actually made within the cap in any 60 s window."""
        for i in range(max(0, len(self._times) - count), len(self._times)):
            self._times[i] = max(self._times[i], now)

    def next_free(self, now: float) -> float:
        """Seconds until the window admits another deletion."""
        if len(self._times) < self.per_minute or not self._times:
            return 0.0
        return max(0.0, 60.0 - (now - self._times[0]))
