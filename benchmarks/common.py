"""Shared benchmark machinery: /proc sampling, the fleet, the controller subprocess, tables.

The pure helpers (parsing, fleet shapes, ratios, table layout) are unit-tested; the rest is the
imperative shell that talks to processes and the apiserver. Numbers are measured, never asserted:
a benchmark reports, it does not pass or fail on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
from kubernetes_asyncio import config as kconfig
from kubernetes_asyncio.client import ApiClient, Configuration

from licensectl.kube.watch import CACHE_PROBE_SELECTOR
from licensectl_dev.devcluster import fleet
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.metrics_text import Scrape, delta
from licensectl_dev.testkit.world import SOURCE_NAME, World, build_world

REPO_ROOT = Path(__file__).resolve().parent.parent
CONTROLLER_WRITE_CONCURRENCY = 32  # ReplicationController(concurrency=32) in licensectl/controllers/replication_loop.py
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ControllerBuild:
    """Which licensectl the benchmark's controller processes run: this tree (`tree` None), or the
    package of another git revision (`--controller-from REV`), so a before/after comparison runs on
    the same fleet, floors and benchmark code, with only the controller's code differing."""

    label: str = "this tree"
    tree: Path | None = None
    tracemalloc: bool = False  # `--tracemalloc`: PYTHONTRACEMALLOC=1, /debug/memory read at the peak
    profile: bool = False  # `--profile`: py-spy samples the cold start and the rotation (benchmarks/profile.py)


THIS_TREE = ControllerBuild()


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

    Names follow Cozystack (docs/design.md#tenants): a child `x` of the root is `tenant-x`, a child `y` of
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


def machine_rows(apiserver_version: str, etcd_version: str, build: ControllerBuild = THIS_TREE) -> list[list[str]]:
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
        ["controller build", build.label],
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


# ---------------------------------------------------------------------------------------------
# The hoster's fleet (both cluster benchmarks)
# ---------------------------------------------------------------------------------------------
CONTROLLER_NS = "licensectl-system"
SOURCE_NS = "hoster-licenses"
CLASS = "vws"
ROOT = "tenant-root"
SEED_CONCURRENCY = 64
GRIDD_CONF = "# hoster\nFeatureType=1\n"


async def seed_fleet(api: ApiClient, token: bytes, namespaces: int, max_depth: int) -> tuple[World, dict[str, float]]:
    """The hoster's objects, then `namespaces` tenants (parents first) with one GPUClaim each.

    Returns the world (its `tenants` in tree order) and the seconds spent on tenants and claims.
    """
    w = await build_world(api, world_type=World, controller_ns=CONTROLLER_NS, source_ns=SOURCE_NS, root_name=ROOT,
                          cls=CLASS, token=token, gridd_conf=GRIDD_CONF)
    objs: dict[str, dict[str, Any]] = {ROOT: w.root}
    tree = tenant_tree(namespaces, max_depth, ROOT)
    times: dict[str, float] = {}
    t0 = time.monotonic()
    for depth in range(1, max_depth + 1):
        def make(name: str, parent: str) -> Callable[[], Awaitable[None]]:
            async def job() -> None:
                objs[name] = await fleet.create_tenant(api, name, parent=objs[parent], vgpu=True)
            return job

        await run_bounded(f"seed tenants depth {depth}", [make(t.name, t.parent) for t in tree if t.depth == depth],
                          SEED_CONCURRENCY)
    times["tenants"] = time.monotonic() - t0
    w.tenants = [t.name for t in tree]

    def claim(ns: str) -> Callable[[], Awaitable[None]]:
        return lambda: fleet.create_claim(api, ns, "gpu", class_name=CLASS)

    times["claims"] = await run_bounded("seed claims", [claim(ns) for ns in w.tenants], SEED_CONCURRENCY)
    return w, times


def fake_tokens(count: int) -> list[bytes]:
    """The source's first token and those of the rotations after it: the n-th valid n * 90 days from now."""
    now = int(time.time())
    return [fleet.fake_token(now + 86400 * 90 * n, extra={"rotation": n}) for n in range(1, count + 1)]


async def rotate_source(api: ApiClient, token: bytes) -> None:
    """The hoster replaces the source Secret's token (a new revision)."""
    await fleet.put_source_secret(api, SOURCE_NS, SOURCE_NAME, token=token, gridd_conf=GRIDD_CONF)


# ---------------------------------------------------------------------------------------------
# The controller as its own process
# ---------------------------------------------------------------------------------------------
class BenchController(ControllerProcess):
    """The controller at log level warning with its RSS sampled, CPU time and scrape cost measured.

    Its log goes to a scratch directory that `close()` removes.
    """

    def __init__(self, kubeconfig: str | os.PathLike[str], *, args: Sequence[str] = (),
                 build: ControllerBuild = THIS_TREE) -> None:
        self._logs = tempfile.TemporaryDirectory(prefix="licensectl-bench-controller-")
        super().__init__(os.fspath(kubeconfig), CONTROLLER_NS, log_dir=Path(self._logs.name), name="controller",
                         settings={"log_level": "warning"}, args=args, reports_port=0, tree=build.tree,
                         extra_env={"PYTHONTRACEMALLOC": "1"} if build.tracemalloc else None)
        self.peak_rss = 0  # max VmRSS seen by the sampler
        self.phase = "start"  # set by the benchmark: the sampler keeps a peak per phase
        self.phase_peaks: dict[str, int] = {}  # phase -> max VmRSS sampled in it, in the order entered
        self._sampler: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await super().start()
        self._sampler = asyncio.create_task(self._sample_rss())

    async def _sample_rss(self) -> None:
        while self.alive() and self.pid is not None:
            rss = proc_memory(self.pid).get("VmRSS", 0)
            self.peak_rss = max(self.peak_rss, rss)
            self.phase_peaks[self.phase] = max(self.phase_peaks.get(self.phase, 0), rss)
            await asyncio.sleep(0.2)

    def memory(self) -> dict[str, int]:
        return proc_memory(self.pid) if self.pid is not None else {}

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.pid) if self.pid is not None else 0.0

    async def scrape(self) -> Scrape | None:
        """One /metrics scrape, or None while the listener is not up yet; raises once the process exited."""
        if not self.alive():
            raise RuntimeError(f"controller exited with {self.returncode}:\n{self.log_tail()}")
        return await super().scrape()

    async def memory_report(self) -> str:
        """The controller's /debug/memory (allocation sites; needs `ControllerBuild.tracemalloc`)."""
        url = self.metrics_url.rsplit("/metrics", 1)[0] + "/debug/memory"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s, s.get(url) as r:
            return f"HTTP {r.status}\n{await r.text()}" if r.status != 200 else await r.text()

    async def scrape_cost(self) -> tuple[float, int, int]:
        """(seconds, bytes, series) of one /metrics scrape: what a Prometheus scrape costs the controller."""
        t = time.monotonic()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s, s.get(self.metrics_url) as r:
            body = await r.read()
        seconds = time.monotonic() - t
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        return seconds, len(body), series

    async def stop(self, grace: float = 40.0) -> int | None:
        """SIGTERM (graceful stop), then SIGKILL after `grace` seconds; returns the exit code."""
        code = await super().stop(grace)
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        return code

    async def close(self) -> None:
        await super().close()
        self._logs.cleanup()


LOOP_LAG = "licensectl_event_loop_lag_seconds"


GC_PAUSE = "licensectl_gc_pause_seconds"


@dataclass(frozen=True, slots=True)
class HistogramDelta:
    """What one histogram (one label set) observed between two scrapes."""
    count: int
    total: float
    buckets: tuple[tuple[float, int], ...]  # (upper bound, cumulative count), ascending

    def over(self, bound: float) -> int:
        """Observations above `bound` (counted from the first bucket bound at or above it)."""
        return self.count - next((n for b, n in self.buckets if b >= bound), self.count)

    def worst(self) -> float:
        """The bucket bound the largest observation fell under (inf: above every bound)."""
        return next((b for b, n in self.buckets if n >= self.count), float("inf"))


def histogram_between(before: Scrape, after: Scrape, name: str, **labels: str) -> HistogramDelta:
    buckets = sorted((float("inf") if dict(ls)["le"] == "+Inf" else float(dict(ls)["le"]),
                      int(v - before.value(n, **labels, le=dict(ls)["le"])))
                     for (n, ls), v in after.samples.items()
                     if n == f"{name}_bucket" and set(labels.items()) <= ls)
    return HistogramDelta(count=int(after.value(f"{name}_count", **labels) - before.value(f"{name}_count", **labels)),
                          total=after.value(f"{name}_sum", **labels) - before.value(f"{name}_sum", **labels),
                          buckets=tuple(buckets))


def gc_pauses_between(before: Scrape, after: Scrape, over: float = 0.05) -> str:
    """The controller's full (generation 2) garbage collections between two scrapes: how many, their total,
    how many took longer than `over` and the bucket of the longest. A collection holds the GIL, so it
    stops the event loop wherever it was triggered. "n/a" for a controller without the timer."""
    if not after.has(f"{GC_PAUSE}_count"):
        return "n/a (no GC timer in this controller)"
    h = histogram_between(before, after, GC_PAUSE, generation="2")
    if h.count <= 0:
        return "none"
    worst = h.worst()
    worst_text = "> 2.5 s" if worst == float("inf") else f"≤ {worst:g} s"
    return (f"{h.count} full collections, {h.total:.2f} s in all, {h.over(over)} longer than "
            f"{over * 1000:.0f} ms, worst {worst_text}")


def loop_lag_between(before: Scrape, after: Scrape, over: float = 0.1) -> str:
    """What the controller's loop-lag probe saw between two scrapes (its histogram's deltas): samples,
    how many were later than `over` seconds, and the bucket the worst one fell in. "n/a" for a controller
    without the probe (an older revision)."""
    if not after.has(f"{LOOP_LAG}_count"):
        return "n/a (no loop-lag probe in this controller)"
    h = histogram_between(before, after, LOOP_LAG)
    if h.count <= 0:
        return "no samples"
    worst = h.worst()
    worst_text = "> 10 s" if worst == float("inf") else f"≤ {worst:g} s"
    return f"{h.count} samples, {h.over(over)} later than {over * 1000:.0f} ms, worst {worst_text}"


class BenchRun:
    """What one benchmark run starts, ended when the run ends however it ends, in this order: the
    controller process of the moment (its log tail first goes to stderr if the run failed: that tail
    usually says why), whatever else was registered with `on_exit` (newest first), the API clients.

    The controller is stopped before the simulator and proxies it talks through go away.
    """

    def __init__(self) -> None:
        self.controller: BenchController | None = None
        self._on_exit: list[Callable[[], Awaitable[Any]]] = []
        self._clients: list[ApiClient] = []

    async def client(self, kubeconfig: str | os.PathLike[str], pool: int) -> ApiClient:
        """`make_client`, closed when the run ends."""
        api = await make_client(kubeconfig, pool)
        self._clients.append(api)
        return api

    def hold(self, ctl: BenchController) -> BenchController:
        """`ctl` is the run's controller from now on (a controller replaced earlier was closed by its caller)."""
        self.controller = ctl
        return ctl

    def on_exit(self, stop: Callable[[], Awaitable[Any]]) -> None:
        self._on_exit.append(stop)

    async def __aenter__(self) -> BenchRun:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        ctl = self.controller
        if ctl is not None:
            if exc_type is not None and ctl.log_tail():
                progress("controller log tail:\n" + ctl.log_tail())
            await ctl.close()
        for stop in reversed(self._on_exit):
            await stop()
        for api in self._clients:
            with contextlib.suppress(Exception):
                await api.close()


# ---------------------------------------------------------------------------------------------
# Recovery from an apiserver outage
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Recovery:
    outage: float            # apiserver process stopped -> started again
    restart: float           # started -> /readyz answers (the apiserver's own recovery)
    unhealthy_seen: bool     # the controller reported an unhealthy cache during the outage
    to_ready: float | None   # /readyz -> every informer synced and healthy, and licensectl_ready 1
    to_leader: float | None  # /readyz -> the controller holds its Lease again
    to_served: float | None = None  # /readyz -> the apiserver answers a LIST of every watched kind (its part)
    per_informer: tuple[InformerRecovery, ...] = ()
    # CPU seconds from /readyz until the controller was ready, per process (the apiserver's own start,
    # before /readyz, not included): who did the work the recovery waited for.
    cpu: Mapping[str, float] = field(default_factory=dict)
    scrapes: int = 0  # /metrics scrapes the probe made from /readyz until done (each costs the controller)

    def synced_after(self, resources: Callable[[str], bool]) -> float | None:
        """/readyz -> the last of the caches `resources` picks synced again (None: one was not seen synced)."""
        picked = [r.synced_after for r in self.per_informer if resources(r.resource)]
        return None if not picked or None in picked else max(t for t in picked if t is not None)

    def cpu_text(self) -> str:
        return ", ".join(f"{k} {v:.1f} s" for k, v in self.cpu.items()) or "n/a"


@dataclass(frozen=True, slots=True)
class InformerRecovery:
    """One cache around the outage: when it was synced and healthy again, and the LISTs it made."""
    resource: str
    synced_after: float | None  # /readyz -> licensectl_informer_synced 1 again (None: not seen)
    lists: int                  # complete LISTs that succeeded during the outage and the recovery
    list_seconds: float         # their time (licensectl_informer_list_duration_seconds)
    failed_lists: int           # LISTs that failed (the apiserver down, or 429 while its cache filled)
    watch_restarts: dict[str, int]  # by reason (gone: relist needed; error: rewatch from the last RV)

    def describe(self) -> str:
        when = "not synced" if self.synced_after is None else f"synced {self.synced_after:.2f} s"
        lists = f"{self.lists} LIST(s) {self.list_seconds:.2f} s" if self.lists else "no relist"
        restarts = ", ".join(f"{k} {v}" for k, v in sorted(self.watch_restarts.items()) if v) or "none"
        return f"{self.resource}: {when}, {lists}, {self.failed_lists} failed, watch restarts {restarts}"


LIST_SECONDS = "licensectl_informer_list_duration_seconds"


def informer_recoveries(before: Scrape, after: Scrape, synced_at: Mapping[str, float]) -> tuple[InformerRecovery, ...]:
    """Per cache, from the scrapes before the outage and after the recovery: when it was synced again
    (`synced_at`, seconds after /readyz, from the polls) and the LISTs and watch restarts in between."""
    resources = sorted({dict(ls)["resource"] for (n, ls) in after.samples if n == "licensectl_informer_synced"})
    out = []
    for r in resources:
        kind = r.split(":")[0]  # sources are "source:<ns>/<name>"; the counters are labelled "source"
        restarts = {dict(ls).get("reason", ""): int(v - before.value(n, **dict(ls)))
                    for (n, ls), v in after.samples.items()
                    if n == "licensectl_watch_restarts_total" and dict(ls).get("resource") == kind}
        out.append(InformerRecovery(
            resource=r, synced_after=synced_at.get(r),
            lists=int(delta(after, before, f"{LIST_SECONDS}_count", resource=kind, result="ok")),
            list_seconds=delta(after, before, f"{LIST_SECONDS}_sum", resource=kind, result="ok"),
            failed_lists=int(delta(after, before, f"{LIST_SECONDS}_count", resource=kind, result="error")),
            watch_restarts={k: v for k, v in restarts.items() if v}))
    return tuple(out)


# One LIST (limit 1) per kind the controller watches, with the controller's watch-cache probe selector:
# a restarted apiserver answers a *selected* LIST 429 "storage is initializing" until its watch cache of
# that kind is filled, so the last of them is when its part ends. (An unselected LIST with a limit is
# read from etcd meanwhile and answers 200 at once: docs/design.md#watch-cache-probe.)
WATCHED_LISTS: tuple[str, ...] = (
    "/api/v1/namespaces", "/api/v1/secrets", "/apis/kubevirt.io/v1/virtualmachines",
    "/apis/kubevirt.io/v1/virtualmachineinstances")


async def lists_served(api: ApiClient, *, within: float = 300.0, every: float = 0.1) -> float | None:
    """Seconds from now until every `WATCHED_LISTS` path answered 200 at least once (None: not within)."""
    start = time.monotonic()
    pending = set(WATCHED_LISTS)
    while pending and time.monotonic() - start < within:
        for path in sorted(pending):
            with contextlib.suppress(Exception):
                # Preloaded: any status outside 2xx (the 429 while the cache fills) raises ApiException.
                await api.call_api(path, "GET", query_params=[("limit", 1), ("labelSelector", CACHE_PROBE_SELECTOR)],
                                   auth_settings=["BearerToken"],
                                   response_types_map={}, _preload_content=True, _request_timeout=5)
                pending.discard(path)
        if pending:
            await asyncio.sleep(every)
    return None if pending else time.monotonic() - start


RECOVERY_PROCESSES = ("kube-apiserver", "etcd", "kube-controller-manager")


async def restart_cpu_without_controller(cp: Any, window: float) -> dict[str, float]:
    """The same apiserver restart with no controller running: CPU per control-plane process over
    `window` seconds from /readyz. Subtracted from the recovery's CPU it leaves the work the
    controller's relists caused, apart from what a restart costs the apiserver anyway."""
    proc = cp._procs["kube-apiserver"]
    await asyncio.to_thread(proc.stop)
    await asyncio.to_thread(proc.start)
    await asyncio.to_thread(cp._wait_apiserver_ready)
    procs = {k: v for k, v in cp.pids.items() if k in RECOVERY_PROCESSES}
    before = cpu_seconds(procs)
    await asyncio.sleep(window)
    return {k: v - before.get(k, 0.0) for k, v in cpu_seconds(procs).items()}


RECOVERY_POLL_SECONDS = 0.5
RECOVERY_POLL_SHARE = 4.0  # sleep four times the last scrape's time: the probe holds the controller ≤ 1/5


def informers_recovered(s: Scrape) -> bool:
    """Every watched resource synced and healthy (licensectl_informer_synced 1), and ready."""
    synced = [v for (name, _), v in s.samples.items() if name == "licensectl_informer_synced"]
    return bool(synced) and min(synced) == 1.0 and s.value("licensectl_ready") == 1.0


async def apiserver_outage(cp: Any, ctl: BenchController, outage_seconds: float, *, within: float = 300.0,
                           api: ApiClient | None = None) -> Recovery:
    """Stop kube-apiserver for `outage_seconds` (longer than the informers' unhealthy grace, so the
    old backoff had reached its ceiling), start it on the same port and storage, and time from
    /readyz answering to the controller being ready with every cache resynced."""
    proc = cp._procs["kube-apiserver"]  # the same stop/start ControlPlane.restart_apiserver does
    before = await ctl.must_scrape()
    await asyncio.to_thread(proc.stop)
    t_down = time.monotonic()
    unhealthy = False
    while time.monotonic() - t_down < outage_seconds:
        s = await ctl.scrape()
        unhealthy = unhealthy or (s is not None and not informers_recovered(s))
        await asyncio.sleep(0.5)
    t_start = time.monotonic()
    await asyncio.to_thread(proc.start)
    await asyncio.to_thread(cp._wait_apiserver_ready)
    healed = time.monotonic()
    procs = {"controller": ctl.pid or 0, **{k: v for k, v in cp.pids.items() if k in RECOVERY_PROCESSES}}
    cpu0 = cpu_seconds(procs)
    cpu_ready: dict[str, float] = {}
    # The apiserver's part, polled beside the controller's (a LIST of one object costs it little).
    served = asyncio.create_task(lists_served(api, within=within)) if api is not None else None
    to_ready: float | None = None
    to_leader: float | None = None
    synced_at: dict[str, float] = {}
    last = before
    scrapes = 0
    while time.monotonic() - healed < within and (to_ready is None or to_leader is None):
        asked = time.monotonic()
        s = await ctl.scrape()
        took = time.monotonic() - asked
        scrapes += 1
        if s is not None:
            last = s
            for (name, labels), v in s.samples.items():
                if name == "licensectl_informer_synced" and v == 1.0:
                    synced_at.setdefault(dict(labels)["resource"], s.at - healed)
            if to_ready is None and informers_recovered(s):
                to_ready = s.at - healed
                cpu_ready = {k: v - cpu0.get(k, 0.0) for k, v in cpu_seconds(procs).items()}
            if to_leader is None and s.value("licensectl_leader") == 1.0:
                to_leader = s.at - healed
        # A scrape costs the controller CPU (at xl a third of a second): poll it at most a fifth of the
        # time, or the probe itself slows the recovery it times (a Prometheus scrapes every 15-30 s).
        await asyncio.sleep(max(RECOVERY_POLL_SECONDS, RECOVERY_POLL_SHARE * took))
    return Recovery(outage=t_start - t_down, restart=healed - t_start, unhealthy_seen=unhealthy,
                    to_ready=to_ready, to_leader=to_leader, to_served=await served if served else None,
                    per_informer=informer_recoveries(before, last, synced_at), cpu=cpu_ready, scrapes=scrapes)
