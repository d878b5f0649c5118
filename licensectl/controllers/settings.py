"""Settings -> the parameter dataclasses of the pure core.

The core (entitlement, rollout planning) takes small frozen dataclasses holding only the knobs it
needs, so it never imports `config` and can be tested without one. This shell module is the one
place that maps the controller's `config.Settings` onto them.
"""

from __future__ import annotations

import datetime as dt

from licensectl.config import Settings
from licensectl.core import defaults
from licensectl.core.drain import DrainSettings, drain_timeout_for
from licensectl.core.entitlement import TenantSettings
from licensectl.core.rollout import RolloutSettings
from licensectl.core.rotation import CanarySpec, RotationSettings, parse_steps


def tenant_settings(s: Settings) -> TenantSettings:
    """The tenant-model knobs entitlement reads."""
    return TenantSettings(vgpu_label=s.vgpu_label, tenant_label_prefix=s.tenant_label_prefix,
                          root_tenant=s.root_tenant)


def rollout_settings(s: Settings) -> RolloutSettings:
    """The rollout planner's knobs (`restart_reissue_seconds` is `reissue_after_seconds` there)."""
    return RolloutSettings(
        settle_seconds=s.settle_seconds,
        max_unavailable=s.max_unavailable,
        max_per_namespace=s.max_per_namespace,
        max_failures=s.max_failures,
        restart_timeout_seconds=s.restart_timeout_seconds,
        manual_deadline_seconds=s.manual_deadline_seconds,
        done_gate=s.done_gate,
        reissue_after_seconds=s.restart_reissue_seconds,
        max_restarts_per_minute=s.max_restarts_per_minute,
        max_disrupted_workers=s.max_disrupted_workers,
        # A worker held by a condition is tried again after a few eviction retry intervals (60 s as shipped).
        drain_hold_seconds=defaults.DRAIN_HOLD_RETRIES * s.drain_retry_seconds,
    )


def drain_settings(s: Settings, *, machine_drain_timeout: float | None = None, exclude_draining: bool = False,
                   restart_without_drain: bool = False, max_disrupted: int | None = None) -> DrainSettings:
    """The drain planner's knobs for one worker: licensectl's defaults, the Machine's and the Cluster's say."""
    return DrainSettings(
        drain_timeout=drain_timeout_for(machine_drain_timeout, dt.timedelta(seconds=s.drain_timeout_seconds)),
        exclude_draining=exclude_draining, restart_without_drain=restart_without_drain,
        boot_timeout=dt.timedelta(seconds=s.worker_boot_timeout_seconds),
        reissue_after=dt.timedelta(seconds=s.restart_reissue_seconds),
        retry_interval=dt.timedelta(seconds=s.drain_retry_seconds),
        max_disrupted=s.max_disrupted_workers if max_disrupted is None else max_disrupted)


def rotation_settings(s: Settings) -> RotationSettings:
    """The safe-rotation knobs (docs/design.md#safe-rotation); the strings were validated at startup."""
    return RotationSettings(canary=CanarySpec.parse(s.canary), steps=parse_steps(s.rollout_steps),
                            analysis_deadline_seconds=s.analysis_deadline_seconds,
                            max_unlicensed=s.analysis_max_unlicensed)
