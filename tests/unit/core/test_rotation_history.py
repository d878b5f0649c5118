"""The rotation record's history (`licensectl rollout history`): every candidate's outcome written with the
decision that ends it, bounded, re-derived the same after a crash; and the record's annotation names."""

from __future__ import annotations

import dataclasses
import json

import pytest

from licensectl.core.rotation import (
    ANN_CANDIDATE,
    ANN_HISTORY,
    ANN_PHASE,
    ANN_STABLE,
    HistoryEntry,
    HosterControl,
    Outcome,
    RotationPhase,
    RotationRecord,
    content_revision,
    decide,
)
from licensectl.core.rotation_record import ANN_CANDIDATE_EARLIER, ANN_STABLE_EARLIER, HISTORY_LIMIT
from licensectl.core.timecodec import format_micro_time

from .test_rotation import NAMESPACES, ST, T0, C, N, S, carrying, record, sec, view, vmi


def test_each_outcome_is_recorded_once_in_order_promoted_aborted_undone() -> None:
    every = dict.fromkeys(NAMESPACES, C)
    # Promoted: the last step passes.
    promoted = decide(record(RotationPhase.PROMOTING, wave=3, canary=()),
                      view(C, every, [vmi(ns) for ns in NAMESPACES]), st=ST, now=T0 + sec(10)).record
    assert promoted is not None and promoted.history == (HistoryEntry(C, Outcome.PROMOTED, T0 + sec(10)),)
    # The next source revision: the promoted one becomes stable (no second entry); its canary fails.
    started = decide(promoted, view(N, every, [vmi(ns, on=False) for ns in NAMESPACES]), st=ST,
                     now=T0 + sec(20)).record
    assert started is not None and started.candidate == N and started.history == promoted.history
    canary = started.canary[0]
    aborted = decide(started, view(N, {canary: N}, [vmi(canary, failure="not_found", licensed=False)]),
                     st=ST, now=T0 + sec(30)).record
    assert aborted is not None and aborted.phase is RotationPhase.ABORTED
    assert aborted.history[-1] == HistoryEntry(N, Outcome.ABORTED, T0 + sec(30))
    # Retried, then undone by the hoster: a second entry for the same source revision, at the undo's time.
    retried = decide(aborted, view(N, {}, control=HosterControl(retry_at=T0 + sec(40))), st=ST,
                     now=T0 + sec(41)).record
    assert retried is not None and retried.phase is RotationPhase.CANARY and retried.history == aborted.history
    undone = decide(retried, view(N, {}, control=HosterControl(undo_at=T0 + sec(50))), st=ST,
                    now=T0 + sec(51)).record
    assert undone is not None and undone.history[-1] == HistoryEntry(N, Outcome.UNDONE, T0 + sec(50))
    assert [e.outcome for e in undone.history] == [Outcome.PROMOTED, Outcome.ABORTED, Outcome.UNDONE]


def test_a_running_candidate_replaced_is_superseded_and_an_aborted_one_keeps_its_outcome() -> None:
    rec = record(RotationPhase.CANARY)
    d = decide(rec, view(N, carrying(rec, NAMESPACES)), st=ST, now=T0 + sec(5))
    assert d.record is not None and d.record.candidate == N
    assert d.record.history == (HistoryEntry(C, Outcome.SUPERSEDED, T0 + sec(5)),)
    aborted = dataclasses.replace(record(RotationPhase.ABORTED), history=(HistoryEntry(C, Outcome.ABORTED, T0),))
    d = decide(aborted, view(N, {}), st=ST, now=T0 + sec(5))
    assert d.record is not None and d.record.history == aborted.history


@pytest.mark.parametrize("phase", [RotationPhase.CANARY, RotationPhase.PROMOTING, RotationPhase.ABORTED])
def test_the_same_observations_decide_the_same_history_after_a_crash(phase: RotationPhase) -> None:
    """A leader killed before its write leaves the old record: the next one derives the same record,
    so the entry is written once, by the one guarded write that carries the decision."""
    rec = record(phase, wave=1 if phase is RotationPhase.PROMOTING else 0)
    v = view(S, carrying(rec, NAMESPACES))
    first, again = decide(rec, v, st=ST, now=T0 + sec(9)), decide(rec, v, st=ST, now=T0 + sec(9))
    assert first == again and first.record is not None
    assert len(first.record.history) == (0 if phase is RotationPhase.ABORTED else 1)
    # Written and read back: nothing more to decide, nothing added.
    back = RotationRecord.from_annotations(first.record.annotations())
    assert back == first.record
    assert decide(back, v, st=ST, now=T0 + sec(10)).record is None


def test_the_history_is_bounded_and_survives_the_annotation_round_trip() -> None:
    rec = record(RotationPhase.CANARY)
    for i in range(HISTORY_LIMIT + 3):
        rec = dataclasses.replace(rec.ended(Outcome.ABORTED, T0 + sec(i)),
                                  candidate=content_revision(f"t{i}".encode(), None))
    assert len(rec.history) == HISTORY_LIMIT and rec.history[0].at == T0 + sec(3)
    ann = rec.annotations()
    assert len(ann[ANN_HISTORY]) < 2048  # ten entries: a small annotation on a Secret licensectl owns
    assert RotationRecord.from_annotations(ann) == rec


def test_an_unreadable_history_entry_is_left_out_never_the_record() -> None:
    good = {"source_revision": C, "outcome": "promoted", "at": format_micro_time(T0)}
    base = {ANN_STABLE: S, ANN_PHASE: "stable"}
    for raw in ("not json", "{}", json.dumps([good, {"outcome": "exploded"}, 3, {**good, "at": "yesterday"}])):
        rec = RotationRecord.from_annotations({**base, ANN_HISTORY: raw})
        assert rec is not None and rec.stable == S
        assert rec.history == ((HistoryEntry(C, Outcome.PROMOTED, T0),) if raw.startswith("[") else ())


def test_the_earlier_annotation_names_are_read_and_the_new_ones_written() -> None:
    earlier = {ANN_STABLE_EARLIER: S, ANN_CANDIDATE_EARLIER: C, ANN_PHASE: "canary"}
    rec = RotationRecord.from_annotations(earlier)
    assert rec is not None and (rec.stable, rec.candidate, rec.phase) == (S, C, RotationPhase.CANARY)
    ann = rec.annotations()
    assert (ann[ANN_STABLE], ann[ANN_CANDIDATE]) == (S, C)
    assert ANN_STABLE == "licensectl.io/stable-source-revision"
    assert ANN_CANDIDATE == "licensectl.io/candidate-source-revision"
    assert ANN_STABLE_EARLIER not in ann and ANN_CANDIDATE_EARLIER not in ann
    # The new names win; an empty new candidate (stable) is not overridden by a stale earlier one.
    mixed = RotationRecord.from_annotations({**earlier, ANN_STABLE: N, ANN_CANDIDATE: "", ANN_PHASE: "stable"})
    assert mixed is not None and (mixed.stable, mixed.candidate) == (N, "")
