"""`PlannerThread`: where a reconcile loop's pure plan runs, off the event loop.

A plan over a large fleet (the rollout's over 50,000 VMIs, replication's over 20,000 namespaces) takes
up to a second of CPU. On the event loop that second holds up everything else the loop does: Lease
renewals, watch reads, guest reports, scrapes (docs/design.md#plans-off-the-loop). A pass therefore
gathers its inputs on the loop in one synchronous step (copies of what the loop keeps changing), plans
in this thread, and acts on the loop again. The GIL is handed back to the loop within the switch
interval, so the loop waits milliseconds, not the whole plan.

One thread per loop, one plan at a time: a plan may keep state from pass to pass (the rollout's memo),
and a pass that was cancelled while its plan ran leaves that plan to finish before the next one starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class PlannerThread:
    def __init__(self, name: str) -> None:
        self.name = name
        self._executor: ThreadPoolExecutor | None = None

    async def run(self, plan: Callable[[], T]) -> tuple[T, float]:
        """`plan()` in the thread, and the CPU time it took there (what paces a loop: runner.Pacing)."""
        def timed() -> tuple[T, float]:
            cpu = time.thread_time()
            out = plan()
            return out, time.thread_time() - cpu

        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"licensectl-{self.name}-plan")
        return await asyncio.get_running_loop().run_in_executor(self._executor, timed)

    def close(self) -> None:
        """Let the thread go: a plan under way finishes, nothing waits for it, a later `run` starts anew."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
