"""What the planner reads, parsed from cluster objects: a replica's revision, the guest-report gate,
the hoster's switches on a source, the planner's settings and the restart intent on a VM. Separate so
reading annotations (with the memoized intent parse every pass relies on) is one place with no planning
logic mixed in.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from licensectl.core import defaults, model
from licensectl.core.rollout.constants import RESULT_DONE, RESULT_FAILED, RESULT_RETRY
from licensectl.core.timecodec import annotation_time, annotation_value_time


@dataclass(frozen=True, slots=True)
class ReplicaRevision:
    """The current content revision of one replica Secret (namespace/name) and its source."""

    namespace: str
    name: str
    revision: str
    revision_time: dt.datetime
    source: model.ObjectRef
    class_name: str = ""  # the GPU class it renders for: one source revision has a replica revision per class

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @classmethod
    def from_secret(cls, secret: model.ReplicaSecret) -> ReplicaRevision | None:
        """Read revision, revision time and source from an owned replica; None when incomplete."""
        if not secret.owned:
            return None
        ann = secret.annotations
        revision = ann.get(model.ANN_REVISION)
        when = annotation_time(ann, model.ANN_REVISION_TIME)
        src_ns, src_name = ann.get(model.ANN_SOURCE_NAMESPACE), ann.get(model.ANN_SOURCE_NAME)
        if not revision or when is None or not src_name or src_ns is None:
            return None
        return cls(secret.namespace, secret.name, revision, when, model.ObjectRef(src_ns, src_name),
                   ann.get(model.ANN_CLASS, ""))


@dataclass(frozen=True, slots=True)
class GuestGate:
    """What the newest in-guest probe report says about licensing (evidence, optional)."""

    licensed: bool
    token_sha256_current: bool
    reported_at: dt.datetime

    def proves_current(self, after: dt.datetime) -> bool:
        return self.licensed and self.token_sha256_current and self.reported_at > after


@dataclass(frozen=True, slots=True)
class SourceControl:
    """The hoster's switches on a source Secret."""

    paused: bool = False
    resumed_at: dt.datetime | None = None

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> SourceControl:
        paused = annotations.get(model.ANN_ROLLOUT_PAUSED, "").strip().lower() in ("true", "1", "yes")
        return cls(paused, annotation_time(annotations, model.ANN_ROLLOUT_RESUMED_AT))


@dataclass(frozen=True, slots=True)
class RolloutSettings:
    """The planner's knobs (config.Settings documents them; licensectl.controllers.settings maps them)."""

    settle_seconds: float = defaults.SETTLE_SECONDS
    max_unavailable: str = defaults.MAX_UNAVAILABLE
    max_per_namespace: int = defaults.MAX_PER_NAMESPACE
    max_failures: int = defaults.MAX_FAILURES  # < 1 disables the failure pause
    restart_timeout_seconds: float = defaults.RESTART_TIMEOUT_SECONDS
    manual_deadline_seconds: float = defaults.MANUAL_DEADLINE_SECONDS
    done_gate: str = defaults.DONE_GATE
    reissue_after_seconds: float = defaults.RESTART_REISSUE_SECONDS
    max_restarts_per_minute: int = defaults.MAX_RESTARTS_PER_MINUTE  # < 1: no rate limit beyond max_unavailable
    # Backstop retries (docs/design.md#backstop-retry): attempt n waits base * 2**(n-1), at most max.
    retry_base_seconds: float = 30.0
    retry_max_seconds: float = 1800.0
    # Tenant cluster workers (docs/design.md#tenant-worker-drain): open drain cycles per cluster, and how
    # long a worker held by a condition (its cluster unreachable, no Node) waits before it is planned again.
    max_disrupted_workers: int = defaults.MAX_DISRUPTED_WORKERS
    drain_hold_seconds: float = defaults.DRAIN_HOLD_SECONDS

    def retry_delay(self, attempt: int) -> float:
        """Seconds after restart ``attempt`` came back without its volume before the next one: doubling,
        bounded, so a VM the webhook keeps missing is retried forever but never in a loop."""
        n = max(1, attempt)
        return min(self.retry_max_seconds, self.retry_base_seconds * 2.0 ** min(n - 1, 30))

    def source_failure_namespaces(self) -> int:
        """Namespaces with failed restarts that pause the whole source: max(2, max_failures), so one
        tenant can never pause the others (docs/design.md#failure-budget-per-tenant)."""
        return max(2, self.max_failures)

    def unavailable_limit(self, affected: int) -> int:
        """An absolute count, or a percentage of the affected VMIs rounded down; at least 1."""
        raw = self.max_unavailable.strip()
        if raw.endswith("%"):
            return max(1, int(raw[:-1]) * affected // 100)
        return max(1, int(raw))


@dataclass(frozen=True, slots=True)
class RestartIntent:
    """The intent annotations on a VirtualMachine, parsed."""

    revision: str
    issued_at: dt.datetime
    attempted_at: dt.datetime
    vmi_uid: str | None = None
    replica: str | None = None
    result: str | None = None
    attempt: int = 1  # which restart for this revision (backstop retries)
    guest_reports: bool | None = None  # the guest had reported when it was issued (None: unknown)

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> RestartIntent | None:
        """None when there is no readable intent; a VM is then planned from its VMI alone, which is
        safe: a VMI recreated after the revision is current by its start time."""
        revision = annotations.get(model.ANN_RESTART_REVISION)
        if not revision:
            return None
        return _parse_intent(revision, annotations.get(model.ANN_RESTART_ISSUED_AT),
                             annotations.get(model.ANN_RESTART_ATTEMPTED_AT),
                             annotations.get(model.ANN_RESTART_VMI_UID), annotations.get(model.ANN_RESTART_REPLICA),
                             annotations.get(model.ANN_RESTART_RESULT), annotations.get(model.ANN_RESTART_ATTEMPT),
                             annotations.get(model.ANN_RESTART_GUEST_REPORTS))


def _parse_intent(revision: str, issued_raw: str | None, attempted_raw: str | None, vmi_uid: str | None,
                  replica: str | None, result: str | None, attempt_raw: str | None = None,
                  reports_raw: str | None = None) -> RestartIntent | None:
    issued = annotation_value_time(issued_raw)
    if issued is None:
        return None
    attempted = annotation_value_time(attempted_raw) or issued
    attempt = int(attempt_raw) if attempt_raw and attempt_raw.isdigit() else 1
    return RestartIntent(
        revision=revision,
        issued_at=issued,
        attempted_at=max(attempted, issued),
        vmi_uid=vmi_uid or None,
        replica=replica or None,
        result=result if result in (RESULT_DONE, RESULT_FAILED, RESULT_RETRY) else None,
        attempt=max(1, min(attempt, 1_000_000)),
        guest_reports={"true": True, "false": False}.get(reports_raw or ""),
    )
