"""One task per tenant cluster: a hung cluster holds up no other, work is the latest handed over, and no
task outlives its cluster or the leadership."""

from __future__ import annotations

import asyncio
import datetime as dt

from licensectl.controllers.cluster_tasks import ClusterTasks


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class _Runs:
    """A run function that records (cluster, work, fresh, kicked) and hangs for clusters in `hung`."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bool, bool]] = []
        self.hung: set[str] = set()
        self.release = asyncio.Event()
        self.ran = asyncio.Event()
        self.due: dt.datetime | None = None

    async def __call__(self, work: str, fresh: bool, kicked: bool) -> dt.datetime | None:
        cluster = work.split(":")[0]
        if cluster in self.hung:
            await self.release.wait()
        self.seen.append((cluster, work, fresh, kicked))
        self.ran.set()
        return self.due

    async def until(self, n: int) -> None:
        while len(self.seen) < n:
            self.ran.clear()
            await asyncio.wait_for(self.ran.wait(), 5)


async def test_a_hung_cluster_holds_up_no_other_and_then_runs_the_latest_work_once() -> None:
    runs = _Runs()
    runs.hung.add("a")
    tasks: ClusterTasks[str] = ClusterTasks(runs, clock=_now, retry_seconds=1)
    try:
        tasks.sync({"a": ("a:1", 1), "b": ("b:1", 1)})
        await runs.until(1)
        assert runs.seen == [("b", "b:1", True, False)]
        assert tasks.busy() == frozenset({"a"})
        # Passes go on while `a` hangs: `b` is driven each time its work changes, `a` only keeps the latest.
        tasks.sync({"a": ("a:2", 2), "b": ("b:2", 2)})
        tasks.sync({"a": ("a:3", 3), "b": ("b:2", 2)})  # b's work unchanged: no run for it
        await runs.until(2)
        assert runs.seen[1] == ("b", "b:2", True, False)
        runs.release.set()
        await runs.until(4)
        assert runs.seen[2:] == [("a", "a:1", True, False), ("a", "a:3", True, False)]
        assert tasks.busy() == frozenset()
    finally:
        await tasks.stop()


async def test_a_kick_runs_at_once_and_a_cluster_without_work_ends_its_task() -> None:
    runs = _Runs()
    tasks: ClusterTasks[str] = ClusterTasks(runs, clock=_now, retry_seconds=1)
    try:
        tasks.sync({"a": ("a:1", 1)})
        await runs.until(1)
        tasks.kick("a")
        await runs.until(2)
        assert runs.seen[1] == ("a", "a:1", False, True)
        task = tasks.tasks["a"].task
        tasks.sync({})
        await asyncio.wait_for(task, 5)
        assert "a" not in tasks.tasks
    finally:
        await tasks.stop()


async def test_a_run_asks_for_its_next_time_and_stop_leaves_no_task() -> None:
    runs = _Runs()
    runs.due = _now()  # due again at once: runs on its own time, not fresh
    tasks: ClusterTasks[str] = ClusterTasks(runs, clock=_now, retry_seconds=1)
    tasks.sync({"a": ("a:1", 1), "b": ("b:1", 1)})
    await runs.until(4)
    assert ("a", "a:1", False, False) in runs.seen
    running = [t.task for t in tasks.tasks.values()]
    await tasks.stop()
    assert all(t.done() for t in running) and not tasks.tasks


async def test_a_failing_run_is_tried_again_after_the_retry_time() -> None:
    calls: list[bool] = []

    async def failing(_work: str, fresh: bool, _kicked: bool) -> dt.datetime | None:
        calls.append(fresh)
        raise RuntimeError("tenant trouble")

    tasks: ClusterTasks[str] = ClusterTasks(failing, clock=_now, retry_seconds=0.01)
    try:
        tasks.sync({"a": ("a:1", 1)})
        for _ in range(500):
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.01)
        assert calls[:2] == [True, False]
    finally:
        await tasks.stop()
