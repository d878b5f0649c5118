"""nvidia-smi's `License Status` text (`Licensed (Expiry: ...)`, `Unlicensed (Restricted)`, ...) to
a license state, expiry and grace flag, and the bounded `GpuLicense` both nvidia-smi parsers build from
it. Shared by the XML and the text parser, and by the gridd log parser for expiry dates, so it sits below
all three.
"""

from __future__ import annotations

import datetime as dt
import re

from licensectl.core.guest_report.bounded_text import _SPACES, _clean_opt, _token_opt, clean_text
from licensectl.core.guest_report.limits import MAX_PRODUCT_CHARS, MAX_RAW_STATUS_CHARS
from licensectl.core.guest_report.state import GpuLicense, LicenseState

# Driver format (fixtures/nvidia/README.md): `Licensed (Expiry: 2026-7-7 16:1:44 GMT)`, no zero padding.
_EXPIRY = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2}) (\d{1,2}):(\d{1,2}):(\d{1,2}) GMT")
_LICENSED = re.compile(r"Licensed(?:\s*\(\s*Expiry:\s*(?P<exp>[^)]*)\))?")
_UNLICENSED = re.compile(r"Unlicensed(?:\s*\(\s*(?P<q>Restricted|Unrestricted)\s*\))?")


def parse_expiry(s: str) -> dt.datetime | None:
    """`2026-7-7 16:1:44 GMT` -> aware UTC datetime; anything else (e.g. `N/A`) -> None."""
    m = _EXPIRY.fullmatch(s.strip())
    if not m:
        return None
    try:
        y, mo, d, h, mi, sec = (int(g) for g in m.groups())
        return dt.datetime(y, mo, d, h, mi, sec, tzinfo=dt.UTC)
    except ValueError:
        return None


def _parse_status(s: str) -> tuple[LicenseState, dt.datetime | None, bool]:
    s = _SPACES.sub(" ", s).strip()
    m = _LICENSED.fullmatch(s)
    if m:
        exp = m.group("exp")
        return LicenseState.LICENSED, parse_expiry(exp) if exp is not None else None, False
    m = _UNLICENSED.fullmatch(s)
    if m:
        q = m.group("q")
        if q == "Restricted":
            return LicenseState.RESTRICTED, None, False
        return LicenseState.UNLICENSED, None, q == "Unrestricted"
    return LicenseState.UNKNOWN, None, False


def parse_license_status(s: str) -> tuple[LicenseState, dt.datetime | None]:
    """Map nvidia-smi's `License Status` to a state and expiry.

    Whether a past expiry means *expired* depends on `now`: that is `evaluate`'s job, not parsing's.
    """
    state, expiry, _ = _parse_status(s)
    return state, expiry


def is_grace(s: str) -> bool:
    """True for `Unlicensed (Unrestricted)`: no license yet, but still at full speed."""
    return _parse_status(s)[2]


def _gpu(product: str | None, raw_status: str | None, **ids: str | None) -> GpuLicense:
    raw = raw_status or ""
    state, expiry, grace = _parse_status(raw)
    return GpuLicense(
        product=_clean_opt(product, MAX_PRODUCT_CHARS),
        state=state,
        expiry=expiry,
        raw_status=clean_text(raw, MAX_RAW_STATUS_CHARS),
        driver_version=_token_opt(ids.get("driver_version"), 32),
        pci_id=_token_opt(ids.get("pci_id"), 32),
        gpu_uuid=_token_opt(ids.get("gpu_uuid"), 64),
        gpu_name=_clean_opt(ids.get("gpu_name"), MAX_PRODUCT_CHARS),
        grace=grace,
    )
