"""The replication reconcile: observe caches -> plan (pure) -> act -> report.

Level-based like controller-runtime: every pass looks at the whole picture, so a missed event,
a crash or a duplicate trigger cannot leave a wrong state behind. Deletions happen only when every
input cache completed a full LIST and is healthy, and never faster than the configured cap.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from licensectl import config, logs
from licensectl.controllers import replication_status
from licensectl.controllers.deletion_budget import DeletionBudget as DeletionBudget
from licensectl.controllers.planner import CacheCopies, PlannerThread, objects_of
from licensectl.controllers.replication_events import PROBLEM_REASONS as PROBLEM_REASONS
from licensectl.controllers.replication_events import (
    license_change_message,
    namespace_object,
    rewrite_event,
    secret_object,
)
from licensectl.controllers.replication_status import ReplicationStatus
from licensectl.controllers.replication_status import class_status as class_status
from licensectl.controllers.settings import rotation_settings, tenant_settings
from licensectl.core import tokeninfo
from licensectl.core.model import (
    ANN_SOURCE_NAME,
    ANN_SOURCE_NAMESPACE,
    ANN_SOURCE_REVISION,
    ObjectRef,
    ReplicaSecret,
)
from licensectl.core.ports import (
    Credentials,
    EventSink,
    InvolvedObject,
    MonotonicClock,
    ObservedMeta,
    ReplicationCaches,
    ReplicaWriter,
    SecretBody,
    WallClock,
    WriteResult,
)
from licensectl.core.reasons import EventType, Reason
from licensectl.core.render import DesiredReplica, SourceProblem, UpdateKind, update_kind
from licensectl.core.replication import (
    ReplicationInputs,
    ReplicationPlan,
    SourceRevisions,
    plan_replication,
)
from licensectl.core.revision_text import replica_revision, source_revision
from licensectl.metrics import GaugeSample, Metrics

log = logs.get(__name__)
T = TypeVar("T")


def _by_name(cache: Mapping[tuple[str, str], T]) -> dict[str, T]:
    return {k[1]: v for k, v in cache.items()}


CONFLICT_RECHECK_SECONDS = 60.0


class ReplicationController:
    def __init__(self, *, caches: ReplicationCaches, writer: ReplicaWriter, events: EventSink, metrics: Metrics,
                 settings: config.Settings, credentials: Credentials, report_url: str,
                 clock: WallClock | None = None, monotonic: MonotonicClock = time.monotonic,
                 concurrency: int = 32, gpu_class_api_version: str = "gpu.cozystack.io/v1alpha1",
                 rotations: Callable[[], Mapping[ObjectRef, SourceRevisions] | None] = lambda: None) -> None:
        self.caches = caches
        # Safe rotation (docs/design.md#safe-rotation): replicas follow each source's record; None
        # (tests of replication alone) follows the live source.
        self.rotations = rotations
        self.steps = rotation_settings(settings).steps
        self.writer = writer
        self.events = events
        self.metrics = metrics
        self.settings = settings
        # The guests' report credentials, key id, revocation epoch and CA (docs/design.md#key-ring), read
        # when a pass gathers: the key of that moment is bound into the plan.
        self.credentials = credentials
        self._planner = PlannerThread("replication")  # docs/design.md#plans-off-the-loop
        self._copies = CacheCopies()  # the gather's copies, once per cache generation
        self.report_url = report_url
        self.clock: WallClock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._monotonic = monotonic
        self.tenant = tenant_settings(settings)
        self.budget = DeletionBudget(settings.deletions_per_minute)
        self.status = ReplicationStatus()
        self._sem = asyncio.Semaphore(concurrency)
        self._concurrency = max(1, concurrency)
        self._class_api_version = gpu_class_api_version
        self._token_info: dict[str, tokeninfo.TokenInfo] = {}  # revision -> what the token says of itself
        # What was already reported, so each finding gets one Event (and one count), not one per pass:
        # labelled-but-foreign Secrets by (namespace, name) -> uid/resourceVersion; undecodable
        # tokens by source -> token digest (so two classes sharing a source count as one).
        self._reported_conflicts: dict[tuple[str, str], str] = {}
        self._reported_tokens: dict[ObjectRef, str] = {}
        self._token_sha: dict[ObjectRef, str] = {}
        self._logged_changes: dict[str, tuple[tuple[str, ...], str]] = {}  # held class changes already logged
        self.retry_after: float | None = None  # seconds until the deletion cap frees up, if deferred
        # Replicas rewritten in this pass by (kind of change, source namespace, source name, class, revision):
        # routine writes get one summarising Event on the source, not one each (docs/design.md#event-policy).
        self._rotated: dict[tuple[UpdateKind, str, str, str, str], int] = {}

    # -- observe + plan ---------------------------------------------------------------------------
    def plan(self) -> ReplicationPlan:
        """gather + plan in the caller's thread (tests, tools); `reconcile` plans off the loop."""
        return plan_replication(self.gather())

    def gather(self) -> ReplicationInputs:
        """What a plan is made from, taken on the event loop in one synchronous step: copies of the caches,
        and the signing key of this moment bound into `credential_for` (a key rotated while the plan runs
        in the planner thread must not mix into it)."""
        c = self.caches
        classes = self._copies.of(c.classes, _by_name)
        wanted_sources = {gc.secret_ref for gc in classes.values() if gc.mode == "vgpu" and gc.secret_ref}
        c.ensure_sources(wanted_sources)
        return ReplicationInputs(
            namespaces=self._copies.of(c.namespaces, _by_name),
            classes=classes,
            claims=self._copies.of(c.claims, objects_of),
            sources=c.source_states(),
            replicas=self._copies.of(c.replicas, dict),
            conflicts=frozenset(k for k, seen in self.status.conflicts.items()
                                if self._monotonic() - seen < CONFLICT_RECHECK_SECONDS),
            credential_for=self.credentials.bound(),
            report_url=self.report_url,
            report_ca=self.credentials.report_ca(),
            token_key=self.settings.token_key,
            tenant=self.tenant,
            now=self.clock(),
            rotations=self.rotations(),
            steps=self.steps,
            credential_key=self.credentials.key_id(),
            credential_epoch=self.credentials.epoch(),
        )

    # -- act --------------------------------------------------------------------------------------
    async def reconcile(self, *, leader: bool = True) -> ReplicationPlan | None:
        """One pass. Returns None when the caches are not ready for any decision yet."""
        if not self.caches.core_synced():
            return None
        start = time.monotonic()
        result = "ok"
        try:
            inputs = self.gather()
            plan, _cpu = await self._planner.run(lambda: plan_replication(inputs))
            self.status.plan = plan
            self._update_token_expiry(plan)
            if leader:
                await self._act(plan)
            await self._report_problems(plan, leader)
            return plan
        except Exception:
            result = "error"
            raise
        finally:
            self.status.last_pass = self.clock()
            self.metrics.reconcile_total.labels("replication", result).inc()
            self.metrics.reconcile_duration.labels("replication").observe(time.monotonic() - start)

    async def _act(self, plan: ReplicationPlan) -> None:
        deletes = await self._admit_deletes(list(plan.deletes))
        if self.settings.dry_run:
            for d in plan.creates:
                log.info("dry-run: would create replica", namespace=d.namespace, name=d.name, revision=d.revision[:12])
            for _, d in plan.updates:
                log.info("dry-run: would update replica", namespace=d.namespace, name=d.name, revision=d.revision[:12])
            for r in deletes:
                log.info("dry-run: would delete replica", namespace=r.namespace, name=r.name)
            return
        jobs: list[Callable[[], Awaitable[None]]] = [functools.partial(self._create, d) for d in plan.creates]
        jobs += [functools.partial(self._update, existing, d) for existing, d in plan.updates]
        jobs += [functools.partial(self._delete, r) for r in deletes]
        self._rotated = {}
        await self._run_pool(jobs)
        await self._rotation_events()
        if deletes:
            self.budget.settle(len(deletes), self._monotonic())

    async def _admit_deletes(self, deletes: list[ReplicaSecret]) -> list[ReplicaSecret]:
        """Deletions only on complete, healthy caches, and never faster than the per-minute cap."""
        self.retry_after = None
        self.status.deferred_deletions = 0
        if not deletes:
            return []
        if not self.caches.core_healthy():
            log.warning("deletions held: a cache is not synced and healthy", pending=len(deletes))
            self.status.deferred_deletions = len(deletes)
            return []
        allowed = self.budget.take(len(deletes), self._monotonic())
        deferred = deletes[allowed:]
        self.status.deferred_deletions = len(deferred)
        if deferred:
            self.metrics.deletion_cap_hits.inc()
            self.retry_after = max(1.0, self.budget.next_free(self._monotonic()))
            await self._deletion_cap_events(deferred)
        return deletes[:allowed]

    async def _run_pool(self, jobs: list[Callable[[], Awaitable[None]]]) -> None:
        """Every job, by a few workers that each start the next when one ends: a rotation's thousands of
        writes are not thousands of tasks started in one step of the loop (docs/design.md#plans-off-the-loop).
        Twice the write slots, so a worker writing an Event after its write never holds a slot idle."""
        pending = iter(jobs)

        async def worker() -> None:
            for job in pending:
                await self._guarded(job())

        await asyncio.gather(*(worker() for _ in range(min(len(jobs), 2 * self._concurrency))))

    async def _guarded(self, coro: Any) -> None:
        try:
            await coro
        except Exception as e:  # one failed write must not stop the others; the next pass retries
            log.warning("replica write failed", error=type(e).__name__, status=getattr(e, "status", None))
            self.metrics.replica_writes.labels("write", "error").inc()

    @staticmethod
    def _body(d: DesiredReplica) -> SecretBody:
        return SecretBody(namespace=d.namespace, name=d.name, labels=d.labels, annotations=d.annotations,
                          data=d.data)

    # Writes hold a concurrency slot; the Event about them is written after the slot is released.
    async def _create(self, d: DesiredReplica) -> None:
        async with self._sem:
            res = await self.writer.create(self._body(d))
        await self._after_write(None, d, res)

    async def _update(self, existing: ReplicaSecret, d: DesiredReplica) -> None:
        observed = ObservedMeta(namespace=existing.namespace, name=existing.name,
                                resource_version=existing.resource_version, labels=existing.labels,
                                annotations=existing.annotations)
        async with self._sem:
            res = await self.writer.update(self._body(d), observed)
        await self._after_write(update_kind(existing, d), d, res)

    async def _after_write(self, kind: UpdateKind | None, d: DesiredReplica, res: WriteResult) -> None:
        """`kind` None: a create."""
        self.metrics.replica_writes.labels("create" if kind is None else "update", res.value).inc()
        obj = secret_object(d.namespace, d.name)
        if res is WriteResult.CONFLICT:
            self.status.conflicts[(d.namespace, d.name)] = self._monotonic()
            self.metrics.conflicts_total.inc()
            await self.events.emit(obj, EventType.WARNING, Reason.REPLICA_CONFLICT,
                                   f"Secret {d.namespace}/{d.name} exists but is not managed by licensectl; "
                                   f"left untouched. Rename or delete it to let class {d.class_name} replicate.")
        elif res is WriteResult.CREATED:
            # Routine: counted in licensectl_replica_writes_total, no Event (docs/design.md#event-policy).
            self.status.conflicts.pop((d.namespace, d.name), None)
        elif res is WriteResult.UPDATED and kind is not None and kind is not UpdateKind.DRIFT:
            key = (kind, d.annotations.get(ANN_SOURCE_NAMESPACE, ""), d.annotations.get(ANN_SOURCE_NAME, ""),
                   d.class_name, _revision_text(d, kind))
            self._rotated[key] = self._rotated.get(key, 0) + 1
        elif res is WriteResult.UPDATED:
            await self.events.emit(obj, EventType.NORMAL, Reason.REPLICA_REVERTED,
                                   f"License replica for class {d.class_name} reverted to the desired content "
                                   f"({replica_revision(d.revision)})")

    async def _rotation_events(self) -> None:
        """One Event per (kind of change, source, class) per pass, on the source Secret."""
        for (kind, ns, name, class_name, revision_text), n in sorted(self._rotated.items()):
            if ns and name:
                reason, message = rewrite_event(kind, class_name, revision_text=revision_text, replicas=n)
                await self.events.emit(secret_object(ns, name), EventType.NORMAL, reason, message)

    async def _delete(self, r: ReplicaSecret) -> None:
        async with self._sem:
            res = await self.writer.delete(r.namespace, r.name, r.uid)
        self.metrics.replica_writes.labels("delete", res.value).inc()
        if res is WriteResult.DELETED:
            await self.events.emit(namespace_object(r.namespace), EventType.NORMAL, Reason.REPLICA_DELETED,
                                   f"License replica {r.name} deleted: namespace is no longer entitled")

    async def _deletion_cap_events(self, deferred: Iterable[ReplicaSecret]) -> None:
        by_source: dict[tuple[str, str], int] = {}
        for r in deferred:
            key = (r.annotations.get(ANN_SOURCE_NAMESPACE, ""), r.annotations.get(ANN_SOURCE_NAME, ""))
            by_source[key] = by_source.get(key, 0) + 1
        for (ns, name), n in sorted(by_source.items()):
            if not ns or not name:
                continue
            await self.events.emit(secret_object(ns, name), EventType.WARNING, Reason.DELETION_CAP_HIT,
                                   f"{n} replica deletions deferred by the cap of "
                                   f"{self.settings.deletions_per_minute}/min; they continue automatically")

    async def _report_problems(self, plan: ReplicationPlan, leader: bool) -> None:
        if not leader:
            return
        await self._report_labelled_conflicts(plan)
        await self._report_token_formats()
        for p in plan.tenant_problems:
            await self.events.emit(self._problem_object(p.kind, p.ref), EventType.WARNING, PROBLEM_REASONS[p.kind],
                                   p.message)
        for class_name, sp in sorted(plan.source_problems.items()):
            await self._source_problem_events(class_name, sp)
        await self._class_events(plan)

    async def _report_labelled_conflicts(self, plan: ReplicationPlan) -> None:
        """A Secret under a replica's name that carries licensectl's label but not its annotations (or
        names another class) is in the replica cache, so the plan marks it conflict and no write ever
        runs into it: report it here, once per object version, as the write path does for others."""
        live = self.caches.replicas.cache
        seen: dict[tuple[str, str], str] = {}
        for key, state in sorted(plan.states.items()):
            existing = live.get(key)
            if state != "conflict" or existing is None:
                continue
            version = f"{existing.uid}/{existing.resource_version}"
            seen[key] = version
            if self._reported_conflicts.get(key) == version:
                continue
            self.metrics.conflicts_total.inc()
            why = ("carries the label app.kubernetes.io/managed-by=licensectl but not licensectl's annotations"
                   if not existing.owned else "is a licensectl replica of another GPU class")
            log.warning("replica conflict", namespace=key[0], name=key[1], labelled=True)
            await self.events.emit(secret_object(key[0], key[1], existing.uid), EventType.WARNING,
                                   Reason.REPLICA_CONFLICT,
                                   f"Secret {key[0]}/{key[1]} {why}; left untouched. Rename or delete it "
                                   f"to let licensectl replicate.")
        self._reported_conflicts = seen

    async def _report_token_formats(self) -> None:
        """A source token that is not a decodable JWT is still delivered byte for byte, but its expiry
        (and so the expiry alert) is unknown: say so once per revision, naming only the Secret."""
        for ref, fmt in sorted(self.status.token_format.items(), key=lambda kv: str(kv[0])):
            token_sha = self._token_sha.get(ref, "")
            if fmt is tokeninfo.TokenFormat.JWT or \
                    self.status.token_readability.get(ref) is tokeninfo.Readability.OPAQUE:
                self._reported_tokens.pop(ref, None)
                continue
            if self._reported_tokens.get(ref) == token_sha:
                continue
            self._reported_tokens[ref] = token_sha
            what = ("is not a decodable JWT" if fmt is tokeninfo.TokenFormat.NOT_JWT
                    else "is a JWT without a usable exp claim")
            log.warning("license token expiry unknown", source_namespace=ref.namespace, source_name=ref.name,
                        format=fmt.value)
            await self.events.emit(secret_object(ref.namespace, ref.name), EventType.WARNING,
                                   Reason.LICENSE_TOKEN_UNREADABLE,
                                   f"Token in Secret {ref.namespace}/{ref.name} {what}: delivered unchanged, "
                                   f"but its expiry is unknown, so no expiry alert can fire for it")

    def _problem_object(self, kind: str, ref: ObjectRef) -> InvolvedObject:
        if kind == "unknown_class":
            return InvolvedObject(self._class_api_version, "GPUClaim", ref.namespace, ref.name)
        if kind == "invalid_class":
            return InvolvedObject(self._class_api_version, "GPUClass", "", ref.name)
        return namespace_object(ref.name)  # tenant link problems

    async def _source_problem_events(self, class_name: str, sp: SourceProblem) -> None:
        msg = f"GPUClass {class_name}: {sp.message}; existing replicas kept, no rollout"
        await self.events.emit(InvolvedObject(self._class_api_version, "GPUClass", "", class_name),
                               EventType.WARNING, Reason.LICENSE_SOURCE_INVALID, msg)
        if sp.ref.namespace:
            await self.events.emit(secret_object(sp.ref.namespace, sp.ref.name), EventType.WARNING,
                                   Reason.LICENSE_SOURCE_INVALID, msg)

    async def _class_events(self, plan: ReplicationPlan) -> None:
        """FeatureType mismatches and held license changes, on the GPUClass (docs/design.md#feature-type,
        docs/design.md#decision-class-change). Repeats within the sink's window cost nothing."""
        for class_name, check in sorted(plan.feature_type_checks.items()):
            if check.mismatch:
                await self.events.emit(self._class_object(class_name), EventType.WARNING, Reason.FEATURE_TYPE_MISMATCH,
                                       f"GPUClass {class_name}: {check.message}. Replicas are written as the "
                                       "class says")
        logged = {name: (c.recorded, c.current) for name, c in plan.license_changes.items()}
        for class_name, change in sorted(plan.license_changes.items()):
            if self._logged_changes.get(class_name) != logged[class_name]:  # one line per change, not per pass
                log.warning("GPU class license changed in place: replicas held", gpu_class=class_name,
                            recorded=list(change.recorded), current=change.current, held=change.held)
            await self.events.emit(self._class_object(class_name), EventType.WARNING, Reason.GPU_CLASS_LICENSE_CHANGED,
                                   license_change_message(change))
        self._logged_changes = logged

    def _class_object(self, class_name: str) -> InvolvedObject:
        return InvolvedObject(self._class_api_version, "GPUClass", "", class_name)

    def _update_token_expiry(self, plan: ReplicationPlan) -> None:
        out: dict[ObjectRef, dt.datetime | None] = {}
        formats: dict[ObjectRef, tokeninfo.TokenFormat] = {}
        classes = {k[1]: v for k, v in self.caches.classes.snapshot().items()}
        for class_name, lic in plan.licenses.items():
            gc = classes.get(class_name)
            if gc is None or gc.secret_ref is None:
                continue
            if lic.revision not in self._token_info:
                if len(self._token_info) > 256:
                    self._token_info.clear()
                self._token_info[lic.revision] = tokeninfo.token_info(lic.token)
            info = self._token_info[lic.revision]
            out[gc.secret_ref] = info.expiry
            formats[gc.secret_ref] = info.format
            self._token_sha[gc.secret_ref] = lic.token_sha256
        self.status.token_expiry = out
        self.status.token_format = formats
        live = self.caches.source_states()
        self.status.token_readability = {
            ref: tokeninfo.readability(fmt, s.annotations if (s := live.get(ref)) is not None else {})
            for ref, fmt in formats.items()}

    # -- metrics ----------------------------------------------------------------------------------
    def samples(self) -> Iterable[GaugeSample]:
        return replication_status.samples(self.status, self.caches)

    def close(self) -> None:
        self._planner.close()

    def status_dict(self) -> dict[str, Any]:
        return replication_status.status_dict(self.status, self.caches)


def _revision_text(d: DesiredReplica, kind: UpdateKind) -> str:
    """A rewritten replica in Event wording (core/revision_text.py): its source revision, capitalised
    to open the message; the labelled replica revision for a replica written without one, or when the
    source did not change (a key revocation)."""
    src = d.annotations.get(ANN_SOURCE_REVISION)
    text = source_revision(src) if src and kind is UpdateKind.CONTENT else replica_revision(d.revision)
    return text[:1].upper() + text[1:]
