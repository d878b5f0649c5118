"""Shared benchmark machinery: metric parsing, /proc sampling, the controller subprocess, tables.

The pure helpers (parsing, fleet shapes, ratios, table layout) are unit-tested; the rest is the
imperative shell that talks to processes and the apiserver. Numbers are measured, never asserted:
a benchmark reports, it does not pass or fail on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
from kubernetes_asyncio import config as kconfig
from kubernetes_asyncio.client import ApiClient, Configuration
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parent.parent
CONTROLLER_WRITE_CONCURRENCY = 32  # ReplicationController(concurrency=32) in licensectl/controller.py
MIB = 1024 * 1024


# ---------------------------------------------------------------------------------------------
# Prometheus text
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricSnapshot:
    """One scrape of /metrics: every sample as (name, labels) -> value, plus when it was taken."""

    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float]
    at: float = 0.0  # time.monotonic() of the scrape

    def value(self, name: str, **labels: str) -> float:
        """Sum of every sample named `name` whose labels include `labels` (0 when none)."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def has(self, name: str, **labels: str) -> bool:
        want = set(labels.items())
        return any(n == name and want <= ls for (n, ls) in self.samples)

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Values of `name` summed per value of one label (e.g. api requests per verb)."""
        out: dict[str, float] = {}
        for (n, ls), v in self.samples.items():
            if n != name:
                continue
            key = dict(ls).get(label, "")
            out[key] = out.get(key, 0.0) + v
        return out


def parse_metrics(text: str, at: float = 0.0) -> MetricSnapshot:
    """Parse the Prometheus text exposition format (counters keep their `_total` sample name)."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return MetricSnapshot(samples, at)


def delta(after: MetricSnapshot, before: MetricSnapshot, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def delta_by_label(after: MetricSnapshot, before: MetricSnapshot, name: str, label: str) -> dict[str, float]:
    a, b = after.by_label(name, label), before.by_label(name, label)
    return {k: a.get(k, 0.0) - b.get(k, 0.0) for k in sorted(set(a) | set(b)) if a.get(k, 0.0) != b.get(k, 0.0)}


# ---------------------------------------------------------------------------------------------
# /proc
# ---------------------------------------------------------------------------------------------
def parse_proc_status(text: str) -> dict[str, int]:
    """Memory fields of /proc/<pid>/status in bytes (VmRSS, VmHWM, ...)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if sep and len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * 1024
    return out


def parse_proc_stat_cpu(text: str, clock_ticks: int) -> float:
    """utime + stime of /proc/<pid>/stat in seconds.

    The command name (field 2) may contain spaces and parentheses, so fields are counted after
    the last ')': utime and stime are fields 14 and 15 of proc(5), i.e. 12th and 13th after it.
    """
    rest = text[text.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / clock_ticks


def clock_ticks() -> int:
    return int(os.sysconf("SC_CLK_TCK"))


def proc_memory(pid: int) -> dict[str, int]:
    try:
        return parse_proc_status(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return {}


def proc_cpu_seconds(pid: int) -> float:
    try:
        return parse_proc_stat_cpu(Path(f"/proc/{pid}/stat").read_text(), clock_ticks())
    except (OSError, ValueError, IndexError):
        return 0.0


def cpu_seconds(pids: Mapping[str, int]) -> dict[str, float]:
    return {name: proc_cpu_seconds(pid) for name, pid in pids.items()}


def self_cpu_seconds() -> float:
    """CPU time of this (benchmark) process: seeding client, simulator, proxy, polling."""
    return time.process_time()


# ---------------------------------------------------------------------------------------------
# Fleet shape (pure)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    parent: str
    depth: int  # 1 = child of the root tenant


def level_sizes(count: int, max_depth: int) -> list[int]:
    """Tenants per depth: weights 1:2:...:max_depth (deeper levels are wider), summing to `count`."""
    if count < 0 or max_depth < 1:
        raise ValueError("count must be >= 0 and max_depth >= 1")
    weights = list(range(1, max_depth + 1))
    total = sum(weights)
    sizes = [count * w // total for w in weights]
    sizes[-1] += count - sum(sizes)
    # Every level needs a parent level: never leave a level empty before a non-empty one.
    for i in range(max_depth - 1):
        if sizes[i] == 0 and sum(sizes[i + 1:]) > 0:
            sizes[i] += 1
            j = max(k for k in range(i + 1, max_depth) if sizes[k] > 0)
            sizes[j] -= 1
    return sizes


def tenant_tree(count: int, max_depth: int, root: str = "tenant-root") -> list[TenantSpec]:
    """`count` Cozystack tenants under `root`, depth 1..max_depth, parents listed before children.

    Names follow Cozystack (domain.md §1): a child `x` of the root is `tenant-x`, a child `y` of
    `tenant-x` is `tenant-x-y`. Parents of one level are used round-robin by the next.
    """
    out: list[TenantSpec] = []
    previous = [root]
    letters = "abcdefghijklmnopqrstuvwxyz"
    for depth, size in enumerate(level_sizes(count, max_depth), start=1):
        level: list[str] = []
        for i in range(size):
            parent = previous[i % len(previous)]
            local = f"{letters[depth - 1]}{i}"
            name = f"tenant-{local}" if parent == root else f"{parent}-{local}"
            out.append(TenantSpec(name, parent, depth))
            level.append(name)
        if level:
            previous = level
    return out


def spread(items: int, buckets: int) -> list[int]:
    """How many of `items` go to each of `buckets`, as even as possible (first buckets get extra)."""
    if buckets <= 0:
        raise ValueError("buckets must be positive")
    base, extra = divmod(items, buckets)
    return [base + (1 if i < extra else 0) for i in range(buckets)]


# ---------------------------------------------------------------------------------------------
# Formatting (pure)
# ---------------------------------------------------------------------------------------------
def ratio(num: float, den: float) -> float | None:
    return None if den <= 0 else num / den


def fmt_ratio(r: float | None, unit: str = "x") -> str:
    return "n/a" if r is None else f"{r:.2f}{unit}"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.2f} s"
    return f"{s:.0f} s ({s / 60:.1f} min)"


def fmt_mib(b: float | None) -> str:
    return "n/a" if b is None else f"{b / MIB:.1f} MiB"


def fmt_num(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "n/a"
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.{digits}f}"


def fmt_counts(counts: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {fmt_num(v)}" for k, v in sorted(counts.items())) or "none"


def format_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A plain-text table with a title line; cells are left-aligned, columns sized to fit."""
    body = [list(map(str, r)) for r in rows]
    for r in body:
        if len(r) != len(headers):
            raise ValueError(f"row has {len(r)} cells, expected {len(headers)}: {r!r}")
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([title, line(headers), sep, *(line(r) for r in body)])


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine_rows(apiserver_version: str, etcd_version: str) -> list[list[str]]:
    from licensectl import __version__

    mem = proc_meminfo_total()
    return [
        ["cores", str(os.cpu_count())],
        ["cpu", cpu_model()],
        ["memory", fmt_mib(mem) if mem else "n/a"],
        ["python", f"{platform.python_implementation()} {platform.python_version()}"],
        ["kube-apiserver", apiserver_version],
        ["etcd", etcd_version],
        ["licensectl", __version__],
        ["kernel", platform.release()],
        ["load average (1/5/15 min) at the end", " / ".join(f"{x:.2f}" for x in os.getloadavg())],
    ]


def proc_meminfo_total() -> int:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def progress(msg: str) -> None:
    """Progress lines go to stderr so stdout holds only the result tables."""
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stderr.flush()


async def make_client(kubeconfig: str | os.PathLike[str], pool: int) -> ApiClient:
    """A bare kubernetes-asyncio ApiClient with `pool` connections (the default is cores * 5)."""
    cfg = Configuration()
    await kconfig.load_kube_config(config_file=os.fspath(kubeconfig), client_configuration=cfg,
                                   persist_config=False)
    cfg.connection_pool_maxsize = pool
    return ApiClient(configuration=cfg)


async def run_bounded(label: str, jobs: Sequence[Callable[[], Awaitable[Any]]], concurrency: int,
                      *, report_every: float = 10.0) -> float:
    """Run every job with at most `concurrency` in flight; print progress; return elapsed seconds."""
    total = len(jobs)
    done = 0
    start = time.monotonic()
    last = start
    it = iter(jobs)

    async def worker() -> None:
        nonlocal done, last
        for job in it:
            await job()
            done += 1
            now = time.monotonic()
            if now - last >= report_every:
                last = now
                progress(f"{label}: {done:,}/{total:,} ({done / (now - start):,.0f}/s)")

    await asyncio.gather(*(worker() for _ in range(min(concurrency, total) or 1)))
    elapsed = time.monotonic() - start
    progress(f"{label}: {total:,} in {elapsed:.1f}s ({total / elapsed if elapsed else 0:,.0f}/s)")
    return elapsed


async def wait_for(check: Callable[[], Awaitable[bool]], *, within: float, interval: float = 0.25,
                   what: str = "condition") -> float:
    """Poll until `check()` holds; return the monotonic time it was first seen true."""
    deadline = time.monotonic() + within
    while True:
        if await check():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


# ---------------------------------------------------------------------------------------------
# The controller as its own process
# ---------------------------------------------------------------------------------------------
def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """PR_SET_PDEATHSIG(SIGTERM): a crashed benchmark never leaves a controller behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


@dataclass
class ControllerProcess:
    """`python -m licensectl run ...` with its own RSS and CPU, scraped over /metrics."""

    kubeconfig: str
    namespace: str
    metrics_port: int
    extra_args: Sequence[str] = ()
    proc: subprocess.Popen[bytes] | None = None
    peak_rss: int = 0  # max VmRSS seen by the sampler
    _log: IO[bytes] | None = None
    _log_path: Path | None = None
    _sampler: asyncio.Task[None] | None = None
    _session: aiohttp.ClientSession | None = None
    started_at: float = 0.0
    cmd: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> None:
        self.cmd = [sys.executable, "-m", "licensectl", "run", "--kubeconfig", self.kubeconfig,
                    "--namespace", self.namespace, "--metrics-address", f"127.0.0.1:{self.metrics_port}",
                    "--reports-address", "127.0.0.1:0", "--log-format", "json", "--log-level", "warning",
                    *self.extra_args]
        fd, path = tempfile.mkstemp(prefix="licensectl-bench-controller-", suffix=".log")
        self._log_path = Path(path)
        self._log = os.fdopen(fd, "wb")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        self.started_at = time.monotonic()
        self.proc = self._launch(env)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        self._sampler = asyncio.create_task(self._sample_rss())

    def _launch(self, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                preexec_fn=_die_with_parent)

    async def _sample_rss(self) -> None:
        while self.proc is not None and self.proc.poll() is None:
            self.peak_rss = max(self.peak_rss, proc_memory(self.proc.pid).get("VmRSS", 0))
            await asyncio.sleep(0.2)

    def memory(self) -> dict[str, int]:
        return proc_memory(self.pid)

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_lines(self) -> list[str]:
        if self._log_path is None or not self._log_path.exists():
            return []
        return self._log_path.read_text(errors="replace").splitlines()

    async def scrape(self) -> MetricSnapshot | None:
        """One /metrics scrape, or None while the listener is not up yet."""
        if not self.alive():
            raise RuntimeError(f"controller exited with {self.proc.returncode if self.proc else '?'}:\n"
                               f"{self.log_tail()}")
        assert self._session is not None
        try:
            async with self._session.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as r:
                if r.status != 200:
                    return None
                text = await r.text()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None
        return parse_metrics(text, time.monotonic())

    async def scrape_cost(self) -> tuple[float, int, int]:
        """(seconds, bytes, series) of one /metrics scrape: what a Prometheus scrape costs the controller."""
        assert self._session is not None
        t = time.monotonic()
        async with self._session.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as r:
            body = await r.read()
        seconds = time.monotonic() - t
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        return seconds, len(body), series

    async def must_scrape(self, within: float = 60.0) -> MetricSnapshot:
        deadline = time.monotonic() + within
        while True:
            snap = await self.scrape()
            if snap is not None:
                return snap
            if time.monotonic() > deadline:
                raise TimeoutError("controller /metrics did not answer")
            await asyncio.sleep(0.2)

    async def stop(self, grace: float = 40.0) -> int | None:
        """SIGTERM (graceful stop), then SIGKILL after `grace` seconds; returns the exit code."""
        code: int | None = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)
        if self.proc is not None:
            code = self.proc.returncode
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def cleanup_log(self) -> None:
        if self._log_path is not None:
            with contextlib.suppress(OSError):
                self._log_path.unlink()
