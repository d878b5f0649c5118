"""`licensectl rollout pause|resume|retry|undo` refuse what makes no sense (kubectl-style), and say
what they wrote: the pure rules of core/rollout/actions.py (the real thing against the apiserver:
tests/integration/test_cli_actions.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from licensectl.core.model import (
    ANN_ROLLOUT_PAUSED,
    ANN_SOURCE_NAME,
    ANN_SOURCE_NAMESPACE,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    REVISION_STORE_LABEL,
    ObjectRef,
)
from licensectl.core.reasons import Reason
from licensectl.core.revision_text import unlabeled_hashes
from licensectl.core.rollout import actions as ra
from licensectl.core.rotation import RotationPhase, RotationRecord

REF = ObjectRef("hoster", "nls")
STABLE, CAND = "a" * 64, "b" * 64
PAUSED = {ANN_ROLLOUT_PAUSED: "true"}


def target(*, annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
           record: RotationRecord | None = None, is_source: bool | None = True) -> ra.Target:
    return ra.Target(REF, labels or {}, annotations or {}, is_source, record)


def rec(phase: RotationPhase) -> RotationRecord:
    return RotationRecord(stable=STABLE, phase=phase, candidate="" if phase is RotationPhase.STABLE else CAND)


@pytest.mark.parametrize(("verb", "t", "says"), [
    (ra.Verb.PAUSE, target(annotations=PAUSED), "source hoster/nls is already paused"),
    (ra.Verb.RESUME, target(), "source hoster/nls is not paused"),
    (ra.Verb.UNDO, target(), "no rollout history found for source hoster/nls: licensectl holds no rotation record"),
    (ra.Verb.RETRY, target(), "no rollout history found for source hoster/nls"),
    (ra.Verb.UNDO, target(record=rec(RotationPhase.STABLE)),
     f"no rollout history found for source hoster/nls: it is stable on source revision {STABLE[:12]}, there is "
     "no candidate to undo"),
    (ra.Verb.RETRY, target(record=rec(RotationPhase.STABLE)), "there is no candidate to retry"),
    (ra.Verb.UNDO, target(record=rec(RotationPhase.ABORTED)), f"candidate source revision {CAND[:12]} is already "
                                                              "aborted"),
    (ra.Verb.UNDO, target(record=rec(RotationPhase.UNDONE)), "is already undone"),
    (ra.Verb.RETRY, target(record=rec(RotationPhase.CANARY)), "is canary, not aborted or undone; nothing to retry"),
    (ra.Verb.RETRY, target(record=rec(RotationPhase.PROMOTED)), "is promoted, not aborted or undone"),
    (ra.Verb.PAUSE, target(labels={MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                           annotations={ANN_SOURCE_NAMESPACE: "src", ANN_SOURCE_NAME: "tok"}),
     "hoster/nls is a license replica licensectl writes into a tenant namespace, not a license source; act on "
     "its source: licensectl rollout pause src/tok"),
    (ra.Verb.UNDO, target(labels={REVISION_STORE_LABEL: "true"}), "is licensectl's revision store"),
    (ra.Verb.PAUSE, target(is_source=False), "hoster/nls is not the license source of any GPUClass"),
])
def test_refusals(verb: ra.Verb, t: ra.Target, says: str) -> None:
    why = ra.refusal(verb, t)
    assert why is not None and says in why
    assert unlabeled_hashes(why) == []


@pytest.mark.parametrize(("verb", "t"), [
    (ra.Verb.PAUSE, target()),
    (ra.Verb.PAUSE, target(is_source=None)),  # classes not listable: the Secret's own marks decide
    (ra.Verb.RESUME, target(annotations=PAUSED)),
    (ra.Verb.UNDO, target(record=rec(RotationPhase.CANARY))),
    (ra.Verb.UNDO, target(record=rec(RotationPhase.PROMOTING))),
    (ra.Verb.UNDO, target(record=rec(RotationPhase.PROMOTED))),
    (ra.Verb.RETRY, target(record=rec(RotationPhase.ABORTED))),
    (ra.Verb.RETRY, target(record=rec(RotationPhase.UNDONE))),
])
def test_what_makes_sense_goes_ahead_with_one_event(verb: ra.Verb, t: ra.Target) -> None:
    assert ra.refusal(verb, t) is None
    _type, reason, message = ra.event(verb, t.record)
    assert reason is ra.REASONS[verb] and reason in set(Reason)
    assert unlabeled_hashes(message) == [] and unlabeled_hashes(ra.done_text(verb, str(REF), t.record)) == []
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert ra.patch_annotations(verb, now)  # one annotation patch, never empty


def test_a_pause_during_a_canary_says_its_deadline_keeps_counting() -> None:
    _t, _r, message = ra.event(ra.Verb.PAUSE, rec(RotationPhase.CANARY))
    assert "canary" in message and "deadline keeps counting" in message
