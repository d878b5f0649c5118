"""One licensectl process: caches, the two reconcile loops, leader election and both listeners.

`App` is the imperative shell around the pure planners; tests and the demo run it in-process,
`licensectl run` runs it until SIGTERM. Shutdown order matters: stop taking reports, let the
current reconcile passes finish their writes, release the Lease, then close the caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api

from licensectl import __version__, config, logs
from licensectl.caches import Caches
from licensectl.controller import CONFLICT_RECHECK_SECONDS, ReplicationController
from licensectl.core_settings import tenant_settings
from licensectl.entitlement import customer_tenant
from licensectl.guest_report import GuestState
from licensectl.guests import GuestStore
from licensectl.kube import client as kclient
from licensectl.kube.events import EventRecorder
from licensectl.kube.kubevirt import KubevirtClient
from licensectl.kube.lease import ApiLeaseBackend, LeaderElector, LeaseConfig
from licensectl.kube.server_clock import ServerClock
from licensectl.kube.signing_key import SigningKeyStore
from licensectl.kube.watch import InformerHooks
from licensectl.kube.writer import SecretWriter
from licensectl.metrics import GaugeSample, Metrics
from licensectl.model import ANN_CLASS, DOMAIN
from licensectl.render import RenderedLicense
from licensectl.reports import EndpointLimits, make_reports_app
from licensectl.rollout_controller import RolloutController
from licensectl.server import make_internal_app, start_site

log = logs.get(__name__)

LEADER_LABEL = f"{DOMAIN}/leader"
Clock = Callable[[], dt.datetime]


class App:
    def __init__(self, settings: config.Settings, *, api_client: ApiClient | None = None,
                 clock: Clock | None = None, identity: str | None = None) -> None:
        self.settings = settings
        # Revision times and VMI start times must be judged on one clock: the apiserver's, learnt
        # from the Date headers of this process's own client (see `start`).
        self.server_clock = ServerClock()
        self.clock: Clock = clock or self.server_clock.now
        self._api_client = api_client
        self._own_client = api_client is None
        self.identity = identity or settings.pod_name or socket.gethostname()
        self.metrics = Metrics()
        self.guests = GuestStore(settings.report_interval_seconds)
        self._repl_trigger = asyncio.Event()
        self._roll_trigger = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._runners: list[web.AppRunner] = []
        self._stopping = False
        self._reports_open = False
        self._uuid_index: dict[tuple[str, str], str] | None = None
        self.metrics_port = 0
        self.reports_port = 0
        self.elector: LeaderElector | None = None
        self.started_at = time.monotonic()

    # -- wiring -------------------------------------------------------------------------------------
    @property
    def api(self) -> ApiClient:
        assert self._api_client is not None
        return self._api_client

    @property
    def is_leader(self) -> bool:
        return True if self.elector is None else self.elector.is_leader

    # Which loop reads which cache: an event wakes only the loops whose inputs it changed.
    REPLICATION_INPUTS = frozenset({"namespaces", "gpuclasses", "gpuclaims", "replicas", "source"})
    ROLLOUT_INPUTS = frozenset({"replicas", "source", "virtualmachines", "virtualmachineinstances"})

    def _count_request(self, verb: str, code: int) -> None:
        self.metrics.api_requests.labels(verb, str(code)).inc()

    def _changed(self, kind: str) -> None:
        if kind == "virtualmachineinstances":
            self._uuid_index = None
        if kind in self.REPLICATION_INPUTS:
            self._repl_trigger.set()
        if kind in self.ROLLOUT_INPUTS:
            self._roll_trigger.set()

    async def start(self) -> None:
        s = self.settings
        if self._api_client is None:
            tracing = kclient.request_tracing(on_request=self._count_request, clock=self.server_clock)
            self._api_client = await kclient.make_api_client(s, trace_configs=[tracing])
        hooks = InformerHooks(on_watch_restart=lambda inf, reason: self.metrics.watch_restarts.labels(
            inf.split(":")[0], reason).inc())
        self.caches = Caches(self.api, s, on_change=self._changed, hooks=hooks)
        self.events = EventRecorder(CoreV1Api(self.api), dry_run=s.dry_run, clock=self.clock)
        self.keys = SigningKeyStore(self.api, s.namespace, grace=dt.timedelta(seconds=s.key_grace_seconds),
                                    clock=self.clock, dry_run=s.dry_run)
        self.replication = ReplicationController(
            caches=self.caches, writer=SecretWriter(CoreV1Api(self.api), dry_run=s.dry_run), events=self.events,
            metrics=self.metrics, settings=s, credential_for=self._credential_for,
            report_url=config.report_url_for(s), clock=self.clock,
            gpu_class_api_version=f"{s.gpu_group}/{s.gpu_version}")
        self.rollout = RolloutController(
            caches=self.caches,
            kubevirt=KubevirtClient(self.api, dry_run=s.dry_run, fallback_delete=s.restart_fallback_delete),
            events=self.events, metrics=self.metrics, settings=s, guests=self.guests, clock=self.clock)
        self.metrics.snapshots.add(self._samples)

        internal = make_internal_app(self.metrics, ready=self.ready, healthy=self.healthy, status=self.status)
        runner, self.metrics_port = await start_site(internal, s.metrics_address)
        self._runners.append(runner)
        reports = make_reports_app(
            keyring_provider=self._keyring_for_reports, uuid_known=self._uuid_known, token_sha_for=self._token_sha,
            on_report=self._on_report, on_result=lambda r: self.metrics.reports_total.labels(r).inc(),
            limits=EndpointLimits(key_grace=dt.timedelta(seconds=s.key_grace_seconds)), clock=self.clock)
        runner, self.reports_port = await start_site(reports, s.reports_address)
        self._runners.append(runner)
        self._reports_open = True

        self.caches.start()
        if s.leader_elect:
            # A container restarted after a crash keeps its pod, and the pod keeps the leader label
            # its previous run set: clear it before campaigning, or the reports Service would keep
            # routing guests to this (now standby) replica.
            await self._label_pod(False)
            self.elector = LeaderElector(ApiLeaseBackend(self.api), LeaseConfig(
                namespace=s.namespace, name=s.lease_name, identity=self.identity,
                lease_duration=s.lease_duration_seconds, renew_deadline=s.renew_deadline_seconds,
                retry_period=s.retry_period_seconds), on_change=self._leadership_changed, wall=self.clock)
            self._tasks.append(asyncio.create_task(self.elector.run(), name="leader-election"))
        else:
            self.guests.start_receiving(self.clock())
        self._tasks.append(asyncio.create_task(self._loop("replication", self._repl_trigger, self._replicate)))
        self._tasks.append(asyncio.create_task(self._loop("rollout", self._roll_trigger, self._roll)))
        log.info("licensectl started", version=__version__, identity=self.identity, metrics_port=self.metrics_port,
                 reports_port=self.reports_port, leader_elect=s.leader_elect, dry_run=s.dry_run)

    async def stop(self) -> None:
        """Graceful: no new reports, finish the current passes, release the Lease, close caches."""
        self._stopping = True
        self._reports_open = False
        for runner in reversed(self._runners[1:]):
            await runner.cleanup()
        self._repl_trigger.set()
        self._roll_trigger.set()
        loops = [t for t in self._tasks if t.get_name() != "leader-election"]
        _, pending = await asyncio.wait(loops, timeout=30) if loops else (set(), set())
        for t in pending:
            t.cancel()
        for t in self._tasks:
            if t.get_name() == "leader-election":
                t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.elector is not None:
            await self.elector.release()
            await self._label_pod(False)
        await self.caches.stop()
        if self._runners:
            await self._runners[0].cleanup()
        self._runners.clear()
        if self._own_client and self._api_client is not None:
            await self._api_client.close()
        log.info("licensectl stopped")

    # -- loops --------------------------------------------------------------------------------------
    async def _loop(self, name: str, trigger: asyncio.Event, step: Callable[[], Awaitable[float | None]]) -> None:
        resync = self.settings.resync_seconds
        failures = 0
        while not self._stopping:
            wait: float | None
            try:
                wait = await step()
                failures = 0
            except Exception as e:
                failures += 1
                wait = min(30.0, 0.5 * 2 ** min(failures, 6))
                log.warning("reconcile failed", loop=name, error=type(e).__name__, status=getattr(e, "status", None),
                            retry_in=wait)
            if self._stopping:
                return
            timeout = resync if wait is None else max(0.05, min(wait, resync))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(trigger.wait(), timeout)
            trigger.clear()
            await asyncio.sleep(0.05)  # coalesce bursts of watch events into one pass

    async def _replicate(self) -> float | None:
        if not self.caches.core_synced():
            return 0.2
        leader = self.is_leader
        if self.keys.keyring is None or leader:
            await self.keys.refresh(create=leader)
        if self.keys.keyring is None and not self.settings.dry_run:
            return 1.0  # no credential to write yet: replicas would be unusable for reports
        await self.replication.reconcile(leader=leader)
        waits = [w for w in (self.replication.retry_after,
                             CONFLICT_RECHECK_SECONDS if self.replication.status.conflicts else None) if w]
        return min(waits) if waits else None

    async def _roll(self) -> float | None:
        plan = await self.rollout.reconcile(leader=self.is_leader)
        if plan is None:
            return 0.5
        if self.rollout.awaiting_own_writes:
            return 0.2
        if plan.next_wakeup is None:
            return None
        return max(0.1, (plan.next_wakeup - self.clock()).total_seconds())

    def _leadership_changed(self, leader: bool) -> None:
        if leader:
            self.guests.start_receiving(self.clock())
        else:
            self.guests.stop_receiving()
        self._repl_trigger.set()
        self._roll_trigger.set()
        if not self._stopping:
            self._tasks.append(asyncio.create_task(self._label_pod(leader), name="label-pod"))

    async def _label_pod(self, leader: bool) -> None:
        """The reports Service selects the leader's pod by this label (see docs/operations.md)."""
        if not self.settings.pod_name:
            return
        body = {"metadata": {"labels": {LEADER_LABEL: "true" if leader else None}}}
        try:
            await CoreV1Api(self.api).patch_namespaced_pod(self.settings.pod_name, self.settings.namespace, body)
        except (ApiException, OSError) as e:
            log.warning("could not label own pod", pod=self.settings.pod_name, error=type(e).__name__)

    # -- reports ------------------------------------------------------------------------------------
    def _credential_for(self, namespace: str) -> str:
        ring = self.keys.keyring
        return ring.credential(namespace) if ring is not None else ""

    def _keyring_for_reports(self) -> Any:
        if not self._reports_open or not self.is_leader:
            return None  # standbys answer 503 so the probe retries against the leader
        return self.keys.keyring

    def _uuid_known(self, namespace: str, uuid: str) -> str | None:
        if self._uuid_index is None:
            vmis = self.caches.vmis
            index: dict[tuple[str, str], str] = {}
            if vmis is not None:
                for v in vmis.cache.values():
                    if v.firmware_uuid:
                        index[(v.namespace, v.firmware_uuid.lower())] = v.name
            self._uuid_index = index
        return self._uuid_index.get((namespace, uuid.lower()))

    def _mounted_license(self, namespace: str, vmi: str) -> RenderedLicense | None:
        """The rendered license of the replica a VMI mounts: what its guest must hold."""
        plan = self.replication.status.plan
        v = self.caches.vmis.cache.get((namespace, vmi)) if self.caches.vmis else None
        if plan is None or v is None:
            return None
        for secret_name in v.secret_volumes:
            r = self.caches.replicas.cache.get((namespace, secret_name))
            if r is not None and r.owned:
                lic = plan.licenses.get(r.annotations.get(ANN_CLASS, ""))
                if lic is not None:
                    return lic
        return None

    def _token_sha(self, namespace: str, vmi: str) -> str | None:
        lic = self._mounted_license(namespace, vmi)
        return None if lic is None else lic.token_sha256

    def _feature_type(self, namespace: str, vmi: str) -> int | None:
        lic = self._mounted_license(namespace, vmi)
        return None if lic is None else lic.feature_type

    def _on_report(self, namespace: str, vmi: str, state: GuestState) -> None:
        self.guests.record(namespace, vmi, state, feature_type=self._feature_type(namespace, vmi))
        self._roll_trigger.set()

    def affected_vmis(self) -> list[tuple[str, str]]:
        """VMIs that mount a licensectl replica: the guests we expect reports from."""
        vmis = self.caches.vmis
        if vmis is None:
            return []
        replicas = self.caches.replicas.cache
        return [(v.namespace, v.name) for v in vmis.cache.values()
                if any((v.namespace, s) in replicas for s in v.secret_volumes)]

    # -- health, metrics, status --------------------------------------------------------------------
    def ready(self) -> bool:
        return not self._stopping and self.caches.core_synced()

    def healthy(self) -> bool:
        return not self._stopping and all(t.done() is False for t in self._tasks if t.get_name() != "label-pod")

    def _samples(self) -> list[GaugeSample]:
        now = self.clock()
        live = self.affected_vmis()
        self.guests.prune(live)
        out: list[GaugeSample] = []
        # Which pod exports what (docs/operations.md#which-pod-exports-what): replication series from
        # every replica (the same watched cluster state, so `max` over pods is exact and a failover
        # leaves no gap); rollout and guest series only from the leader, the one replica that holds
        # the guest reports they depend on.
        out.extend(self.replication.samples())
        if self.is_leader:
            out.extend(self.rollout.samples())
            out.extend(self.guests.samples(now, live, tenant_of=self._tenant_of(),
                                           per_vmi=self.settings.guest_metrics == "per-vmi"))
        out.append(GaugeSample("leader", (), 1.0 if self.is_leader else 0.0))
        out.append(GaugeSample("ready", (), 1.0 if self.ready() else 0.0))
        return out

    def _tenant_of(self) -> Callable[[str], str]:
        """Namespace -> its customer tenant, from the namespace cache (entitlement.customer_tenant)."""
        namespaces = {k[1]: v for k, v in self.caches.namespaces.cache.items()}
        settings = tenant_settings(self.settings)
        return lambda ns: customer_tenant(ns, namespaces, settings)

    def status(self) -> dict[str, Any]:
        now = self.clock()
        live = self.affected_vmis()
        return {
            "version": __version__,
            "identity": self.identity,
            "leader": self.is_leader,
            "ready": self.ready(),
            "replication": self.replication.status_dict(),
            "rollout": self.rollout.status_dict(),
            "guests": {
                "counts": self.guests.counts(now, live),
                "list": [{"namespace": v.namespace, "vmi": v.vmi, "state": v.state,
                          "product": v.report.product if v.report else None,
                          "expiry": v.report.expiry.isoformat() if v.report and v.report.expiry else None,
                          "token_current": v.report.token_current if v.report else None,
                          "reason": v.reason, "wrong_product": v.wrong_product}
                         for v in self.guests.views(now, live)],
            },
        }


async def run(settings: config.Settings) -> int:
    """`licensectl run`: until SIGTERM/SIGINT, then a graceful stop."""
    logs.configure(settings.log_format, settings.log_level)
    app = App(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await app.start()
    except Exception as e:
        log.error("start failed", error=str(e) if not isinstance(e, ApiException) else f"HTTP {e.status}")
        return 1
    await stop.wait()
    log.info("signal received, shutting down", pid=os.getpid())
    await app.stop()
    return 0
