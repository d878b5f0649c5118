"""How the App's loops run: the reconcile loop, what a pass returns, and the task runner.

Concurrency model: one asyncio event loop runs everything but the pure plans (each loop plans in its
own thread, docs/design.md#plans-off-the-loop) and the admission webhook (its own thread,
docs/design.md#webhook-thread). Each reconcile loop is one task that runs one
pass at a time, so a pass never races itself and reads the watch caches without locks; the caches
are updated by the same loop between passes. A pass is level-based (it looks at the whole picture),
so triggers carry no payload: an `asyncio.Event` set by a watch callback just says "look again",
and any number of sets before the next pass collapse into one. A coalescing window after each pass
keeps event bursts from re-planning the fleet many times a second, and an expensive plan
bounds its own share of the interpreter (`Pacing`). A pass that raises is retried
with exponential backoff; a periodic resync re-runs every loop even without events, so nothing
depends on an event being delivered.

Why a runner: the loops, the leader elector and short fire-and-forget writes (the pod label, Events
about admissions) are tasks whose lifetime the App must control, in one order at shutdown (finish
the passes and their writes, then stop campaigning for the Lease) and in one health answer (a dead
loop means a stuck controller: /healthz must say so, and the kubelet restarts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

from licensectl import logs, malloc

log = logs.get(__name__)

# Failure backoff: 1 s after the first failed pass, doubling, at most 30 s.
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0
# The shortest wait a pass may ask for: a requeue of 0 must not spin the event loop.
MIN_REQUEUE_SECONDS = 0.05
# How long a graceful stop waits for the loops (and background writes) to finish before cancelling.
STOP_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Result:
    """What one reconcile pass asks of its loop (controller-runtime's `reconcile.Result`).

    `requeue_after`: run again after at most this many seconds (capped by the resync period);
    None: nothing is scheduled, the next trigger or the periodic resync wakes the loop.
    """

    requeue_after: float | None = None

    @classmethod
    def after(cls, seconds: float) -> Result:
        """Run again in `seconds`: something is due then (a settle period ends, the cap frees up)."""
        return cls(seconds)


# Nothing scheduled: wait for the next trigger or the periodic resync.
IDLE: Final = Result()


@dataclass(frozen=True, slots=True)
class Pacing:
    """How a loop spaces its passes (docs/design.md#webhook-thread).

    `coalesce`: after a watch event the loop stays idle this long, so a burst of events is one pass.
    `idle_per_busy`: after a watch event it also stays idle this many times the CPU time its last *plan*
    took (the synchronous part of the pass: `busy` in `reconcile_loop`), so a loop whose plan walks a large
    fleet takes at most 1 / (1 + idle_per_busy) of the interpreter while events keep coming, and the
    replica writes, watches and /metrics that share the event loop keep the rest. Bounded by `max_idle`.
    Only the plan's own CPU counts: time the pass spent awaiting (its writes, while other tasks ran) is
    not the pass's cost, and counting it once stalled a rollout behind a busy event loop."""

    coalesce: float
    idle_per_busy: float = 0.0
    max_idle: float = 5.0


def idle_before_next_pass(p: Pacing, *, triggered: bool, since_start: float, since_end: float,
                          busy: float) -> float:
    """Seconds to stay idle now, before the next pass (pure, so the rule is tested alone).

    triggered: woken by a watch event (else by the pass's own requeue or the resync); since_start /
    since_end: seconds since the last pass started / ended; busy: CPU seconds of its plan. A timed wakeup
    (a settle period ending, a re-issue due) has nothing to coalesce and is never held back by the duty
    bound: it only keeps passes a window apart."""
    if not triggered:
        return max(0.0, p.coalesce - since_start)
    duty = min(p.max_idle, p.idle_per_busy * max(0.0, busy)) - since_end
    return max(0.0, p.coalesce, duty)


async def reconcile_loop(name: str, step: Callable[[], Awaitable[Result]], *, trigger: asyncio.Event,
                         resync: float, pacing: Pacing, stopping: Callable[[], bool],
                         busy: Callable[[], float] | None = None) -> None:
    """Run `step` until `stopping()`: after each pass wait for `trigger`, the requeue, or `resync`, then
    stay idle as `pacing` says (`busy()`: CPU seconds of the last pass's plan).

    A failed pass is logged and retried with exponential backoff (reset by the next success); a
    pass in progress when `stopping()` turns true finishes, then the loop returns. The log line names
    the error and its message every time, and carries its traceback the first time and then at most
    every `logs.TRACEBACK_EVERY_SECONDS` for the same failure (`logs.TracebackLimit`).
    """
    failures = 0
    loop = asyncio.get_running_loop()
    tracebacks = logs.TracebackLimit(logs.TRACEBACK_EVERY_SECONDS, clock=loop.time)
    while not stopping():
        wait: float | None
        started = loop.time()
        try:
            wait = (await step()).requeue_after
            failures = 0
        except Exception as e:
            failures += 1
            wait = min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2 ** min(failures, 6))
            log.warning("reconcile failed", loop=name, **logs.failure_fields(e, traceback=tracebacks.due(name, e)),
                        status=getattr(e, "status", None), retry_in=wait)
        if stopping():
            return
        ended = loop.time()
        timeout = resync if wait is None else max(MIN_REQUEUE_SECONDS, min(wait, resync))
        triggered = False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(trigger.wait(), timeout)
            triggered = True
        trigger.clear()
        now = loop.time()
        await asyncio.sleep(idle_before_next_pass(pacing, triggered=triggered, since_start=now - started,
                                                  since_end=now - ended, busy=busy() if busy else 0.0))


# How often the loop-lag probe asks for a timer: the lag it sees is what a Lease renewal, a watch read or
# a report answer due at that moment waits behind (a long pass, a scrape's sample taking).
LOOP_LAG_INTERVAL_SECONDS = 0.1


async def measure_loop_lag(observe: Callable[[float], None], *,
                           interval: float = LOOP_LAG_INTERVAL_SECONDS) -> None:
    """Until cancelled: sleep `interval` and `observe` how much later than asked the loop woke up."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(interval)
        observe(max(0.0, loop.time() - asked - interval))


def gc_pause_timer(observe: Callable[[int, float], None],
                   clock: Callable[[], float] = time.perf_counter) -> Callable[[str, dict[str, int]], None]:
    """A `gc.callbacks` entry that `observe`s (generation, seconds) of every collection. A collection holds
    the GIL: over a large heap it stops the event loop and every thread at once, wherever it was triggered."""
    started: list[float] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [clock()]
        elif phase == "stop" and started:
            observe(int(info.get("generation", 0)), clock() - started.pop())

    return callback


async def measure_gc_pauses(observe: Callable[[int, float], None]) -> None:
    """Until cancelled: time the interpreter's garbage collections (`gc_pause_timer`)."""
    callback = gc_pause_timer(observe)
    gc.callbacks.append(callback)
    try:
        await asyncio.Event().wait()
    finally:
        gc.callbacks.remove(callback)


# How often the heap is collected in full and frozen again (`keep_heap_frozen`): the one full-heap pause
# the controller then takes on purpose, and the longest a cycle of frozen garbage waits to be freed.
REFREEZE_SECONDS = 600.0
# Collections of the middle generation between two full ones (CPython's default is 10). Cycles die
# young and are freed by the younger collections; what reaches the oldest generation is mostly caches
# and plans, which a full collection walks for nothing. At 50,000 VMIs the default made 30 full
# collections (5.6 s of pauses, each over 50 ms) in one rotation.
FULL_COLLECTION_THRESHOLD = 100


def refreeze() -> None:
    """Collect everything once, then move every surviving object to the permanent generation, which no
    later collection walks (`gc.freeze`). Frozen objects are still freed by reference counting; only a
    cycle among them waits for the next refreeze."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    malloc.trim()  # what the collection and the LIST pages before it freed leaves the process


async def keep_heap_frozen(ready: Callable[[], bool], *, every: float = REFREEZE_SECONDS,
                           poll: float = 1.0, full_every: int = FULL_COLLECTION_THRESHOLD) -> None:
    """Until cancelled: a full collection only every `full_every` middle-generation ones, and once
    `ready()` (the caches are listed: the bulk of the heap exists) `refreeze`, then again every `every`
    seconds. A full
    collection walks every tracked object: over the caches of a large fleet it takes 100 ms or more and
    stops the loop (the GIL), and while a rotation churns objects it ran about once a second. With the
    long-lived objects frozen it walks only what changed since. Stopping restores both."""
    threshold = gc.get_threshold()
    gc.set_threshold(threshold[0], threshold[1], full_every)
    try:
        while not ready():  # noqa: ASYNC110 (a predicate over several caches, no one event)
            await asyncio.sleep(poll)
        while True:
            refreeze()
            await asyncio.sleep(every)
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()  # a stopped App leaves nothing frozen (tests run many in one process)


class TaskRunner:
    """Owns the App's tasks, in three kinds that differ in how they end.

    - loops (`start_loop`): reconcile loops; they return by themselves once the App is stopping,
      so `stop` waits for them (their last writes land) and cancels them only after the timeout.
    - daemons (`start_daemon`): run until cancelled (the leader elector); `stop` cancels them after
      the loops have finished, so the Lease is held until the last write of this leader is done.
    - background tasks (`spawn`): short fire-and-forget writes (the leader label, admission Events);
      kept referenced until done, waited for together with the loops on `stop`, never part of health.

    A loop or daemon that ends before `stop` is a dead controller: `healthy()` turns false.
    """

    def __init__(self, *, drain_timeout: float = STOP_TIMEOUT_SECONDS) -> None:
        self.drain_timeout = drain_timeout
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._daemons: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()

    def _create(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        if name in self._loops or name in self._daemons:
            coro.close()
            raise ValueError(f"a task named {name!r} is already running")
        task = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._log_failure)
        return task

    def start_loop(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        """A long-running task that ends by itself when stopping; awaited on `stop`."""
        self._loops[name] = self._create(name, coro)

    def start_daemon(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        """A long-running task that runs until cancelled; cancelled on `stop` after the loops."""
        self._daemons[name] = self._create(name, coro)

    def spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        """A short task nobody awaits: referenced until done, failures logged, excluded from health."""
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(self._log_failure)

    def healthy(self) -> bool:
        """No loop or daemon has ended."""
        return all(not t.done() for t in (*self._daemons.values(), *self._loops.values()))

    async def stop(self) -> None:
        """Wait up to `drain_timeout` for the loops and background writes, cancel what is left, then
        cancel the daemons; returns once every task has ended. The caller makes the loops return
        (its stopping flag and their triggers) before calling this."""
        draining = [*self._loops.values(), *self._background]
        _, pending = await asyncio.wait(draining, timeout=self.drain_timeout) if draining else (set(), set())
        for t in pending:
            t.cancel()
        for t in self._daemons.values():
            t.cancel()
        for t in (*self._daemons.values(), *self._loops.values(), *draining):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    @staticmethod
    def _log_failure(task: asyncio.Task[None]) -> None:
        """Say why a task died when it dies (retrieving the exception), not at shutdown or never: with
        its message and traceback, since a task dies once."""
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("task failed", task=task.get_name(), **logs.failure_fields(error))
