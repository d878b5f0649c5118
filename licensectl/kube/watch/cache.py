"""The read side of an informer: its cache of projections and what a reader may conclude from it.

Apart from the LIST/WATCH loop that keeps it current (`licensectl.kube.watch.informer`, the only
writer): `synced`, `healthy` and `stale_seconds` are what the controller consults before it trusts the
cache (deletions above all), so they are read here in one place, next to the state they read.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Generic, TypeVar

from licensectl.kube.watch import wire

T = TypeVar("T")


class WatchCache(Generic[T]):
    """A cache keyed by (namespace, name) and its health; mutated only by the `Informer` subclass."""

    def __init__(self, name: str, *, unhealthy_after: float) -> None:
        self.name = name
        self._unhealthy_after = unhealthy_after
        self._cache: dict[wire.Key, T] = {}
        self._generation = 0
        self._rv = ""
        self._synced = False
        self._synced_event = asyncio.Event()
        self._list_failed = False
        self._watch_down_since: float | None = time.monotonic()
        self._running = False
        self._last_sync_at: dt.datetime | None = None
        self._heard_at: float | None = None  # monotonic: last complete LIST, watch opened or watch line read
        self._counters: dict[str, int] = dict.fromkeys(
            ("lists", "list_failures", "relists", "events", "watch_restarts", "invalid_objects", "ignored_objects"),
            0)

    # -- read side ------------------------------------------------------------------------------
    @property
    def cache(self) -> Mapping[wire.Key, T]:
        """Read-only live view. Take `snapshot()` if you await while iterating it."""
        return MappingProxyType(self._cache)

    def snapshot(self) -> dict[wire.Key, T]:
        return dict(self._cache)

    @property
    def generation(self) -> int:
        """Grows with every effective change (the changes `on_change` is told of, relists included)."""
        return self._generation

    @property
    def synced(self) -> bool:
        return self._synced

    @property
    def healthy(self) -> bool:
        """Running, synced, last LIST succeeded, and the watch is up (or down for less than the grace)."""
        if not self._running or not self._synced or self._list_failed:
            return False
        down = self._watch_down_since
        return down is None or time.monotonic() - down <= self._unhealthy_after

    @property
    def stale_seconds(self) -> float | None:
        """Seconds since this cache last heard from the apiserver (a LIST, a watch opening, any watch line,
        bookmarks included); None before the first LIST. A quiet healthy watch reaches at most its server
        timeout (up to 2 x watch_timeout); more means the apiserver has gone silent (docs/operations.md#readiness)."""
        return None if self._heard_at is None else time.monotonic() - self._heard_at

    @property
    def resource_version(self) -> str:
        return self._rv

    @property
    def last_sync_at(self) -> dt.datetime | None:
        """Wall-clock time of the last complete LIST."""
        return self._last_sync_at

    @property
    def running(self) -> bool:
        return self._running

    @property
    def counters(self) -> Mapping[str, int]:
        return MappingProxyType(dict(self._counters))

    async def wait_synced(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 (a bool, not a raise)
        """True once synced; False if `timeout` seconds pass first."""
        if self._synced:
            return True
        try:
            await asyncio.wait_for(self._synced_event.wait(), timeout)
        except TimeoutError:
            return False
        return self._synced
