"""Every metric licensectl exports, defined in one place with its help text.

Counters and histograms are ordinary prometheus-client objects. State gauges (replicas by state,
rollout progress, guest license state) are rendered at scrape time from the latest snapshot the
controllers publish, so a series whose object disappeared disappears too — no stale label sets,
and label values only ever come from cluster object names, never from guest input.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from licensectl import __version__
from licensectl.exposition import gauge_text

PREFIX = "licensectl"


@dataclass(frozen=True, slots=True)
class GaugeSample:
    """One gauge series of a snapshot: metric suffix, labels, value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


# Help text for every snapshot gauge; a snapshot may only emit names listed here.
SNAPSHOT_GAUGES: dict[str, str] = {
    # Replication
    "entitled_namespaces": "Tenant namespaces entitled to a license source.",
    "replicas": "Replica Secrets by state (in_sync, drifted, missing, conflict, held).",
    "source_valid": "1 when the license source of a GPU class is usable, 0 when it is invalid.",
    "source_problem": "1 for each (class, reason) whose license source is invalid.",
    "class_feature_type_mismatch": "1 when a GPU class's featureType cannot license its spec.profile (or a "
                                   "passthrough class's is neither 2 nor 4), 0 otherwise.",
    "class_license_changed": "1 while a GPU class's license fields were edited in place and its replicas are "
                             "held until the change is accepted, 0 otherwise.",
    "source_revision_info": "Current source revision (12 hex of the source content hash, the replicas' "
                            "licensectl.io/source-revision) per source and class (value is always 1).",
    "token_expiry_timestamp_seconds": "exp claim of the source token (JWT payload, unverified).",
    "token_expiry_known": "1 when the source token's expiry could be decoded, 0 when unknown.",
    "token_format": "Source token format (jwt, not_jwt, no_expiry; value is always 1): only jwt has a known expiry.",
    "source_token_unreadable": "1 when a source's token is not a JWT and the source is not marked "
                               "licensectl.io/token-opaque (probably the wrong file), 0 otherwise.",
    "tenant_problems": "Tenant namespaces whose tenant links are broken, by kind.",
    "informer_synced": "1 when the cache of a watched resource completed its initial list and is healthy.",
    "watch_stale_seconds": "Seconds since the cache of a watched resource last heard from the apiserver (a list, "
                           "a watch opening or any watch event); a quiet healthy watch stays below 630.",
    "deletions_deferred": "Replica deletions waiting for the deletion cap.",
    # Rollout
    "rollout_vmis": "Affected VMIs by rollout state (current, stale, restarting, failed, blocked, manual, "
                    "awaiting-evidence, undeliverable, overdue).",
    "rotation_phase": "1 for the current safe-rotation phase of a source (stable, canary, promoting, promoted, "
                      "aborted, undone), 0 for the others.",
    "rotation_wave": "The running wave of a source's rotation: 0 canary, i step i.",
    "rotation_namespaces": "Entitled namespaces whose replicas carry the stable or the candidate source revision "
                           "(label slot) under the current rotation decision.",
    "rollout_in_progress": "1 while a rollout for a source is settling or progressing.",
    "rollout_paused": "1 while a rollout is paused, by reason (failures, manual, tenant_failures, webhook).",
    "rollout_last_progress_timestamp_seconds": "Last time a rollout issued or completed a restart.",
    "rollout_manual_restart_overdue": "1 per manual-restart VMI still on an old token past the manual deadline.",
    "vmis_missing_license_volume": "Running VMIs of entitled vGPU claims without their license volume, by "
                                   "namespace (the backstop restarts them; a spec blocking delivery counts in "
                                   "vmis_delivery_blocked instead).",
    "vmis_delivery_blocked": "Running VMIs without their license volume whose spec the webhook cannot add it to "
                             "(a volume name or disk serial taken), by namespace and reason: never restarted.",
    "vmis_backstop_retrying": "VMIs whose backstop restart came back without the license volume and are retried "
                              "with backoff, by namespace.",
    "vms_restart_held": "VMs not restarted because a dry-run create of their new VMI was refused (the restart "
                        "pre-flight), by namespace.",
    "worker_drains": "Open drain cycles of tenant-cluster workers (cordon, drain, restart, wait-boot, uncordon), "
                     "by namespace, cluster and step.",
    "worker_drain_blocked": "1 per tenant-cluster worker whose drain is blocked (closed for its revision) or held, "
                            "by namespace, VM, cluster and reason.",
    "rollout_failed_restarts": "Failed restarts counted against a source's failure budgets (all namespaces).",
    "rollout_namespace_failed_restarts": "Failed restarts counted against a namespace's failure budget, per source.",
    "rollout_namespace_paused": "1 while a namespace's part of a source's rollout is paused by its own failures.",
    # Delivery (docs/operations.md#delivery-readiness)
    "delivery_ready": "1 while this replica holds fresh evidence that the apiserver reaches a licensectl webhook "
                      "that mutates (the delivery probe); backstop and rollout restarts wait for it.",
    "webhook_configuration_problem": "1 when a webhook configuration licensectl needs is missing, has a webhook "
                                     "without a caBundle or is forbidden to it, by kind, name and problem "
                                     "(missing, no_ca_bundle, forbidden).",
    # Guests
    "guest_license_state": "Guest license state reported by the in-guest probe: one series per guest, value 1, "
                           "the state a label.",
    "guest_license_expiry_timestamp_seconds": "Earliest license expiry reported by a guest.",
    "guest_license_lease_seconds": "Lease length as observed: expiry minus report time when the guest's expiry was "
                                   "first seen or last moved (an underestimate by at most one report interval). "
                                   "Detail series: only for guests that need a look.",
    "guest_last_report_timestamp_seconds": "Time of the last accepted report from a guest (detail series).",
    "guest_token_current": "1 when the guest runs the current token of its replica (detail series).",
    "guest_clock_skew_seconds": "Guest clock minus controller clock at report time (detail series).",
    "guest_unlicensed_reason": "1 for a guest holding no usable license, with gridd's reason (bounded set).",
    "guest_wrong_product": "1 for a guest holding another license product than its GPU class implies.",
    "guests": "Guests by license state and tenant.",
    "guests_reporting": "Guests with a fresh report, by tenant and whether the token they run is the current "
                        "one (token=current|stale).",
    # Controller
    "leader": "1 on the replica that holds the leader Lease.",
    "ready": "1 while /readyz answers ok: this replica can answer admission correctly (docs/design.md#readiness).",
}


@dataclass(frozen=True, slots=True)
class Deferred:
    """Samples a provider computes later, in the render thread, from copies it took on the event loop: a
    walk over every guest (tens of thousands) is work the loop that renews the Lease must not do."""

    compute: Callable[[], Iterable[GaugeSample]]


class SnapshotCollector(Collector):
    """Renders gauges from providers called at scrape time.

    The providers read the controller's caches, so they run on the event loop; `render` takes their
    samples there (`take`) and writes the text in a worker thread from those samples only, so a large
    scrape never holds the loop that renews the Lease and answers admission. A provider's large part
    comes as a `Deferred`, expanded in that thread. `collect` serves whoever reads the registry itself
    (prometheus-client's own exposition, `get_sample_value`); `render` writes these families with its
    own writer and silences `collect` meanwhile."""

    def __init__(self) -> None:
        self._providers: list[Callable[[], Iterable[GaugeSample | Deferred]]] = []
        self._taken: list[GaugeSample | Deferred] | None = None

    def add(self, provider: Callable[[], Iterable[GaugeSample | Deferred]]) -> None:
        self._providers.append(provider)

    def take(self) -> list[GaugeSample | Deferred]:
        """Every provider's samples now (on the event loop); deferred parts stay deferred."""
        return [s for provider in self._providers for s in provider()]

    def collect(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily] = {}
        taken = self._taken
        for provider in ((lambda: taken),) if taken is not None else self._providers:
            for s in _expanded(provider()):
                fam = families.get(s.name)
                if fam is None:
                    fam = GaugeMetricFamily(f"{PREFIX}_{s.name}", SNAPSHOT_GAUGES[s.name],
                                            labels=[k for k, _ in s.labels])
                    families[s.name] = fam
                fam.add_metric([v for _, v in s.labels], s.value)
        yield from families.values()

    def describe(self) -> Iterator[Metric]:
        return iter(())

    @contextlib.contextmanager
    def using(self, samples: list[GaugeSample | Deferred]) -> Iterator[None]:
        """`collect` yields exactly `samples` while this holds (one render at a time: `render`)."""
        self._taken = samples
        try:
            yield
        finally:
            self._taken = None


def _expanded(items: Iterable[GaugeSample | Deferred]) -> Iterator[GaugeSample]:
    for s in items:
        if isinstance(s, Deferred):
            yield from s.compute()
        else:
            yield s


@dataclass
class Metrics:
    """The process's metrics; a fresh registry per instance keeps tests independent."""

    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))

    def __post_init__(self) -> None:
        r = self.registry
        self.snapshots = SnapshotCollector()
        r.register(self.snapshots)
        self._render_lock = asyncio.Lock()
        self.build_info = Gauge(f"{PREFIX}_build_info", "licensectl version (value is always 1).",
                                ["version"], registry=r)
        self.build_info.labels(__version__).set(1)
        self.reconcile_total = Counter(f"{PREFIX}_reconcile_total", "Reconcile passes by controller and result.",
                                       ["controller", "result"], registry=r)
        self.reconcile_duration = Histogram(f"{PREFIX}_reconcile_duration_seconds",
                                            "Duration of reconcile passes.", ["controller"], registry=r,
                                            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        self.watch_restarts = Counter(f"{PREFIX}_watch_restarts_total",
                                      "Watch restarts by resource and reason (gone, error, timeout, ...).",
                                      ["resource", "reason"], registry=r)
        self.informer_lists = Histogram(f"{PREFIX}_informer_list_duration_seconds",
                                        "Complete paged LISTs (initial and relists) by resource and result: "
                                        "how long a cache takes to resync after an outage.",
                                        ["resource", "result"], registry=r,
                                        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.api_requests = Counter(f"{PREFIX}_api_requests_total", "Requests to the apiserver by verb and code.",
                                    ["verb", "code"], registry=r)
        self.replica_writes = Counter(f"{PREFIX}_replica_writes_total",
                                      "Replica Secret writes by action (create, update, delete) and result.",
                                      ["action", "result"], registry=r)
        self.conflicts_total = Counter(f"{PREFIX}_replica_conflicts_total",
                                       "Foreign Secrets found under a replica's name (left untouched).",
                                       registry=r)
        self.deletion_cap_hits = Counter(f"{PREFIX}_deletion_cap_hits_total",
                                         "Times the per-minute replica deletion cap deferred deletions.", registry=r)
        self.worker_evictions = Counter(f"{PREFIX}_worker_evictions_total",
                                        "Evictions of tenant-cluster Pods while draining a worker, by result "
                                        "(evicted, refused: a PodDisruptionBudget said 429, gone, error).",
                                        ["result"], registry=r)
        for result in ("evicted", "refused", "gone", "error"):
            self.worker_evictions.labels(result)
        self.restarts_total = Counter(f"{PREFIX}_restarts_total",
                                      "VMI restarts by result (issued, fallback_delete, error, done, failed, retry).",
                                      ["result"], registry=r)
        self.rollout_duration = Histogram(f"{PREFIX}_rollout_duration_seconds",
                                          "Time from a revision being written to its rollout completing.",
                                          registry=r,
                                          buckets=(10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400))
        self.webhook_admissions = Counter(
            f"{PREFIX}_webhook_admissions_total",
            "VMI admission reviews answered, by result (mutated, stamped, unchanged, not_ready, ignored, probe).",
            ["result"], registry=r)
        self.webhook_skipped = Counter(
            f"{PREFIX}_webhook_skipped_total",
            "GPU claims of admitted VMIs that got no license volume, by reason.", ["reason"], registry=r)
        # Boot images of vGPU VMIs and the vGPU guest driver mark (docs/operations.md#vgpu-driver-marks).
        self.webhook_boot_image = Counter(
            f"{PREFIX}_webhook_boot_image_total",
            "Boot images of admitted vGPU VMIs by result (marked, unmarked, unknown).", ["result"], registry=r)
        self.webhook_boot_image_denied = Counter(
            f"{PREFIX}_webhook_boot_image_denied_total",
            "vGPU VMI creations denied because the boot image is not marked (--vgpu-driver-check=enforce).",
            registry=r)
        self.webhook_duration = Histogram(
            f"{PREFIX}_webhook_duration_seconds", "Time to answer one admission review (in-process).",
            registry=r, buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5))
        self.restart_preflights = Counter(
            f"{PREFIX}_restart_preflights_total",
            "Restart pre-flights (dry-run creates of a VM's next VMI) by result (admitted, denied, unanswered).",
            ["result"], registry=r)
        self.delivery_probes = Counter(
            f"{PREFIX}_delivery_probes_total",
            "Delivery probes (dry-run VMI creates through the apiserver) by result (mutated, unchanged, error).",
            ["result"], registry=r)
        self.loop_lag = Histogram(
            f"{PREFIX}_event_loop_lag_seconds",
            "How much later than asked the event loop ran a timer due every 0.1 s: what a Lease renewal, a "
            "watch read or a guest report waits behind (a long plan, a scrape).", registry=r,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.gc_pauses = Histogram(
            f"{PREFIX}_gc_pause_seconds",
            "Python garbage collections by generation: each one stops the event loop and every thread (the "
            "GIL), so a long one shows as loop lag.", ["generation"], registry=r,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
        self.reports_total = Counter(f"{PREFIX}_reports_total", "Guest reports by result.", ["result"],
                                     registry=r)
        # Serving TLS (webhook and guest reports listeners): docs/operations.md#serving-tls.
        self.serving_cert_expiry = Gauge(f"{PREFIX}_serving_cert_expiry_timestamp_seconds",
                                         "notAfter of the serving certificate currently loaded.", registry=r)
        self.serving_cert_reloads = Counter(f"{PREFIX}_serving_cert_reloads_total",
                                            "Serving certificate loads by result (loaded, invalid, missing, "
                                            "foreign, error).", ["result"], registry=r)


async def render(metrics: Metrics) -> bytearray:
    """The exposition text: snapshot samples taken on the event loop, formatted in a worker thread (a
    scrape of a large fleet is mostly formatting), one render at a time."""
    async with metrics._render_lock:
        samples = metrics.snapshots.take()
        return await asyncio.to_thread(_text, metrics, samples)


def _text(metrics: Metrics, samples: list[GaugeSample | Deferred]) -> bytearray:
    """The snapshot gauges by our own writer (the bulk of a large fleet's text, held about once:
    licensectl/exposition.py), then the registry's counters and histograms by prometheus-client."""
    out = gauge_text(_expanded(samples), SNAPSHOT_GAUGES, PREFIX)
    with metrics.snapshots.using([]):
        out += generate_latest(metrics.registry)
    return out
