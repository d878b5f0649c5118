"""Replication at scale: cold start, rotation vs a raw-write floor, steady-state cost, peak RSS.

Fleet: N Cozystack tenant namespaces (depth up to 4) under a vGPU-enabled root, one GPUClaim of a
vgpu class in each, M unrelated Secrets spread over them (which licensectl must never list or
hold in memory), and V running VMs with their VMIs mounting the replica (which it must cache: the
rollout and the backstop read them). The controller runs as its own process so its RSS and CPU are
its own.

The rotation time is reported as a ratio to a floor measured in the same run: after the
controller converged on the new revision it is stopped, and a bare kubernetes-asyncio client
replaces the same replica Secrets with new content at the controller's write concurrency.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from benchmarks.common import (
    CLASS,
    CONTROLLER_WRITE_CONCURRENCY,
    RECOVERY_POLL_SHARE,
    ROOT,
    SEED_CONCURRENCY,
    THIS_TREE,
    BenchController,
    BenchRun,
    ControllerBuild,
    apiserver_outage,
    cpu_seconds,
    fake_tokens,
    fmt_counts,
    fmt_mib,
    fmt_num,
    fmt_ratio,
    fmt_seconds,
    format_table,
    gc_pauses_between,
    loop_lag_between,
    make_client,
    progress,
    ratio,
    restart_cpu_without_controller,
    rotate_source,
    run_bounded,
    seed_fleet,
    tenant_tree,
)
from benchmarks.profile import Profiler, closing
from licensectl.core.model import ANN_CLASS, MANAGED_BY_LABEL, MANAGED_BY_VALUE
from licensectl.core.render import replica_name
from licensectl.core.timecodec import format_time
from licensectl.kube import api as kube_api
from licensectl.kube.api import MERGE_PATCH
from licensectl.kube.raw import RawApi
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.controlplane import ControlPlane
from licensectl_dev.devcluster.kubeapi import install_crds
from licensectl_dev.devcluster.vm_semantics import firmware_uuid, vmi_from_vm
from licensectl_dev.testkit.metrics_text import Scrape, delta, delta_by_label, parse_metrics
from licensectl_dev.testkit.poll import EventuallyTimeout, eventually

# How often convergence is read from the controller's /metrics. A scrape costs the controller CPU (at
# 20,000 VMIs one guest series each), so polling 4 times a second measured the benchmark as much as the
# controller; once a second still times the phases (tens of seconds) to a few percent. A Prometheus
# scrapes every 15-60 s.
POLL_SECONDS = 1.0
# A seeded VMI is judged silent 3 report intervals + the boot allowance (8 min by default) after its start.
GUEST_JUDGE_TIMEOUT = 900.0
GOAL_FLOOR_RATIO = 1.15
KUBEVIRT, KUBEVIRT_VERSION = "kubevirt.io", "v1"
# One-step rotation (every namespace at once), measured against the raw floors; the settle period
# outlasts the run, so the VMIs made stale by the rotation are planned but never restarted (the
# rollout benchmark measures restarts). The safe rotation's waves would gate replica writes on VMI
# restarts and make the rotation row measure those.
CONTROLLER_ARGS = ("--canary", "0", "--rollout-steps", "100%", "--settle-seconds", "86400")


@dataclass(frozen=True)
class ReplicationScale:
    namespaces: int
    max_depth: int
    unrelated_secrets: int
    resync_seconds: float
    steady_periods: int
    timeout: float
    vmis: int = 0  # running VMs, each with its VMI, spread over the tenants
    outage_seconds: float = 35.0  # > the informers' 30 s unhealthy grace: the old backoff was at its ceiling
    rss_goal_mib: int = 100  # peak RSS goal (issue goals: 256 MiB at xl)
    recovery_goal: float = 10.0  # /readyz -> ready, seconds (issue goals: 10 s at full, 30 s at xl)


SCALES = {
    "small": ReplicationScale(namespaces=500, max_depth=4, unrelated_secrets=5_000, resync_seconds=20.0,
                              steady_periods=2, timeout=600.0, vmis=2_000),
    "full": ReplicationScale(namespaces=5_000, max_depth=4, unrelated_secrets=50_000, resync_seconds=20.0,
                             steady_periods=2, timeout=3600.0, vmis=20_000),
    # Opt-in, not in CI: 20,000 tenants and 50,000 VMIs; what breaks first is reported.
    "xl": ReplicationScale(namespaces=20_000, max_depth=4, unrelated_secrets=50_000, resync_seconds=20.0,
                           steady_periods=2, timeout=4 * 3600.0, vmis=50_000, recovery_goal=30.0,
                           rss_goal_mib=256),
}


KUBEVIRT_CACHES = frozenset({"virtualmachines", "virtualmachineinstances"})


def is_kubevirt_cache(resource: str) -> bool:
    return resource in KUBEVIRT_CACHES


def is_core_cache(resource: str) -> bool:
    """The caches every replication decision needs (`Caches.core` and the sources)."""
    return resource.startswith("source:") or resource in {
        "namespaces", "gpuclasses", "gpuclaims", "replicas", "revisionstores"}


# ---------------------------------------------------------------------------------------------
# Seeding
# ---------------------------------------------------------------------------------------------
async def seed(api: ApiClient, scale: ReplicationScale, token: bytes) -> dict[str, float]:
    """Build the fleet; returns seconds per phase."""
    raw: Any = RawApi(CoreV1Api(api))
    w, times = await seed_fleet(api, token, scale.namespaces, scale.max_depth)
    names = w.tenants
    filler = base64.b64encode(b"x" * 256).decode()

    def secret(i: int) -> Any:
        ns = names[i % len(names)]
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": f"unrelated-{i}", "namespace": ns, "labels": {"app": "tenant-workload"}},
                "data": {"payload": filler}}
        return lambda: raw.create_namespaced_secret(ns, body)

    times["unrelated secrets"] = await run_bounded(
        "seed unrelated secrets", [secret(i) for i in range(scale.unrelated_secrets)], SEED_CONCURRENCY)
    if scale.vmis:
        times["VMs + VMIs"] = await run_bounded(
            "seed running VMs and their VMIs", [running_vm(api, names[i % len(names)], f"vm-{i}")
                                               for i in range(scale.vmis)], SEED_CONCURRENCY)
    return times


def running_vm(api: ApiClient, ns: str, name: str) -> Callable[[], Awaitable[None]]:
    """A VM and its running, Ready VMI as virt-controller and virt-handler leave them (the shapes of
    licensectl_dev/devcluster/virt_controller.py; the VMI is the simulator's own `vmi_from_vm`), mounting
    the replica; written directly, as nothing boots or restarts them here (no simulator: the
    controller's settle period outlasts the run)."""
    co: Any = CustomObjectsApi(api)

    async def job() -> None:
        body = fleet.vm_body(ns, name, license_secret=replica_name(CLASS), firmware_uuid=firmware_uuid(name))
        vm = await co.create_namespaced_custom_object(KUBEVIRT, KUBEVIRT_VERSION, ns, "virtualmachines", body)
        await co.patch_namespaced_custom_object_status(
            KUBEVIRT, KUBEVIRT_VERSION, ns, "virtualmachines", name,
            {"status": {"created": True, "ready": True, "printableStatus": "Running"}}, _content_type=MERGE_PATCH)
        await co.create_namespaced_custom_object(KUBEVIRT, KUBEVIRT_VERSION, ns, "virtualmachineinstances",
                                                 vmi_from_vm(vm))
        t = format_time(dt.datetime.now(dt.UTC))
        stamps = [{"phase": p, "phaseTransitionTimestamp": t} for p in ("Pending", "Scheduling", "Scheduled",
                                                                        "Running")]
        await co.patch_namespaced_custom_object_status(
            KUBEVIRT, KUBEVIRT_VERSION, ns, "virtualmachineinstances", name,
            {"status": {"phase": "Running", "nodeName": "devcluster-node", "phaseTransitionTimestamps": stamps,
                        "conditions": [{"type": "Ready", "status": "True", "reason": "", "lastProbeTime": None,
                                        "lastTransitionTime": t}]}}, _content_type=MERGE_PATCH)

    return job


# ---------------------------------------------------------------------------------------------
# The raw-write floor
# ---------------------------------------------------------------------------------------------
async def listed_replicas(raw: Any, expected: int, floor: str) -> list[dict[str, Any]]:
    """Every replica Secret as listed; raises unless there are `expected` of them."""
    listed = await raw.list_secret_for_all_namespaces(label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")
    # The signing-key Secret carries the managed-by label too; replicas also carry the class annotation.
    items: list[dict[str, Any]] = [s for s in listed.get("items") or []
                                   if ANN_CLASS in ((s.get("metadata") or {}).get("annotations") or {})]
    if len(items) != expected:
        raise RuntimeError(f"{floor}: expected {expected} replicas, listed {len(items)}")
    return items


def replica_body(s: dict[str, Any], data: dict[str, Any], *, keep_version: bool) -> dict[str, Any]:
    """A listed replica as a write body with `data`; `keep_version` guards a replace by its resourceVersion."""
    meta = s["metadata"]
    metadata = {"name": meta["name"], "namespace": meta["namespace"], "labels": meta.get("labels") or {},
                "annotations": meta.get("annotations") or {}}
    if keep_version:
        metadata["resourceVersion"] = meta["resourceVersion"]
    return {"apiVersion": "v1", "kind": "Secret", "type": s.get("type", "Opaque"), "data": data, "metadata": metadata}


async def raw_write_floor(api: ApiClient, expected: int, token: bytes) -> tuple[float, int]:
    """Replace every replica with new content at the controller's concurrency; (seconds, writes)."""
    raw: Any = RawApi(kube_api.CoreV1Api(api))  # the thin client the controller uses, no controller logic
    new = base64.b64encode(token).decode()
    bodies = [replica_body(s, {**(s.get("data") or {}), "client_configuration_token.tok": new}, keep_version=True)
              for s in await listed_replicas(raw, expected, "floor")]

    def put(b: dict[str, Any]) -> Any:
        return lambda: raw.replace_namespaced_secret(b["metadata"]["name"], b["metadata"]["namespace"], b)

    elapsed = await run_bounded("raw-write floor", [put(b) for b in bodies], CONTROLLER_WRITE_CONCURRENCY)
    return elapsed, len(bodies)


async def raw_create_floor(api: ApiClient, expected: int) -> tuple[float, int]:
    """Delete every replica (untimed), then create them again from their listed content at the
    controller's concurrency: the cold start's baseline; (seconds, creates)."""
    raw: Any = RawApi(kube_api.CoreV1Api(api))  # the thin client the controller uses, no controller logic
    bodies = [replica_body(s, dict(s.get("data") or {}), keep_version=False)
              for s in await listed_replicas(raw, expected, "create floor")]

    def delete(b: dict[str, Any]) -> Any:
        return lambda: raw.delete_namespaced_secret(b["metadata"]["name"], b["metadata"]["namespace"])

    def create(b: dict[str, Any]) -> Any:
        return lambda: raw.create_namespaced_secret(b["metadata"]["namespace"], b)

    await run_bounded("create floor: deleting replicas (untimed)", [delete(b) for b in bodies], SEED_CONCURRENCY)
    elapsed = await run_bounded("raw-create floor", [create(b) for b in bodies], CONTROLLER_WRITE_CONCURRENCY)
    return elapsed, len(bodies)


# ---------------------------------------------------------------------------------------------
# apiserver-side request counts (cross-check of what the controller reports)
# ---------------------------------------------------------------------------------------------
async def apiserver_metrics(cp: ControlPlane) -> Scrape:
    ctx = ssl.create_default_context(cafile=str(cp.ca_path))
    async with aiohttp.ClientSession() as s, s.get(
            f"{cp.server}/metrics", ssl=ctx, headers={"Authorization": f"Bearer {cp.admin_token}"}) as r:
        text = await r.text()
    # Only the request counter is needed; the full exposition is several MB of histograms.
    keep = "\n".join(line for line in text.splitlines()
                     if line.startswith(("apiserver_request_total{", "# TYPE apiserver_request_total",
                                         "# HELP apiserver_request_total")))
    return parse_metrics(keep + "\n", time.monotonic())


WATCHED = ("namespaces", "secrets", "gpuclasses", "gpuclaims", "virtualmachines", "virtualmachineinstances")


def apiserver_lists(after: Scrape, before: Scrape) -> dict[str, float]:
    out: dict[str, float] = {}
    for res in WATCHED:
        n = delta(after, before, "apiserver_request_total", verb="LIST", resource=res)
        if n:
            out[res] = n
    return out


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------
def _replica_state(s: Scrape, state: str) -> float:
    return s.value("licensectl_replicas", state=state)


def _revision(s: Scrape) -> str:
    for (name, labels), v in s.samples.items():
        if name == "licensectl_source_revision_info" and v == 1.0:
            return dict(labels).get("revision", "")
    return ""


async def run(cp: ControlPlane, scale_name: str, build: ControllerBuild = THIS_TREE) -> str:
    scale = SCALES[scale_name]
    n = scale.namespaces
    token1, token2, token3 = fake_tokens(3)
    rows: list[list[str]] = []
    async with BenchRun() as bench:
        api = await bench.client(cp.kubeconfig_path, SEED_CONCURRENCY + 8)
        await install_crds(api)
        progress(f"replication[{scale_name}]: seeding {n:,} tenants, {n:,} claims, "
                 f"{scale.unrelated_secrets:,} unrelated Secrets, {scale.vmis:,} VMs + VMIs")
        seed_times = await seed(api, scale, token1)
        depth_counts: dict[int, int] = {}
        for t in tenant_tree(n, scale.max_depth, ROOT):
            depth_counts[t.depth] = depth_counts.get(t.depth, 0) + 1

        cp_pids = {k: v for k, v in cp.pids.items() if k in ("kube-apiserver", "etcd")}

        # -- cold start ---------------------------------------------------------------------
        ctl = bench.hold(BenchController(cp.kubeconfig_path, args=["--resync-seconds", str(scale.resync_seconds),
                                                                   *CONTROLLER_ARGS], build=build))
        cpu0 = cpu_seconds(cp_pids)
        progress("cold start: launching the controller")
        ctl.phase = "cold start"
        await ctl.start()
        profiler = Profiler(build.profile, f"{build.label}, {scale_name}")
        bench.on_exit(closing(profiler))
        profiler.begin(ctl.pid, "cold start")
        t_start = ctl.started_at
        marks: dict[str, float] = {}
        last_print = [time.monotonic()]

        async def cold_done() -> bool:
            s = await ctl.scrape()
            if s is None:
                return False
            if "ready" not in marks and s.value("licensectl_ready") == 1.0:
                marks["ready"] = s.at
            if "writes" not in marks and s.value("licensectl_replica_writes_total", action="create") >= n:
                marks["writes"] = s.at
            if time.monotonic() - last_print[0] > 10:
                last_print[0] = time.monotonic()
                progress(f"cold start: {fmt_num(_replica_state(s, 'in_sync'))}/{n:,} in sync, "
                         f"{fmt_num(s.value('licensectl_replica_writes_total', action='create'))} created")
            return (_replica_state(s, "in_sync") == n and _replica_state(s, "missing") == 0
                    and _replica_state(s, "drifted") == 0)

        await eventually(cold_done, timeout=scale.timeout, interval=POLL_SECONDS, what="cold-start convergence")
        await profiler.end()
        t_cold = time.monotonic()
        cold = await ctl.must_scrape()
        cold_ctl_cpu = ctl.cpu_seconds()
        cpu1 = cpu_seconds(cp_pids)
        progress(f"cold start: converged in {t_cold - t_start:.1f}s")

        # -- rotation -----------------------------------------------------------------------
        await asyncio.sleep(2.0)
        before = await ctl.must_scrape()
        rev_before = _revision(before)
        ctl_cpu_before = ctl.cpu_seconds()
        cpu2 = cpu_seconds(cp_pids)
        progress("rotation: replacing the source token")
        ctl.phase = "rotation"
        profiler.begin(ctl.pid, "rotation")
        t_rot = time.monotonic()
        await rotate_source(api, token2)
        rot_marks: dict[str, float] = {}

        async def rotated() -> bool:
            s = await ctl.scrape()
            if s is None:
                return False
            updated = delta(s, before, "licensectl_replica_writes_total", action="update", result="updated")
            if "writes" not in rot_marks and updated >= n:
                rot_marks["writes"] = s.at
            if time.monotonic() - last_print[0] > 10:
                last_print[0] = time.monotonic()
                progress(f"rotation: {fmt_num(updated)}/{n:,} replicas updated")
            return (updated >= n and _revision(s) not in ("", rev_before) and _replica_state(s, "in_sync") == n)

        await eventually(rotated, timeout=scale.timeout, interval=POLL_SECONDS, what="rotation convergence")
        await profiler.end()
        t_rotated = time.monotonic()
        after_rot = await ctl.must_scrape()
        rot_ctl_cpu = ctl.cpu_seconds() - ctl_cpu_before
        cpu3 = cpu_seconds(cp_pids)
        rot_seconds = t_rotated - t_rot
        rot_write_seconds = rot_marks.get("writes", t_rotated) - t_rot
        progress(f"rotation: converged in {rot_seconds:.1f}s")

        # -- steady state -------------------------------------------------------------------
        await asyncio.sleep(3.0)
        ss_before = await ctl.must_scrape()
        as_before = await apiserver_metrics(cp)
        ss_cpu_before = ctl.cpu_seconds()
        window = scale.steady_periods * scale.resync_seconds
        progress(f"steady state: observing {window:.0f}s ({scale.steady_periods} resync periods)")
        ctl.phase = "steady state"
        await asyncio.sleep(window)
        ss_after = await ctl.must_scrape()
        as_after = await apiserver_metrics(cp)
        ss_cpu = ctl.cpu_seconds() - ss_cpu_before
        periods = (ss_after.at - ss_before.at) / scale.resync_seconds

        # The timed scrape counts every guest. A guest that never reports is judged silent (one series,
        # state "unknown") only once the controller has received reports for three intervals and its
        # VMI had its boot allowance; a scrape before that leaves the fleet's guests out, which is not
        # what a Prometheus scrape of a running fleet costs. So wait (bounded) until all are judged.
        judged = await _guests_judged(ctl, scale.vmis, within=GUEST_JUDGE_TIMEOUT)

        # One timed scrape, then the loop-lag probe's view of the scrapes around it (renewing the Lease
        # and reading the watches wait behind whatever holds the loop: goal ≤ 100 ms).
        lag_before = await ctl.must_scrape()
        cost = await ctl.scrape_cost()
        lag_after = await ctl.must_scrape()
        lag = loop_lag_between(lag_before, lag_after)
        lag_rotation = loop_lag_between(before, after_rot)  # the rotation, scraped once a second
        lag_steady = loop_lag_between(ss_before, ss_after)
        mem = ctl.memory()
        hwm = mem.get("VmHWM", 0)
        rss_end = mem.get("VmRSS", 0)

        allocations = await ctl.memory_report() if build.tracemalloc else ""

        # -- recovery from an apiserver outage (after the memory readings: a relist may follow) ---
        progress(f"recovery: stopping kube-apiserver for {scale.outage_seconds:g}s")
        ctl.phase = "recovery"
        rec = await apiserver_outage(cp, ctl, scale.outage_seconds, api=api)
        progress(f"recovery: ready {fmt_seconds(rec.to_ready)} after the apiserver answered /readyz")
        code = await ctl.stop()
        progress(f"controller stopped (exit code {code})")
        # The same restart without the controller: what the apiserver spends on a restart anyway.
        window = rec.to_ready if rec.to_ready is not None else 10.0
        progress(f"recovery baseline: restarting kube-apiserver without the controller ({window:.0f}s window)")
        idle_restart = await restart_cpu_without_controller(cp, window)

        # -- raw-write floor ----------------------------------------------------------------
        floor_api = await make_client(cp.kubeconfig_path, CONTROLLER_WRITE_CONCURRENCY)
        try:
            floor_seconds, floor_writes = await raw_write_floor(floor_api, n, token3)
            create_floor_seconds, create_floor_writes = await raw_create_floor(floor_api, n)
        finally:
            await floor_api.close()

        # -- report -------------------------------------------------------------------------
        cold_req = delta_by_label(cold, Scrape({}), "licensectl_api_requests_total", label="verb")
        rot_req = delta_by_label(after_rot, before, "licensectl_api_requests_total", label="verb")
        rot_req_total = sum(rot_req.values())
        rot_passes = delta_by_label(after_rot, before, "licensectl_reconcile_total", label="controller")
        cold_passes = delta_by_label(cold, Scrape({}), "licensectl_reconcile_total", label="controller")
        ss_req = delta_by_label(ss_after, ss_before, "licensectl_api_requests_total", label="verb")
        ss_writes = delta(ss_after, ss_before, "licensectl_replica_writes_total")
        ss_passes = delta(ss_after, ss_before, "licensectl_reconcile_total", controller="replication")
        ss_gets = ss_req.get("GET", 0.0)
        as_lists = apiserver_lists(as_after, as_before)
        cp_cold = {k: cpu1[k] - cpu0[k] for k in cpu0}
        cp_rot = {k: cpu3[k] - cpu2[k] for k in cpu2}
        rot_ratio = ratio(rot_seconds, floor_seconds)
        cold_create_seconds = marks.get("writes", t_cold) - marks.get("ready", t_start)
        cold_writes = sum(cold_req.get(verb, 0.0) for verb in ("POST", "PUT", "PATCH", "DELETE"))
        rot_writes = sum(rot_req.get(verb, 0.0) for verb in ("POST", "PUT", "PATCH", "DELETE"))
        depth_str = ", ".join(f"d{d}: {c:,}" for d, c in sorted(depth_counts.items()))
        rows = [
            ["fleet", f"{n:,} tenant ns ({depth_str}), {n:,} claims, {scale.unrelated_secrets:,} unrelated "
                      f"Secrets, {scale.vmis:,} running VMs + VMIs", "", "1 vgpu class, 1 source"],
            ["controller", build.label, "", " ".join(CONTROLLER_ARGS) + " (one-step; nothing restarted)"],
            ["seeding (benchmark client, 64 in flight)",
             ", ".join(f"{k} {v:.0f}s" for k, v in seed_times.items()), "", "not part of the result"],
            ["cold start: caches synced (ready)", fmt_seconds(marks.get("ready", t_cold) - t_start), "",
             "process start -> initial LISTs done"],
            ["cold start: all replicas created", fmt_seconds(marks.get("writes", t_cold) - t_start), "",
             f"{fmt_num(cold.value('licensectl_replica_writes_total', action='create'))} creates"],
            ["cold start: full convergence", fmt_seconds(t_cold - t_start), "",
             f"replicas in_sync = {n:,} on /metrics"],
            ["cold start: controller CPU", fmt_seconds(cold_ctl_cpu), "",
             f"apiserver {cp_cold.get('kube-apiserver', 0):.0f}s, etcd {cp_cold.get('etcd', 0):.0f}s CPU"],
            ["cold start: controller API requests", fmt_counts(cold_req), "", ""],
            ["cold start: creating (ready -> all created) / raw-create floor",
             fmt_ratio(ratio(cold_create_seconds, create_floor_seconds)), f"goal ≤ {GOAL_FLOOR_RATIO:.2f}x",
             f"{fmt_seconds(cold_create_seconds)} vs floor {fmt_seconds(create_floor_seconds)} "
             f"({create_floor_writes:,} POSTs, {CONTROLLER_WRITE_CONCURRENCY} in flight)"],
            ["cold start: API writes per replica created", fmt_num(ratio(cold_writes, n)), "goal 1",
             "POST/PUT/PATCH/DELETE, Events included"],
            ["cold start: controller CPU per replica write", f"{cold_ctl_cpu / n * 1000:.2f} ms", "",
             "whole cold start (LISTs, planning, writes) / replicas"],
            ["cold start: reconcile passes", fmt_counts(cold_passes), "", "by controller loop"],
            ["rotation: all replicas written", fmt_seconds(rot_write_seconds), "",
             "source PUT -> last replica PUT"],
            ["rotation: full convergence (controller)", fmt_seconds(rot_seconds),
             f"floor {fmt_seconds(floor_seconds)}", f"floor: bare client, {floor_writes:,} PUTs, "
                                                    f"{CONTROLLER_WRITE_CONCURRENCY} in flight"],
            ["rotation / raw-write floor", fmt_ratio(rot_ratio), f"goal ≤ {GOAL_FLOOR_RATIO:.2f}x",
             "1.00x = floor; same run, same apiserver"],
            ["rotation: API writes per replica change", fmt_num(ratio(rot_writes, n)), "goal 1",
             "POST/PUT/PATCH/DELETE, Events included"],
            ["rotation: API requests per replica update", fmt_num(ratio(rot_req_total, n)), "floor: 1",
             fmt_counts(rot_req)],
            ["rotation: reconcile passes", fmt_counts(rot_passes), "", "by controller loop"],
            ["rotation: controller CPU", fmt_seconds(rot_ctl_cpu),
             "", f"{rot_ctl_cpu / n * 1000:.2f} ms/replica; apiserver {cp_rot.get('kube-apiserver', 0):.0f}s, "
                 f"etcd {cp_rot.get('etcd', 0):.0f}s CPU"],
            ["steady state: window", f"{ss_after.at - ss_before.at:.0f}s = {periods:.2f} resync periods",
             "", f"--resync-seconds {scale.resync_seconds:g}; {fmt_num(ss_passes)} replication passes"],
            ["steady state: replica writes / period", fmt_num(ss_writes / periods), "goal 0", ""],
            ["steady state: controller GETs / period", fmt_num(ss_gets / periods), "",
             f"LISTs + 1 signing-key read per pass; all verbs: {fmt_counts(ss_req)}"],
            ["steady state: apiserver LISTs / period", fmt_num(sum(as_lists.values()) / periods), "",
             f"apiserver_request_total verb=LIST: {fmt_counts(as_lists)}"],
            ["steady state: controller CPU / period", fmt_seconds(ss_cpu / periods), "", ""],
            ["one /metrics scrape at steady state", f"{fmt_seconds(cost[0])}, {cost[2]:,} series, "
                                                    f"{cost[1] / 1024:.0f} KiB", "",
             f"{judged:,} of {scale.vmis:,} guests judged (none reports: one series each); "
             f"convergence polled every {POLL_SECONDS:g}s"],
            ["event loop lag across 3 scrapes", lag, "goal ≤ 100 ms", "licensectl_event_loop_lag_seconds, a "
                                                                        "0.1 s timer: what a Lease renewal waits"],
            ["event loop lag during the rotation", lag_rotation, "goal ≤ 100 ms",
             "replica writes, watch events, rollout passes, a scrape a second"],
            ["event loop lag at steady state", lag_steady, "", "resync passes only"],
            ["full GC collections during the rotation", gc_pauses_between(before, after_rot), "",
             "licensectl_gc_pause_seconds{generation=\"2\"}: each stops the loop and every thread"],
            ["full GC collections at steady state", gc_pauses_between(ss_before, ss_after), "", ""],
            ["controller peak RSS (VmHWM)", fmt_mib(hwm), f"goal ≤ {scale.rss_goal_mib} MiB",
             f"VmRSS before the recovery {fmt_mib(rss_end)}; max sampled VmRSS, recovery included, "
             f"{fmt_mib(ctl.peak_rss)}"],
            ["controller VmRSS peak by phase", "; ".join(f"{p} {fmt_mib(v)}" for p, v in ctl.phase_peaks.items()),
             "", "sampled every 0.2 s: where the peak is made (the cold LISTs, a rotation's plans, a relist)"],
            ["recovery: apiserver /readyz -> controller ready", fmt_seconds(rec.to_ready),
             f"goal ≤ {scale.recovery_goal:g} s",
             f"every informer synced+healthy after a {rec.outage:.0f}s outage (apiserver restart took "
             f"{rec.restart:.1f}s; caches went unhealthy: {'yes' if rec.unhealthy_seen else 'no'}); "
             f"{rec.scrapes} /metrics scrapes meanwhile, spaced ≥ {RECOVERY_POLL_SHARE:g} times a scrape's time"],
            ["recovery: /readyz -> replication's caches synced", fmt_seconds(rec.synced_after(is_core_cache)), "",
             "namespaces, GPU classes and claims, replicas, revision stores, sources: replication and "
             "admission decide from these alone"],
            ["recovery: /readyz -> VM and VMI caches synced", fmt_seconds(rec.synced_after(is_kubevirt_cache)), "",
             "what the rollout waits for: 2 paged LISTs of every vGPU VM and VMI"],
            ["recovery: apiserver /readyz -> leader again", fmt_seconds(rec.to_leader), "",
             "Lease re-acquired (lease duration 15 s)"],
            ["recovery, the apiserver's part: /readyz -> LISTs served", fmt_seconds(rec.to_served), "",
             "a selected LIST (limit 1) of every watched kind answered 200: its watch cache is filled"],
            ["recovery, the controller's part: ready - LISTs served",
             fmt_seconds(None if rec.to_ready is None or rec.to_served is None else rec.to_ready - rec.to_served),
             "", "the relists, the first passes and everything else the controller waits for"],
            ["recovery: CPU from /readyz to ready", rec.cpu_text(), "",
             "per process: which one did the work the recovery waited for"],
            ["recovery baseline: the same restart without the controller",
             ", ".join(f"{k} {v:.1f} s" for k, v in idle_restart.items()), "",
             "CPU over the same window from /readyz: what the restart costs the control plane anyway"],
            *[[f"recovery, cache {r.resource}", r.describe(), "",
               "from licensectl_informer_synced (polled), _informer_list_duration_seconds, _watch_restarts_total"]
              for r in rec.per_informer],
            ["controller exit on SIGTERM", str(code), "0", ""],
        ]
        table = format_table(f"Replication benchmark ({scale_name})", ["metric", "measured", "baseline / goal",
                                                                       "notes"], rows)
        if allocations:
            table += ("\n\nController memory by allocation site (/debug/memory after the steady state, "
                      "tracemalloc, 1 frame)\n\n" + allocations)
        return table + profiler.tables()


async def _guests_judged(ctl: BenchController, vmis: int, *, within: float) -> int:
    """Wait until `licensectl_guests` counts every VMI (at most `within` seconds); the number it counts."""
    judged = 0

    async def all_judged() -> bool:
        nonlocal judged
        judged = int((await ctl.must_scrape()).value("licensectl_guests"))
        return judged >= vmis

    with contextlib.suppress(EventuallyTimeout):
        await eventually(all_judged, timeout=within, interval=5.0, what="every guest judged")
    progress(f"steady state: {judged:,} of {vmis:,} guests judged")
    return judged
