"""The shipped default of every `licensectl run` setting the core also takes: one value per fact.

The core's parameter dataclasses (RolloutSettings, DrainSettings, RotationSettings) default to these,
and config.Settings shows the same values as its flags' defaults (and so in the README and the chart),
so the two cannot drift apart; tests/unit/core/test_defaults.py walks the pairs. Imports nothing:
config reads it when the CLI starts, before any of the core is needed.
"""

from __future__ import annotations

from typing import Final

# Rollout (core/rollout/inputs.py RolloutSettings).
SETTLE_SECONDS: Final = 60.0
MAX_UNAVAILABLE: Final = "10%"
MAX_PER_NAMESPACE: Final = 1
MAX_FAILURES: Final = 3
RESTART_TIMEOUT_SECONDS: Final = 600.0
MANUAL_DEADLINE_SECONDS: Final = 7 * 24 * 3600.0
DONE_GATE: Final = "ready-licensed"  # one of core/rollout/constants.py's DONE_GATE_* names
RESTART_REISSUE_SECONDS: Final = 60.0  # also the drain's: a restart not seen by then is issued again
MAX_RESTARTS_PER_MINUTE: Final = 0

# Tenant cluster workers (core/drain.py DrainSettings; docs/design.md#tenant-worker-drain).
MAX_DISRUPTED_WORKERS: Final = 1
DRAIN_TIMEOUT_SECONDS: Final = 900.0
DRAIN_RETRY_SECONDS: Final = 20.0  # cluster-api's drainRetryInterval
WORKER_BOOT_TIMEOUT_SECONDS: Final = 600.0
# A worker held by a condition is tried again after this many eviction retry intervals.
DRAIN_HOLD_RETRIES: Final = 3
DRAIN_HOLD_SECONDS: Final = DRAIN_HOLD_RETRIES * DRAIN_RETRY_SECONDS

# Safe rotation (core/rotation.py RotationSettings; docs/design.md#safe-rotation), in the flags' notation.
CANARY: Final = "3"
ROLLOUT_STEPS: Final = "10%,50%,100%"
ANALYSIS_DEADLINE_SECONDS: Final = 900.0
ANALYSIS_MAX_UNLICENSED: Final = 1

# Guest reports (core/guest_report/observation.py).
GUEST_BOOT_ALLOWANCE_SECONDS: Final = 300.0
