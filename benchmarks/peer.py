"""CPU against a rate-unlimited Go replicator (the Go peer), N=3,000 tenant namespaces, no VMs.

What would a hoster pay in CPU for licensectl over the smallest Go controller that copies one Secret
into every tenant? The same fleet (3,000 tenants, one GPUClaim each, one source Secret, no VMs and
no unrelated Secrets) is replicated twice on one apiserver, one replicator after the other: first the
licensectl controller (its own process, the replication benchmark's one-step settings), then the Go
peer (go/replicator-peer: client-go shared informers, a 32-worker queue, no client-side rate limit).
Each does a cold start (process start -> every copy in sync) and a rotation (the source's token
replaced -> every copy carries it); reported are each process's CPU seconds per phase from /proc,
the ratio licensectl / peer (goal ≤ 1.0x), wall times and peak RSS. Measured, never asserted.

The peer is a reference point, not a licensectl: it has no entitlement logic (it copies into every
namespace its selector picks), no revision store, no Events, no rollout and no metrics.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient, CoreV1Api

from benchmarks.common import (
    CONTROLLER_WRITE_CONCURRENCY,
    ROOT,
    SEED_CONCURRENCY,
    SOURCE_NS,
    THIS_TREE,
    BenchController,
    BenchRun,
    ControllerBuild,
    cpu_seconds,
    fake_tokens,
    fmt_mib,
    fmt_num,
    fmt_ratio,
    fmt_seconds,
    format_table,
    proc_cpu_seconds,
    proc_memory,
    progress,
    ratio,
    rotate_source,
    seed_fleet,
)
from benchmarks.profile import Profiler, closing
from benchmarks.replication import CONTROLLER_ARGS
from licensectl.kube.raw import RawApi
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.controlplane import ControlPlane
from licensectl_dev.devcluster.gotools import ensure_tool
from licensectl_dev.devcluster.kubeapi import install_crds
from licensectl_dev.testkit.metrics_text import Scrape, delta
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.process import ManagedProcess
from licensectl_dev.testkit.world import SOURCE_NAME

NAMESPACES = 3_000  # the comparison point, whatever --scale says
MAX_DEPTH = 4
TIMEOUT = 1800.0
POLL_SECONDS = 1.0  # as the replication benchmark: convergence read once a second on both sides
GOAL_CPU_RATIO = 1.0
PEER_TOOL = "replicator-peer"
PEER_COPY_NAME = "peer-license"  # not a licensectl replica name: both sets of copies coexist
PEER_LABEL = "peer-replica"      # the label main.go puts on its copies
PEER_WORKERS = CONTROLLER_WRITE_CONCURRENCY  # the controller's write concurrency: same writes in flight
CONTROL_PLANE = ("kube-apiserver", "etcd")
NOTE = ("the peer has no entitlement logic (it copies into every namespace its selector picks), no revision "
        "store, no Events, no rollout, no metrics")


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------
def namespace_selector(root: str = ROOT) -> str:
    """The tenants below `root`, not the root itself: the root has no claim, so licensectl writes it
    no replica, and both replicators then keep the same N copies."""
    return f"{fleet.TENANT_LABEL_PREFIX}{root},kubernetes.io/metadata.name!={root}"


def peer_argv(binary: Path | str, kubeconfig: Path | str, *, workers: int = PEER_WORKERS) -> list[str]:
    """The peer's command line: no client-side rate limit (QPS < 0), the benchmark's source and tenants."""
    return [str(binary), "-kubeconfig", str(kubeconfig), "-source", f"{SOURCE_NS}/{SOURCE_NAME}",
            "-namespace-selector", namespace_selector(), "-copy-name", PEER_COPY_NAME,
            "-workers", str(workers), "-qps", "-1"]


def count_in_sync(items: Iterable[Mapping[str, Any]], want: Mapping[str, str], name: str = PEER_COPY_NAME) -> int:
    """How many namespaces hold a copy `name` whose data (base64, as listed) equals `want`."""
    namespaces: set[str] = set()
    for s in items:
        meta = s.get("metadata") or {}
        if meta.get("name") == name and dict(s.get("data") or {}) == dict(want):
            namespaces.add(str(meta.get("namespace", "")))
    return len(namespaces)


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of one replicator: its process's CPU, the wall time, and the control plane's CPU."""

    cpu: float
    wall: float
    control_plane_cpu: float  # kube-apiserver + etcd over the same phase


@dataclass(frozen=True, slots=True)
class Side:
    """What one replicator cost: cold start, rotation, and its peak RSS (VmHWM)."""

    cold: Phase
    rotation: Phase
    peak_rss: int


def comparison_rows(lic: Side, peer: Side, n: int) -> list[list[str]]:
    """The table's rows: metric, licensectl, Go peer, licensectl / peer, goal, notes."""
    goal = f"≤ {GOAL_CPU_RATIO:.1f}x"

    def cpu_row(label: str, a: Phase, b: Phase, per: str) -> list[str]:
        return [label, fmt_seconds(a.cpu), fmt_seconds(b.cpu), fmt_ratio(ratio(a.cpu, b.cpu)), goal,
                f"per copy {a.cpu / n * 1000:.2f} ms vs {b.cpu / n * 1000:.2f} ms ({per})"]

    def row(label: str, a: float, b: float, fmt: Callable[[float], str], note: str) -> list[str]:
        return [label, fmt(a), fmt(b), fmt_ratio(ratio(a, b)), "", note]

    return [
        cpu_row("cold start: replicator CPU", lic.cold, peer.cold, "process start -> every copy in sync"),
        cpu_row("rotation: replicator CPU", lic.rotation, peer.rotation, "source PUT -> every copy updated"),
        row("cold start: wall", lic.cold.wall, peer.cold.wall, fmt_seconds,
            "process start -> every copy in sync, polled once a second"),
        row("rotation: wall", lic.rotation.wall, peer.rotation.wall, fmt_seconds,
            "source PUT -> every copy carries the new token"),
        row("cold start: kube-apiserver + etcd CPU", lic.cold.control_plane_cpu, peer.cold.control_plane_cpu,
            fmt_seconds, "the peer's also serves the benchmark's LIST of the copies once a second"),
        row("rotation: kube-apiserver + etcd CPU", lic.rotation.control_plane_cpu,
            peer.rotation.control_plane_cpu, fmt_seconds, "as above"),
        row("peak RSS (VmHWM)", float(lic.peak_rss), float(peer.peak_rss), fmt_mib, "of the replicator process"),
    ]


def _source_revision(s: Scrape) -> str:
    for (name, labels), v in s.samples.items():
        if name == "licensectl_source_revision_info" and v == 1.0:
            return dict(labels).get("revision", "")
    return ""


def _replicas(s: Scrape, state: str) -> float:
    return s.value("licensectl_replicas", state=state)


# ---------------------------------------------------------------------------------------------
# licensectl
# ---------------------------------------------------------------------------------------------
async def measure_licensectl(bench: BenchRun, cp: ControlPlane, api: ApiClient, n: int, token: bytes,
                             build: ControllerBuild, profiler: Profiler) -> tuple[Side, float]:
    """Cold start and rotation (to `token`) of the licensectl controller; (its costs, CPU at ready)."""
    cp_pids = {k: v for k, v in cp.pids.items() if k in CONTROL_PLANE}
    ctl = bench.hold(BenchController(cp.kubeconfig_path, args=list(CONTROLLER_ARGS), build=build))
    cp0 = sum(cpu_seconds(cp_pids).values())
    progress("licensectl: cold start")
    await ctl.start()
    profiler.begin(ctl.pid, "cold start")
    at_ready: list[float] = []
    last_print = [time.monotonic()]

    async def cold_done() -> bool:
        s = await ctl.scrape()
        if s is None:
            return False
        if not at_ready and s.value("licensectl_ready") == 1.0:
            at_ready.append(ctl.cpu_seconds())
        if time.monotonic() - last_print[0] > 10:
            last_print[0] = time.monotonic()
            progress(f"licensectl cold start: {fmt_num(_replicas(s, 'in_sync'))}/{n:,} in sync")
        return _replicas(s, "in_sync") == n and _replicas(s, "missing") == 0 and _replicas(s, "drifted") == 0

    await eventually(cold_done, timeout=TIMEOUT, interval=POLL_SECONDS, what="licensectl cold start")
    await profiler.end()
    cold = Phase(cpu=ctl.cpu_seconds(), wall=time.monotonic() - ctl.started_at,
                 control_plane_cpu=sum(cpu_seconds(cp_pids).values()) - cp0)
    progress(f"licensectl cold start: {fmt_seconds(cold.wall)}, CPU {fmt_seconds(cold.cpu)}")

    await asyncio.sleep(2.0)
    before = await ctl.must_scrape()
    rev_before = _source_revision(before)
    cpu0, cp1 = ctl.cpu_seconds(), sum(cpu_seconds(cp_pids).values())
    progress("licensectl rotation: replacing the source token")
    profiler.begin(ctl.pid, "rotation")
    t0 = time.monotonic()
    await rotate_source(api, token)

    async def rotated() -> bool:
        s = await ctl.scrape()
        if s is None:
            return False
        updated = delta(s, before, "licensectl_replica_writes_total", action="update", result="updated")
        if time.monotonic() - last_print[0] > 10:
            last_print[0] = time.monotonic()
            progress(f"licensectl rotation: {fmt_num(updated)}/{n:,} replicas updated")
        return updated >= n and _source_revision(s) not in ("", rev_before) and _replicas(s, "in_sync") == n

    await eventually(rotated, timeout=TIMEOUT, interval=POLL_SECONDS, what="licensectl rotation")
    await profiler.end()
    rotation = Phase(cpu=ctl.cpu_seconds() - cpu0, wall=time.monotonic() - t0,
                     control_plane_cpu=sum(cpu_seconds(cp_pids).values()) - cp1)
    progress(f"licensectl rotation: {fmt_seconds(rotation.wall)}, CPU {fmt_seconds(rotation.cpu)}")
    hwm = ctl.memory().get("VmHWM", 0)
    code = await ctl.stop()
    progress(f"licensectl stopped (exit code {code})")
    return Side(cold, rotation, hwm), (at_ready[0] if at_ready else 0.0)


# ---------------------------------------------------------------------------------------------
# The Go peer
# ---------------------------------------------------------------------------------------------
async def source_data(raw: Any) -> dict[str, str]:
    """The source Secret's data as the apiserver holds it (base64 values): what every copy must carry."""
    doc = await raw.read_namespaced_secret(SOURCE_NAME, SOURCE_NS)
    return dict(doc.get("data") or {})


async def copies_in_sync(raw: Any, want: Mapping[str, str]) -> int:
    listed = await raw.list_secret_for_all_namespaces(label_selector=f"{PEER_LABEL}=true")
    return count_in_sync(listed.get("items") or [], want)


async def measure_peer(bench: BenchRun, cp: ControlPlane, api: ApiClient, n: int, first: bytes, second: bytes,
                       binary: Path) -> Side:
    """Cold start from the `first` token, then the rotation to `second`, of the Go peer process."""
    raw: Any = RawApi(CoreV1Api(api))
    cp_pids = {k: v for k, v in cp.pids.items() if k in CONTROL_PLANE}
    # licensectl is stopped: the source goes back to the token its cold start began with.
    await rotate_source(api, first)
    want = await source_data(raw)
    logs = tempfile.TemporaryDirectory(prefix="licensectl-bench-peer-")
    proc = ManagedProcess(peer_argv(binary, cp.kubeconfig_path), log_path=Path(logs.name) / "peer.log",
                          name=PEER_TOOL)

    async def close() -> None:
        await proc.stop(grace=10.0)
        logs.cleanup()

    bench.on_exit(close)
    last_print = [time.monotonic()]

    def converged(phase: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            if not proc.alive():
                raise RuntimeError(f"the Go peer exited with {proc.returncode}:\n{proc.log_tail()}")
            done = await copies_in_sync(raw, want)
            if time.monotonic() - last_print[0] > 10:
                last_print[0] = time.monotonic()
                progress(f"peer {phase}: {done:,}/{n:,} copies in sync")
            return done >= n
        return check

    cp0 = sum(cpu_seconds(cp_pids).values())
    progress("peer: cold start")
    proc.start()
    pid = proc.pid or 0
    try:
        await eventually(converged("cold start"), timeout=TIMEOUT, interval=POLL_SECONDS, what="peer cold start")
        cold = Phase(cpu=proc_cpu_seconds(pid), wall=time.monotonic() - proc.started_at,
                     control_plane_cpu=sum(cpu_seconds(cp_pids).values()) - cp0)
        progress(f"peer cold start: {fmt_seconds(cold.wall)}, CPU {fmt_seconds(cold.cpu)}")

        await asyncio.sleep(2.0)
        cpu0, cp1 = proc_cpu_seconds(pid), sum(cpu_seconds(cp_pids).values())
        progress("peer rotation: replacing the source token")
        t0 = time.monotonic()
        await rotate_source(api, second)
        want = await source_data(raw)
        await eventually(converged("rotation"), timeout=TIMEOUT, interval=POLL_SECONDS, what="peer rotation")
        rotation = Phase(cpu=proc_cpu_seconds(pid) - cpu0, wall=time.monotonic() - t0,
                         control_plane_cpu=sum(cpu_seconds(cp_pids).values()) - cp1)
        progress(f"peer rotation: {fmt_seconds(rotation.wall)}, CPU {fmt_seconds(rotation.cpu)}")
        hwm = proc_memory(pid).get("VmHWM", 0)
    except BaseException:
        if proc.log_tail():
            progress("peer log tail:\n" + proc.log_tail())
        raise
    code = await proc.stop(grace=10.0)
    progress(f"peer stopped (exit code {code})")
    return Side(cold, rotation, hwm)


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------
async def run(cp: ControlPlane, scale_name: str, build: ControllerBuild = THIS_TREE) -> str:
    """`--scale` is ignored: the comparison is defined at N=3,000 tenants."""
    n = NAMESPACES
    first, second = fake_tokens(2)
    binary = await asyncio.to_thread(ensure_tool, PEER_TOOL, progress)
    profiler = Profiler(build.profile, f"{build.label}, N={n:,}")
    async with BenchRun() as bench:
        bench.on_exit(closing(profiler))
        api = await bench.client(cp.kubeconfig_path, SEED_CONCURRENCY + 8)
        await install_crds(api)
        progress(f"peer[{scale_name} ignored]: seeding {n:,} tenants with one claim each (no VMs, no unrelated "
                 "Secrets)")
        _, seed_times = await seed_fleet(api, first, n, MAX_DEPTH)
        lic, at_ready = await measure_licensectl(bench, cp, api, n, second, build, profiler)
        peer = await measure_peer(bench, cp, api, n, first, second, binary)
    rows = [
        ["fleet", f"{n:,} tenant ns (depth ≤ {MAX_DEPTH})", "", "", "",
         f"{n:,} claims, 1 source, no VMs, no unrelated Secrets; seeding "
         + ", ".join(f"{k} {v:.0f}s" for k, v in seed_times.items()) + " (not part of the result)"],
        ["replicator", build.label, f"{PEER_TOOL} (client-go)", "", "",
         f"licensectl {' '.join(CONTROLLER_ARGS)}; peer {PEER_WORKERS} workers, QPS unlimited"],
        *comparison_rows(lic, peer, n),
        ["licensectl CPU at ready", fmt_seconds(at_ready), "", "", "",
         "of its cold-start CPU: interpreter start, imports, initial LISTs"],
        ["note", "", "", "", "", NOTE],
    ]
    return format_table("Go peer benchmark: CPU against a rate-unlimited Go replicator (N=3,000, no VMs)",
                        ["metric", "licensectl", "Go peer", "licensectl / peer", "goal", "notes"],
                        rows) + profiler.tables()

