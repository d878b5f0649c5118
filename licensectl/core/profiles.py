"""Which FeatureType can license a class's vGPU profile (docs/design.md#feature-type). Pure.

A vGPU type's last letter names its series, and the series decides the product a guest needs: Q is
RTX Virtual Workstation, B Virtual PC, A Virtual Applications, C Virtual Compute Server / NVIDIA AI
Enterprise. FeatureType 1 lets nvidia-gridd pick the product from the type and so always fits; 2 and 4
name one product each and fit only where that product serves. A class whose FeatureType cannot
license its profile still renders (the hoster decides what the class says); the controller only warns.

Passthrough GPUs have no vGPU type, so 1 cannot auto-detect anything there: such a class needs 2
(graphics) or 4 (compute), whatever its profile says.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Final

MAX_PROFILE_LENGTH: Final = 100  # far above any NVIDIA type name; longer input is not a profile

# NVIDIA's type names: `<GPU>-<framebuffer GB><series>`, e.g. L40S-2Q, T4-2A, L4-1B, H200-70C;
# MIG-backed types carry `<slices>-<GB>` (A100-1-5C, with media extensions A100-1-5CME); a few
# B types end in their display-head count (M10-1B4); M10-0B has a 512 MB framebuffer.
# Written as nvidia-smi and the driver's type list print them ("NVIDIA L40S-2Q", older "GRID T4-2Q")
# or as a device-plugin resource name ("nvidia.com/NVIDIA_L40S-2Q"): those prefixes are dropped.
_RESOURCE_PREFIX: Final = "NVIDIA.COM/"
_VENDOR_WORD = re.compile(r"(?:NVIDIA|GRID)[ _]+")
_PROFILE = re.compile(
    r"(?P<gpu>[A-Z0-9]+(?:[ _][A-Z0-9]+)*)-(?P<size>[0-9]+(?:-[0-9]+)?)(?P<series>[A-Z])(?P<suffix>ME|[0-9]+)?")


class Series(StrEnum):
    Q = "Q"
    B = "B"
    A = "A"
    C = "C"


@dataclass(frozen=True, slots=True)
class SeriesLicensing:
    """One row of NVIDIA's table: the product a series needs and the FeatureTypes that license it."""

    series: Series
    product: str
    works: tuple[int, ...]  # the recommended one first
    notes: Mapping[int, str]  # FeatureType -> what choosing it implies, where it is not plain

    @property
    def recommended(self) -> int:
        return self.works[0]


_AUTO = "the product is auto-detected from the vGPU type"

# NVIDIA Client Licensing User Guide, table 1 (docs/design.md#feature-type keeps the same table).
SERIES_LICENSING: Final[Mapping[Series, SeriesLicensing]] = MappingProxyType({
    Series.Q: SeriesLicensing(Series.Q, "NVIDIA RTX Virtual Workstation", (1, 2), MappingProxyType({1: _AUTO})),
    Series.B: SeriesLicensing(Series.B, "NVIDIA Virtual PC", (1, 2), MappingProxyType({
        1: _AUTO, 2: "consumes an RTX Virtual Workstation license, which also serves B-series types"})),
    Series.A: SeriesLicensing(Series.A, "NVIDIA Virtual Applications", (1,), MappingProxyType({1: _AUTO})),
    Series.C: SeriesLicensing(Series.C, "NVIDIA Virtual Compute Server / NVIDIA AI Enterprise", (1, 4, 2),
                              MappingProxyType({1: _AUTO, 2: "consumes an RTX Virtual Workstation license, "
                                                              "which also serves C-series types"})),
})
# A passthrough GPU has no vGPU type: 2 for graphics, 4 for compute; 1 cannot auto-detect.
PASSTHROUGH_WORKS: Final = (2, 4)
_FEATURE_NAMES: Final = {0: "unlicensed", 1: "NVIDIA vGPU, auto-detected", 2: "RTX Virtual Workstation",
                         4: "Virtual Compute Server"}


@dataclass(frozen=True, slots=True)
class ParsedProfile:
    """A profile name as licensectl understood it: `name` without prefixes, upper case."""

    name: str
    gpu: str
    letter: str  # the series letter as written

    @property
    def series(self) -> Series | None:
        """Q, B, A or C; None for a series letter licensectl does not know."""
        return Series(self.letter) if self.letter in Series.__members__ else None


def _suffix_fits(letter: str, suffix: str | None) -> bool:
    """Media extensions come with compute (MIG) types only, a display-head count with B types only."""
    return suffix is None or (letter == "C" if suffix == "ME" else letter == "B")


def parse_profile(raw: object) -> ParsedProfile | None:
    """The vGPU type a class names, or None when the value is no type name at all."""
    if not isinstance(raw, str) or len(raw) > MAX_PROFILE_LENGTH:
        return None
    name = raw.strip().upper()
    if name.startswith(_RESOURCE_PREFIX):
        name = name[len(_RESOURCE_PREFIX):]
    vendor = _VENDOR_WORD.match(name)
    if vendor is not None:
        name = name[vendor.end():]
    m = _PROFILE.fullmatch(name)
    if m is None or not _suffix_fits(m.group("series"), m.group("suffix")):
        return None
    return ParsedProfile(name=name, gpu=m.group("gpu"), letter=m.group("series"))


def profile_series(raw: object) -> Series | None:
    """Q, B, A or C for a vGPU type name; None for anything else."""
    p = parse_profile(raw)
    return None if p is None else p.series


class CheckResult(StrEnum):
    OK = "ok"
    MISMATCH = "mismatch"  # the FeatureType cannot license the profile: guests stay unlicensed
    UNKNOWN_PROFILE = "unknown_profile"  # a profile licensectl cannot read: nothing checked
    # Nothing to check against: a vGPU class without a profile, a passthrough class without a FeatureType.
    NO_PROFILE = "no_profile"


@dataclass(frozen=True, slots=True)
class ProfileCheck:
    result: CheckResult
    message: str  # why, for an Event or `licensectl status`; "" when there is nothing to say
    series: Series | None = None
    works: tuple[int, ...] = ()  # the FeatureTypes that would fit, recommended first

    @property
    def mismatch(self) -> bool:
        return self.result is CheckResult.MISMATCH


def _show(value: object) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else f"{value!r:.40}"


def _given(feature_type: object) -> str:
    return "a missing featureType" if feature_type is None else f"featureType {_show(feature_type)}"


def _names(works: tuple[int, ...], recommended: int | None) -> str:
    return ", ".join(f"{ft} ({_FEATURE_NAMES[ft]}{'; recommended' if ft == recommended else ''})" for ft in works)


def _valid(feature_type: object) -> int | None:
    return feature_type if isinstance(feature_type, int) and not isinstance(feature_type, bool) else None


def check_feature_type(mode: object, profile: object, feature_type: object) -> ProfileCheck:
    """Can a class of this mode, profile and FeatureType license its guests?

    Passthrough: 2 or 4 when it names a FeatureType at all, whatever the profile. Any other mode is
    checked as vGPU (an invalid mode is reported on its own): no profile, or one licensectl cannot
    read, checks nothing; otherwise the FeatureType must be one its series' row lists.
    """
    ft = _valid(feature_type)
    if mode == "passthrough":
        if feature_type is None:  # licensectl delivers nothing to passthrough guests: no claim to check
            return ProfileCheck(CheckResult.NO_PROFILE, "")
        if ft in PASSTHROUGH_WORKS:
            return ProfileCheck(CheckResult.OK, "", None, PASSTHROUGH_WORKS)
        return ProfileCheck(CheckResult.MISMATCH,
                            f"a passthrough GPU has no vGPU type, so {_given(feature_type)} cannot "
                            f"license it (1 cannot auto-detect the product there); FeatureTypes that work: "
                            f"{_names(PASSTHROUGH_WORKS, None)}", None, PASSTHROUGH_WORKS)
    if profile is None or (isinstance(profile, str) and not profile.strip()):
        return ProfileCheck(CheckResult.NO_PROFILE, "")
    parsed = parse_profile(profile)
    if parsed is None:
        return ProfileCheck(CheckResult.UNKNOWN_PROFILE,
                            f"profile {_show(profile)} is not an NVIDIA vGPU type name (such as L40S-2Q): "
                            "featureType not checked")
    if parsed.series is None:
        return ProfileCheck(CheckResult.UNKNOWN_PROFILE,
                            f"profile {parsed.name} is of series {parsed.letter}, which licensectl does not know "
                            "(Q, B, A, C): featureType not checked")
    row = SERIES_LICENSING[parsed.series]
    if ft in row.works:
        note = row.notes.get(ft, "") if ft != row.recommended else ""
        return ProfileCheck(CheckResult.OK, f"profile {parsed.name}: featureType {ft} {note}" if note else "",
                            parsed.series, row.works)
    return ProfileCheck(CheckResult.MISMATCH,
                        f"profile {parsed.name} is a {parsed.series}-series vGPU type, which needs {row.product}; "
                        f"{_given(feature_type)} cannot license it, so its guests stay unlicensed. "
                        f"FeatureTypes that work: {_names(row.works, row.recommended)}",
                        parsed.series, row.works)
