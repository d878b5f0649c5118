"""How one informer is tuned (`InformerOptions`) and what it tells the metrics (`InformerHooks`).

Two small frozen records instead of a dozen constructor keywords: the defaults are the production
values, and a caller names only what it changes (a short backoff for a simulator, a longer ceiling for
an optional API that may be absent for good).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from licensectl.kube.watch.backoff import RECOVERY_CAP, THROTTLED_CAP


def _noop_restart(informer: str, reason: str) -> None:
    return None


def _noop_list(informer: str, result: str, objects: int, seconds: float) -> None:
    return None


@dataclass(frozen=True, slots=True)
class InformerHooks:
    """Metric hooks; called inline, keep them cheap.

    on_watch_restart(informer, reason): reason in gone, timeout, error, line_too_long.
    on_list(informer, result, objects, seconds): result "ok" or "error".
    """

    on_watch_restart: Callable[[str, str], None] = _noop_restart
    on_list: Callable[[str, str, int, float], None] = _noop_list


@dataclass(frozen=True, slots=True)
class InformerOptions:
    """Paging, timeouts and backoff of one informer (seconds unless named otherwise).

    page_size: objects per LIST page (0: unpaged). watch_timeout: the least server-side watch timeout
    asked (spread up to twice that). request_timeout: a LIST page, and the connect of a watch.
    unhealthy_after: how long the watch may be down before `healthy` turns false. backoff_base,
    backoff_cap: the retry schedule of a failing server; throttled_cap: its ceiling after a 429 (never
    below backoff_cap). max_line_bytes: the longest watch event held before the connection is dropped.
    """

    page_size: int = 500
    watch_timeout: float = 300.0
    request_timeout: float = 60.0
    unhealthy_after: float = 30.0
    backoff_base: float = 0.5
    backoff_cap: float = RECOVERY_CAP
    throttled_cap: float = THROTTLED_CAP
    max_line_bytes: int = 16 * 1024 * 1024
