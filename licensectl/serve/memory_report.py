"""Where the controller's memory is, from the interpreter's own allocation tracer.

Started only with Python's standard switch (`PYTHONTRACEMALLOC=1` in the container's environment):
tracing costs CPU and memory, so it is for a hoster or a benchmark asking where the memory went,
never on by default. `/debug/memory` on the internal listener answers with the allocation sites that
hold the most, grouped by source line and by file (docs/operations.md#memory).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Site:
    where: str  # "licensectl/kube/projections.py:325", or a file
    size: int   # bytes held now
    count: int  # blocks held now


@dataclass(frozen=True, slots=True)
class MemoryReport:
    traced: int  # bytes held by every traced allocation now
    peak: int    # the most they ever held since tracing started
    by_line: tuple[Site, ...]
    by_file: tuple[Site, ...]

    def text(self) -> str:
        lines = [f"traced now {mib(self.traced)}, traced peak {mib(self.peak)}", "", "by file:"]
        lines += [f"{mib(s.size):>12} {s.count:>10,} blocks  {s.where}" for s in self.by_file]
        lines += ["", "by line:"]
        lines += [f"{mib(s.size):>12} {s.count:>10,} blocks  {s.where}" for s in self.by_line]
        return "\n".join(lines) + "\n"


def mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


def short_path(filename: str) -> str:
    """A path from its package down (`.../site-packages/aiohttp/x.py` -> `aiohttp/x.py`): the report
    names code, not the machine it runs on."""
    for marker in ("site-packages/", "dist-packages/", "/lib/python3"):
        if marker in filename:
            tail = filename.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python3" and "/" in tail else tail
    parts = filename.split("/licensectl/", 1)
    return "licensectl/" + parts[1] if len(parts) == 2 else filename


def top_sites(stats: Iterable[tuple[str, int, int]], limit: int) -> tuple[Site, ...]:
    """The `limit` biggest of (where, size, count), biggest first, where ties keep their order."""
    ranked = sorted(stats, key=lambda s: -s[1])
    return tuple(Site(w, size, count) for w, size, count in ranked[:limit])


def report(snapshot: tracemalloc.Snapshot, *, traced: int, peak: int, limit: int = 30) -> MemoryReport:
    """Group a snapshot by line and by file (without the tracer's own allocations)."""
    snap = snapshot.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    lines: Sequence[tracemalloc.Statistic] = snap.statistics("lineno")
    files: Sequence[tracemalloc.Statistic] = snap.statistics("filename")

    def where(st: tracemalloc.Statistic, *, line: bool) -> str:
        frame = st.traceback[0]
        return f"{short_path(frame.filename)}:{frame.lineno}" if line else short_path(frame.filename)

    return MemoryReport(traced=traced, peak=peak,
                        by_line=top_sites(((where(s, line=True), s.size, s.count) for s in lines), limit),
                        by_file=top_sites(((where(s, line=False), s.size, s.count) for s in files), limit))


def current_report(limit: int = 30) -> MemoryReport | None:
    """The report now, or None when the tracer is off (run it in a worker thread: a snapshot of a large
    heap takes seconds)."""
    if not tracemalloc.is_tracing():
        return None
    traced, peak = tracemalloc.get_traced_memory()
    return report(tracemalloc.take_snapshot(), traced=traced, peak=peak, limit=limit)
