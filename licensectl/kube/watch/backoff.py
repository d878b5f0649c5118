"""When an informer tries again: jittered exponential backoff, throttling, Retry-After, watch timeouts.

Ceilings are short for a server that is down or failing (an attempt costs it nothing or little, and a
healed server must be seen within seconds) and long only when the server itself asks to slow down
(429) (docs/design.md#recovery-backoff). Every function takes its random draw `rnd` as an argument,
so the schedule is deterministic under test; the informer passes `random.random()`.
"""

from __future__ import annotations

from licensectl.kube.errors import TooManyRequests, is_status
from licensectl.kube.watch.wire import ApiError


def backoff_delay(attempt: int, rnd: float, *, base: float = 0.5, cap: float = 30.0) -> float:
    """Jittered exponential backoff: in [d/2, d] with d = min(cap, base * 2**attempt).

    `rnd` is a uniform draw in [0, 1) passed in, so the schedule is testable.
    """
    exp = min(max(attempt, 0), 62)
    d = min(cap, base * (2.0**exp))
    r = min(max(rnd, 0.0), 1.0)
    return d * (0.5 + 0.5 * r)


# Backoff ceilings: short for a server that is down or failing (an attempt costs it nothing or
# little, and a healed server must be seen within seconds), long for a server that throttles (429).
RECOVERY_CAP = 2.0
THROTTLED_CAP = 30.0
MIN_RETRY_AFTER = 0.2  # "Retry-After: 0" must not become a busy loop


def retry_delay(attempt: int, rnd: float, *, throttled: bool, base: float = 0.5, cap: float = RECOVERY_CAP,
                throttled_cap: float = THROTTLED_CAP, retry_after: float | None = None) -> float:
    """The informer's backoff schedule: jittered exponential up to `cap`, or up to `throttled_cap`
    when the last failure was a 429 (the apiserver's priority and fairness shedding load). A
    Retry-After the server sent wins (a restarted apiserver answers 429 "storage is initializing"
    with Retry-After: 1 until its watch cache is filled), jittered up by at most a quarter."""
    if retry_after is not None and retry_after >= 0:
        r = min(max(rnd, 0.0), 1.0)
        return min(throttled_cap, max(retry_after, MIN_RETRY_AFTER) * (1.0 + 0.25 * r))
    return backoff_delay(attempt, rnd, base=base, cap=throttled_cap if throttled else cap)


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the apiserver sends an integer); None when absent or an HTTP date."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds < 86400 else None


def retry_after_of(e: BaseException | None) -> float | None:
    return e.retry_after if isinstance(e, ApiError) else None


def is_throttled(e: BaseException | None) -> bool:
    """429 from a LIST or WATCH (our ApiError, or an ApiException raised by the client)."""
    return e is not None and is_status(e, TooManyRequests)


def watch_timeout_seconds(minimum: float, rnd: float) -> int:
    """Server-side watch timeout in [minimum, 2*minimum), spread like client-go so that many
    watches do not all reconnect at once."""
    return max(1, int(minimum * (1.0 + min(max(rnd, 0.0), 0.999999))))
