"""The safe-rotation record: the decision state of one source, as annotations on its revision store Secret.

Every decision of core/rotation.py is one write of this record; replicas follow it, never the live
source (docs/design.md#safe-rotation). Kept apart from the decisions because many readers (the
replication plan, the rollout, the revision store, the CLI) need the record and its encoding, not
how it is decided.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from licensectl.core.model import DOMAIN, u64
from licensectl.core.timecodec import annotation_time, format_micro_time, parse_time

# Record annotations on the revision store Secret. Stable and candidate are source revisions, named so
# beside a replica's `licensectl.io/revision` (a replica revision). Earlier releases wrote them as
# `stable-revision` and `candidate-revision`: still read where the new names are absent, never written
# (docs/operations.md#revisions).
ANN_STABLE = f"{DOMAIN}/stable-source-revision"
ANN_CANDIDATE = f"{DOMAIN}/candidate-source-revision"
ANN_STABLE_EARLIER = f"{DOMAIN}/stable-revision"
ANN_CANDIDATE_EARLIER = f"{DOMAIN}/candidate-revision"
ANN_PHASE = f"{DOMAIN}/rotation-phase"
ANN_WAVE = f"{DOMAIN}/rotation-wave"
ANN_WAVE_STARTED_AT = f"{DOMAIN}/rotation-wave-started-at"
ANN_CANARY = f"{DOMAIN}/rotation-canary"
ANN_EVIDENCE = f"{DOMAIN}/rotation-evidence"
ANN_REASON = f"{DOMAIN}/rotation-reason"
ANN_ACTED_AT = f"{DOMAIN}/rotation-acted-at"
# The last HISTORY_LIMIT outcomes, oldest first (`licensectl rollout history`): JSON
# [{"source_revision": <64 hex>, "outcome": <Outcome>, "at": <RFC 3339>}].
ANN_HISTORY = f"{DOMAIN}/rotation-history"
HISTORY_LIMIT = 10
# Hoster actions, annotations on the source Secret (written by `licensectl rollout retry|undo`).
ANN_RETRY_AT = f"{DOMAIN}/rollout-retry-at"
ANN_UNDO_AT = f"{DOMAIN}/rollout-undo-at"

MAX_REASON_CHARS = 256


class RotationPhase(StrEnum):
    STABLE = "stable"  # no candidate: every namespace on stable
    CANARY = "canary"  # wave 0: the canary namespaces on the candidate, analysis running
    PROMOTING = "promoting"  # wave i >= 1: step i's namespaces on the candidate
    PROMOTED = "promoted"  # every namespace on the candidate (stable kept for undo)
    ABORTED = "aborted"  # analysis failed: every namespace back on stable
    UNDONE = "undone"  # the hoster undid it: every namespace back on stable


ACTIVE = frozenset({RotationPhase.CANARY, RotationPhase.PROMOTING})
REJECTED = frozenset({RotationPhase.ABORTED, RotationPhase.UNDONE})


class Outcome(StrEnum):
    """How a candidate source revision ended, as `rollout history` lists it."""

    PROMOTED = "promoted"  # passed every step: runs everywhere
    ABORTED = "aborted"  # failed its analysis: every namespace back on stable
    UNDONE = "undone"  # the hoster undid it
    SUPERSEDED = "superseded"  # a newer source revision replaced it during its canary or a step
    WITHDRAWN = "withdrawn"  # the hoster put the stable content back into the source


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    source_revision: str
    outcome: Outcome
    at: dt.datetime

    def as_json(self) -> dict[str, str]:
        return {"source_revision": self.source_revision, "outcome": self.outcome.value,
                "at": format_micro_time(self.at)}


def _history(raw: str) -> tuple[HistoryEntry, ...]:
    """The recorded outcomes; an unreadable entry (a hand edit) is left out, never the whole record:
    the history informs the hoster, no decision reads it."""
    try:
        items = json.loads(raw or "[]")
    except ValueError:
        return ()
    out: list[HistoryEntry] = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        rev, at = item.get("source_revision"), parse_time(str(item.get("at") or ""))
        try:
            outcome = Outcome(str(item.get("outcome")))
        except ValueError:
            continue
        if isinstance(rev, str) and rev and at is not None:
            out.append(HistoryEntry(rev, outcome, at))
    return tuple(out[-HISTORY_LIMIT:])


def content_revision(token: bytes, gridd_conf: bytes | None) -> str:
    """The source revision: SHA-256 of what the hoster supplies (token and optional gridd.conf),
    length-prefixed. Independent of classes, so one source has one candidate."""
    h = hashlib.sha256(b"licensectl-source-v1\0")
    h.update(u64(len(token)) + token)
    conf = b"" if gridd_conf is None else gridd_conf
    h.update(u64(0 if gridd_conf is None else 1) + u64(len(conf)) + conf)
    return h.hexdigest()


def bucket(candidate: str, namespace: str) -> float:
    """Where a namespace falls in [0, 100) for this candidate: a step of p% holds bucket < p.

    A fresh order per candidate (not always the same tenants first), and independent of the other
    namespaces, so promotion never flips back when namespaces come and go. Remembered per candidate
    (`_BUCKETS`): every pass of a rotation asks it for every namespace again, and a SHA-256 each time
    was a tenth of the controller's CPU during a rotation (benchmarks/README.md#compiled-paths)."""
    global _BUCKETS
    memo = _BUCKETS.get(candidate)
    if memo is None:  # a new dict, swapped in whole: a thread reading the old one never sees it change size
        memo = {}
        _BUCKETS = {**dict(list(_BUCKETS.items())[1 - _BUCKET_CANDIDATES:]), candidate: memo}
    value = memo.get(namespace)
    if value is None:
        value = memo[namespace] = _hash_bucket(candidate, namespace)
    return value


def _hash_bucket(candidate: str, namespace: str) -> float:
    h = hashlib.sha256(f"{candidate}\0{namespace}".encode()).digest()
    return int.from_bytes(h[:8], "big") * 100.0 / 2**64


# candidate -> namespace -> bucket, for the few candidates of the sources rotating now. A pure memo: a
# value is the hash's, whoever computed it first (the planner threads share it; a lost race computes
# twice), so a new leader derives the same waves.
_BUCKETS: dict[str, dict[str, float]] = {}
_BUCKET_CANDIDATES = 8



@dataclass(frozen=True, slots=True)
class RotationRecord:
    """The decision state of one source, kept as annotations on its revision store Secret."""

    stable: str
    phase: RotationPhase = RotationPhase.STABLE
    candidate: str = ""
    wave: int = 0
    wave_started_at: dt.datetime | None = None
    canary: tuple[str, ...] = ()
    evidence: bool = True  # the canary holds guests that can report (else: readiness only)
    reason: str = ""
    acted_at: dt.datetime | None = None  # hoster actions at or before this are already handled
    history: tuple[HistoryEntry, ...] = ()  # the last HISTORY_LIMIT outcomes, oldest first

    def ended(self, outcome: Outcome, at: dt.datetime) -> RotationRecord:
        """This record with its candidate's outcome added to the history (written with the decision
        that ends it, in the same guarded write: a repeated decision never adds it twice)."""
        entry = HistoryEntry(self.candidate, outcome, at)
        return replace(self, history=(*self.history, entry)[-HISTORY_LIMIT:])

    @classmethod
    def from_annotations(cls, ann: Mapping[str, str]) -> RotationRecord | None:
        """None when unreadable (a store without a stable revision is not a decision). Reads the
        earlier releases' annotation names where the current ones are absent."""
        stable = ann.get(ANN_STABLE) or ann.get(ANN_STABLE_EARLIER, "")
        if not stable:
            return None
        try:
            phase = RotationPhase(ann.get(ANN_PHASE, RotationPhase.STABLE.value))
            wave = int(ann.get(ANN_WAVE, "0") or "0")
            canary = json.loads(ann.get(ANN_CANARY, "[]") or "[]")
        except (ValueError, TypeError):
            return None
        if not isinstance(canary, list) or not all(isinstance(n, str) for n in canary):
            return None
        candidate = ann[ANN_CANDIDATE] if ANN_CANDIDATE in ann else ann.get(ANN_CANDIDATE_EARLIER, "")
        if phase is not RotationPhase.STABLE and not candidate:
            return None
        return cls(stable=stable, phase=phase, candidate=candidate, wave=max(0, wave),
                   wave_started_at=annotation_time(ann, ANN_WAVE_STARTED_AT), canary=tuple(canary),
                   evidence=ann.get(ANN_EVIDENCE, "true") != "false", reason=ann.get(ANN_REASON, ""),
                   acted_at=annotation_time(ann, ANN_ACTED_AT), history=_history(ann.get(ANN_HISTORY, "")))

    def annotations(self) -> dict[str, str]:
        out = {
            ANN_STABLE: self.stable,
            ANN_CANDIDATE: self.candidate,
            ANN_PHASE: self.phase.value,
            ANN_WAVE: str(self.wave),
            ANN_CANARY: json.dumps(list(self.canary)),
            ANN_EVIDENCE: "true" if self.evidence else "false",
            ANN_REASON: self.reason[:MAX_REASON_CHARS],
            ANN_HISTORY: json.dumps([e.as_json() for e in self.history[-HISTORY_LIMIT:]], separators=(",", ":")),
        }
        if self.wave_started_at is not None:
            out[ANN_WAVE_STARTED_AT] = format_micro_time(self.wave_started_at)
        if self.acted_at is not None:
            out[ANN_ACTED_AT] = format_micro_time(self.acted_at)
        return out

    def on_candidate(self, namespace: str, steps: Sequence[float]) -> bool:
        """Whether ``namespace``'s replicas carry the candidate under this decision."""
        if self.phase is RotationPhase.PROMOTED:
            return True
        if self.phase not in ACTIVE:
            return False
        if namespace in self.canary:
            return True
        return self.wave >= 1 and bucket(self.candidate, namespace) < steps[min(self.wave, len(steps)) - 1]

    def revision_for(self, namespace: str, steps: Sequence[float]) -> str:
        return self.candidate if self.on_candidate(namespace, steps) else self.stable


@dataclass(frozen=True, slots=True)
class HosterControl:
    """The hoster's rotation actions, read from the source Secret's annotations."""

    paused: bool = False
    retry_at: dt.datetime | None = None
    undo_at: dt.datetime | None = None

    @classmethod
    def from_annotations(cls, ann: Mapping[str, str], paused: bool = False) -> HosterControl:
        return cls(paused, annotation_time(ann, ANN_RETRY_AT), annotation_time(ann, ANN_UNDO_AT))
