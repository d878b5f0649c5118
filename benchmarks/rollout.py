"""Rollout at scale: rotation -> rolling VMI restarts under maxUnavailable, on the KubeVirt simulator.

Fleet: tenant namespaces with one vgpu claim each and several VMs whose VMIs mount the license
replica. The simulator (virt-controller's VM loop + VMI boot) and the restart proxy (virt-api's
restart subresource) run inside this benchmark process; the controller runs as its own process
and reaches the cluster through the proxy, so its CPU time is its own.

Reported: time from the rotation write to the first restart the simulator accepted ("time to
plan"), the whole rollout's duration and throughput, controller CPU per restart, controller API
requests per restarted VMI, and whether maxUnavailable held. The simulator is one Python process
doing real API writes; the table says when it, not the controller, was the limiting factor.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from dataclasses import dataclass, field

from kubernetes_asyncio.client import ApiClient

from benchmarks.common import (
    CLASS,
    SEED_CONCURRENCY,
    BenchController,
    cpu_seconds,
    fmt_counts,
    fmt_num,
    fmt_seconds,
    format_table,
    make_client,
    progress,
    ratio,
    rotate_source,
    run_bounded,
    seed_fleet,
    self_cpu_seconds,
    spread,
)
from licensectl.devcluster import fleet
from licensectl.devcluster.controlplane import ControlPlane
from licensectl.devcluster.kubeapi import install_crds
from licensectl.devcluster.virt_api import RestartProxy
from licensectl.devcluster.virt_controller import KubevirtSimulator
from licensectl.devcluster.vm_semantics import firmware_uuid
from licensectl.model import ANN_RESTART_RESULT
from licensectl.render import replica_name
from licensectl.rollout import RESULT_DONE, RolloutSettings
from licensectl.testkit.metrics_text import Scrape, delta, delta_by_label
from licensectl.testkit.poll import eventually

MAX_UNAVAILABLE = "10%"
READY_DELAY = 0.05
SPARSE_SCRAPE_SECONDS = 5.0
SATURATED = 0.85  # a process using this share of one core for the whole rollout is the bottleneck


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


def vms_recorded_done(sim: KubevirtSimulator) -> int:
    """VMs whose restart the controller recorded as done (its result annotation on the VM)."""
    return sum(1 for vm in sim.vms.store.values()
               if ((vm.get("metadata") or {}).get("annotations") or {}).get(ANN_RESTART_RESULT) == RESULT_DONE)


def _vmis(s: Scrape, state: str) -> float:
    return s.value("licensectl_rollout_vmis", state=state)


async def run(cp: ControlPlane, scale_name: str) -> str:
    scale = SCALES[scale_name]
    v, nss = scale.vmis, scale.namespaces
    now = int(time.time())
    token1 = fleet.fake_token(now + 86400 * 90, extra={"rotation": 1})
    token2 = fleet.fake_token(now + 86400 * 180, extra={"rotation": 2})
    api = await make_client(cp.kubeconfig_path, SEED_CONCURRENCY + 8)
    sim_api = await make_client(cp.kubeconfig_path, 128)
    sim: KubevirtSimulator | None = None
    proxy: RestartProxy | None = None
    ctl: BenchController | None = None
    lag = LoopLag()
    try:
        await install_crds(api)
        progress(f"rollout[{scale_name}]: seeding {nss:,} tenants with claims")
        names = await seed(api, scale, token1)
        sim = KubevirtSimulator(sim_api, ready_delay=READY_DELAY)
        await sim.start()
        proxy = RestartProxy(sim, upstream=cp.server, ca_path=cp.ca_path, token=cp.admin_token)
        await proxy.start()
        ctl = BenchController(proxy.kubeconfig_path, args=["--settle-seconds", "0", "--max-unavailable",
                                                           MAX_UNAVAILABLE])
        await ctl.start()
        progress("waiting for the replicas")

        async def replicas_ready() -> bool:
            s = await ctl.scrape()
            return s is not None and s.value("licensectl_replicas", state="in_sync") == nss

        await eventually(replicas_ready, timeout=scale.timeout, interval=0.25, what="replicas in sync")
        t_vms = time.monotonic()
        await create_vms(api, names, v)
        last = [time.monotonic()]
        record = sim.record

        async def fleet_up() -> bool:
            s = await ctl.scrape()
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

        # -- the rotation -------------------------------------------------------------------
        cp_pids = {k: p for k, p in cp.pids.items() if k in ("kube-apiserver", "etcd")}
        before = await ctl.must_scrape()
        ctl_cpu0, self_cpu0, cp_cpu0 = ctl.cpu_seconds(), self_cpu_seconds(), cpu_seconds(cp_pids)
        n_records = len(record.restarts)
        lag.start()
        progress("rotation: replacing the source token")
        t_rot = time.monotonic()
        await rotate_source(api, token2)
        marks: dict[str, float] = {}
        last_scrape = [0.0]

        async def rolled_out() -> bool:
            # /metrics is scraped densely only until the replicas are rewritten: a scrape costs the
            # controller CPU that grows with the fleet, and would otherwise be billed to the rollout.
            # Completion is read from the simulator's own VM cache, which costs the controller nothing.
            now_ = time.monotonic()
            if "replicas" not in marks or now_ - last_scrape[0] >= SPARSE_SCRAPE_SECONDS:
                last_scrape[0] = now_
                s = await ctl.scrape()
                if s is not None and "replicas" not in marks and delta(
                        s, before, "licensectl_replica_writes_total", action="update", result="updated") >= nss:
                    marks["replicas"] = s.at
            done = vms_recorded_done(sim)
            if now_ - last[0] > 10:
                last[0] = now_
                progress(f"rollout: {done:,}/{v:,} restarts recorded done, "
                         f"{len(record.currently_unavailable())} VMs unavailable now")
            return done >= v

        await eventually(rolled_out, timeout=scale.timeout, interval=0.25, what="rollout complete")
        t_done = time.monotonic()
        ctl_cpu = ctl.cpu_seconds() - ctl_cpu0
        self_cpu = self_cpu_seconds() - self_cpu0
        cp_cpu1 = cpu_seconds(cp_pids)
        await lag.stop()

        async def gauges_agree() -> bool:
            s = await ctl.scrape()
            return s is not None and _vmis(s, "current") == v and _vmis(s, "stale") == 0 \
                and _vmis(s, "restarting") == 0

        await eventually(gauges_agree, timeout=60.0, interval=1.0, what="rollout gauges: all VMIs current")
        after = await ctl.must_scrape()
        cost = await ctl.scrape_cost()
        mem = ctl.memory()
        code = await ctl.stop()
        progress(f"rollout complete in {t_done - t_rot:.1f}s; controller stopped (exit code {code})")

        # -- report -------------------------------------------------------------------------
        accepted = [r for r in record.restarts[n_records:] if r.status == 202]
        rejected = [r for r in record.restarts[n_records:] if r.status != 202]
        t_first = min((r.at for r in accepted), default=None)
        wall = t_done - t_rot
        restart_wall = t_done - t_first if t_first is not None else None
        restarts = len(accepted)
        req = delta_by_label(after, before, "licensectl_api_requests_total", label="verb")
        req_total = sum(req.values())
        # The rotation also rewrites one replica per tenant (PUT): counted apart from the restarts.
        req_vmi = req_total - min(req.get("PUT", 0.0), float(nss))
        results = delta_by_label(after, before, "licensectl_restarts_total", label="result")
        passes = delta_by_label(after, before, "licensectl_reconcile_total", label="controller")
        limit = RolloutSettings(max_unavailable=MAX_UNAVAILABLE).unavailable_limit(v)
        max_down = record.max_concurrent_unavailable()
        shares = {"controller": ctl_cpu / wall, SIM: self_cpu / wall}
        shares |= {k: (cp_cpu1[k] - cp_cpu0[k]) / wall for k in cp_cpu0}
        verdict = bottleneck(shares, os.cpu_count() or 1, max_down, limit, lag.p95(), os.getloadavg()[0])
        rows = [
            ["fleet", f"{v:,} VMs/VMIs in {nss:,} tenant ns, 1 vgpu class", "",
             f"simulator ready_delay {READY_DELAY:g}s; VMs up in {boot_seconds:.0f}s (not part of the result)"],
            ["settings", f"maxUnavailable {MAX_UNAVAILABLE} (= {limit}), maxPerNamespace 1, settle 0s", "", ""],
            ["rotation -> all replicas rewritten", fmt_seconds(marks["replicas"] - t_rot if "replicas" in marks
                                                              else None), "", f"{nss:,} replicas"],
            ["time to plan (rotation write -> first restart accepted)",
             fmt_seconds(t_first - t_rot if t_first is not None else None), "goal ≤ 1 s after settle",
             "restart proxy's record; settle 0 s here"],
            ["rollout duration (rotation -> all VMIs current)", fmt_seconds(wall), "", ""],
            ["restart throughput", f"{fmt_num(ratio(restarts, restart_wall or 0))} restarts/s", "",
             f"{restarts:,} accepted restarts, {len(rejected)} rejected"],
            ["max concurrently unavailable", f"{max_down}", f"limit {limit}", "simulator's record"],
            ["controller CPU per restart", f"{ctl_cpu / max(restarts, 1) * 1000:.2f} ms",
             "", f"{ctl_cpu:.1f}s CPU over the rollout (incl. {nss:,} replica rewrites)"],
            ["API requests per restarted VMI", fmt_num(ratio(req_vmi, restarts)), "goal ≤ 3",
             f"without the {nss:,} replica PUTs; controller-side, all: {fmt_counts(req)}"],
            ["Event writes per restarted VMI", fmt_num(ratio(req.get("POST", 0.0), restarts)), "",
             "POSTs (Event creates; repeats are PATCHes of a count)"],
            ["reconcile passes during the rollout", fmt_counts(passes), "",
             f"per restart: {', '.join(f'{k} {x / max(restarts, 1):.2f}' for k, x in sorted(passes.items()))}"],
            ["restart results", fmt_counts(results), f"done {v:,}", "licensectl_restarts_total"],
            ["one /metrics scrape after the rollout", f"{fmt_seconds(cost[0])}, {cost[2]:,} series, "
                                                      f"{cost[1] / 1024:.0f} KiB", "",
             f"polled every {SPARSE_SCRAPE_SECONDS:g}s during the rollout (0.25s until replicas rewritten)"],
            ["controller RSS (VmHWM)", f"{mem.get('VmHWM', 0) / 1048576:.1f} MiB", "",
             f"max sampled VmRSS {ctl.peak_rss / 1048576:.1f} MiB"],
            ["CPU use during rollout (share of one core)",
             ", ".join(f"{k} {s:.0%}" for k, s in shares.items()), "", ""],
            ["benchmark-process event-loop lag", f"p95 {fmt_seconds(lag.p95())}, "
                                                 f"max {fmt_seconds(max(lag.samples, default=0.0))}", "",
             "simulator + proxy responsiveness"],
            ["bottleneck", verdict, "", ""],
            ["controller exit on SIGTERM", str(code), "0", ""],
        ]
        return format_table(f"Rollout benchmark ({scale_name})", ["metric", "measured", "baseline / goal", "notes"],
                            rows)
    except BaseException:
        if ctl is not None and ctl.log_tail():
            progress("controller log tail:\n" + ctl.log_tail())
        raise
    finally:
        await lag.stop()
        if ctl is not None:
            await ctl.close()
        if proxy is not None:
            await proxy.stop()
        if sim is not None:
            await sim.stop()
        for c in (api, sim_api):
            with contextlib.suppress(Exception):
                await c.close()
