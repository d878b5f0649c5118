"""One source per default: the `licensectl run` settings the core also takes default to core/defaults.py on
both sides (config.Settings and the core's parameter dataclasses), so a changed default changes both."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from typing import Any

import pytest

from licensectl import config
from licensectl.config import Settings
from licensectl.controllers.settings import drain_settings, rollout_settings, rotation_settings
from licensectl.core import defaults
from licensectl.core.drain import DrainSettings
from licensectl.core.guest_report import observation
from licensectl.core.rollout import RolloutSettings
from licensectl.core.rollout.constants import DONE_GATE_READY, DONE_GATE_READY_LICENSED
from licensectl.core.rotation import RotationSettings

# config.Settings field -> the core/defaults.py constant it shows.
SETTINGS_DEFAULTS = {
    "settle_seconds": "SETTLE_SECONDS",
    "max_unavailable": "MAX_UNAVAILABLE",
    "max_per_namespace": "MAX_PER_NAMESPACE",
    "max_failures": "MAX_FAILURES",
    "restart_timeout_seconds": "RESTART_TIMEOUT_SECONDS",
    "manual_deadline_seconds": "MANUAL_DEADLINE_SECONDS",
    "done_gate": "DONE_GATE",
    "restart_reissue_seconds": "RESTART_REISSUE_SECONDS",
    "max_restarts_per_minute": "MAX_RESTARTS_PER_MINUTE",
    "max_disrupted_workers": "MAX_DISRUPTED_WORKERS",
    "drain_timeout_seconds": "DRAIN_TIMEOUT_SECONDS",
    "drain_retry_seconds": "DRAIN_RETRY_SECONDS",
    "worker_boot_timeout_seconds": "WORKER_BOOT_TIMEOUT_SECONDS",
    "canary": "CANARY",
    "rollout_steps": "ROLLOUT_STEPS",
    "analysis_deadline_seconds": "ANALYSIS_DEADLINE_SECONDS",
    "analysis_max_unlicensed": "ANALYSIS_MAX_UNLICENSED",
    "guest_boot_allowance_seconds": "GUEST_BOOT_ALLOWANCE_SECONDS",
}
# Core parameter dataclass -> its fields that controllers/settings.py fills from config.Settings.
CORE_FIELDS: dict[type, frozenset[str]] = {
    RolloutSettings: frozenset({"settle_seconds", "max_unavailable", "max_per_namespace", "max_failures",
                                "restart_timeout_seconds", "manual_deadline_seconds", "done_gate",
                                "reissue_after_seconds", "max_restarts_per_minute", "max_disrupted_workers",
                                "drain_hold_seconds"}),
    DrainSettings: frozenset({"drain_timeout", "boot_timeout", "reissue_after", "retry_interval"}),
    RotationSettings: frozenset({"canary", "steps", "analysis_deadline_seconds", "max_unlicensed"}),
}
CORE_ONLY = {"DRAIN_HOLD_RETRIES", "DRAIN_HOLD_SECONDS"}  # derived knobs with no flag of their own


def class_defaults(cls: type) -> dict[str, ast.expr]:
    """The default expression of each field of a dataclass, as written in its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    (node,) = tree.body
    assert isinstance(node, ast.ClassDef)
    return {s.target.id: s.value for s in node.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None}


def reads_defaults(expr: ast.expr) -> bool:
    """`defaults.X`, or a constant imported from core/defaults.py by its name."""
    return any((isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "defaults")
               or (isinstance(n, ast.Name) and n.id.isupper() and hasattr(defaults, n.id))
               for n in ast.walk(expr))


def test_every_default_is_shown_by_a_setting() -> None:
    constants = {n for n in vars(defaults) if n.isupper()}
    assert constants == set(SETTINGS_DEFAULTS.values()) | CORE_ONLY
    values = dataclasses.asdict(Settings())
    for field, constant in SETTINGS_DEFAULTS.items():
        assert values[field] == getattr(defaults, constant), field


@pytest.mark.parametrize("cls", [Settings, *CORE_FIELDS], ids=lambda c: c.__name__)
def test_the_defaults_are_read_not_written_again(cls: type) -> None:
    """Each paired field's default is an expression over core/defaults.py, never a literal copy."""
    fields = set(SETTINGS_DEFAULTS) if cls is Settings else CORE_FIELDS[cls]
    written = class_defaults(cls)
    copies = sorted(f for f in fields if not (f in written and reads_defaults(written[f])))
    assert copies == []


def test_settings_at_their_defaults_give_the_core_defaults() -> None:
    """The mapping (controllers/settings.py) of default settings lands on the core's own defaults."""
    s = Settings()
    assert dataclasses.asdict(rollout_settings(s)) == dataclasses.asdict(RolloutSettings())
    assert drain_settings(s) == DrainSettings()
    assert rotation_settings(s) == RotationSettings()
    assert s.guest_boot_allowance_seconds == observation.BOOT_ALLOWANCE_SECONDS


BUILDERS = [(RolloutSettings, rollout_settings), (DrainSettings, drain_settings), (RotationSettings, rotation_settings)]


@pytest.mark.parametrize(("cls", "build"), BUILDERS, ids=lambda c: getattr(c, "__name__", ""))
def test_each_paired_core_field_follows_its_setting(cls: type, build: Any) -> None:
    """Every core field listed as paired really comes from a setting: changing the paired settings
    changes each of those fields (so the pair list above is the mapping, not a wish)."""
    changed = Settings(settle_seconds=7.0, max_unavailable="5", max_per_namespace=4, max_failures=9,
                       restart_timeout_seconds=11.0, manual_deadline_seconds=13.0, done_gate=DONE_GATE_READY,
                       restart_reissue_seconds=12.0, max_restarts_per_minute=5, max_disrupted_workers=2,
                       drain_timeout_seconds=17.0, drain_retry_seconds=19.0, worker_boot_timeout_seconds=23.0,
                       canary="5%", rollout_steps="20%,100%", analysis_deadline_seconds=29.0,
                       analysis_max_unlicensed=3)
    base, moved = build(Settings()), build(changed)
    same = sorted(f for f in CORE_FIELDS[cls] if getattr(base, f) == getattr(moved, f))
    assert same == []


def test_the_default_done_gate_is_a_gate_the_flag_accepts() -> None:
    parse = next(o.parse for o in config.OPTIONS if o.field == "done_gate")
    assert isinstance(parse, config._Choice)
    assert parse.allowed == (DONE_GATE_READY, DONE_GATE_READY_LICENSED)
    assert defaults.DONE_GATE in parse.allowed
