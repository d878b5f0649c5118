"""`--profile`: where the controller's CPU goes in one phase, sampled by py-spy from outside the process.

py-spy attaches to the running controller (`record --pid`, non-blocking: the controller is never
paused, and the sampler's own CPU is its own process's, not the controller's) for one phase — the
cold start or the rotation — and writes collapsed stacks. The table lists the functions with the most
samples: *self* counts samples where the function itself was on the CPU, *total* those where it was
anywhere on the stack. Idle samples (the event loop waiting in `select`/`epoll`) are left out by
py-spy, so the shares are of the CPU the controller used, not of wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import format_table, progress

RATE_HZ = 100
# Everything up to a package's directory: site-packages, the stdlib's, or the checkout's.
_ENV_PREFIX = re.compile(r"^.*/(?:site-packages/|dist-packages/|lib/python3\.\d+/|(?=licensectl))")
TOP = 25


@dataclass(frozen=True, slots=True)
class Stacks:
    """Collapsed stacks of one phase: (frames root first, samples)."""

    phase: str
    stacks: tuple[tuple[tuple[str, ...], int], ...]

    @property
    def samples(self) -> int:
        return sum(n for _, n in self.stacks)


def parse_collapsed(text: str) -> list[tuple[tuple[str, ...], int]]:
    """py-spy's `--format raw` lines `frame;frame;... count` -> (frames, count); malformed lines skipped."""
    out: list[tuple[tuple[str, ...], int]] = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out.append((tuple(stack.split(";")), int(count)))
    return out


def short_frame(frame: str) -> str:
    """`func (path/to/module.py:12)` with the path cut to its package-relative tail."""
    name, sep, where = frame.partition(" (")
    if not sep:
        return frame
    return f"{name} ({_ENV_PREFIX.sub('', where, count=1)}"


def top_functions(stacks: Iterable[tuple[Sequence[str], int]], top: int = TOP) -> list[tuple[str, int, int]]:
    """(function, self samples, total samples), most self samples first; a recursive function counts
    once per stack in its total."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for frames, n in stacks:
        if not frames:
            continue
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    ranked = sorted(total, key=lambda f: (-own[f], -total[f], f))
    return [(f, own[f], total[f]) for f in ranked[:top]]


def profile_table(result: Stacks, label: str, top: int = TOP) -> str:
    samples = result.samples
    rows = [[short_frame(f), f"{own / samples:.1%}" if samples else "n/a", f"{tot / samples:.1%}" if samples else "n/a"]
            for f, own, tot in top_functions(result.stacks, top)]
    return format_table(f"Profile of the controller ({label}), {result.phase}: top {top} functions by own CPU "
                        f"(py-spy, {samples:,} samples at {RATE_HZ} Hz)", ["function", "self", "total"], rows)


def py_spy() -> str:
    """The py-spy of this interpreter's environment (the test extra), else one on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise RuntimeError("--profile needs py-spy (pip install py-spy; it is in the test extra)")
    return found


class PhaseProfile:
    """One py-spy recording of `pid`: `start()` at the phase's start, `await stop()` at its end."""

    def __init__(self, pid: int, phase: str) -> None:
        self.pid = pid
        self.phase = phase
        self._dir = tempfile.TemporaryDirectory(prefix="licensectl-bench-profile-")
        self._out = Path(self._dir.name) / "stacks.txt"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [py_spy(), "record", "--pid", str(self.pid), "--rate", str(RATE_HZ), "--nonblocking", "--function",
                "--format", "raw", "--output", str(self._out)]
        self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=open(Path(self._dir.name) / "py-spy.log", "wb"))  # noqa: SIM115

    async def stop(self) -> Stacks:
        """SIGINT makes py-spy write what it sampled; the stacks, or none if it could not attach."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                proc.kill()
        text = self._out.read_text() if self._out.exists() else ""
        if not text:
            log = Path(self._dir.name) / "py-spy.log"
            progress(f"profile {self.phase}: py-spy wrote nothing: {log.read_text()[-400:] if log.exists() else ''}")
        self._dir.cleanup()
        return Stacks(self.phase, tuple(parse_collapsed(text)))

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._dir.cleanup()


class Profiler:
    """The phases of one controller process, profiled when `enabled` (else every call is a no-op)."""

    def __init__(self, enabled: bool, label: str) -> None:
        self.enabled = enabled
        self.label = label
        self.results: list[Stacks] = []
        self._current: PhaseProfile | None = None

    def begin(self, pid: int | None, phase: str) -> None:
        if self.enabled and pid is not None:
            self._current = PhaseProfile(pid, phase)
            self._current.start()

    async def end(self) -> None:
        if self._current is not None:
            current, self._current = self._current, None
            self.results.append(await current.stop())

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None

    def tables(self) -> str:
        """The profile tables, each preceded by a blank line; "" when profiling is off."""
        return "".join("\n\n" + profile_table(r, self.label) for r in self.results)


def closing(profiler: Profiler) -> Callable[[], Awaitable[None]]:
    """For `BenchRun.on_exit`: a sampler still attached when the benchmark fails is stopped."""

    async def close() -> None:
        profiler.close()

    return close
