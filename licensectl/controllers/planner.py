"""`PlannerThread`: where a reconcile loop's pure plan runs, off the event loop.

A plan over a large fleet (the rollout's over 50,000 VMIs, replication's over 20,000 namespaces) takes
up to a second of CPU. On the event loop that second holds up everything else the loop does: Lease
renewals, watch reads, guest reports, scrapes (docs/design.md#plans-off-the-loop). A pass therefore
gathers its inputs on the loop in one synchronous step (copies of what the loop keeps changing), plans
in this thread, and acts on the loop again. The GIL is handed back to the loop within the switch
interval, so the loop waits milliseconds, not the whole plan.

One thread per loop, one plan at a time: a plan may keep state from pass to pass (the rollout's memo),
and a pass that was cancelled while its plan ran leaves that plan to finish before the next one starts.

`CacheCopies` keeps the gather's own share of the loop small: a cache is copied again only when its
generation moved, so a rotation's passes, which mostly follow replica writes, do not copy 50,000 VMIs,
VMs or 20,000 namespaces each time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

from licensectl.core.ports import CacheView, Key

T = TypeVar("T")
V = TypeVar("V")


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


class CacheCopies:
    """What a gather copies of each cache, made once per cache generation and handed out again while the
    generation holds. A copy is shared by every plan made meanwhile, so its shape must be immutable
    (a tuple) or only ever read (a Mapping nobody writes). One shape per cache: the copy is keyed by the
    cache's name."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[object, int, Any]] = {}

    def of(self, view: CacheView[V], shape: Callable[[Mapping[Key, V]], T]) -> T:
        """`shape(view.cache)` as of the cache's current generation."""
        hit = self._held.get(view.name)
        if hit is None or hit[0] is not view or hit[1] != view.generation:
            hit = (view, view.generation, shape(view.cache))
            self._held[view.name] = hit
        return cast(T, hit[2])


def objects_of(cache: Mapping[Key, V]) -> tuple[V, ...]:
    """A cache's objects as an immutable copy (a `CacheCopies` shape)."""
    return tuple(cache.values())
