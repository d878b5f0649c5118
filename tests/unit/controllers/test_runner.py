"""The runner of the App's loops (controllers/runner.py): a failing pass backs off, a trigger wakes
a loop, a stop lets the passes finish before the elector goes, and a dead task makes the process
unhealthy. Timings are scaled down; the order of things is what is checked."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import itertools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from licensectl import logs
from licensectl.controllers import runner
from licensectl.controllers.runner import IDLE, Pacing, Result, TaskRunner, idle_before_next_pass, reconcile_loop
from licensectl.kube.errors import ApiException as KubeApiException


class Flag:
    def __init__(self) -> None:
        self.set = False

    def __call__(self) -> bool:
        return self.set


async def wait_until(cond: Callable[[], bool], within: float = 2.0) -> None:
    for _ in range(int(within / 0.005)):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"condition not met within {within} s")


async def test_a_failing_pass_backs_off_exponentially_and_success_resets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "BACKOFF_BASE_SECONDS", 0.01)
    loop = asyncio.get_running_loop()
    times: list[float] = []
    stopping = Flag()

    async def step() -> Result:
        times.append(loop.time())
        if len(times) in (1, 2, 3, 5):
            raise ConnectionError("apiserver away")
        if len(times) >= 6:
            stopping.set = True
        return Result.after(0.0)

    with capture_logs() as logs:
        await asyncio.wait_for(reconcile_loop("replication", step, trigger=asyncio.Event(), resync=60.0,
                                              pacing=Pacing(coalesce=0.0), stopping=stopping), 5.0)
    failed = [e for e in logs if e["event"] == "reconcile failed"]
    assert [e["retry_in"] for e in failed] == [0.02, 0.04, 0.08, 0.02]  # the 4th failure follows a success
    assert {e["loop"] for e in failed} == {"replication"} and failed[0]["error"] == "ConnectionError"
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[0] >= 0.019 and gaps[1] >= 0.039 and gaps[2] >= 0.079
    assert len(times) == 6


async def test_backoff_is_capped() -> None:
    stopping = Flag()
    calls = 0

    async def step() -> Result:
        nonlocal calls
        calls += 1
        stopping.set = True
        raise RuntimeError

    with capture_logs() as logs:
        task = asyncio.create_task(reconcile_loop("rollout", step, trigger=asyncio.Event(), resync=60.0,
                                                  pacing=Pacing(coalesce=0.0), stopping=stopping))
        await task
    assert calls == 1 and logs[0]["retry_in"] == 1.0
    assert min(runner.BACKOFF_MAX_SECONDS, runner.BACKOFF_BASE_SECONDS * 2 ** 6) == runner.BACKOFF_MAX_SECONDS


def lookup(table: dict[str, str], key: str) -> str:
    return table[key]  # the line a failed pass's traceback must point at


async def failing_loop(passes: int, *, fail: Callable[[int], None]) -> list[dict[str, Any]]:
    """Run a loop whose every pass calls `fail(pass number)` until `passes` passes ran; its log entries."""
    stopping = Flag()
    calls = 0

    async def step() -> Result:
        nonlocal calls
        calls += 1
        stopping.set = calls >= passes
        fail(calls)
        return IDLE

    with capture_logs() as logs:
        await asyncio.wait_for(reconcile_loop("replication", step, trigger=asyncio.Event(), resync=60.0,
                                              pacing=Pacing(coalesce=0.0), stopping=stopping), 5.0)
    return [e for e in logs if e["event"] == "reconcile failed"]


async def test_a_failed_pass_logs_its_message_and_once_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "BACKOFF_BASE_SECONDS", 0.001)
    monkeypatch.setattr(runner, "BACKOFF_MAX_SECONDS", 0.001)

    def fail(n: int) -> None:
        lookup({}, f"replica-{n}")  # the message changes from pass to pass; the failure does not

    failed = await failing_loop(4, fail=fail)
    assert [e["message"] for e in failed] == [f"'replica-{n}'" for n in range(1, 5)]  # every time
    assert all(e["error"] == "KeyError" and e["loop"] == "replication" for e in failed)
    assert ["exc_info" in e for e in failed] == [True, False, False, False]  # the traceback once
    tb = failed[0]["exc_info"].__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert tb.tb_frame.f_code.co_name == "lookup"


async def test_the_same_failure_gets_its_traceback_again_after_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "BACKOFF_BASE_SECONDS", 0.001)
    monkeypatch.setattr(runner, "BACKOFF_MAX_SECONDS", 0.001)
    now = [0.0]  # the loop's clock as the limiter reads it: pass n fails at n * 100 s

    real = logs.TracebackLimit

    def limit(every: float, *, clock: Callable[[], float]) -> logs.TracebackLimit:
        return real(every, clock=lambda: now[0])

    monkeypatch.setattr(runner.logs, "TracebackLimit", limit)

    def fail(n: int) -> None:
        now[0] = n * 100.0
        lookup({}, "replica")

    failed = await failing_loop(7, fail=fail)
    assert logs.TRACEBACK_EVERY_SECONDS == 300.0
    assert ["exc_info" in e for e in failed] == [True, False, False, True, False, False, True]
    assert all(e["message"] == "'replica'" for e in failed)


async def test_another_failure_gets_its_own_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "BACKOFF_BASE_SECONDS", 0.001)
    monkeypatch.setattr(runner, "BACKOFF_MAX_SECONDS", 0.001)

    def fail(n: int) -> None:
        if n % 2:
            lookup({}, "replica")
        raise ConnectionError("apiserver away")

    failed = await failing_loop(5, fail=fail)
    assert [(e["error"], "exc_info" in e) for e in failed] == [
        ("KeyError", True), ("ConnectionError", True), ("KeyError", False), ("ConnectionError", False),
        ("KeyError", False)]


def test_the_traceback_limit_is_per_scope_and_bounded() -> None:
    now = [0.0]
    limit = logs.TracebackLimit(10.0, clock=lambda: now[0], max_kept=2)
    try:
        lookup({}, "x")
    except KeyError as e:
        err = e
    assert limit.due("a", err) and not limit.due("a", err) and limit.due("b", err)
    now[0] = 9.9
    assert not limit.due("a", err)
    now[0] = 10.0
    assert limit.due("a", err)
    now[0] = 25.0
    assert limit.due("c", err) and len(limit._last) <= 2  # what is past its window is forgotten


def rendered(fmt: str, emit: Callable[[], None]) -> str:
    """What `emit` writes through licensectl's own log setup in `fmt`; structlog's setup is restored."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    buf = io.StringIO()
    try:
        logs.configure(fmt, "info", stream=buf)
        emit()
    finally:
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(level)
    return buf.getvalue()


TOKEN = "eyJhbGciOiJSUzI1NiJ9" + "Q2xpZW50Q29uZmlnVG9rZW4xMjM0NTY3ODkw" * 3  # what a client token looks like


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_a_failure_renders_message_and_traceback_never_token_bytes(fmt: str) -> None:
    def emit() -> None:
        try:
            lookup({}, "replica-a")
        except KeyError as e:
            logs.get("t").warning("reconcile failed", loop="replication", **logs.failure_fields(e))
        try:
            raise ValueError(f"cannot parse {TOKEN}")
        except ValueError as e:
            logs.get("t").warning("reconcile failed", loop="replication", **logs.failure_fields(e))

    out = rendered(fmt, emit)
    assert "Traceback (most recent call last)" in out and "in lookup" in out and "return table[key]" in out
    assert "replica-a" in out and "cannot parse [redacted]" in out
    assert TOKEN[:40] not in out and "Q2xpZW50Q29uZmln" not in out
    if fmt == "json":
        first, second = (json.loads(line) for line in out.splitlines())
        assert (first["error"], first["message"]) == ("KeyError", "'replica-a'")
        assert first["exception"].startswith("Traceback") and "KeyError: 'replica-a'" in first["exception"]
        assert second["message"] == "cannot parse [redacted]"


def test_an_exception_carrying_a_response_body_is_told_by_status_and_reason() -> None:
    class LibraryApiException(Exception):  # kubernetes-asyncio's: its text includes the response body
        def __init__(self) -> None:
            super().__init__(f'HTTP response body: {{"data": {{"token": "{TOKEN}"}}}}')
            self.status, self.reason, self.body = 409, "Conflict", '{"data": ...}'

    assert logs.error_message(LibraryApiException()) == "(409) Conflict"
    assert logs.error_message(KubeApiException(404, "NotFound")) == "(404) NotFound"  # licensectl's: no body
    assert logs.error_message(RuntimeError("x" * 1000)).endswith("…")
    assert len(logs.error_message(RuntimeError("x" * 1000))) == logs.MESSAGE_LIMIT
    assert logs.scrub("ns/licensectl-replica-nvidia-a100-80gb-tenant-some-long-name") == (
        "ns/licensectl-replica-nvidia-a100-80gb-tenant-some-long-name")  # names are not opaque
    assert logs.scrub("sha " + "0123456789abcdef" * 4) == "sha " + "0123456789abcdef" * 4  # nor hex digests


async def test_a_trigger_wakes_an_idle_loop_and_a_burst_is_one_pass() -> None:
    trigger = asyncio.Event()
    stopping = Flag()
    passes = 0

    async def step() -> Result:
        nonlocal passes
        passes += 1
        return IDLE  # nothing scheduled: only a trigger (or the 60 s resync) wakes it

    task = asyncio.create_task(reconcile_loop("replication", step, trigger=trigger, resync=60.0,
                                              pacing=Pacing(coalesce=0.05), stopping=stopping))
    await wait_until(lambda: passes == 1)
    await asyncio.sleep(0.1)
    assert passes == 1
    for _ in range(5):  # a burst of watch events between two passes: one pass
        trigger.set()
    await wait_until(lambda: passes == 2)
    await asyncio.sleep(0.15)
    assert passes == 2
    stopping.set = True
    trigger.set()
    await asyncio.wait_for(task, 1.0)


async def test_a_requeue_runs_the_next_pass_without_a_trigger() -> None:
    stopping = Flag()
    passes = 0

    async def step() -> Result:
        nonlocal passes
        passes += 1
        stopping.set = passes >= 3
        return Result.after(0.01)

    await asyncio.wait_for(reconcile_loop("rollout", step, trigger=asyncio.Event(), resync=60.0,
                                          pacing=Pacing(coalesce=0.0), stopping=stopping), 1.0)
    assert passes == 3


async def test_stop_waits_for_the_loops_then_cancels_the_elector() -> None:
    order: list[str] = []
    trigger = asyncio.Event()
    stopping = Flag()
    in_pass = asyncio.Event()

    async def step() -> Result:
        in_pass.set()
        await asyncio.sleep(0.1)  # a pass's writes in flight when the stop begins
        order.append("pass finished")
        return IDLE

    async def elector() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            order.append("elector cancelled")
            raise

    async def label_pod() -> None:
        await asyncio.sleep(0.05)
        order.append("pod labelled")

    tasks = TaskRunner()
    tasks.start_daemon("leader-election", elector())
    tasks.start_loop("replication", reconcile_loop("replication", step, trigger=trigger, resync=60.0,
                                                   pacing=Pacing(coalesce=0.0), stopping=stopping))
    await in_pass.wait()
    tasks.spawn("label-pod", label_pod())
    stopping.set = True
    trigger.set()
    await tasks.stop()
    assert order == ["pod labelled", "pass finished", "elector cancelled"]
    assert not tasks.healthy()  # everything ended


async def test_stop_cancels_a_loop_that_overruns_the_timeout() -> None:
    cancelled = asyncio.Event()

    async def stuck() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    tasks = TaskRunner(drain_timeout=0.05)
    tasks.start_loop("replication", stuck())
    await asyncio.sleep(0)
    await asyncio.wait_for(tasks.stop(), 1.0)
    assert cancelled.is_set()


async def test_health_is_false_once_a_loop_or_the_elector_dies_not_a_background_task() -> None:
    async def forever() -> None:
        await asyncio.sleep(3600)

    async def crash() -> None:
        raise RuntimeError("bug")

    async def short() -> None:
        return None

    tasks = TaskRunner(drain_timeout=0.05)
    assert tasks.healthy()  # nothing started yet
    tasks.start_daemon("leader-election", forever())
    tasks.start_loop("replication", forever())
    tasks.spawn("label-pod", short())
    await asyncio.sleep(0.01)
    assert tasks.healthy()  # a background task that finished is no dead controller

    with capture_logs() as logs:
        tasks.start_loop("rollout", crash())
        await asyncio.sleep(0.01)
    assert not tasks.healthy()
    died = next(e for e in logs if e["event"] == "task failed")
    assert died == {"event": "task failed", "task": "rollout", "error": "RuntimeError", "message": "bug",
                    "exc_info": died["exc_info"], "log_level": "error"}  # a task dies once: its traceback
    assert isinstance(died["exc_info"], RuntimeError) and died["exc_info"].__traceback__ is not None
    await tasks.stop()


async def test_a_dead_daemon_is_unhealthy_and_names_are_unique() -> None:
    async def forever() -> None:
        await asyncio.sleep(3600)

    async def ends() -> None:
        return None

    tasks = TaskRunner(drain_timeout=0.05)
    tasks.start_loop("replication", forever())
    tasks.start_daemon("leader-election", ends())
    await asyncio.sleep(0.01)
    assert not tasks.healthy()
    with pytest.raises(ValueError, match="already running"):
        tasks.start_loop("replication", forever())
    await tasks.stop()


ROLLOUT = Pacing(coalesce=0.5, idle_per_busy=2.0, max_idle=5.0)


@pytest.mark.parametrize(("triggered", "since_start", "since_end", "busy", "idle"), [
    (True, 0.0, 0.0, 0.001, 0.5),    # a cheap plan: the coalescing window only
    (True, 1.2, 0.0, 1.0, 2.0),      # a 1 s plan after an event: twice its CPU time
    (True, 3.0, 1.5, 1.0, 0.5),      # ... less the time since the pass ended (waiting for the event)
    (True, 3.0, 2.5, 1.0, 0.5),      # ... never below the window
    (True, 30.0, 0.0, 10.0, 5.0),    # bounded: an expensive plan is never held back more than max_idle
    (True, 0.0, 0.0, -1.0, 0.5),     # a clock that went backwards counts as no cost
    (False, 0.2, 0.0, 1.0, 0.3),     # a timed wakeup is due: window from the pass's start, no duty bound
    (False, 2.0, 0.0, 1.0, 0.0),
])
def test_pacing_rule(triggered: bool, since_start: float, since_end: float, busy: float, idle: float) -> None:
    assert idle_before_next_pass(ROLLOUT, triggered=triggered, since_start=since_start, since_end=since_end,
                                 busy=busy) == pytest.approx(idle)


async def test_only_the_plans_own_cpu_paces_the_loop_not_the_time_a_pass_awaited() -> None:
    """A pass that awaits its writes for long (other tasks busy meanwhile) is not an expensive plan: the
    next event runs a pass one window later, not twice the pass's wall time later (the stall a rule that
    counted the whole pass once caused after a failover)."""
    trigger = asyncio.Event()
    stopping = Flag()
    loop = asyncio.get_running_loop()
    times: list[float] = []
    plan_cpu = 0.0

    async def step() -> Result:
        times.append(loop.time())
        if len(times) == 1:
            await asyncio.sleep(0.4)   # awaiting writes: no CPU of its own
        return IDLE

    task = asyncio.create_task(reconcile_loop("rollout", step, trigger=trigger, resync=60.0,
                                              pacing=Pacing(coalesce=0.05, idle_per_busy=2.0, max_idle=5.0),
                                              stopping=stopping, busy=lambda: plan_cpu))
    await wait_until(lambda: len(times) == 1)
    trigger.set()
    await wait_until(lambda: len(times) == 2, within=0.9)  # ~0.45 s: the pass's awaits + one window
    # A plan that did cost CPU holds the next event's pass back by twice that.
    plan_cpu = 0.25
    trigger.set()
    await wait_until(lambda: len(times) == 3)
    assert times[2] - times[1] >= 0.45
    stopping.set = True
    trigger.set()
    await asyncio.wait_for(task, 2.0)


async def test_the_loop_lag_probe_sees_a_pass_that_holds_the_loop() -> None:
    lags: list[float] = []
    probe = asyncio.create_task(runner.measure_loop_lag(lags.append, interval=0.02))
    await wait_until(lambda: len(lags) >= 3)
    time.sleep(0.3)  # noqa: ASYNC251 (the point: a synchronous plan holding the loop)
    await wait_until(lambda: len(lags) >= 5)
    probe.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await probe
    assert max(lags) >= 0.25


def test_the_gc_pause_timer_times_each_collection_by_generation() -> None:
    seen: list[tuple[int, float]] = []
    ticks = iter([10.0, 10.25, 20.0, 20.5])
    cb = runner.gc_pause_timer(lambda g, s: seen.append((g, s)), clock=lambda: next(ticks))
    cb("start", {"generation": 2})
    cb("stop", {"generation": 2, "collected": 0, "uncollectable": 0})
    cb("stop", {"generation": 0})  # a stop without its start (registered mid-collection) is not timed
    cb("start", {"generation": 0})
    cb("stop", {"generation": 0})
    assert seen == [(2, 0.25), (0, 0.5)]


async def test_gc_pauses_are_observed_while_the_daemon_runs_and_not_after() -> None:
    seen: list[tuple[int, float]] = []
    daemon = asyncio.create_task(runner.measure_gc_pauses(lambda g, s: seen.append((g, s))))
    await asyncio.sleep(0)
    gc.collect(2)
    assert any(g == 2 and s >= 0.0 for g, s in seen)
    daemon.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await daemon
    count = len(seen)
    gc.collect(2)
    assert len(seen) == count


async def test_the_heap_is_frozen_once_the_caches_are_listed_and_again_on_schedule() -> None:
    gc.unfreeze()
    ready = [False]
    refrozen: list[int] = []
    real = runner.refreeze

    def counting() -> None:
        real()
        refrozen.append(gc.get_freeze_count())

    runner.refreeze = counting  # type: ignore[assignment]
    threshold = gc.get_threshold()
    daemon = asyncio.create_task(runner.keep_heap_frozen(lambda: ready[0], every=0.05, poll=0.01, full_every=77))
    try:
        await asyncio.sleep(0.05)
        assert refrozen == [] and gc.get_freeze_count() == 0  # not before the caches are listed
        assert gc.get_threshold() == (threshold[0], threshold[1], 77)  # full collections rarer from the start
        ready[0] = True
        await wait_until(lambda: len(refrozen) >= 2)
        assert all(n > 0 for n in refrozen)
    finally:
        daemon.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await daemon
        runner.refreeze = real  # type: ignore[assignment]
    assert gc.get_freeze_count() == 0  # a stopped daemon leaves nothing frozen
    assert gc.get_threshold() == threshold  # and the thresholds as they were


def test_refreeze_frees_a_cycle_that_became_garbage_while_frozen() -> None:
    import weakref

    class Node:
        other: Node | None = None

    gc.unfreeze()
    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    try:
        runner.refreeze()
        del a, b  # a cycle: reference counting alone never frees it
        gc.collect()
        assert alive() is not None  # frozen: no collection walks it
        runner.refreeze()
        assert alive() is None  # the next refreeze collects before it freezes
    finally:
        gc.unfreeze()
