"""Seeded fault scenarios against the real control plane, each ending in the invariants check.

A scenario is `async fn(env, seed, mode) -> Outcome`. The seed drives every random choice (kill
points, fault kinds, burst sizes), so a failing (scenario, seed) pair can be re-run as is:
`python -m tests.faults --only sigkill_rollout --seed 7`. `mode` is "short" (CI) or "long".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, CustomObjectsApi
from prometheus_client import generate_latest

from licensectl import config
from licensectl.app import App
from licensectl.core.render import RenderedLicense
from licensectl.kube.raw import RawApi
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.controlplane import ControlPlane
from licensectl_dev.testkit import world as kit
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.world import SOURCE_NAME, unique

from . import invariants as inv
from .toolkit import FaultProxy, JumpClock, KubevirtRig, TcpProxy, start_kubevirt, write_kubeconfig

Key = tuple[str, str]


@dataclass
class Env:
    """What every scenario gets: the control plane, an admin client, a scratch directory."""

    cp: ControlPlane
    api: ApiClient
    workdir: Path


@dataclass
class Outcome:
    scenario: str
    seed: int
    verdict: inv.Verdict
    seconds: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)


async def gather_bounded(jobs: Iterable[Awaitable[Any]], limit: int = 24) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(j: Awaitable[Any]) -> Any:
        async with sem:
            return await j

    return await asyncio.gather(*(one(j) for j in jobs))


# ---------------------------------------------------------------------------------------------
# A hoster world: controller namespace, source Secret, one vGPU class, a tenant tree
# ---------------------------------------------------------------------------------------------
@dataclass
class World(kit.World):
    """The common world plus what the invariants need: decoy Secrets that must stay untouched, VMs."""

    extra_namespaces: list[str] = field(default_factory=list)
    decoys: list[Key] = field(default_factory=list)
    vms: list[Key] = field(default_factory=list)

    @property
    def namespaces(self) -> list[str]:
        return [self.controller_ns, self.source_ns, self.root_name, *self.tenants, *self.extra_namespaces]

    def base_settings(self, **kw: Any) -> dict[str, Any]:
        s: dict[str, Any] = {"root_tenant": self.root_name, "settle_seconds": 0, "resync_seconds": 30,
                             "max_unavailable": "2", "max_per_namespace": 1, "restart_timeout_seconds": 90,
                             "restart_reissue_seconds": 3, "log_level": "info",
                             "report_url": "http://127.0.0.1:1/v1/reports",
                             # No guest reports here: keep the wait a controller takes after it starts, before
                             # passing a restarted VM on readiness, short (docs/design.md#evidence-after-takeover).
                             "report_interval_seconds": 2.0}
        s.update(kw)
        return s

    async def add_tenant(self, parent: dict[str, Any] | None = None, *, vgpu: bool = True, claim: bool = True,
                         decoy: bool = True) -> dict[str, Any]:
        t = await self.tenant(parent, vgpu, claim=claim)
        if decoy:
            name = self.tenants[-1]
            core: Any = CoreV1Api(self.api)
            await core.create_namespaced_secret(name, {
                "metadata": {"name": "tenant-own"}, "stringData": {"app.conf": "tenant data"}})
            self.decoys.append((name, "tenant-own"))
        return t

    async def revision(self) -> str:
        lic = await inv.expected_license(self.api, self.source, self.cls)
        assert isinstance(lic, RenderedLicense), "source does not render"
        return lic.revision

    async def replicas_present(self, namespaces: Iterable[str]) -> bool:
        have = await inv.owned_replicas(self.api, self.source)
        return all((ns, self.replica) in have for ns in namespaces)

    async def replicas_at(self, namespaces: Iterable[str], revision: str) -> bool:
        have = await inv.owned_replicas(self.api, self.source)
        for ns in namespaces:
            r = have.get((ns, self.replica))
            if r is None or ((r.get("metadata") or {}).get("annotations") or {}).get(
                    "licensectl.io/revision") != revision:
                return False
        return True

    async def create_vms(self, per_tenant: int, tenants: Sequence[str] | None = None) -> list[Key]:
        made: list[Key] = []
        for ns in tenants or self.tenants:
            for i in range(per_tenant):
                await fleet.create_vm(self.api, ns, f"vm{i}", license_secret=self.replica)
                made.append((ns, f"vm{i}"))
        self.vms.extend(made)
        return made

    async def vmis_ready(self, vms: Sequence[Key]) -> bool:
        co = RawApi(CustomObjectsApi(self.api))
        ready: set[Key] = set()
        for ns in sorted({k[0] for k in vms}):
            doc = await co.list_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances")
            for item in doc.get("items") or []:
                meta = item.get("metadata") or {}
                conds = (item.get("status") or {}).get("conditions") or []
                if not meta.get("deletionTimestamp") and any(
                        c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                    ready.add((ns, meta["name"]))
        return all(k in ready for k in vms)

    async def vms_done(self, vms: Sequence[Key], revision: str) -> bool:
        co = RawApi(CustomObjectsApi(self.api))
        for ns in sorted({k[0] for k in vms}):
            doc = await co.list_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachines")
            by_name = {i["metadata"]["name"]: i for i in doc.get("items") or []}
            for k in vms:
                if k[0] != ns:
                    continue
                ann = (by_name.get(k[1], {}).get("metadata") or {}).get("annotations") or {}
                if ann.get("licensectl.io/restart-revision") != revision or \
                        ann.get("licensectl.io/restart-result") != "done":
                    return False
        return await self.vmis_ready(vms)

    async def teardown(self, *extra_namespaces: str) -> None:
        await super().teardown(*self.extra_namespaces, *extra_namespaces)


async def build_world(api: ApiClient, *, tenants: int = 3) -> World:
    w = await kit.build_world(api, world_type=World)
    core: Any = CoreV1Api(api)
    await core.create_namespaced_secret(w.source_ns, {"metadata": {"name": "hoster-other"},
                                                      "stringData": {"x": "hoster data"}})
    w.decoys.append((w.source_ns, "hoster-other"))
    for _ in range(tenants):
        await w.add_tenant()
    return w


# ---------------------------------------------------------------------------------------------
# Shared scenario plumbing
# ---------------------------------------------------------------------------------------------
@dataclass
class Run:
    """One scenario run's resources; `close()` tears everything down in reverse order."""

    env: Env
    seed: int
    mode: str
    name: str
    rng: random.Random
    verdict: inv.Verdict = field(default_factory=inv.Verdict)
    world: World | None = None
    rig: KubevirtRig | None = None
    controllers: list[ControllerProcess] = field(default_factory=list)
    proxies: list[Any] = field(default_factory=list)
    apps: list[App] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    foreign_before: dict[Key, str] = field(default_factory=dict)
    extra_texts: list[tuple[str, str]] = field(default_factory=list)  # e.g. an in-process app's /metrics
    cleanups: list[Callable[[], Awaitable[Any]]] = field(default_factory=list)  # run in reverse by close()

    @property
    def w(self) -> World:
        assert self.world is not None
        return self.world

    def kubeconfig(self, name: str, server: str) -> Path:
        return write_kubeconfig(self.env.workdir, name, server, self.env.cp.ca_pem, self.env.cp.admin_token)

    def controller(self, kubeconfig: Path, *, name: str = "controller", **settings: Any) -> ControllerProcess:
        # Its admission webhook registered, as shipped: restarts wait for evidence that admission delivers
        # (docs/design.md#delivery-readiness), even for VMs that mount their replica by hand.
        c = ControllerProcess(kubeconfig, self.w.controller_ns, log_dir=self.env.workdir, name=name,
                              settings=self.w.base_settings(**settings), keep_bodies=True, webhook_api=self.env.api)
        self.controllers.append(c)
        return c

    async def snapshot_foreign(self) -> None:
        self.foreign_before = await inv.foreign_secrets(self.env.api, self.w.namespaces,
                                                        exclude=[self.w.source])

    async def finish(self, *, entitled: Iterable[str]) -> None:
        """The common invariants: replicas, foreign Secrets, secrecy of everything captured."""
        w = self.w
        replicas = await inv.check_replicas(self.env.api, self.verdict, source=w.source, classes=[w.cls],
                                            entitled=entitled)
        after = await inv.foreign_secrets(self.env.api, w.namespaces, exclude=[w.source])
        inv.check_foreign(self.verdict, self.foreign_before, after)
        for c in self.controllers:
            if c.alive():
                await c.scrape()
                await c.status()
        texts: list[tuple[str, str]] = list(self.extra_texts)
        for c in self.controllers:
            texts.extend((f"{c.name} log line {i + 1}", line) for i, line in enumerate(c.log_lines()))
            texts.extend(c.http_bodies)
        texts.extend(await inv.event_texts(self.env.api, [*w.namespaces, "default"]))
        needles = [n for i, t in enumerate(w.tokens) for n in inv.token_needles(f"token #{i}", t)]
        needles.extend(inv.credential_needles(replicas))
        self.notes["texts_scanned"] = inv.scan(self.verdict, texts, needles)

    async def close(self) -> None:
        for c in self.controllers:
            with contextlib.suppress(Exception):
                await c.close()
        for a in self.apps:
            with contextlib.suppress(Exception):
                await a.stop()
        for cleanup in reversed(self.cleanups):
            with contextlib.suppress(Exception):
                await cleanup()
        for p in reversed(self.proxies):
            with contextlib.suppress(Exception):
                await p.stop()
        if self.rig is not None:
            with contextlib.suppress(Exception):
                await self.rig.stop()
        if self.world is not None:
            with contextlib.suppress(Exception):
                await self.world.teardown()


async def boot_fleet(run: Run, per_tenant: int, metrics_from: ControllerProcess | None = None) -> list[Key]:
    """Replicas first, then (a second later: 1 s timestamps) the VMs; wait until all are Ready."""
    w = run.w
    await eventually(lambda: w.replicas_present(w.tenants), timeout=60, what="replicas in every tenant")
    await asyncio.sleep(1.1)
    vms = await w.create_vms(per_tenant)
    await eventually(lambda: w.vmis_ready(vms), timeout=60, what="fleet Ready")
    if metrics_from is not None:
        async def all_current() -> bool:
            s = await metrics_from.scrape()
            return s is not None and s.value("licensectl_rollout_vmis", state="current") == len(vms)

        await eventually(all_current, timeout=30, what="controller sees the fleet current")
    return vms


async def kubevirt_world(run: Run, *, tenants: int, ready_delay: float) -> World:
    """A world, the KubeVirt rig, and the snapshot of the Secrets licensectl must not touch."""
    w = run.world = await build_world(run.env.api, tenants=tenants)
    run.rig = await start_kubevirt(run.env.api, run.env.cp, ready_delay=ready_delay)
    await run.snapshot_foreign()
    return w


async def rotating_fleet(run: Run, kubeconfig: Path, *, per_tenant: int,
                         max_unavailable: str) -> tuple[ControllerProcess, list[Key], float, str]:
    """One Ready controller, the fleet booted and current, then a rotation: (controller, VMs, since, revision)."""
    ctl = run.controller(kubeconfig, max_unavailable=max_unavailable)
    await ctl.start()
    await ctl.wait_ready()
    vms = await boot_fleet(run, per_tenant, metrics_from=ctl)
    since, rev = await rotate_and_wait_replicas(run)
    return ctl, vms, since, rev


async def rotate_and_wait_replicas(run: Run, n: int = 2) -> tuple[float, str]:
    w = run.w
    since = time.monotonic()
    await w.rotate(n)
    rev = await w.revision()
    return since, rev


async def rollout_checks(run: Run, vms: Sequence[Key], since: float, revision: str, *,
                         max_unavailable: int, timeout: float = 180.0) -> None:
    w = run.w
    try:
        await eventually(lambda: w.vms_done(vms, revision), timeout=timeout, interval=0.5,
                   what="every VM restarted and done")
    except TimeoutError as e:
        run.verdict.check("rollout_completes", False, str(e))
    assert run.rig is not None
    inv.check_restarts(run.verdict, run.rig.record, vms, since=since)
    await inv.check_vms_done(run.env.api, run.verdict, vms, revision)
    inv.check_unavailability(run.verdict, run.rig.record, w.tenants, max_unavailable=max_unavailable,
                             max_per_namespace=1)


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------
async def sigkill_rollout(run: Run) -> None:
    """SIGKILL the controller at random points of a rollout, restart it each time."""
    long = run.mode == "long"
    kills = 20 if long else 8
    w = await kubevirt_world(run, tenants=4 if long else 3, ready_delay=run.rng.uniform(0.4, 1.2))
    limit = 2 if long else 1
    ctl, vms, since, rev = await rotating_fleet(run, run.kubeconfig("kv", run.rig.proxy.url),
                                                per_tenant=4 if long else 3, max_unavailable=str(limit))
    mid = 0
    for _ in range(kills):
        await asyncio.sleep(run.rng.uniform(0.2, 3.0))
        if not await w.vms_done(vms, rev):
            mid += 1
        await ctl.kill()
        await asyncio.sleep(run.rng.choice([0.0, 0.0, run.rng.uniform(0.1, 1.5)]))
        await ctl.start()
    run.notes.update(kills=ctl.kills, kills_mid_rollout=mid)
    await rollout_checks(run, vms, since, rev, max_unavailable=limit)
    await run.finish(entitled=w.tenants)


EVERY_RESTART = 10**6  # more restart answers to lose than a scenario makes restarts


async def restart_answers_lost(run: Run) -> None:
    """virt-api acts on every restart, then the connection breaks before its answer, and the
    controller is SIGKILLed now and then: the client must not send a restart again (that would stop
    the VMI the first one created), and the rollout must learn what happened from the cluster."""
    long = run.mode == "long"
    w = await kubevirt_world(run, tenants=3, ready_delay=run.rng.uniform(0.4, 1.0))
    assert run.rig is not None
    proxy = run.rig.proxy
    proxy.hang_up_after_restarts = EVERY_RESTART
    ctl, vms, since, rev = await rotating_fleet(run, run.kubeconfig("kv", proxy.url),
                                                per_tenant=4 if long else 3, max_unavailable="2")
    for _ in range(6 if long else 2):
        await asyncio.sleep(run.rng.uniform(1.0, 3.0))
        await ctl.kill()
        await asyncio.sleep(run.rng.choice([0.0, run.rng.uniform(0.1, 1.0)]))
        await ctl.start()
    await rollout_checks(run, vms, since, rev, max_unavailable=2)
    run.notes.update(kills=ctl.kills, answers_lost=EVERY_RESTART - proxy.hang_up_after_restarts)
    run.verdict.check("restart_answers_lost", proxy.hang_up_after_restarts < EVERY_RESTART,
                      "no restart answer was dropped: the scenario tested nothing")
    await run.finish(entitled=w.tenants)


async def leader_failover(run: Run) -> None:
    """Two replicas with leader election; SIGKILL the leader mid-rollout, the standby finishes."""
    long = run.mode == "long"
    w = await kubevirt_world(run, tenants=3, ready_delay=run.rng.uniform(0.5, 1.0))
    kube = run.kubeconfig("kv", run.rig.proxy.url)
    lease = {"leader_elect": True, "lease_duration_seconds": 4, "renew_deadline_seconds": 3,
             "retry_period_seconds": 0.5, "max_unavailable": "1"}
    ctls = {n: run.controller(kube, name=f"replica-{n}", pod_name=n, **lease) for n in ("a", "b")}
    for c in ctls.values():
        await c.start()
    for c in ctls.values():
        await c.wait_ready()

    async def leader() -> ControllerProcess | None:
        for c in ctls.values():
            s = await c.scrape() if c.alive() else None
            if s is not None and s.value("licensectl_leader") == 1.0:
                return c
        return None

    first = await eventually(leader, timeout=30, what="a leader")
    vms = await boot_fleet(run, 3, metrics_from=first)
    since, rev = await rotate_and_wait_replicas(run)
    assert run.rig is not None
    rig = run.rig
    failovers = 0
    for _ in range(2 if long else 1):
        await eventually(lambda: any(r.at >= since and r.status == 202 for r in rig.record.restarts),
                   timeout=60, what="first restart")
        await asyncio.sleep(run.rng.uniform(0.0, 2.0))
        old = await eventually(leader, timeout=30, what="current leader")
        await old.kill()
        new = await eventually(leader, timeout=30, what="a new leader")
        failovers += int(new is not old)
        await asyncio.sleep(run.rng.uniform(0.0, 1.0))
        await old.start()  # comes back as the standby
    run.notes.update(failovers=failovers)
    run.verdict.check("leader_failover", failovers >= 1, "the standby never took over")
    await rollout_checks(run, vms, since, rev, max_unavailable=1)
    await run.finish(entitled=w.tenants)


async def apiserver_restart(run: Run) -> None:
    """Restart kube-apiserver in the middle of the initial sync, then change entitlements."""
    n = 60 if run.mode == "long" else 20
    w = run.world = await build_world(run.env.api, tenants=n)
    await run.snapshot_foreign()
    ctl = run.controller(run.kubeconfig("direct", run.env.cp.server))
    await ctl.start()
    await asyncio.sleep(run.rng.uniform(0.8, 2.0))  # process start is ~1 s: this lands in or near the sync
    before = {k: r["metadata"]["uid"] for k, r in (await inv.owned_replicas(run.env.api, w.source)).items()}
    await asyncio.to_thread(run.env.cp.restart_apiserver)
    revoked = run.rng.choice(w.tenants)
    await fleet.set_vgpu(run.env.api, revoked, False)
    await w.add_tenant()
    await w.rotate(2)
    entitled = [t for t in w.tenants if t != revoked]
    rev = await w.revision()
    await eventually(lambda: w.replicas_at(entitled, rev), timeout=90, what="convergence after the restart")
    await eventually(lambda: _gone(w, [revoked]), timeout=60, what="revoked replica removed")
    await inv.check_replica_uids(run.env.api, run.verdict,
                                 {k: u for k, u in before.items() if k[0] != revoked})
    run.notes.update(replicas_before_restart=len(before))
    await run.finish(entitled=entitled)


async def _gone(w: World, namespaces: Iterable[str]) -> bool:
    have = await inv.owned_replicas(w.api, w.source)
    return all((ns, w.replica) not in have for ns in namespaces)


async def etcd_restart(run: Run) -> None:
    """Restart etcd in the middle of a rollout."""
    w = await kubevirt_world(run, tenants=3, ready_delay=run.rng.uniform(0.5, 1.0))
    _, vms, since, rev = await rotating_fleet(run, run.kubeconfig("kv", run.rig.proxy.url), per_tenant=2,
                                              max_unavailable="1")
    await asyncio.sleep(run.rng.uniform(0.5, 4.0))
    await asyncio.to_thread(run.env.cp.restart_etcd)
    await rollout_checks(run, vms, since, rev, max_unavailable=1)
    await run.finish(entitled=w.tenants)


async def watch_cuts(run: Run) -> None:
    """Cut every connection of the controller every few seconds during a rotation (plus stalls)."""
    w = await kubevirt_world(run, tenants=3, ready_delay=run.rng.uniform(0.5, 1.0))
    tcp = TcpProxy(run.rig.proxy.port)
    await tcp.start()
    run.proxies.append(tcp)
    _, vms, since, rev = await rotating_fleet(run, run.kubeconfig("tcp", tcp.url("https")), per_tenant=3,
                                              max_unavailable="2")
    cut_conns = 0
    deadline = time.monotonic() + 150
    while not await w.vms_done(vms, rev) and time.monotonic() < deadline:
        await asyncio.sleep(run.rng.uniform(1.0, 3.0))
        roll = run.rng.random()
        if roll < 0.15:
            tcp.stall(run.rng.uniform(0.5, 3.0))
        elif roll < 0.25:
            tcp.slow(run.rng.choice([0.0, 0.02, 0.1]))
        cut_conns += tcp.cut()
    tcp.slow(0.0)
    run.notes.update(cuts=tcp.cuts, connections_cut=cut_conns)
    await rollout_checks(run, vms, since, rev, max_unavailable=2)
    await run.finish(entitled=w.tenants)


async def http_error_bursts(run: Run) -> None:
    """429/500/503 bursts on every verb, and forced watch expiry (410), during a rotation."""
    w = await kubevirt_world(run, tenants=3, ready_delay=run.rng.uniform(0.5, 1.0))
    fp = FaultProxy(run.rig.proxy.url, run.env.cp.ca_path)
    await fp.start()
    run.proxies.append(fp)
    _, vms, since, rev = await rotating_fleet(run, run.kubeconfig("faulty", fp.url), per_tenant=3,
                                              max_unavailable="2")
    added = False
    window_end = time.monotonic() + (45 if run.mode == "long" else 20)
    while time.monotonic() < window_end and not await w.vms_done(vms, rev):
        await asyncio.sleep(run.rng.uniform(0.3, 1.5))
        if run.rng.random() < 0.2:
            fp.expire_watches()
        else:
            fp.burst(run.rng.choice([429, 500, 503]), run.rng.randint(3, 25), seconds=run.rng.uniform(0.5, 3.0),
                     methods=run.rng.choice([None, ["PUT"], ["PATCH"], ["GET"], ["POST", "PUT", "PATCH"]]))
        if not added and run.rng.random() < 0.3:
            await w.add_tenant()  # a new entitlement while the errors go on
            added = True
    fp.heal()
    run.notes.update({k: v for k, v in fp.stats.items() if k.startswith(("burst", "watch"))})
    await rollout_checks(run, vms, since, rev, max_unavailable=2)
    await eventually(lambda: w.replicas_at(w.tenants, rev), timeout=60, what="replicas everywhere")
    await run.finish(entitled=w.tenants)


async def list_fails_halfway(run: Run) -> None:
    """Every paged LIST fails on its second page while watches are forced to relist: zero deletions."""
    w = run.world = await build_world(run.env.api, tenants=12)
    await run.snapshot_foreign()
    fp = FaultProxy(run.env.cp.server, run.env.cp.ca_path, page_limit=3)
    await fp.start()
    run.proxies.append(fp)
    ctl = run.controller(run.kubeconfig("paged", fp.url))
    await ctl.start()
    await ctl.wait_ready()
    await eventually(lambda: w.replicas_present(w.tenants), timeout=60, what="initial replicas")
    before = {k: r["metadata"]["uid"] for k, r in (await inv.owned_replicas(run.env.api, w.source)).items()}
    # Break it: LIST pages with a continue token fail, every watch ends with 410 (relist needed).
    fp.fail_continue(None, status=run.rng.choice([500, 503, 410]))
    fp.expire_watches()
    revoked, unclaimed = run.rng.sample(w.tenants, 2)
    await fleet.set_vgpu(run.env.api, revoked, False)
    await fleet.delete_claim(run.env.api, unclaimed, "gpu")
    restarted = run.rng.random() < 0.5
    if restarted:  # a fresh process must not act on a partial first LIST either
        await ctl.kill()
        await ctl.start()
    hold = time.monotonic() + run.rng.uniform(4.0, 8.0)
    while time.monotonic() < hold:
        fp.expire_watches()
        await inv.check_replica_uids(run.env.api, run.verdict, before, invariant="zero_deletions_while_list_fails")
        await asyncio.sleep(0.5)
    run.notes.update(failed_pages=sum(v for k, v in fp.stats.items() if k.startswith("continue")),
                     controller_restarted=restarted)
    run.verdict.check("list_fault_injected", run.notes["failed_pages"] > 0, "no LIST page was failed")
    fp.heal()
    await ctl.wait_ready()
    entitled = [t for t in w.tenants if t not in (revoked, unclaimed)]
    await eventually(lambda: _gone(w, [revoked, unclaimed]), timeout=60, what="deletions after healing")
    await inv.check_replica_uids(run.env.api, run.verdict, {k: u for k, u in before.items()
                                                            if k[0] not in (revoked, unclaimed)})
    await run.finish(entitled=entitled)


def worst_minute(within: list[tuple[float, float]]) -> int:
    """The most deletions that surely fell in one 60 s window, each known only to lie between two moments."""
    return max((sum(1 for lo, hi in within if start <= lo and hi <= start + 60.0) for start, _ in within), default=0)


async def deletion_cap(run: Run) -> None:
    """Revoke a middle tenant above many namespaces: the deletion cap engages, then it completes."""
    long = run.mode == "long"
    n, cap = (5000, 2000) if long else (300, 200)
    w = run.world = await build_world(run.env.api, tenants=1)
    sibling = w.tenants[0]
    mid = await w.add_tenant(decoy=False, claim=False)
    mid_name = mid["metadata"]["name"]
    children: list[str] = []

    async def child() -> None:
        name = fleet.tenant_child_name(mid_name, unique("c"), w.root_name)
        await fleet.create_tenant(run.env.api, name, parent=mid, vgpu=True)
        await fleet.create_claim(run.env.api, name, "gpu", class_name=w.cls)
        children.append(name)

    await gather_bounded((child() for _ in range(n)), limit=32)
    w.tenants.extend(children)
    run.foreign_before = await inv.foreign_secrets(run.env.api, [w.source_ns, sibling], exclude=[w.source])
    ctl = run.controller(run.kubeconfig("direct", run.env.cp.server), deletions_per_minute=cap,
                         log_level="warning")
    await ctl.start()
    await ctl.wait_ready(timeout=180)
    expected = [sibling, *children]
    await eventually(lambda: w.replicas_present(expected), timeout=600 if long else 120, interval=1.0,
               what="every replica created")
    have = await inv.owned_replicas(run.env.api, w.source)
    sibling_uid = have[(sibling, w.replica)]["metadata"]["uid"]
    # Revoke the middle tenant; record between which two moments each replica disappeared: after the
    # LIST that still saw it started, before the LIST that no longer did returned (a busy machine's slow
    # poll shifts when a deletion is seen, never when it happened).
    gone_within: dict[str, tuple[float, float]] = {}
    t0 = time.monotonic()
    await fleet.set_vgpu(run.env.api, mid_name, False)
    cap_hits = 0.0
    deadline = t0 + (900 if long else 240)
    seen_since = t0
    while time.monotonic() < deadline:
        started = time.monotonic()
        have = await inv.owned_replicas(run.env.api, w.source)
        listed = time.monotonic()
        for c in children:
            if c not in gone_within and (c, w.replica) not in have:
                gone_within[c] = (seen_since, listed)
        seen_since = started
        s = await ctl.scrape()
        if s is not None:
            cap_hits = max(cap_hits, s.value("licensectl_deletion_cap_hits_total"))
        if len(gone_within) == len(children):
            break
        await asyncio.sleep(0.5)
    seconds = time.monotonic() - t0
    run.verdict.check("revocation_completes", len(gone_within) == len(children),
                      f"{len(children) - len(gone_within)} replicas still present after {seconds:.0f}s")
    run.verdict.check("deletion_cap_metric", cap_hits > 0, "licensectl_deletion_cap_hits_total stayed 0")
    evs = await CoreV1Api(run.env.api).list_namespaced_event(
        w.source_ns, field_selector=f"involvedObject.name={SOURCE_NAME}")
    run.verdict.check("deletion_cap_event", any(e.reason == "DeletionCapHit" for e in evs.items),
                      "no DeletionCapHit Event on the source Secret")
    worst = worst_minute(list(gone_within.values()))
    run.verdict.check("deletion_rate_within_cap", worst <= cap,
                      f"{worst} deletions surely within one minute (cap {cap})")
    await inv.check_replica_uids(run.env.api, run.verdict, {(sibling, w.replica): sibling_uid})
    run.notes.update(namespaces=n, cap_per_minute=cap, deletion_seconds=round(seconds, 1),
                     cap_hits=int(cap_hits), worst_window=worst)
    w.tenants = [sibling, mid_name]  # the secrecy/event scan covers the namespaces that matter
    await run.finish(entitled=[sibling])


WIDE_CLOCK_ENV = "LICENSECTL_FAULTS_WIDE_CLOCK"


async def clock_jumps(run: Run) -> None:
    """In-process controller whose clock steps forward and back (NTP steps) during a rollout.

    Revision times come from the controller's clock, VMI start times from the cluster's, so the
    rollout tolerates a controller/cluster offset smaller than the settle time (a restart is issued
    at revision time + settle). The default envelope keeps |offset| <= 8 s with settle 12 s and
    rotates 10 s after the fleet booted. Set LICENSECTL_FAULTS_WIDE_CLOCK=1 for steps beyond the
    settle time (see docs/reliability.md, open findings).
    """
    wide = os.environ.get(WIDE_CLOCK_ENV) == "1"
    settle, bound = (0.0, 30.0) if wide else (12.0, 8.0)
    w = await kubevirt_world(run, tenants=3, ready_delay=run.rng.uniform(0.5, 1.0))
    clock = JumpClock()
    kube = run.kubeconfig("kv-inproc", run.rig.proxy.url)
    base = w.base_settings(max_unavailable="1", settle_seconds=settle)
    base.pop("log_level")
    fields: dict[str, Any] = {k: (str(v) if k == "max_unavailable" else v) for k, v in base.items()}
    # In-process, with no webhook registered: the VMs mount their replica by hand, so no delivery probe
    # gates restarts (a webhook on the default port would be probed, never answer, and hold every restart).
    settings = dataclasses.replace(config.Settings(), kubeconfig=str(kube), namespace=w.controller_ns,
                                   metrics_address="127.0.0.1:0", reports_address="127.0.0.1:0",
                                   webhook_address="", **fields)
    app = App(settings, clock=clock)
    await app.start()
    run.apps.append(app)
    vms = await boot_fleet(run, 2)
    await eventually(lambda: app.rollout.plan is not None and sum(
        1 for s in app.rollout.plan.vmi_states.values() if s.state.value == "current") == len(vms),
        timeout=30, what="in-process controller sees the fleet current")
    if not wide:
        await asyncio.sleep(10.0)  # every VMI started more than the largest backward step before the rotation
    since, rev = await rotate_and_wait_replicas(run)
    jumps = 0
    deadline = time.monotonic() + 150
    while not await w.vms_done(vms, rev) and time.monotonic() < deadline:
        await asyncio.sleep(run.rng.uniform(0.5, 2.0))
        step = run.rng.choice([-1, 1]) * run.rng.uniform(1.0, 10.0 if wide else 4.0)
        clock.jump(max(-bound, min(bound, clock.offset + step)) - clock.offset)
        jumps += 1
        app._roll_trigger.set()
        app._repl_trigger.set()
    clock.offset = 0.0
    run.notes.update(clock_jumps=jumps, max_offset_seconds=round(max((abs(j) for j in clock.jumps), default=0), 1))
    await rollout_checks(run, vms, since, rev, max_unavailable=1)
    texts = [("in-process /metrics", generate_latest(app.metrics.registry).decode()),
             ("in-process /v1/status", json.dumps(app.status(), default=str))]
    run.extra_texts.extend(texts)
    await run.finish(entitled=w.tenants)


async def vmi_churn(run: Run) -> None:
    """Load: standalone VMIs are created and deleted in waves (20,000 in long mode, 1,500 short)
    while a rotation rolls out over the stable fleet. The controller must keep up (ready, bounded
    memory), restart exactly the stale fleet once, and never act on a churned VMI. Churned VMIs
    carry no license volume: they load the VMI watch, cache and planner, not the rollout limits."""
    long = run.mode == "long"
    total, wave = (20_000, 1_000) if long else (1_500, 250)
    w = await kubevirt_world(run, tenants=3, ready_delay=0.5)
    ctl, vms, since, rev = await rotating_fleet(run, run.kubeconfig("kv", run.rig.proxy.url), per_tenant=2,
                                                max_unavailable="2")
    co: Any = CustomObjectsApi(run.env.api)
    rss: list[int] = []

    def sample_rss() -> None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            for line in Path(f"/proc/{ctl.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss.append(int(line.split()[1]))

    async def create(ns: str, name: str) -> None:
        spec = fleet.vm_body(ns, name, license_secret=None)["spec"]["template"]["spec"]
        await co.create_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances", {
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": ns}, "spec": spec})

    async def delete(ns: str, name: str) -> None:
        with contextlib.suppress(ApiException):
            await co.delete_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances", name)

    churned = 0
    started = time.monotonic()
    while churned < total:
        names = [(w.tenants[(churned + i) % len(w.tenants)], f"churn-{churned + i}") for i in range(wave)]
        await gather_bounded((create(ns, n) for ns, n in names), limit=48)
        sample_rss()
        await gather_bounded((delete(ns, n) for ns, n in names), limit=48)
        sample_rss()
        churned += wave
    run.notes.update(churned=churned, churn_seconds=round(time.monotonic() - started, 1),
                     peak_rss_mib=round(max(rss or [0]) / 1024, 1))
    await rollout_checks(run, vms, since, rev, max_unavailable=2)
    assert run.rig is not None
    acted = [r for r in run.rig.record.restarts if r.vm.startswith("churn-")]
    run.verdict.check("churned_vmis_untouched", not acted, f"{len(acted)} restarts aimed at churned VMIs")
    scrape = await ctl.scrape()
    run.verdict.check("controller_keeps_up", scrape is not None and scrape.value("licensectl_ready") == 1.0,
                      "controller not ready after the churn")
    await run.finish(entitled=w.tenants)


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    name: str
    fn: Callable[[Run], Awaitable[None]]
    short_seeds: tuple[int, ...]
    long_seeds: tuple[int, ...]
    what: str


# The worker scenario uses this module's plumbing (Run, kubevirt_world, rollout_checks).
from .workers import worker_drain_faults  # noqa: E402

SCENARIOS: dict[str, Spec] = {s.name: s for s in (
    Spec("sigkill_rollout", sigkill_rollout, (1, 2), tuple(range(1, 11)),
         "controller SIGKILLed at random points mid-rollout, restarted each time"),
    Spec("restart_answers_lost", restart_answers_lost, (1,), (1, 2, 3),
         "virt-api acts on each restart but its answer is lost; controller SIGKILLed mid-rollout"),
    Spec("leader_failover", leader_failover, (1,), tuple(range(1, 6)),
         "two replicas, leader SIGKILLed mid-rollout, standby finishes"),
    Spec("apiserver_restart", apiserver_restart, (1,), (1, 2, 3),
         "kube-apiserver restarted mid-sync, entitlement changes and rotation"),
    Spec("etcd_restart", etcd_restart, (1,), (1, 2, 3), "etcd restarted mid-rollout"),
    Spec("watch_cuts", watch_cuts, (1,), tuple(range(1, 6)),
         "all connections cut every 1-3 s during a rotation, stalls, latency"),
    Spec("http_error_bursts", http_error_bursts, (1,), tuple(range(1, 6)),
         "429/500/503 bursts on every verb, forced 410 watch expiry"),
    Spec("list_fails_halfway", list_fails_halfway, (1,), tuple(range(1, 6)),
         "paged LISTs fail on page 2 while watches relist: zero deletions"),
    Spec("clock_jumps", clock_jumps, (1,), (1, 2, 3), "controller clock steps during a rollout"),
    Spec("vmi_churn", vmi_churn, (1,), (1,),
         "VMIs created and deleted in waves (short 1,500, long 20,000) while a rotation rolls out"),
    Spec("worker_drain_faults", worker_drain_faults, (1,), (1, 2, 3),
         "a tenant cluster's workers drained and restarted; controller SIGKILLed, tenant API cut, stalled, refused"),
    # Last: deleting its namespaces afterwards keeps the apiserver busy for minutes in long mode.
    Spec("deletion_cap", deletion_cap, (1,), (1,),
         "middle-tenant revocation above 300 (long: 5,000) namespaces under the deletion cap"),
)}


async def run_scenario(env: Env, spec: Spec, seed: int, mode: str) -> Outcome:
    """Run one (scenario, seed); an exception is a violation, teardown always happens."""
    rng = random.Random(f"{spec.name}:{seed}")
    run = Run(env, seed, mode, spec.name, rng)
    started = time.monotonic()
    try:
        await spec.fn(run)
    except Exception as e:
        run.verdict.check("scenario_completes", False, f"{type(e).__name__}: {e}"[:2000])
    finally:
        await run.close()
    return Outcome(spec.name, seed, run.verdict, time.monotonic() - started, run.notes)


@contextlib.asynccontextmanager
async def scenario_env(cp: ControlPlane, api: ApiClient, workdir: Path) -> AsyncIterator[Env]:
    yield Env(cp, api, workdir)
