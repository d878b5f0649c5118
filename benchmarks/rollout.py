"""Rollout at scale: rotation -> rolling VMI restarts under maxUnavailable, on the KubeVirt simulator.

Fleet: tenant namespaces with one vgpu claim each and several VMs whose VMIs mount the license
replica. The simulator (virt-controller's VM loop + VMI boot) and the restart proxy (virt-api's
restart subresource) run inside this benchmark process; the controller runs as its own process
and reaches the cluster through the proxy, so its CPU time is its own.

Two rotations on the same fleet, each by its own controller process with the same limits:

1. the one-step rollout (``--canary 0 --rollout-steps 100%``, every namespace at once), the
   measurement of earlier rounds, kept explicit so its figures stay comparable with them;
2. a safe rotation with the shipped defaults (canary, then growing steps; docs/design.md#safe-rotation).
   No guest reports here, so every wave is judged on readiness alone.

Reported: time from the rotation write to the first restart the simulator accepted ("time to
plan"), the whole rollout's duration and throughput, controller CPU per restart, controller API
requests per restarted VMI, whether maxUnavailable held, restarts per VM, and the writes of the
revision store; the safe rotation as ratios to the one-step one. The simulator is one Python
process doing real API writes; the table says when it, not the controller, was the limiting factor.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes_asyncio.client import ApiClient, CoreV1Api

from benchmarks.common import (
    CLASS,
    CONTROLLER_NS,
    SEED_CONCURRENCY,
    SOURCE_NS,
    THIS_TREE,
    BenchController,
    BenchRun,
    ControllerBuild,
    cpu_seconds,
    fake_tokens,
    fmt_counts,
    fmt_num,
    fmt_ratio,
    fmt_seconds,
    format_table,
    progress,
    ratio,
    rotate_source,
    run_bounded,
    seed_fleet,
    self_cpu_seconds,
    spread,
)
from licensectl.config import Settings
from licensectl.core.model import (
    ANN_RESTART_RESULT,
    ANN_RESTART_REVISION,
    ANN_REVISION,
    ANN_REVISION_TIME,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
)
from licensectl.core.render import replica_name
from licensectl.core.rollout import MIN_SETTLE_SECONDS, RESULT_DONE, RolloutSettings
from licensectl.core.timecodec import annotation_time
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.controlplane import ControlPlane
from licensectl_dev.devcluster.kubeapi import install_crds
from licensectl_dev.devcluster.ledger import Interval, RestartRecord
from licensectl_dev.devcluster.virt_api import RestartProxy
from licensectl_dev.devcluster.virt_controller import KubevirtSimulator
from licensectl_dev.devcluster.vm_semantics import firmware_uuid
from licensectl_dev.testkit.controller import settings_args
from licensectl_dev.testkit.metrics_text import Scrape, delta_by_label
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.world import SOURCE_NAME

MAX_UNAVAILABLE = "10%"
READY_DELAY = 0.05
SPARSE_SCRAPE_SECONDS = 5.0
SATURATED = 0.85  # a process using this share of one core for the whole rollout is the bottleneck

# The rollout of earlier rounds: no canary, every namespace in one step.
ONE_STEP: Mapping[str, str] = {"canary": "0", "rollout_steps": "100%"}
# The shipped defaults, read from Settings so the benchmark follows them.
SAFE: Mapping[str, str] = {"canary": Settings().canary, "rollout_steps": Settings().rollout_steps}
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH"})
WAVE_REASONS = ("RotationStarted", "RotationStepStarted", "RotationPromoted")

Key = tuple[str, str]


@dataclass(frozen=True)
class RolloutScale:
    vmis: int
    namespaces: int
    timeout: float


SCALES = {
    "small": RolloutScale(vmis=200, namespaces=50, timeout=900.0),
    "full": RolloutScale(vmis=2_000, namespaces=500, timeout=3600.0),
    "xl": RolloutScale(vmis=50_000, namespaces=20_000, timeout=6 * 3600.0),  # opt-in, not in CI
}


@dataclass
class LoopLag:
    """How late this process's event loop wakes up: the simulator's and proxy's health signal."""

    samples: list[float] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.1)
            self.samples.append(max(0.0, time.monotonic() - t - 0.1))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def p95(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        return statistics.quantiles(self.samples, n=20)[-1]


SIM = "benchmark process (simulator + proxy)"


def bottleneck(shares: dict[str, float], cores: int, max_down: int, limit: int, lag_p95: float,
               host_load: float = 0.0) -> str:
    """A one-line reading of where the rollout's time went, from CPU shares of one core.

    `host_load` is the 1-minute load average: above the core count, processes also waited for a
    CPU (other work on the host), so low CPU shares no longer mean "idle".
    """
    parts: list[str] = []
    if shares.get(SIM, 0.0) >= SATURATED:
        parts.append("the simulator/proxy process saturated one core: it, not the controller, bounds throughput")
    elif shares.get("controller", 0.0) >= SATURATED:
        parts.append("the controller saturated one core: it bounds throughput")
    elif sum(shares.values()) >= SATURATED * cores:
        parts.append("the machine is CPU-bound (all cores busy)")
    else:
        busiest = max(shares, key=lambda k: shares[k])
        parts.append(f"no benchmarked process saturated a core (busiest {busiest} {shares[busiest]:.0%}): "
                     "the rollout is latency-bound")
    if max_down < limit:
        parts.append(f"maxUnavailable never reached ({max_down} of {limit})")
    if lag_p95 > 0.1:
        parts.append(f"simulator/proxy event loop lagged (p95 {lag_p95 * 1000:.0f} ms), adding latency to "
                     "every proxied request")
    if host_load > cores:
        parts.append(f"host oversubscribed (load {host_load:.1f} on {cores} cores): part of the latency is "
                     "waiting for a CPU")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# Pure readings of the simulator's record, the VM cache and the proxy's traffic
# ---------------------------------------------------------------------------------------------


def _key(vm: Mapping[str, Any]) -> Key:
    md = vm.get("metadata") or {}
    return str(md.get("namespace", "")), str(md.get("name", ""))


def restart_revisions(vms: Iterable[Mapping[str, Any]]) -> dict[Key, str]:
    """Each VM's restart-revision annotation ("" before its first restart): what the next rotation replaces."""
    return {_key(vm): ((vm.get("metadata") or {}).get("annotations") or {}).get(ANN_RESTART_REVISION, "")
            for vm in vms}


def vms_rolled(vms: Iterable[Mapping[str, Any]], before: Mapping[Key, str]) -> int:
    """VMs whose restart the controller recorded as done (its result annotation) for a revision other
    than the one they had in `before`: on a fleet rotated before, an old "done" does not count."""
    n = 0
    for vm in vms:
        ann = (vm.get("metadata") or {}).get("annotations") or {}
        rev = ann.get(ANN_RESTART_REVISION, "")
        if ann.get(ANN_RESTART_RESULT) == RESULT_DONE and rev and rev != before.get(_key(vm), ""):
            n += 1
    return n


def restarts_per_vm(restarts: Iterable[RestartRecord]) -> Counter[Key]:
    """Restarts the proxy accepted (202), per VM."""
    return Counter((r.namespace, r.vm) for r in restarts if r.status == 202)


def exactly_once(per_vm: Mapping[Key, int], vms: int) -> str:
    """"1.00 (200 of 200 VMs exactly once)": restarts per VM and how many VMs got exactly one."""
    once = sum(1 for c in per_vm.values() if c == 1)
    per = ratio(sum(per_vm.values()), vms)
    return f"{'n/a' if per is None else f'{per:.2f}'} ({once:,} of {vms:,} VMs exactly once)"


def peak_unavailable(intervals: Iterable[Interval], since: float) -> int:
    """The most VMs unavailable at the same moment among intervals that began at or after `since`."""
    points: list[tuple[float, int]] = []
    for iv in intervals:
        if iv.start >= since:
            points.append((iv.start, 1))
            points.append((iv.end if iv.end is not None else float("inf"), -1))
    best = cur = 0
    for _, d in sorted(points):  # ends (-1) sort before starts (+1) at a tie
        cur += d
        best = max(best, cur)
    return best


def is_store_write(method: str, path: str, namespace: str = CONTROLLER_NS) -> bool:
    """A write to a Secret in the controller's namespace: the revision store (docs/design.md#safe-rotation);
    the serving-TLS Secret is written there too, but only at start, outside a measured rotation."""
    prefix = f"/api/v1/namespaces/{namespace}/secrets"
    return method in WRITE_VERBS and (path == prefix or path.startswith(prefix + "/"))


def first_new_revision_time(before: Mapping[Key, str], after: Mapping[Key, tuple[str, dt.datetime | None]]
                            ) -> dt.datetime | None:
    """The earliest revision time among replicas whose revision changed: when the settle period of
    the rollout's first restarts began (each replica's restarts settle from its own revision time)."""
    times = [t for key, (rev, t) in after.items() if t is not None and rev != before.get(key)]
    return min(times, default=None)


def after_settle(*, t_first: float | None, t_rot_wall: dt.datetime, first_revision: dt.datetime | None,
                 settle: float) -> float | None:
    """Seconds from the end of the settle period (first new revision time + settle) to the first
    restart accepted, `t_first` being seconds after the rotation write at `t_rot_wall`."""
    if t_first is None or first_revision is None:
        return None
    return t_first - ((first_revision - t_rot_wall).total_seconds() + settle)


def wave_label(reason: str, message: str) -> str:
    if reason == "RotationStepStarted":
        # "<wave> passed (...); step 2 of 3: ..." -> "step 2" (the step that starts, after the last ";")
        for part in reversed(message.split(";")):
            words = part.split()
            if "step" in words and words.index("step") + 1 < len(words):
                return f"step {words[words.index('step') + 1]}"
        return "step"
    return {"RotationStarted": "started", "RotationPromoted": "promoted"}.get(reason, reason)


def wave_offsets(events: Iterable[tuple[dt.datetime, str, str]], since: dt.datetime) -> str:
    """`(firstTimestamp, reason, message)` of the rotation's Events -> "started +0s, step 1 +12s, ...",
    seconds after `since` (Event timestamps have one-second resolution)."""
    floor = since.replace(microsecond=0)
    picked = sorted((ts, reason, msg) for ts, reason, msg in events if reason in WAVE_REASONS and ts >= floor)
    return ", ".join(f"{wave_label(r, m)} +{max(0.0, (ts - since).total_seconds()):.0f}s"
                     for ts, r, m in picked) or "none"


# ---------------------------------------------------------------------------------------------
# The shell
# ---------------------------------------------------------------------------------------------


class CountingProxy(RestartProxy):
    """The restart proxy, also counting the controller's writes to Secrets in its own namespace."""

    def __init__(self, simulator: KubevirtSimulator, *, upstream: str, ca_path: str, token: str) -> None:
        super().__init__(simulator, upstream=upstream, ca_path=ca_path, token=token)
        self.store_writes: Counter[str] = Counter()

    async def upstream_url(self, request: web.Request) -> str:
        if is_store_write(request.method, request.path):
            self.store_writes[request.method] += 1
        return await super().upstream_url(request)


def controller_args(rotation: Mapping[str, str]) -> list[str]:
    return settings_args(settle_seconds=0, max_unavailable=MAX_UNAVAILABLE, **rotation)


def _vmis(s: Scrape, state: str) -> float:
    return s.value("licensectl_rollout_vmis", state=state)


@dataclass(frozen=True)
class Phase:
    """One rotation of the running fleet, as measured."""

    wall: float  # rotation write -> every VM's restart recorded done
    t_first: float | None  # rotation write -> first restart accepted
    t_after_settle: float | None  # end of the first replicas' settle period -> first restart accepted
    t_replicas: float | None  # rotation write -> every replica rewritten (one-step only)
    accepted: int
    rejected: int
    per_vm: Counter[Key]
    req: dict[str, float]
    codes: dict[str, float]
    results: dict[str, float]
    passes: dict[str, float]
    ctl_cpu: float
    scrape_cpu: float  # of ctl_cpu: spent while answering the benchmark's /metrics polls (an upper bound)
    shares: dict[str, float]
    max_down: int
    lag: list[float]
    store_writes: dict[str, int]
    waves: str
    cost: tuple[float, int, int]
    mem: dict[str, int]
    peak_rss: int
    code: int | None

    @property
    def restart_wall(self) -> float | None:
        return None if self.t_first is None else self.wall - self.t_first

    def lag_p95(self) -> float:
        return statistics.quantiles(self.lag, n=20)[-1] if len(self.lag) >= 2 else 0.0


async def _replica_revisions(api: ApiClient) -> dict[Key, tuple[str, dt.datetime | None]]:
    """Every replica's revision and revision time: one list call, served from the apiserver's watch
    cache (cheap; a moment behind etcd at most)."""
    res = await CoreV1Api(api).list_secret_for_all_namespaces(
        label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}", resource_version="0")
    out: dict[Key, tuple[str, dt.datetime | None]] = {}
    for sec in res.items:
        ann = sec.metadata.annotations or {}
        out[(sec.metadata.namespace, sec.metadata.name)] = (ann.get(ANN_REVISION, ""),
                                                            annotation_time(ann, ANN_REVISION_TIME))
    return out


async def _source_events(api: ApiClient) -> list[tuple[dt.datetime, str, str]]:
    res = await CoreV1Api(api).list_namespaced_event(SOURCE_NS, field_selector=f"involvedObject.name={SOURCE_NAME}")
    return [(e.first_timestamp, e.reason or "", e.message or "") for e in res.items if e.first_timestamp is not None]


async def rotate_and_measure(*, cp: ControlPlane, api: ApiClient, sim: KubevirtSimulator, proxy: CountingProxy,
                             ctl: BenchController, token: bytes, vms: int, namespaces: int, within: float,
                             label: str) -> Phase:
    """Replace the source token, wait until every VM's restart is recorded done for the new revision,
    then read the controller's counters and stop it. Completion is read from the simulator's own VM
    cache, which costs the controller nothing. /metrics is scraped every few seconds in both rotations
    (a scrape costs the controller CPU that grows with the fleet, billed to the rollout alike). In the
    one-step rollout the replicas are read from the apiserver's cache every poll until all are rewritten,
    to time that mark: not from /metrics, whose scrape (a second of the controller's loop at 2,000 VMIs)
    four times a second would hold up the very restarts the time to plan measures."""
    record = sim.record
    dense = label == "one-step"
    cp_pids = {k: p for k, p in cp.pids.items() if k in ("kube-apiserver", "etcd")}
    before = await ctl.must_scrape()
    revisions = restart_revisions(sim.vms.store.values())
    ctl_cpu0, self_cpu0, cp_cpu0 = ctl.cpu_seconds(), self_cpu_seconds(), cpu_seconds(cp_pids)
    n_records = len(record.restarts)
    writes0 = Counter(proxy.store_writes)
    revisions_before = {k: rev for k, (rev, _) in (await _replica_revisions(api)).items()}
    lag = LoopLag()
    lag.start()
    try:
        progress(f"{label} rotation: replacing the source token")
        t_rot, wall_rot = time.monotonic(), dt.datetime.now(dt.UTC)
        await rotate_source(api, token)
        marks: dict[str, float] = {}
        last = [time.monotonic(), 0.0]  # last progress line, last scrape
        scrape_cpu = [0.0]  # controller CPU during this benchmark's own /metrics scrapes

        async def rolled_out() -> bool:
            now_ = time.monotonic()
            if dense and "replicas" not in marks:
                now_revs = await _replica_revisions(api)
                if sum(1 for k, (rev, _) in now_revs.items() if rev != revisions_before.get(k)) >= namespaces:
                    marks["replicas"] = time.monotonic()
            if now_ - last[1] >= SPARSE_SCRAPE_SECONDS:
                last[1] = now_
                c0 = ctl.cpu_seconds()
                await ctl.scrape()
                scrape_cpu[0] += ctl.cpu_seconds() - c0
            done = vms_rolled(sim.vms.store.values(), revisions)
            if now_ - last[0] > 10:
                last[0] = now_
                progress(f"{label}: {done:,}/{vms:,} restarts recorded done, "
                         f"{len(record.currently_unavailable())} VMs unavailable now")
            return done >= vms

        await eventually(rolled_out, timeout=within, interval=0.25, what=f"{label} rollout complete")
        t_done = time.monotonic()
        ctl_cpu = ctl.cpu_seconds() - ctl_cpu0
        self_cpu = self_cpu_seconds() - self_cpu0
        cp_cpu1 = cpu_seconds(cp_pids)
    finally:
        await lag.stop()

    async def settled() -> bool:
        s = await ctl.scrape()
        return s is not None and _vmis(s, "current") == vms and _vmis(s, "stale") == 0 \
            and _vmis(s, "restarting") == 0 and s.value("licensectl_rotation_phase", phase="promoted") == 1

    await eventually(settled, timeout=120.0, interval=1.0, what=f"{label}: all VMIs current, rotation promoted")
    after = await ctl.must_scrape()
    writes = Counter(proxy.store_writes)
    writes.subtract(writes0)
    cost = await ctl.scrape_cost()
    mem = ctl.memory()
    code = await ctl.stop()
    wall = t_done - t_rot
    progress(f"{label} rotation complete in {wall:.1f}s; controller stopped (exit code {code})")
    restarts = record.restarts[n_records:]
    accepted = [r for r in restarts if r.status == 202]
    t_first = min(r.at for r in accepted) - t_rot if accepted else None
    first_revision = first_new_revision_time(revisions_before, await _replica_revisions(api))
    shares = {"controller": ctl_cpu / wall, SIM: self_cpu / wall}
    shares |= {k: (cp_cpu1[k] - cp_cpu0[k]) / wall for k in cp_cpu0}
    return Phase(
        wall=wall,
        t_first=t_first,
        t_after_settle=after_settle(t_first=t_first, t_rot_wall=wall_rot, first_revision=first_revision,
                                    settle=MIN_SETTLE_SECONDS),
        t_replicas=marks["replicas"] - t_rot if "replicas" in marks else None,
        accepted=len(accepted), rejected=len(restarts) - len(accepted), per_vm=restarts_per_vm(restarts),
        req=delta_by_label(after, before, "licensectl_api_requests_total", label="verb"),
        codes=delta_by_label(after, before, "licensectl_api_requests_total", label="code"),
        results=delta_by_label(after, before, "licensectl_restarts_total", label="result"),
        passes=delta_by_label(after, before, "licensectl_reconcile_total", label="controller"),
        ctl_cpu=ctl_cpu, scrape_cpu=scrape_cpu[0], shares=shares, max_down=peak_unavailable(record.unavailable, t_rot),
        lag=list(lag.samples), store_writes={k: n for k, n in writes.items() if n},
        waves=wave_offsets(await _source_events(api), wall_rot), cost=cost, mem=mem, peak_rss=ctl.peak_rss,
        code=code)


async def seed(api: ApiClient, scale: RolloutScale, token: bytes) -> list[str]:
    w, _ = await seed_fleet(api, token, scale.namespaces, 2)
    return w.tenants


async def create_vms(api: ApiClient, namespaces: list[str], total: int) -> None:
    jobs = []
    for ns, count in zip(namespaces, spread(total, len(namespaces)), strict=True):
        for i in range(count):
            name = f"vm{i}"
            # A preset firmware UUID spares the simulator one VM patch per VM (vm/firmware.go).
            jobs.append(lambda ns=ns, name=name: fleet.create_vm(
                api, ns, name, license_secret=replica_name(CLASS), firmware_uuid=firmware_uuid(name)))
    await run_bounded("create VMs", jobs, SEED_CONCURRENCY)


async def wait_steady(ctl: BenchController, *, namespaces: int, vms: int, within: float) -> None:
    """A freshly started controller has synced, sees every replica in sync and every VMI current."""
    async def steady() -> bool:
        s = await ctl.scrape()
        return s is not None and s.value("licensectl_replicas", state="in_sync") == namespaces \
            and _vmis(s, "current") == vms

    await eventually(steady, timeout=within, interval=0.5, what="controller steady on the fleet")


def _steps(settings: Mapping[str, str]) -> str:
    return f"canary {settings['canary']}, steps {settings['rollout_steps']}"


def phase_rows(p: Phase, *, vms: int, namespaces: int, limit: int) -> list[list[str]]:
    """The rows of the one-step rollout: the measurement of earlier rounds, unchanged."""
    restarts = p.accepted
    req_total = sum(p.req.values())
    # The rotation also rewrites one replica per tenant (PUT): counted apart from the restarts.
    req_vmi = req_total - min(p.req.get("PUT", 0.0), float(namespaces))
    verdict = bottleneck(p.shares, os.cpu_count() or 1, p.max_down, limit, p.lag_p95(), os.getloadavg()[0])
    return [
        ["rotation -> all replicas rewritten", fmt_seconds(p.t_replicas), "", f"{namespaces:,} replicas"],
        ["time to plan (rotation write -> first restart accepted)", fmt_seconds(p.t_first),
         "", f"restart proxy's record; settle 0 s here, i.e. the minimum {MIN_SETTLE_SECONDS:g} s"],
        ["first restart after the settle period", fmt_seconds(p.t_after_settle), "goal ≤ 1 s",
         "from the first rewritten replica's revision time (whole seconds) + settle"],
        ["rollout duration (rotation -> all VMIs current)", fmt_seconds(p.wall), "", ""],
        ["restart throughput", f"{fmt_num(ratio(restarts, p.restart_wall or 0))} restarts/s", "",
         f"{restarts:,} accepted restarts, {p.rejected} rejected"],
        ["max concurrently unavailable", f"{p.max_down}", f"limit {limit}", "simulator's record"],
        ["controller CPU per restart", f"{p.ctl_cpu / max(restarts, 1) * 1000:.2f} ms",
         "", f"{p.ctl_cpu:.1f}s CPU over the rollout (incl. {namespaces:,} replica rewrites)"],
        ["  of which answering this benchmark's /metrics polls", f"{p.scrape_cpu / max(restarts, 1) * 1000:.2f} ms",
         "", f"{p.scrape_cpu:.1f}s: controller CPU while a poll was in flight (an upper bound: the "
             "rollout goes on meanwhile)"],
        ["API requests per restarted VMI", fmt_num(ratio(req_vmi, restarts)), "goal ≤ 3",
         f"without the {namespaces:,} replica PUTs; controller-side, all: {fmt_counts(p.req)}; "
         f"by code: {fmt_counts(p.codes)}"],
        ["Event writes per restarted VMI", fmt_num(ratio(p.req.get("POST", 0.0), restarts)), "",
         "POSTs (Event creates; repeats are PATCHes of a count)"],
        ["reconcile passes during the rollout", fmt_counts(p.passes), "",
         f"per restart: {', '.join(f'{k} {x / max(restarts, 1):.2f}' for k, x in sorted(p.passes.items()))}"],
        ["restart results", fmt_counts(p.results), f"done {vms:,}", "licensectl_restarts_total"],
        ["restarts per VM", exactly_once(p.per_vm, vms), "1.00", "restart proxy's record (accepted)"],
        ["revision store writes", fmt_counts(p.store_writes), "", "PUT/POST/PATCH to Secrets in "
                                                                   f"{CONTROLLER_NS}, counted at the proxy"],
        ["one /metrics scrape after the rollout", f"{fmt_seconds(p.cost[0])}, {p.cost[2]:,} series, "
                                                  f"{p.cost[1] / 1024:.0f} KiB", "",
         f"polled every {SPARSE_SCRAPE_SECONDS:g}s during the rollout"],
        ["controller RSS (VmHWM)", f"{p.mem.get('VmHWM', 0) / 1048576:.1f} MiB", "",
         f"max sampled VmRSS {p.peak_rss / 1048576:.1f} MiB"],
        ["CPU use during rollout (share of one core)", ", ".join(f"{k} {s:.0%}" for k, s in p.shares.items()), "",
         ""],
        ["benchmark-process event-loop lag", f"p95 {fmt_seconds(p.lag_p95())}, "
                                             f"max {fmt_seconds(max(p.lag, default=0.0))}", "",
         "simulator + proxy responsiveness"],
        ["bottleneck", verdict, "", ""],
        ["controller exit on SIGTERM", str(p.code), "0", ""],
    ]


def safe_rows(safe: Phase, one: Phase, *, vms: int, namespaces: int, limit: int) -> list[list[str]]:
    """The safe rotation against the one-step rollout of the same run: ratios, never a verdict on time."""
    def per_restart_requests(p: Phase) -> float | None:
        return ratio(sum(p.req.values()) - min(p.req.get("PUT", 0.0), float(namespaces)), p.accepted)

    req_safe, req_one = per_restart_requests(safe), per_restart_requests(one)
    cpu_safe, cpu_one = ratio(safe.ctl_cpu, safe.accepted), ratio(one.ctl_cpu, one.accepted)
    verdict = bottleneck(safe.shares, os.cpu_count() or 1, safe.max_down, limit, safe.lag_p95(),
                         os.getloadavg()[0])
    return [
        ["safe rotation: time to first restart (canary)", fmt_seconds(safe.t_first),
         f"one-step: {fmt_seconds(one.t_first)}", f"after the settle period: {fmt_seconds(safe.t_after_settle)}"],
        ["safe rotation: time to full rollout", fmt_seconds(safe.wall), f"one-step: {fmt_seconds(one.wall)}",
         f"{fmt_ratio(ratio(safe.wall, one.wall))}; waves (Event times, 1 s resolution): {safe.waves}"],
        ["safe rotation: restarts per VM", exactly_once(safe.per_vm, vms),
         f"one-step: {exactly_once(one.per_vm, vms)}", f"must be 1.00; {safe.rejected} rejected"],
        ["safe rotation: max concurrently unavailable", f"{safe.max_down}", f"limit {limit}", "simulator's record"],
        ["safe rotation: revision store writes", fmt_counts(safe.store_writes),
         f"one-step: {fmt_counts(one.store_writes)}", f"PUT/POST/PATCH to Secrets in {CONTROLLER_NS}: one per "
                                                      "decision, counted at the proxy"],
        ["safe rotation: API requests per restarted VMI", fmt_num(req_safe),
         f"one-step: {fmt_num(req_one)}", f"{fmt_ratio(ratio(req_safe or 0, req_one or 0))}; all: "
                                          f"{fmt_counts(safe.req)}"],
        ["safe rotation: controller CPU per restart", f"{(cpu_safe or 0) * 1000:.2f} ms",
         f"one-step: {(cpu_one or 0) * 1000:.2f} ms", fmt_ratio(ratio(cpu_safe or 0, cpu_one or 0))],
        ["safe rotation: restart results", fmt_counts(safe.results), f"done {vms:,}", "licensectl_restarts_total"],
        ["safe rotation: bottleneck", verdict, "", ""],
        ["safe rotation: controller exit on SIGTERM", str(safe.code), "0", ""],
    ]


async def run(cp: ControlPlane, scale_name: str, build: ControllerBuild = THIS_TREE) -> str:
    scale = SCALES[scale_name]
    v, nss = scale.vmis, scale.namespaces
    tokens = fake_tokens(3)
    async with BenchRun() as bench:
        api = await bench.client(cp.kubeconfig_path, SEED_CONCURRENCY + 8)
        sim_api = await bench.client(cp.kubeconfig_path, 128)
        await install_crds(api)
        progress(f"rollout[{scale_name}]: seeding {nss:,} tenants with claims")
        names = await seed(api, scale, tokens[0])
        sim = KubevirtSimulator(sim_api, ready_delay=READY_DELAY)
        bench.on_exit(sim.stop)
        await sim.start()
        proxy = CountingProxy(sim, upstream=cp.server, ca_path=str(cp.ca_path), token=cp.admin_token)
        bench.on_exit(proxy.stop)
        await proxy.start()
        first = bench.hold(BenchController(proxy.kubeconfig_path, args=controller_args(ONE_STEP), build=build))
        await first.start()
        progress("waiting for the replicas")

        async def replicas_ready() -> bool:
            s = await first.scrape()
            return s is not None and s.value("licensectl_replicas", state="in_sync") == nss

        await eventually(replicas_ready, timeout=scale.timeout, interval=0.25, what="replicas in sync")
        t_vms = time.monotonic()
        await create_vms(api, names, v)
        last = [time.monotonic()]
        record = sim.record

        async def fleet_up() -> bool:
            s = await first.scrape()
            ready = len({(e.namespace, e.name) for e in record.vmi_events if e.kind == "ready"})
            if time.monotonic() - last[0] > 10:
                last[0] = time.monotonic()
                progress(f"booting: {ready:,}/{v:,} VMIs ready (simulator), "
                         f"{fmt_num(_vmis(s, 'current') if s else 0)} current (controller)")
            return s is not None and ready >= v and _vmis(s, "current") == v

        await eventually(fleet_up, timeout=scale.timeout, interval=1.0, what="all VMIs running and current")
        boot_seconds = time.monotonic() - t_vms
        progress(f"fleet up: {v:,} VMIs ready in {boot_seconds:.0f}s")
        await asyncio.sleep(2.0)

        # -- 1. the one-step rollout (the measurement of earlier rounds) ----------------------
        one = await rotate_and_measure(cp=cp, api=api, sim=sim, proxy=proxy, ctl=first, token=tokens[1], vms=v,
                                       namespaces=nss, within=scale.timeout, label="one-step")
        await first.close()

        # -- 2. a safe rotation with the shipped defaults, same fleet and limits ---------------
        second = bench.hold(BenchController(proxy.kubeconfig_path, args=controller_args(SAFE), build=build))
        await second.start()
        progress("safe rotation: waiting for the second controller to be steady on the fleet")
        await wait_steady(second, namespaces=nss, vms=v, within=scale.timeout)
        await asyncio.sleep(2.0)
        safe = await rotate_and_measure(cp=cp, api=api, sim=sim, proxy=proxy, ctl=second, token=tokens[2], vms=v,
                                        namespaces=nss, within=scale.timeout, label="safe")

        limit = RolloutSettings(max_unavailable=MAX_UNAVAILABLE).unavailable_limit(v)
        rows = [
            ["fleet", f"{v:,} VMs/VMIs in {nss:,} tenant ns, 1 vgpu class", "",
             f"simulator ready_delay {READY_DELAY:g}s; VMs up in {boot_seconds:.0f}s (not part of the result)"],
            ["settings", f"maxUnavailable {MAX_UNAVAILABLE} (= {limit}), maxPerNamespace 1, settle 0s", "",
             "both rotations, each by its own controller process"],
            ["rotation 1: one-step rollout", _steps(ONE_STEP), "",
             "every namespace at once: the rollout of earlier rounds, comparable with their figures"],
            *phase_rows(one, vms=v, namespaces=nss, limit=limit),
            ["rotation 2: safe rotation", _steps(SAFE), "shipped defaults",
             "same fleet, a new token; no guest reports here, so every wave is judged on VMI readiness "
             "(restarted, Ready, done) alone"],
            *safe_rows(safe, one, vms=v, namespaces=nss, limit=limit),
        ]
        return format_table(f"Rollout benchmark ({scale_name})", ["metric", "measured", "baseline / goal", "notes"],
                            rows)
