"""`eventually`: the one polling helper of the tests, fault scenarios and benchmarks.

Cluster state converges asynchronously, so tests wait for a condition instead of sleeping a fixed
time. A timeout names what was awaited and the last value seen, which is usually the whole story of
a failure.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


class EventuallyTimeout(AssertionError, TimeoutError):
    """A condition did not hold in time.

    Both an AssertionError (a test failure, not an error in the test) and a TimeoutError (what a
    fault scenario catches to record a failed invariant instead of aborting).
    """


@overload
async def eventually(check: Callable[[], Awaitable[T]], *, timeout: float = ..., interval: float = ...,  # noqa: ASYNC109
                     what: str = ...) -> T: ...


@overload
async def eventually(check: Callable[[], T], *, timeout: float = ..., interval: float = ...,  # noqa: ASYNC109
                     what: str = ...) -> T: ...


async def eventually(
        check: Callable[[], Awaitable[T]] | Callable[[], T], *,
        timeout: float = 20.0,  # noqa: ASYNC109 - the deadline also bounds the sleeps between checks
        interval: float = 0.1, what: str = "condition") -> T:
    """Call `check()` (sync or async) until it returns a truthy value, and return that value.

    Raises EventuallyTimeout naming `what` and the last value once `timeout` seconds have passed.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        res = check()
        last = await res if inspect.isawaitable(res) else res
        if last:
            return last  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise EventuallyTimeout(f"timed out after {timeout:g}s waiting for {what}; last value: {last!r:.200}")
        await asyncio.sleep(interval)
