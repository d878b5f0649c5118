"""What an answered admission leaves behind: metrics on the webhook's thread, Events on the controller's loop.

The webhook answers from its own thread (docs/design.md#webhook-thread) and hands every answer here:
counters are thread-safe and counted at once; an Event is an API write, so it is handed to the
controller's loop and never delays the answer. Only the leader writes boot-image Events
(docs/design.md#decision-leader-only); a dry run causes no Event (sideEffects: None).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from licensectl import logs
from licensectl.core import boot_image
from licensectl.core.ports import EventSink, InvolvedObject
from licensectl.core.reasons import EventType, Reason
from licensectl.metrics import Metrics
from licensectl.serve.webhook import Admission, Validation

log = logs.get("licensectl.app")  # these lines were always the process's own


def _vmi(namespace: str, name: str) -> InvolvedObject:
    return InvolvedObject("kubevirt.io/v1", "VirtualMachineInstance", namespace, name)


class AdmissionOutcomes:
    def __init__(self, *, metrics: Metrics, events: EventSink, loop: asyncio.AbstractEventLoop,
                 spawn: Callable[[str, Coroutine[Any, Any, None]], None], is_leader: Callable[[], bool],
                 enforce: bool) -> None:
        self._metrics = metrics
        self._events = events
        self._loop = loop
        self._spawn = spawn
        self._is_leader = is_leader
        self._enforce = enforce

    def on_validation(self, v: Validation) -> None:
        """Runs on the webhook's thread. The mutating webhook already counted the image and wrote the Event."""
        if v.denied:
            self._metrics.webhook_boot_image_denied.inc()
            log.info("vGPU VMI denied: boot image not marked", namespace=v.namespace, vmi=v.name, dry_run=v.dry_run)

    def on_admission(self, a: Admission) -> None:
        """Runs on the webhook's thread: metrics (thread-safe) here, Events on the controller's loop."""
        m = self._metrics
        m.webhook_admissions.labels(a.result).inc()
        m.webhook_duration.observe(a.seconds)
        if a.boot is not None:
            m.webhook_boot_image.labels(a.boot.verdict.value).inc()
            # Only the leader writes (docs/design.md#decision-leader-only): a standby's answer carries the
            # warning and counts the metric, and leaves the Event to the leader's answers.
            if (a.boot.verdict is not boot_image.Verdict.MARKED and a.name and not a.dry_run
                    and self._is_leader()):
                self._loop.call_soon_threadsafe(self._boot_image_event, a)
        if a.delivery is None:
            return
        if a.delivery.added:
            log.debug("license volume added", namespace=a.namespace, vmi=a.name, replicas=list(a.delivery.added))
        for _, reason in a.delivery.skipped:
            m.webhook_skipped.labels(reason.value).inc()
        # An Event needs an object (a name) and no dry run (sideEffects: None); never on the answer's path.
        if a.delivery.skipped and a.name and not a.dry_run:
            self._loop.call_soon_threadsafe(self._not_delivered_events, a)

    def _not_delivered_events(self, a: Admission) -> None:
        assert a.delivery is not None
        for claim, reason in a.delivery.skipped:
            self._spawn("admission-event", self._events.emit(
                _vmi(a.namespace, a.name), EventType.WARNING, Reason.LICENSE_NOT_DELIVERED,
                a.delivery.skip_message(claim, reason)))

    def _boot_image_event(self, a: Admission) -> None:
        assert a.boot is not None
        enforced = self._enforce and a.boot.verdict is boot_image.Verdict.UNMARKED
        self._spawn("admission-event", self._events.emit(
            _vmi(a.namespace, a.name), EventType.WARNING, Reason.VGPU_DRIVER_UNMARKED,
            boot_image.event_message(a.boot, enforced=enforced)))
