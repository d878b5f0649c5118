"""One long-lived task per tenant cluster, so a tenant's API never stalls the rollout pass or another tenant.

As controller-runtime gives each key one worker at a time, each tenant cluster gets one task
(docs/design.md#failure-domains). The rollout pass hands it the latest desired state (`submit`: latest
wins, nothing queues up behind a hung API) and reads back whether it has answered (`busy`); the task
runs when the state it was handed changed, when the time its last run asked for has come, or when
kicked (the cluster's kubeconfig Secret changed). Nothing is decided here: the run function writes every
decision onto the cluster's records, as the drain always did, so a new leader re-derives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from licensectl import logs
from licensectl.kube.tasks import cancel_and_wait

log = logs.get(__name__)

W = TypeVar("W")

# Run function: (the latest work, fresh: handed over since the last run, kicked) -> when to run again
# (None: only when handed new work or kicked).
RunFn = Callable[[W, bool, bool], Awaitable[dt.datetime | None]]


class ClusterTask(Generic[W]):
    """One cluster's task: at most one run at a time, over the latest work it was handed."""

    def __init__(self, key: str, run: RunFn[W], *, clock: Callable[[], dt.datetime], retry_seconds: float,
                 after_run: Callable[[ClusterTask[W]], None]) -> None:
        self.key = key
        self._run = run
        self._clock = clock
        self._retry = dt.timedelta(seconds=retry_seconds)
        self._after_run = after_run
        self._work: W | None = None
        self._signature: Hashable = None
        self._fresh = False  # work handed over since the last run
        self._kicked = False
        self._retired = False
        self._wake = asyncio.Event()
        self.running = False
        self.asked_while_busy = False  # a pass held this cluster's workers back while it ran: tell it when done
        self.due: dt.datetime | None = None
        self.task: asyncio.Task[None] = asyncio.create_task(self._loop(), name=f"drain-cluster-{key}")

    @property
    def busy(self) -> bool:
        """Running, or work handed over not yet run: a new pick for this cluster would wait behind it."""
        return self.running or self._fresh or self._kicked

    def submit(self, work: W, signature: Hashable) -> None:
        """The latest desired state; a run is due at once only when it differs from what was handed before."""
        self._work = work
        self._retired = False
        if signature != self._signature:
            self._signature = signature
            self._fresh = True
            self._wake.set()

    def kick(self) -> None:
        self._kicked = True
        self._retired = False
        self._wake.set()

    def retire(self) -> None:
        """No work for this cluster any more: the task ends after its current run (unless handed more)."""
        self._retired = True
        self._wake.set()

    async def _sleep(self) -> None:
        timeout = None if self.due is None else max(0.0, (self.due - self._clock()).total_seconds())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()

    async def _loop(self) -> None:
        while True:
            await self._sleep()
            if self._retired and not (self._fresh or self._kicked):
                return
            work = self._work
            due_now = self.due is not None and self._clock() >= self.due
            if work is None or not (self._fresh or self._kicked or due_now):
                continue
            fresh, kicked = self._fresh, self._kicked
            self._fresh = self._kicked = False
            self.running = True
            try:
                self.due = await self._run(work, fresh, kicked)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # this cluster's trouble stays its own; tried again after a while
                log.warning("tenant cluster task run failed", cluster=self.key, error=type(e).__name__,
                            status=getattr(e, "status", None))
                self.due = self._clock() + self._retry
            finally:
                self.running = False
            self._after_run(self)


class ClusterTasks(Generic[W]):
    """The set of cluster tasks: started with the clusters that have work, ended when they have none or
    when leadership is lost (`stop`), never left running."""

    def __init__(self, run: RunFn[W], *, clock: Callable[[], dt.datetime], retry_seconds: float,
                 after_run: Callable[[ClusterTask[W]], None] = lambda _t: None) -> None:
        self._run = run
        self._clock = clock
        self._retry_seconds = retry_seconds
        self._after_run = after_run
        self.tasks: dict[str, ClusterTask[W]] = {}

    def sync(self, work: dict[str, tuple[W, Hashable]]) -> None:
        """Hand each cluster its latest work; clusters without any retire."""
        for key, (w, signature) in work.items():
            task = self.tasks.get(key)
            if task is None or task.task.done():
                task = ClusterTask(key, self._run, clock=self._clock, retry_seconds=self._retry_seconds,
                                   after_run=self._after_run)
                task.task.add_done_callback(functools.partial(self._ended, key, task))
                self.tasks[key] = task
            task.submit(w, signature)
        for key, task in self.tasks.items():
            if key not in work:
                task.retire()

    def _ended(self, key: str, task: ClusterTask[W], _done: asyncio.Task[None]) -> None:
        if self.tasks.get(key) is task:
            del self.tasks[key]

    def kick(self, key: str) -> None:
        task = self.tasks.get(key)
        if task is not None:
            task.kick()

    def busy(self) -> frozenset[str]:
        """Clusters whose task is running or has work not yet run (the pass's picks wait for those)."""
        out = frozenset(k for k, t in self.tasks.items() if t.busy)
        for k in out:
            self.tasks[k].asked_while_busy = True
        return out

    async def stop(self) -> None:
        """End every task (leadership lost, shutdown), waiting for each to be gone."""
        tasks = [t.task for t in self.tasks.values()]
        self.tasks.clear()
        await cancel_and_wait(tasks)
