"""Settings -> the core's parameter dataclasses: every knob lands in the right field."""

from __future__ import annotations

import dataclasses

from licensectl.config import Settings
from licensectl.controllers.settings import rollout_settings, rotation_settings, tenant_settings
from licensectl.core.entitlement import TenantSettings
from licensectl.core.rollout import RolloutSettings
from licensectl.core.rotation import RotationSettings


def test_tenant_settings_come_from_config() -> None:
    s = Settings(vgpu_label="x/y", tenant_label_prefix="p/", root_tenant="tenant-top")
    assert tenant_settings(s) == TenantSettings("x/y", "p/", "tenant-top")


def test_rollout_settings_come_from_config() -> None:
    s = Settings(settle_seconds=7.0, max_unavailable="25%", max_per_namespace=4, max_failures=9,
                 restart_timeout_seconds=11.0, manual_deadline_seconds=13.0, done_gate="ready-licensed",
                 restart_reissue_seconds=12.0)
    assert rollout_settings(s) == RolloutSettings(
        settle_seconds=7.0, max_unavailable="25%", max_per_namespace=4, max_failures=9,
        restart_timeout_seconds=11.0, manual_deadline_seconds=13.0, done_gate="ready-licensed",
        reissue_after_seconds=12.0)


def test_defaults_agree_with_config() -> None:
    """The core's own defaults are the documented configuration defaults (tests rely on both)."""
    assert tenant_settings(Settings()) == TenantSettings()
    assert dataclasses.asdict(rollout_settings(Settings())) == dataclasses.asdict(RolloutSettings())
    assert rotation_settings(Settings()) == RotationSettings()
