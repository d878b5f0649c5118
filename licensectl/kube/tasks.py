"""Ending a component's background tasks: the one shutdown step the informer owners share."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel every task, then wait for each to end, so none outlives its owner's stop; what a task
    raises on its way out is its own to log, never the stopping caller's."""
    ending = list(tasks)
    for t in ending:
        t.cancel()
    for t in ending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
