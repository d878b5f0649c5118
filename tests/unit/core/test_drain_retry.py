"""The hoster's way out of a BootTimeout (`licensectl rollout retry-worker`, core/drain.py `_retry_boot`): a
retry asked after the cycle closed restarts the worker once more with a fresh boot window, exactly once."""

from __future__ import annotations

import dataclasses

from licensectl.core.drain import (
    ANN_DRAIN_RETRY_AT,
    Blocked,
    BlockReason,
    DrainIntent,
    Restart,
    Step,
    WaitBoot,
    parse_annotations,
)
from licensectl.core.timecodec import format_micro_time
from tests.unit.core.test_drain import NOW, SETTINGS, S, intent, node, seen, step


def test_the_retry_annotation_is_read_with_the_intent_and_only_a_newer_one_asks() -> None:
    rec = intent(Step.BLOCKED, reason=BlockReason.BOOT_TIMEOUT, cordoned=False)
    ann = rec.render_annotations()
    assert ANN_DRAIN_RETRY_AT not in ann  # the CLI's, never rewritten by the drain
    for at, asked in ((rec.step_at + S, True), (rec.step_at, False), (rec.step_at - S, False)):
        parsed = parse_annotations({**ann, ANN_DRAIN_RETRY_AT: format_micro_time(at)})
        assert isinstance(parsed, DrainIntent) and parsed.retry_requested is asked
    garbage = parse_annotations({**ann, ANN_DRAIN_RETRY_AT: "garbage"})
    assert isinstance(garbage, DrainIntent) and not garbage.retry_requested
    pdb = intent(Step.BLOCKED, reason=BlockReason.PDB_BLOCKED, retry_at=NOW)
    assert not pdb.retry_requested  # only a worker down after its restart is retried


def test_a_retry_restarts_the_running_vmi_again_with_a_fresh_boot_window_once() -> None:
    rec = intent(Step.BLOCKED, reason=BlockReason.BOOT_TIMEOUT, cordoned=False, vmi_uid="uid-1",
                 retry_at=NOW - 5 * S)
    a = step(rec, seen(vmi_uid="uid-2", node=node(ready=False)))
    assert isinstance(a, Restart) and a.vmi_uid == "uid-2"
    assert (a.intent.step, a.intent.step_at, a.intent.reason, a.intent.boot_id) == (Step.RESTART, NOW, None, "boot-1")
    assert not a.intent.retry_requested  # its own step is newer than the request: handled once
    # The restart went out: the Node's return is waited for afresh, a second timeout closes it again.
    waiting = step(a.intent, seen(vmi_uid="uid-3", node=node(ready=False)), now=NOW + S)
    assert isinstance(waiting, WaitBoot) and waiting.until == NOW + S + SETTINGS.boot_timeout
    again = step(waiting.intent, seen(vmi_uid="uid-3", node=node(ready=False)), now=waiting.until)
    assert isinstance(again, Blocked) and again.reason is BlockReason.BOOT_TIMEOUT and again.closed
    assert again.intent is not None and again.intent.down
    assert not dataclasses.replace(again.intent, retry_at=rec.retry_at).retry_requested


def test_a_retry_of_a_worker_whose_vmi_is_gone_waits_for_its_replacement() -> None:
    rec = intent(Step.BLOCKED, reason=BlockReason.BOOT_TIMEOUT, cordoned=False, retry_at=NOW)
    a = step(rec, seen(vmi_uid=None, node=node(ready=False)), now=NOW + S)
    assert isinstance(a, WaitBoot) and a.intent.step is Step.WAIT_BOOT and a.until == NOW + S + SETTINGS.boot_timeout


def test_without_a_retry_a_down_worker_stays_blocked() -> None:
    rec = intent(Step.BLOCKED, reason=BlockReason.BOOT_TIMEOUT, cordoned=False)
    assert step(rec, seen(node=node(ready=False))) == Blocked(BlockReason.BOOT_TIMEOUT, rec)


def test_a_skip_closes_a_down_worker_for_its_revision_once_and_frees_its_budget() -> None:
    rec = intent(Step.BLOCKED, reason=BlockReason.BOOT_TIMEOUT, cordoned=False, skip_at=NOW - 5 * S)
    assert rec.skip_requested and rec.holds_budget
    a = step(rec, seen(node=None))
    assert isinstance(a, Blocked) and a.closed and a.reason is BlockReason.SKIPPED
    assert a.intent is not None and not a.intent.down and not a.intent.holds_budget
    assert not a.intent.skip_requested  # handled once: its step time moved past the request
    assert step(a.intent, seen(node=None), now=NOW + S) == Blocked(BlockReason.SKIPPED, a.intent)
    # Given up for its revision only: a new revision starts over.
    assert not isinstance(step(a.intent, seen(revision="r2"), now=NOW + S), Blocked)


def test_of_a_retry_and_a_skip_both_pending_the_later_wins() -> None:
    base = intent(Step.BLOCKED, reason=BlockReason.BOOT_TIMEOUT, cordoned=False)
    later_skip = dataclasses.replace(base, retry_at=NOW - 5 * S, skip_at=NOW - 2 * S)
    assert isinstance(step(later_skip, seen()), Blocked)
    later_retry = dataclasses.replace(base, retry_at=NOW - 2 * S, skip_at=NOW - 5 * S)
    assert isinstance(step(later_retry, seen()), Restart)
