"""The data a guest report becomes: per-GPU licensing, recognised gridd events, the parsed report
and the evaluated guest state, with the license states, their severity order and gridd's reasons for
holding no license. Plain frozen values without behaviour, kept apart so the parsers, the evaluation
and the shell share one vocabulary without importing each other.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class LicenseState(StrEnum):
    """A guest's license condition. Parsing yields licensed/unlicensed/restricted/unknown per GPU
    (grace is a flag there); `evaluate` adds grace, expired and driver_missing for the guest."""

    LICENSED = "licensed"
    UNLICENSED = "unlicensed"
    RESTRICTED = "restricted"
    GRACE = "grace"  # `Unlicensed (Unrestricted)`: full speed for now, restricted soon
    EXPIRED = "expired"
    DRIVER_MISSING = "driver_missing"  # the probe found no nvidia-smi: image without the guest driver
    UNKNOWN = "unknown"

    @property
    def severity(self) -> int:
        """Rank in the worst-first aggregation (higher is worse): a guest takes its worst GPU's state."""
        return _SEVERITY[self]

    @property
    def no_license(self) -> bool:
        """The guest holds no usable license, so it carries gridd's reason (docs/operations.md#guest-conditions)."""
        return self in _NO_LICENSE


# Worst-first aggregation: a guest is as bad as its worst GPU. Restricted is throttled right now,
# expired is about to be, unlicensed is past or outside grace, grace still runs at full speed,
# unknown says nothing bad for sure. driver_missing never mixes with GPU states (no GPU is seen).
_SEVERITY: Final[dict[LicenseState, int]] = {state: rank for rank, state in enumerate((
    LicenseState.LICENSED,
    LicenseState.UNKNOWN,
    LicenseState.GRACE,
    LicenseState.UNLICENSED,
    LicenseState.EXPIRED,
    LicenseState.RESTRICTED,
    LicenseState.DRIVER_MISSING,
))}
# No usable license: unlicensed, in grace (unlicensed, still unthrottled), restricted, or a lease run out.
_NO_LICENSE: Final = frozenset({LicenseState.UNLICENSED, LicenseState.RESTRICTED, LicenseState.GRACE,
                                LicenseState.EXPIRED})

# Why a guest holds no license, from gridd's own log (bounded: used as a metric label).
REASON_TOKEN_MISSING: Final = "token_missing"
REASON_TOKEN_CORRUPT: Final = "token_corrupt"
REASON_CONFIG_MISSING: Final = "config_missing"
REASON_ACQUIRE_FAILED: Final = "acquire_failed"
REASON_NOT_FOUND: Final = "not_found"
REASON_LEASE_EXPIRED: Final = "lease_expired"  # licensed once, the expiry passed without renewal
REASON_UNKNOWN: Final = "unknown"  # the log (if any) names no cause
UNLICENSED_REASONS: Final = frozenset({REASON_TOKEN_MISSING, REASON_TOKEN_CORRUPT, REASON_CONFIG_MISSING,
                                       REASON_ACQUIRE_FAILED, REASON_NOT_FOUND, REASON_LEASE_EXPIRED,
                                       REASON_UNKNOWN})


@dataclass(frozen=True, slots=True)
class GpuLicense:
    """One GPU's licensing as nvidia-smi printed it. `grace` marks `Unlicensed (Unrestricted)`."""

    product: str | None
    state: LicenseState
    expiry: dt.datetime | None
    raw_status: str
    driver_version: str | None = None
    pci_id: str | None = None
    gpu_uuid: str | None = None
    gpu_name: str | None = None
    grace: bool = False


class GriddEventKind(StrEnum):
    ACQUIRED = "acquired"
    RENEWED = "renewed"
    RETURNED = "returned"
    FAILED = "failed"
    NOT_FOUND = "not_found"
    TOKEN_MISSING = "token_missing"
    TOKEN_CORRUPT = "token_corrupt"
    CONFIG_MISSING = "config_missing"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True, slots=True)
class GriddEvent:
    """One recognised nvidia-gridd log line. `at` is None when the line carries no timestamp."""

    kind: GriddEventKind
    at: dt.datetime | None
    message: str
    server: str | None = None
    product: str | None = None
    expiry: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class GuestReport:
    """A parsed, validated report. Holds no secret: only the token's SHA-256."""

    format_version: int
    uuid: str
    hostname: str
    clock: dt.datetime
    token_sha256: str | None
    probe_version: str
    smi_format: str | None  # "xml", "text" or None when nvidia-smi gave nothing
    gpus: tuple[GpuLicense, ...]
    events: tuple[GriddEvent, ...]
    smi_status: str | None = None  # one of SMI_STATUSES; None: a version 1 probe did not say
    guest_os: str | None = None  # one of OS_VALUES; None: the probe did not say (the Linux probe)
    utc_offset: dt.timedelta | None = None  # the guest's UTC offset, when it sent one


@dataclass(frozen=True, slots=True)
class GuestState:
    """What the rest of licensectl needs to know about one guest after one report."""

    uuid: str
    hostname: str
    state: LicenseState
    product: str | None
    expiry: dt.datetime | None
    driver_version: str | None
    gpu_count: int
    grace: bool
    token_sha256: str | None
    token_current: bool
    clock_skew_seconds: float
    reported_at: dt.datetime
    last_event: GriddEventKind | None
    last_event_at: dt.datetime | None
    reason: str | None = None  # one of UNLICENSED_REASONS while the guest holds no license
