"""The controller's event loop: uvloop where the platform has it, else asyncio's own.

uvloop (libuv, compiled) runs the same asyncio programs with less CPU per socket read, timer and
callback, which is most of what a controller does between its decisions (docs/design.md#compiled-paths).
It is a dependency on CPython for Linux and macOS; where it cannot be imported (another
interpreter, Windows, a build without it) the process runs on asyncio's default loop and behaves
the same, only with more CPU. Which loop runs is logged at start (`event_loop`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """("uvloop", its loop constructor), or ("asyncio", None) for the default loop."""
    try:
        import uvloop
    except ImportError:
        return "asyncio", None
    return "uvloop", uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop `loop_factory` picks."""
    _, factory = loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """The running loop's implementation, for the start log: "uvloop" or "asyncio"."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"
