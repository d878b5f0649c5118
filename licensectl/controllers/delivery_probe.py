"""Delivery readiness: evidence that a VMI created now would pass through licensectl's webhook.

A backstop or rollout restart only helps when the new VMI gets its license volume, and with
`failurePolicy: Ignore` the apiserver admits it unchanged whenever the webhook cannot be reached
(no ready endpoint behind the Service yet, a missing caBundle, a wrong configuration name). So the
controller asks the apiserver itself: a server-side dry-run create (dryRun=All, nothing stored) of a
probe VMI in licensectl's own namespace, through the real admission chain, must come back carrying
the webhook's answer annotation (docs/design.md#delivery-readiness). Until it does, and again when it
stops doing so, `ready()` is False and the rollout issues no restart.

Only the leader probes: it is the one replica that restarts, and a standby stays read-only (a dry-run
create is still a create request in the apiserver's audit log). A new leader is woken on takeover and
holds evidence within one probe, before its first restart; failures retry with a short, doubling
backoff, successes are re-checked at a steady interval, and evidence older than `max_age` no longer
counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from typing import Any

from licensectl import logs
from licensectl.core.delivery import probe_answered, probe_vmi
from licensectl.core.ports import VmiDryRun
from licensectl.kube.api import ApiException
from licensectl.metrics import GaugeSample, Metrics

log = logs.get(__name__)

MUTATED = "mutated"
UNCHANGED = "unchanged"
ERROR = "error"
RESULTS = (MUTATED, UNCHANGED, ERROR)
WAITING = "waiting for the admission webhook"
STANDBY = "standby: only the leader probes"


class DeliveryProbe:
    """Periodic dry-run probes; `ready` is the `delivery_ready` callable the rollout takes."""

    def __init__(self, dry_run: VmiDryRun, namespace: str, *, metrics: Metrics | None = None,
                 interval: float = 15.0, min_backoff: float = 0.5, max_backoff: float = 8.0,
                 request_timeout: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[bool], None] | None = None,
                 active: Callable[[], bool] = lambda: True) -> None:
        self._dry_run = dry_run
        self.namespace = namespace
        self._metrics = metrics
        self.interval = interval
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.max_age = 3 * interval
        self._timeout = request_timeout
        self._clock = clock
        self._on_change = on_change
        self._active = active  # is this replica the leader (the one that probes and restarts)?
        self.last_ok: float | None = None  # monotonic time of the last mutated answer
        self.last_result: str | None = None
        self.error: str | None = "not probed yet"
        self.failures = 0
        self._wake = asyncio.Event()
        if metrics is not None:
            for r in RESULTS:
                metrics.delivery_probes.labels(r)

    def ready(self) -> bool:
        """Fresh evidence: the last probe came back mutated, within `max_age`."""
        return (self.last_result == MUTATED and self.last_ok is not None
                and self._clock() - self.last_ok <= self.max_age)

    def forget(self) -> None:
        """Drop evidence when this replica stops being the leader: a later takeover probes afresh."""
        self.last_ok = None
        self.last_result = None
        self.error = STANDBY
        self.failures = 0

    def wake(self) -> None:
        """Probe now (leadership changed)."""
        self._wake.set()

    def recheck(self) -> None:
        """A restart came back without its volume: the evidence held is in doubt. Not ready until a fresh
        probe comes back mutated, so no later restart goes out on it; probe now."""
        if self.last_ok is not None:
            self.last_ok = None
            self.last_result = None
            self.error = "re-checking: a restarted VMI came back without its license volume"
            if self._on_change is not None:
                self._on_change(False)
        self._wake.set()

    async def probe_once(self) -> bool:
        """One dry-run create; True when licensectl's webhook answered it."""
        before = self.ready()
        nonce = secrets.token_hex(8)
        try:
            obj = await self._dry_run.create_vmi(self.namespace, probe_vmi(nonce), request_timeout=self._timeout)
        except (ApiException, OSError, TimeoutError) as e:
            status = getattr(e, "status", None)
            self._record(ERROR, f"dry-run create failed: {type(e).__name__}" + (f" HTTP {status}" if status else ""))
        else:
            if probe_answered(obj, nonce):
                self.last_ok = self._clock()
                self._record(MUTATED, None)
            else:
                self._record(UNCHANGED, "the apiserver admitted the probe VMI unchanged: no licensectl webhook "
                             "answered it (endpoint, caBundle or configuration missing, or caches not synced)")
        after = self.ready()
        if after != before:
            log.info("delivery readiness changed", ready=after, error=self.error)
            if self._on_change is not None:
                self._on_change(after)
        return self.last_result == MUTATED

    def _record(self, result: str, error: str | None) -> None:
        self.last_result = result
        self.error = error
        self.failures = 0 if error is None else self.failures + 1
        if self._metrics is not None:
            self._metrics.delivery_probes.labels(result).inc()
        if error is not None and (self.failures in (1, 10) or self.failures % 100 == 1):
            log.warning("delivery probe failed", result=result, error=error, failures=self.failures)

    def next_delay(self) -> float:
        """Steady when ready; after a failure min_backoff, doubling to max_backoff."""
        if self.failures == 0:
            return self.interval
        return float(min(self.max_backoff, self.min_backoff * 2.0 ** min(self.failures - 1, 30)))

    async def run(self) -> None:
        while True:
            if not self._active():
                if self.last_result is not None:
                    self.forget()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.interval)
                self._wake.clear()
                continue
            try:
                await self.probe_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never let a probe bug stop the process; it counts as no evidence
                self._record(ERROR, f"probe failed: {type(e).__name__}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.next_delay())
            self._wake.clear()

    def samples(self) -> list[GaugeSample]:
        """Leader only: a standby holds no evidence, and `max(licensectl_delivery_ready)` asks the leader."""
        if not self._active():
            return []
        return [GaugeSample("delivery_ready", (), 1.0 if self.ready() else 0.0)]

    def status_dict(self) -> dict[str, Any]:
        age = None if self.last_ok is None else round(self._clock() - self.last_ok, 1)
        return {"ready": self.ready(), "prober": self._active(), "last_result": self.last_result,
                "last_success_seconds_ago": age,
                "error": self.error, "consecutive_failures": self.failures}
