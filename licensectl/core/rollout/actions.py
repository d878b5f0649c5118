"""The hoster's rollout actions (`licensectl rollout pause|resume|retry|undo`): what each one writes,
when it makes no sense, and the one Event it leaves on the source Secret.

Pure: the CLI reads the Secret it was pointed at and the source's rotation record first, then asks
`refusal` (kubectl's `is already paused` / `is not paused` / `no rollout history found`), and only
writes when it says nothing. docs/operations.md#cli-exit-codes lists the refusals.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from licensectl.core.model import (
    ANN_ROLLOUT_PAUSED,
    ANN_ROLLOUT_RESUMED_AT,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    REVISION_STORE_LABEL,
    ObjectRef,
    source_of,
)
from licensectl.core.reasons import EventType, Reason
from licensectl.core.revision_text import source_revision
from licensectl.core.rollout import SourceControl
from licensectl.core.rotation import ACTIVE, ANN_RETRY_AT, ANN_UNDO_AT, REJECTED, RotationPhase, RotationRecord
from licensectl.core.timecodec import format_micro_time


class Verb(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    RETRY = "retry"
    UNDO = "undo"


@dataclass(frozen=True, slots=True)
class Target:
    """What the CLI read before acting: the Secret it was pointed at and the source's rotation record."""

    ref: ObjectRef
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    is_class_source: bool | None  # a GPUClass names it in spec.license.secretRef; None: could not list classes
    record: RotationRecord | None  # None: no revision store (or an unreadable one) for this source


def refusal(verb: Verb, t: Target) -> str | None:
    """Why `verb` makes no sense on `t` (one line, kubectl-style), or None to go ahead."""
    src = str(t.ref)
    owner = source_of(t.annotations)
    if t.labels.get(REVISION_STORE_LABEL) is not None:
        return (f"{src} is licensectl's revision store{f' of source {owner}' if owner else ''}, not a license "
                f"source; act on the source Secret")
    if t.labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE or owner is not None:
        return (f"{src} is a license replica licensectl writes into a tenant namespace, not a license source"
                + (f"; act on its source: licensectl rollout {verb.value} {owner}" if owner else ""))
    if t.is_class_source is False:
        return f"{src} is not the license source of any GPUClass (spec.license.secretRef)"
    paused = SourceControl.from_annotations(t.annotations).paused
    rec = t.record
    if verb is Verb.PAUSE:
        return f"source {src} is already paused" if paused else None
    if verb is Verb.RESUME:
        return None if paused else f"source {src} is not paused"
    if rec is None:
        return f"no rollout history found for source {src}: licensectl holds no rotation record for it"
    if rec.phase is RotationPhase.STABLE:
        return (f"no rollout history found for source {src}: it is stable on {source_revision(rec.stable)}, "
                f"there is no candidate to {verb.value}")
    if verb is Verb.UNDO and rec.phase in REJECTED:
        return (f"source {src}: candidate {source_revision(rec.candidate)} is already {rec.phase.value}; every "
                f"namespace is on stable {source_revision(rec.stable)}")
    if verb is Verb.RETRY and (rec.phase in ACTIVE or rec.phase is RotationPhase.PROMOTED):
        return (f"source {src}: candidate {source_revision(rec.candidate)} is {rec.phase.value}, not aborted or "
                f"undone; nothing to retry")
    return None


def patch_annotations(verb: Verb, server_now: dt.datetime) -> dict[str, str | None]:
    """The annotation patch on the source Secret; `server_now` must be the apiserver's time.

    The controller compares `resumed-at` with restart times it stamped on the apiserver's clock
    (docs/design.md), so a workstation clock that is off would reset or extend the failure budget.
    """
    if verb is Verb.RESUME:
        return {ANN_ROLLOUT_PAUSED: None, ANN_ROLLOUT_RESUMED_AT: format_micro_time(server_now)}
    if verb is Verb.RETRY:  # an aborted or undone candidate starts again from the canary
        return {ANN_RETRY_AT: format_micro_time(server_now)}
    if verb is Verb.UNDO:  # every namespace back on the stable revision (docs/design.md#safe-rotation)
        return {ANN_UNDO_AT: format_micro_time(server_now)}
    return {ANN_ROLLOUT_PAUSED: "true"}


REASONS = {Verb.PAUSE: Reason.ROLLOUT_PAUSE_REQUESTED, Verb.RESUME: Reason.ROLLOUT_RESUME_REQUESTED,
           Verb.RETRY: Reason.ROLLOUT_RETRY_REQUESTED, Verb.UNDO: Reason.ROLLOUT_UNDO_REQUESTED}


def event(verb: Verb, record: RotationRecord | None) -> tuple[EventType, Reason, str]:
    """(type, reason, message) of the one Event the action leaves on the source Secret."""
    running = record is not None and record.phase in ACTIVE
    if verb is Verb.PAUSE:
        held = (f"; the {'canary' if record.wave == 0 else f'step {record.wave}'} of candidate "
                f"{source_revision(record.candidate)} is held, its analysis deadline keeps counting"
                if record is not None and running else "")
        return (EventType.NORMAL, REASONS[verb],
                f"Rollout paused by the hoster: licensectl restarts no VMI of this source until resumed{held}")
    if verb is Verb.RESUME:
        return (EventType.NORMAL, REASONS[verb],
                "Rollout resumed by the hoster: restarts continue within the rollout's limits")
    assert record is not None  # refusal() let only a source with a candidate through
    if verb is Verb.RETRY:
        return (EventType.NORMAL, REASONS[verb],
                f"Retry requested by the hoster: candidate {source_revision(record.candidate)} starts again from "
                "a fresh canary")
    return (EventType.WARNING, REASONS[verb],
            f"Undo requested by the hoster: candidate {source_revision(record.candidate)} is dropped, every "
            f"namespace returns to stable {source_revision(record.stable)}")


def done_text(verb: Verb, src: str, record: RotationRecord | None) -> str:
    """The success line on stdout: what was written, not what will have happened."""
    if verb is Verb.PAUSE:
        return f"rollout of {src} paused"
    if verb is Verb.RESUME:
        return f"rollout of {src} resumed"
    assert record is not None
    if verb is Verb.RETRY:
        return (f"retry of candidate {source_revision(record.candidate)} of {src} requested: the controller "
                "restarts it from the canary")
    return (f"undo of candidate {source_revision(record.candidate)} of {src} requested: the controller returns every "
            f"namespace to stable {source_revision(record.stable)}")
