"""The C allocator settings (licensectl/malloc.py): they take on glibc, and are no-ops without it."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from licensectl import malloc
from licensectl.controllers import runner

REPO = Path(__file__).resolve().parents[3]
# A child interpreter fragments malloc's heap (4,000-byte bytes objects come from malloc, not from
# Python's own arenas; one in 50 is kept), then reads VmRSS before and after `malloc.trim()`.
FRAGMENTED_HEAP = """
import os
from benchmarks.common import proc_memory
from licensectl import malloc
def rss():
    return proc_memory(os.getpid())["VmRSS"]
blocks = [bytes(4000) for _ in range(20000)]
keep = blocks[::50]
del blocks
before = rss()
released = malloc.trim()
print(before, rss(), released, len(keep))
"""


def test_trim_hands_a_fragmented_heaps_free_pages_back() -> None:
    out = subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True, text=True, check=True,
                         cwd=REPO)
    before, after, released, kept = out.stdout.split()
    assert released == "True" and kept == "400"
    # About 78 MiB were freed but stay in the process (a kept block in every page run); the trim
    # returns most of them.
    assert int(before) - int(after) > 40 << 20, (int(before) >> 20, int(after) >> 20)


def test_the_arena_limit_is_taken_by_glibc() -> None:
    assert malloc.limit_arenas() is True


def test_without_the_c_functions_both_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(malloc, "_libc_function", lambda name: None)
    assert malloc.limit_arenas() is False
    assert malloc.trim() is False


def test_refreeze_trims_after_it_collects(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def collect() -> int:
        calls.append("collect")
        return 0

    def trim() -> bool:
        calls.append("trim")
        return True

    monkeypatch.setattr(gc, "collect", collect)
    monkeypatch.setattr(malloc, "trim", trim)
    try:
        runner.refreeze()
    finally:
        gc.unfreeze()
    assert calls == ["collect", "trim"]
