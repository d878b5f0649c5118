"""Kubernetes Events for what licensectl does and what it refuses to do.

Events are for humans reading `kubectl describe`; they are not state, and each one is an apiserver
and etcd write, so callers emit only where a person must look (docs/operations.md#events). A
level-based loop sees the same problem on every pass, so the recorder aggregates like client-go's
EventCorrelator: one Event object per (object, reason, message), re-emitted at most once per
interval, and a repeat is one patch of its count, not a new object (docs/design.md#event-aggregation).
Messages are built by the caller from names and reasons only — never from Secret data.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from collections.abc import Callable
from typing import Any

from licensectl import logs
from licensectl.core.ports import InvolvedObject
from licensectl.core.reasons import EventType, Reason
from licensectl.core.timecodec import format_time
from licensectl.kube.api import CoreV1Api, absent_on_404
from licensectl.kube.errors import ApiException, Conflict, Forbidden, NotFound
from licensectl.kube.raw import RawApi

log = logs.get(__name__)

MAX_MESSAGE = 1024
# A write that failed for a reason other than the namespace being gone is tried again by the first
# emit this long after, not one min_interval later: the Event was never written, so nothing is a repeat.
RETRY_SECONDS = 10.0


def event_name(obj: InvolvedObject, reason: str, message: str) -> str:
    """Deterministic, so re-emitting after a controller restart bumps the same Event."""
    digest = hashlib.sha256(f"{obj.kind}/{obj.namespace}/{obj.name}/{obj.uid}/{reason}/{message}".encode())
    return f"{obj.name[:200]}.{digest.hexdigest()[:16]}"


class EventRecorder:
    """Writes core/v1 Events; failures are logged, never raised (an Event must not stop a reconcile)."""

    def __init__(self, api: CoreV1Api, *, component: str = "licensectl", dry_run: bool = False,
                 min_interval: float = 300.0, clock: Callable[[], dt.datetime] | None = None,
                 concurrency: int = 16,
                 ) -> None:
        self._api: Any = RawApi(api)
        self._component = component
        self._dry_run = dry_run
        self._min_interval = min_interval
        self._clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._last: dict[str, dt.datetime] = {}
        self._counts: dict[str, int] = {}
        self._sem = asyncio.Semaphore(concurrency)
        self.emitted: list[tuple[InvolvedObject, str, str, str]] = []  # recent, for tests and status

    async def emit(self, obj: InvolvedObject, type_: EventType, reason: Reason, message: str) -> None:
        message = message[:MAX_MESSAGE]
        name = event_name(obj, reason, message)
        now = self._clock()
        last = self._last.get(name)
        if last is not None and (now - last).total_seconds() < self._min_interval:
            return
        self._last[name] = now
        if len(self._last) > 50_000:  # bounded memory under a storm of distinct problems
            self._last.clear()
            self._counts.clear()
        self.emitted.append((obj, type_, reason, message))
        del self.emitted[:-1000]
        log.info("event", kind=obj.kind, namespace=obj.namespace, name=obj.name, type=type_, reason=reason,
                 message=message)
        if self._dry_run:
            return
        ns = obj.namespace or "default"  # apiserver validation: cluster-scoped objects' Events go to default
        ts = format_time(now)  # firstTimestamp/lastTimestamp are metav1.Time: seconds
        try:
            async with self._sem:  # bounded: a 5,000-replica rotation must not fan out 5,000 Event writes
                await self._bump_or_create(ns, name, obj, type_, reason, message, ts)
        except (Forbidden, NotFound) as e:
            # The namespace is terminating or gone; nobody will read that Event anyway.
            log.debug("event write failed", reason=reason, name=obj.name, status=e.status)
        except ApiException as e:
            log.warning("event write failed", reason=reason, name=obj.name, status=e.status)
            self._retry_soon(name, now)
        except Exception as e:  # network trouble: a pass RETRY_SECONDS later emits it again
            log.warning("event write failed", reason=reason, name=obj.name, error=type(e).__name__)
            self._retry_soon(name, now)

    def _retry_soon(self, name: str, now: dt.datetime) -> None:
        """Let the next emit of an Event whose write failed through after RETRY_SECONDS, not min_interval,
        and count it as the write that did not happen (a failed first create is retried as a create)."""
        self._counts[name] = max(0, self._counts.get(name, 1) - 1)
        wait = min(RETRY_SECONDS, self._min_interval)
        self._last[name] = now - dt.timedelta(seconds=self._min_interval - wait)

    async def _bump_or_create(self, ns: str, name: str, obj: InvolvedObject, type_: str, reason: str,
                              message: str, ts: str) -> None:
        """First time: create. A repeat of an Event this process wrote: one patch of its count (404:
        someone deleted it or it expired, so create again). A create that meets an existing Event
        (written before a restart) falls back to the patch. Needs only create + patch on events."""
        count = self._counts.get(name, 0) + 1
        self._counts[name] = count
        if count > 1:
            bump = {"count": count, "lastTimestamp": ts}
            if await absent_on_404(self._api.patch_namespaced_event(name, ns, bump)) is not None:
                return
            self._counts[name] = count = 1
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": obj.as_dict(), "type": type_, "reason": reason, "message": message,
            "source": {"component": self._component}, "reportingComponent": self._component,
            "reportingInstance": self._component,
            "firstTimestamp": ts, "lastTimestamp": ts, "count": 1,
        }
        try:
            await self._api.create_namespaced_event(ns, body)
            return
        except Conflict:
            pass
        self._counts[name] = count = 2
        await self._api.patch_namespaced_event(name, ns, {"count": count, "lastTimestamp": ts})
