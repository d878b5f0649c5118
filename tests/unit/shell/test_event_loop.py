"""The controller's loop: uvloop where importable, asyncio's default loop where not (licensectl/event_loop.py)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from licensectl import event_loop


async def _what_runs() -> tuple[str, str]:
    await asyncio.sleep(0)
    return event_loop.running_loop_name(), type(asyncio.get_running_loop()).__module__


def test_the_controller_runs_on_uvloop_where_it_is_installed() -> None:
    name, module = event_loop.run(_what_runs())
    assert name == "uvloop"
    assert module.startswith("uvloop")


def test_without_uvloop_the_same_program_runs_on_asyncios_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what `import uvloop` meets where it is not installed
    assert event_loop.loop_factory() == ("asyncio", None)
    name, module = event_loop.run(_what_runs())
    assert name == "asyncio"
    assert module.startswith("asyncio")
