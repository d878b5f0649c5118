"""One licensectl process: caches, the two reconcile loops, leader election and both listeners.

`App` is the composition root around the pure planners: it builds the adapters (kube/), hands
them to the controllers as the ports they take (core/ports.py), and runs the two loops in the pass
order written in licensectl/controllers/__init__.py. The fleet-wide questions (what admission would
deliver, which VMIs expect reports, which keys they may hold) are `controllers.fleet.FleetView`'s.
Tests and the demo run it in-process, `licensectl run` runs it until SIGTERM. Shutdown order matters:
stop taking reports, let the current reconcile passes finish their writes, release the Lease, then
close the caches.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from licensectl import __version__, config, event_loop, logs
from licensectl.controllers.credentials import KeyringCredentials
from licensectl.controllers.delivery_probe import DeliveryProbe
from licensectl.controllers.fleet import FleetView
from licensectl.controllers.guests import GuestStore
from licensectl.controllers.replication_loop import CONFLICT_RECHECK_SECONDS, ReplicationController
from licensectl.controllers.restart_preflight import RestartGate
from licensectl.controllers.rollout_loop import RolloutController
from licensectl.controllers.rotation import RotationController
from licensectl.controllers.runner import (
    IDLE,
    Pacing,
    Result,
    TaskRunner,
    keep_heap_frozen,
    measure_gc_pauses,
    measure_loop_lag,
    reconcile_loop,
)
from licensectl.controllers.worker_drain import WorkerDrainer
from licensectl.core import boot_image
from licensectl.core import readiness as health
from licensectl.core.delivery import Skip
from licensectl.core.guest_report import GuestState
from licensectl.core.model import DOMAIN
from licensectl.core.ports import Credentials
from licensectl.kube import client as kclient
from licensectl.kube.admission_probe import VmiDryRunApi
from licensectl.kube.api import AnyClient, ApiException, CoreV1Api
from licensectl.kube.caches import Caches
from licensectl.kube.cluster_api import ClusterApiReader
from licensectl.kube.events import EventRecorder
from licensectl.kube.kubevirt import KubevirtClient
from licensectl.kube.lease import ApiLeaseBackend, LeaderElector, LeaseConfig
from licensectl.kube.preflight import VmPreflightApi
from licensectl.kube.rotation_store import ApiRevisionStores
from licensectl.kube.server_clock import ServerClock
from licensectl.kube.serving_tls import ServingTLS
from licensectl.kube.signing_key import SigningKeyStore
from licensectl.kube.tenant import TenantClusters
from licensectl.kube.watch import InformerHooks
from licensectl.kube.writer import SecretWriter
from licensectl.metrics import Deferred, GaugeSample, Metrics
from licensectl.serve.admission_outcomes import AdmissionOutcomes
from licensectl.serve.http import make_internal_app, start_site
from licensectl.serve.reports import EndpointLimits, make_reports_app
from licensectl.serve.webhook import WebhookServer, make_webhook_app

log = logs.get(__name__)

LEADER_LABEL = f"{DOMAIN}/leader"
# How each loop spaces its passes (controllers/runner.py Pacing, docs/design.md#webhook-thread). The
# rollout plans over every VMI: VMI churn (tens of creations a second) or a rotation's replica writes (one
# watch event each) would otherwise re-plan the fleet back to back, holding the interpreter while replica
# writes and admission answers wait. Restarts are paced in seconds, so half a second (or twice the last
# plan's CPU time, at most 5 s) costs nothing.
PACING = {"replication": Pacing(coalesce=0.05), "rollout": Pacing(coalesce=0.5, idle_per_busy=2.0, max_idle=5.0)}
Clock = Callable[[], dt.datetime]

# Why a pass asks to run again soon rather than at the next event or resync.
WAIT_FOR_CACHES = Result.after(0.2)  # the core caches have not completed their first LIST
NO_CREDENTIAL_YET = Result.after(1.0)  # no signing key: replicas written now would be unusable for reports
WAIT_FOR_ROLLOUT_CACHES = Result.after(0.5)  # the rollout cannot plan yet (KubeVirt caches not synced)
WAIT_FOR_OWN_WRITES = Result.after(0.2)  # the watch cache has not shown the last pass's VM writes yet


class App:
    def __init__(self, settings: config.Settings, *, api_client: AnyClient | None = None,
                 clock: Clock | None = None, identity: str | None = None) -> None:
        self.settings = settings
        # Revision times and VMI start times must be judged on one clock: the apiserver's, learnt
        # from the Date headers of this process's own client (see `start`).
        self.server_clock = ServerClock()
        self.clock: Clock = clock or self.server_clock.now
        # A replica's revision time is stamped with the latest the apiserver's clock can read: a VMI that
        # started before the write is then never judged started after it (docs/design.md#decision-stale-rule).
        self.stamp_clock: Clock = clock or self.server_clock.latest
        self._api_client = api_client
        self._own_client = api_client is None
        self.identity = identity or settings.pod_name or socket.gethostname()
        self.metrics = Metrics()
        for verdict in boot_image.Verdict:
            self.metrics.webhook_boot_image.labels(verdict.value)
        for skip in Skip:  # a bounded set: every reason starts at 0, so increase() is 0, not empty
            self.metrics.webhook_skipped.labels(skip.value)
        self.guests = GuestStore(settings.report_interval_seconds,
                                 boot_allowance_seconds=settings.guest_boot_allowance_seconds)
        self._repl_trigger = asyncio.Event()
        self._roll_trigger = asyncio.Event()
        self.tasks = TaskRunner()
        self._runners: list[web.AppRunner] = []
        self._stopping = False
        self._reports_open = False
        self.metrics_port = 0
        self.reports_port = 0
        self.webhook_port = 0
        self.webhook: WebhookServer | None = None
        self.delivery_probe: DeliveryProbe | None = None
        self.elector: LeaderElector | None = None
        self.started_at = time.monotonic()

    # -- wiring -------------------------------------------------------------------------------------
    @property
    def api(self) -> AnyClient:
        assert self._api_client is not None
        return self._api_client

    @property
    def is_leader(self) -> bool:
        return True if self.elector is None else self.elector.is_leader

    # Which loop reads which cache: an event wakes only the loops whose inputs it changed.
    REPLICATION_INPUTS = frozenset({"namespaces", "gpuclasses", "gpuclaims", "replicas", "source", "revisionstores"})
    ROLLOUT_INPUTS = frozenset({"replicas", "source", "virtualmachines", "virtualmachineinstances",
                                "revisionstores"})

    def _count_request(self, verb: str, code: int) -> None:
        self.metrics.api_requests.labels(verb, str(code)).inc()

    def _changed(self, kind: str) -> None:
        if kind == "virtualmachineinstances":
            self.fleet.vmis_changed()
        if kind in self.REPLICATION_INPUTS:
            self._repl_trigger.set()
        if kind in self.ROLLOUT_INPUTS:
            self._roll_trigger.set()

    async def start(self) -> None:
        s = self.settings
        if self._api_client is None:
            tracing = kclient.request_tracing(on_request=self._count_request, clock=self.server_clock)
            self._api_client = await kclient.make_api_client(s, trace_configs=[tracing])
        hooks = InformerHooks(
            on_watch_restart=lambda inf, reason: self.metrics.watch_restarts.labels(inf.split(":")[0], reason).inc(),
            on_list=lambda inf, result, _objects, seconds: self.metrics.informer_lists.labels(
                inf.split(":")[0], result).observe(seconds))
        self.caches = Caches(self.api, s, on_change=self._changed, hooks=hooks)
        self.fleet = fleet = FleetView(self.caches, s)
        self.events = EventRecorder(CoreV1Api(self.api), dry_run=s.dry_run, clock=self.clock)
        self.keys = SigningKeyStore(self.api, s.namespace, grace=dt.timedelta(seconds=s.key_grace_seconds),
                                    clock=self.clock, dry_run=s.dry_run)
        # One serving certificate for the HTTPS listeners (docs/operations.md#serving-tls).
        self.tls = ServingTLS(self.api, s, is_leader=lambda: self.elector.is_leader if self.elector else not
                              s.leader_elect, clock=self.clock, metrics=self.metrics, events=self.events,
                              on_ca_change=self._repl_trigger.set)
        self.credentials: Credentials = KeyringCredentials(self.keys, self.tls, plain_http=s.reports_plain_http)
        creds = self.credentials
        self.replication = ReplicationController(
            caches=self.caches, writer=SecretWriter(CoreV1Api(self.api), dry_run=s.dry_run), events=self.events,
            metrics=self.metrics, settings=s, credentials=creds, report_url=config.report_url_for(s),
            clock=self.stamp_clock, gpu_class_api_version=f"{s.gpu_group}/{s.gpu_version}", rotations=fleet.rotations)
        # Evidence that a restarted VMI would get its volume (docs/design.md#delivery-readiness): only where
        # this deployment runs the webhook; without one, VM templates mount their replica themselves.
        if s.webhook_address:
            self.delivery_probe = DeliveryProbe(VmiDryRunApi.for_client(self.api), s.namespace, metrics=self.metrics,
                                                on_change=lambda _ready: self._roll_trigger.set(),
                                                active=lambda: self.is_leader)
        kubevirt = KubevirtClient(self.api, dry_run=s.dry_run, fallback_delete=s.restart_fallback_delete)
        self.rollout = RolloutController(
            caches=self.caches, kubevirt=kubevirt,
            events=self.events, metrics=self.metrics, settings=s, guests=self.guests, clock=self.clock,
            wanted=fleet.wanted_volumes, token_sha_for=fleet.token_sha, delivery_ready=fleet.delivery_ready,
            drainer=(drainer := WorkerDrainer(
                cluster_api=ClusterApiReader.for_client(self.api), tenants=TenantClusters(self.api), kubevirt=kubevirt,
                events=self.events, metrics=self.metrics, settings=s, clock=self.clock,
                wake_rollout=self._roll_trigger.set, watch_kubeconfigs=self.caches.ensure_kubeconfigs,
                active=lambda: self.is_leader)),
            preflight=RestartGate(VmPreflightApi(self.api), kubevirt=kubevirt, events=self.events,
                                  metrics=self.metrics, clock=self.clock),
            on_volume_missing=self.delivery_probe.recheck if self.delivery_probe is not None else lambda: None)
        self.caches.on_kubeconfig = drainer.kick
        self.rotation = RotationController(
            caches=self.caches, stores=ApiRevisionStores(CoreV1Api(self.api), namespace=s.namespace,
                                                         token_key=s.token_key),
            events=self.events, metrics=self.metrics, settings=s, guests=self.guests, clock=self.clock,
            inputs=fleet)
        fleet.attach(replication=self.replication, rollout=self.rollout, rotation=self.rotation,
                     delivery_probe=self.delivery_probe)
        self.metrics.snapshots.add(self._samples)

        await self.tls.start()
        internal = make_internal_app(self.metrics, ready=self.readiness, live=self.liveness, status=self.status)
        runner, self.metrics_port = await start_site(internal, s.metrics_address)
        self._runners.append(runner)
        reports = make_reports_app(
            keyring_provider=self._keyring_for_reports, uuid_known=fleet.uuid_known, token_sha_for=fleet.token_sha,
            on_report=self._on_report, on_result=lambda r: self.metrics.reports_total.labels(r).inc(),
            limits=EndpointLimits(), clock=self.clock)
        runner, self.reports_port = await start_site(
            reports, s.reports_address, ssl_context=None if s.reports_plain_http else self.tls.context)
        self._runners.append(runner)
        self._reports_open = True
        if s.webhook_address:
            # Every replica answers admission, leader or not (docs/operations.md#license-delivery),
            # from its own thread and loop (docs/design.md#webhook-thread).
            outcomes = AdmissionOutcomes(metrics=self.metrics, events=self.events, loop=asyncio.get_running_loop(),
                                         spawn=self.tasks.spawn, is_leader=lambda: self.is_leader,
                                         enforce=s.vgpu_driver_check == "enforce")
            # The boot image check (docs/design.md#boot-image-mark): warnings from the mutating webhook,
            # denials from the validating one only with --vgpu-driver-check=enforce.
            check = None if s.vgpu_driver_check == "off" else fleet.check_boot
            check_vm = None if s.vgpu_driver_check == "off" else fleet.check_vm_boot
            self.webhook = WebhookServer(make_webhook_app(
                decide=fleet.admit, on_admission=outcomes.on_admission, check_boot=check, check_vm_boot=check_vm,
                enforce=s.vgpu_driver_check == "enforce", on_validation=outcomes.on_validation,
                probe_namespace=s.namespace, probe_answer=self._probe_answer), s.webhook_address)
            self.tls.subscribe(self.webhook.reload)
            self.webhook_port = await asyncio.to_thread(self.webhook.start)

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
            self.tasks.start_daemon("leader-election", self.elector.run())
        else:
            self.guests.start_receiving(self.clock())
        self.tasks.start_loop("replication", self._loop("replication", self._repl_trigger, self._replicate))
        self.tasks.start_loop("rollout", self._loop("rollout", self._roll_trigger, self._roll))
        if self.delivery_probe is not None:
            self.tasks.start_daemon("delivery-probe", self.delivery_probe.run())
        self.tasks.start_daemon("guest-prune", self._prune_guests())
        self.tasks.start_daemon("loop-lag", measure_loop_lag(self.metrics.loop_lag.observe))
        self.tasks.start_daemon("heap-freeze", keep_heap_frozen(
            lambda: self.caches.core_synced() and (self.caches.vmis is None or self.caches.kubevirt_healthy())))
        self.tasks.start_daemon("gc-pauses", measure_gc_pauses(
            lambda generation, seconds: self.metrics.gc_pauses.labels(str(generation)).observe(seconds)))
        log.info("licensectl started", version=__version__, identity=self.identity, metrics_port=self.metrics_port,
                 reports_port=self.reports_port, leader_elect=s.leader_elect, dry_run=s.dry_run)

    async def stop(self) -> None:
        """Graceful: no new reports, finish the current passes, release the Lease, close caches."""
        self._stopping = True
        self._reports_open = False
        for runner in reversed(self._runners[1:]):
            await runner.cleanup()
        if self.webhook is not None:
            await asyncio.to_thread(self.webhook.stop)
        self._repl_trigger.set()
        self._roll_trigger.set()
        await self.tasks.stop()  # the passes finish (and the pod label lands), then the elector is cancelled
        if self.rollout.drainer is not None:
            await self.rollout.drainer.stop()  # no tenant cluster task outlives the passes (nor the Lease)
        self.rollout.close()
        self.replication.close()
        if self.elector is not None:
            await self.elector.release()
            await self._label_pod(False)
        await self.caches.stop()
        await self.tls.stop()
        if self._runners:
            await self._runners[0].cleanup()
        self._runners.clear()
        if self._own_client and self._api_client is not None:
            await self._api_client.close()
        log.info("licensectl stopped")

    # -- loops --------------------------------------------------------------------------------------
    async def _loop(self, name: str, trigger: asyncio.Event, step: Callable[[], Awaitable[Result]]) -> None:
        busy = (lambda: self.rollout.plan_cpu_seconds) if name == "rollout" else None
        await reconcile_loop(name, step, trigger=trigger, resync=self.settings.resync_seconds,
                             pacing=PACING.get(name, Pacing(coalesce=0.05)), stopping=lambda: self._stopping,
                             busy=busy)

    # The two passes follow the order in licensectl/controllers/__init__.py: keep them in step.
    async def _replicate(self) -> Result:
        if not self.caches.core_synced():
            return WAIT_FOR_CACHES
        leader = self.is_leader
        if self.keys.keyring is None or leader:
            await self.keys.refresh(create=leader)
        if self.keys.keyring is None and not self.settings.dry_run:
            return NO_CREDENTIAL_YET
        await self.replication.reconcile(leader=leader)
        await self.rotation.reconcile(leader=leader)
        # The deletion cap frees up, or a foreign Secret holding a replica's name is due a re-check.
        waits = [w for w in (self.replication.retry_after,
                             CONFLICT_RECHECK_SECONDS if self.replication.status.conflicts else None) if w]
        return Result.after(min(waits)) if waits else IDLE

    async def _roll(self) -> Result:
        plan = await self.rollout.reconcile(leader=self.is_leader)
        if plan is None:
            return WAIT_FOR_ROLLOUT_CACHES
        # The rotation reads what the rollout just decided (docs/design.md#safe-rotation).
        await self.rotation.reconcile(leader=self.is_leader)
        # Key holders are VMIs, so the pass that sees VMIs come and go retires keys (docs/design.md#key-ring).
        prune_due = await self._prune_keys() if self.is_leader else None
        if self.rollout.awaiting_own_writes:
            return WAIT_FOR_OWN_WRITES
        # A settle period ends, a restart is due a re-issue, a rotation wave is due its analysis, or an
        # unheld signing key its retirement.
        wakeups = [t for t in (plan.next_wakeup, self.rotation.next_check, prune_due,
                               self.rollout.drain_wakeup if self.is_leader else None) if t is not None]
        if not wakeups:
            return IDLE
        return Result.after(max(0.1, (min(wakeups) - self.clock()).total_seconds()))

    def _leadership_changed(self, leader: bool) -> None:
        if leader:
            self.guests.start_receiving(self.clock())
        else:
            self.guests.stop_receiving()
            if self.rollout.drainer is not None and not self._stopping:
                self.tasks.spawn("drain-stop", self.rollout.drainer.stop())  # tenant cluster tasks are the leader's
        self._repl_trigger.set()
        self._roll_trigger.set()
        self.tls.wake()  # a new leader renews the certificate and the webhook caBundle if due
        if self.delivery_probe is not None:
            self.delivery_probe.wake()  # fresh evidence before the new leader's first restart
        if not self._stopping:
            self.tasks.spawn("label-pod", self._label_pod(leader))

    async def _label_pod(self, leader: bool) -> None:
        """The reports Service selects the leader's pod by this label (see docs/operations.md)."""
        if not self.settings.pod_name:
            return
        body = {"metadata": {"labels": {LEADER_LABEL: "true" if leader else None}}}
        try:
            await CoreV1Api(self.api).patch_namespaced_pod(self.settings.pod_name, self.settings.namespace, body)
        except (ApiException, OSError) as e:
            log.warning("could not label own pod", pod=self.settings.pod_name, error=type(e).__name__)

    # -- admission ----------------------------------------------------------------------------------
    def delivery_ready(self) -> bool:
        """The rollout's gate for restarts: evidence that admission delivers (True without a webhook)."""
        return self.fleet.delivery_ready()

    def _probe_answer(self) -> str | None:
        """Webhook thread: a delivery probe is answered only by a replica that could deliver now."""
        return self.identity if self.fleet.delivery_view() is not None else None

    # -- reports ------------------------------------------------------------------------------------
    async def _prune_keys(self) -> dt.datetime | None:
        """Retire older signing keys no running VMI holds; a failed write is retried. Returns when an
        unheld key may be retired next (the pass comes back then), or None."""
        holders = self.fleet.key_holders()
        try:
            await self.keys.prune(holders)
        except (ApiException, ValueError, RuntimeError) as e:
            log.warning("could not retire signing keys", error=str(e) if not isinstance(e, ApiException)
                        else f"HTTP {e.status}")
            return self.clock() + dt.timedelta(seconds=5)
        return self.keys.next_prune_at(holders)

    def _keyring_for_reports(self) -> Any:
        if not self._reports_open or not self.is_leader:
            return None  # standbys answer 503 so the probe retries against the leader
        return self.keys.keyring

    def _on_report(self, namespace: str, vmi: str, state: GuestState) -> None:
        self.guests.record(namespace, vmi, state, feature_type=self.fleet.feature_type(namespace, vmi))
        self._roll_trigger.set()

    async def _prune_guests(self) -> None:
        """Forget the reports of guests whose VMI is gone, on a schedule of its own (a scrape only reads),
        and only from a synced, healthy VMI cache: a failed LIST is never read as every VMI gone."""
        while True:
            await asyncio.sleep(max(1.0, self.settings.report_interval_seconds))
            c = self.caches
            if c.vmis is not None and c.core_synced() and c.kubevirt_healthy():
                self.guests.prune(self.fleet.affected_vmis())

    # -- health, metrics, status --------------------------------------------------------------------
    def readiness(self) -> health.Readiness:
        """/readyz: can this replica answer admission correctly now (docs/design.md#readiness)."""
        tls_needed = not (self.settings.reports_plain_http and not self.settings.webhook_address)
        return health.readiness(
            stopping=self._stopping, caches_synced=self.caches.core_synced(),
            admission_decidable=not self.settings.webhook_address or self.fleet.delivery_view() is not None,
            tls_ready=self.tls.ready or not tls_needed, stale_seconds=self.caches.core_stale_seconds())

    def ready(self) -> bool:
        return self.readiness().ready

    def _report_ca(self) -> bytes:
        """The CA bundle guests verify the reports listener with (none over plain HTTP)."""
        return self.credentials.report_ca()

    def liveness(self) -> health.Readiness:
        """/livez: the loops and listeners run; the apiserver's health never enters (docs/design.md#readiness)."""
        return health.liveness(stopping=self._stopping, loops_healthy=self.tasks.healthy())

    def healthy(self) -> bool:
        return not self._stopping and self.tasks.healthy()

    def _samples(self) -> list[GaugeSample | Deferred]:
        now = self.clock()
        live = self.fleet.affected_vmis()
        out: list[GaugeSample | Deferred] = []
        # Which pod exports what (docs/operations.md#which-pod-exports-what): replication series from
        # every replica (the same watched cluster state, so `max` over pods is exact and a failover
        # leaves no gap); rollout and guest series only from the leader, the one replica that holds
        # the guest reports they depend on.
        out.extend(self.replication.samples())
        out.extend(self.rotation.samples())
        if self.is_leader:
            out.extend(self.rollout.samples())
            if self.rollout.drainer is not None and self.caches.vms is not None:
                out.extend(self.rollout.drainer.samples(self.caches.vms.cache.values()))
            if self.rollout.preflight is not None and self.caches.vms is not None:
                out.extend(self.rollout.preflight.samples(self.rollout.plan, self.caches.vms.cache))
            # The per-guest walk runs in the render thread, over copies taken here (metrics.Deferred).
            guests, tenant_of, started = self.guests.copy(), self.fleet.tenant_of(), self.fleet.vmi_starts()
            per_vmi = self.settings.guest_metrics == "per-vmi"
            token_sha = self.fleet.token_sha  # key lookups in the live caches only, safe from the render thread
            out.append(Deferred(lambda: guests.samples(now, live, tenant_of=tenant_of, started=started,
                                                       per_vmi=per_vmi, token_sha_for=token_sha)))
        if self.delivery_probe is not None:
            out.extend(self.delivery_probe.samples())
        out.extend(self.tls.samples())
        out.append(GaugeSample("leader", (), 1.0 if self.is_leader else 0.0))
        out.append(GaugeSample("ready", (), 1.0 if self.ready() else 0.0))
        return out

    def status(self) -> dict[str, Any]:
        now = self.clock()
        live = self.fleet.affected_vmis()
        started = self.fleet.vmi_starts()
        return {
            "version": __version__,
            "identity": self.identity,
            "leader": self.is_leader,
            "ready": self.ready(),
            "replication": self.replication.status_dict(),
            "rollout": self.rollout.status_dict(),
            "rotation": self.rotation.status_dict(),
            "delivery": {**(self.delivery_probe.status_dict() if self.delivery_probe is not None else {"ready": True}),
                         "webhook_configurations": self.tls.configuration_status()},
            "guests": {
                "counts": self.guests.counts(now, live, started),
                "list": [{"namespace": v.namespace, "vmi": v.vmi, "state": v.state,
                          "product": v.report.product if v.report else None,
                          "expiry": v.report.expiry.isoformat() if v.report and v.report.expiry else None,
                          "token_current": v.token_current,
                          "reason": v.reason, "wrong_product": v.wrong_product}
                         for v in self.guests.views(now, live, started, token_sha_for=self.fleet.token_sha)],
            },
        }


async def run(settings: config.Settings) -> int:
    """`licensectl run`: until SIGTERM/SIGINT, then a graceful stop."""
    logs.configure(settings.log_format, settings.log_level)
    log.info("event_loop", implementation=event_loop.running_loop_name())
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
