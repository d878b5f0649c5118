"""FeatureType against a class's vGPU profile (licensectl/core/profiles.py, docs/design.md#feature-type).

Every series NVIDIA's table lists, with every FeatureType 0..5; the prefixes and case a profile may be
written in; passthrough classes; and names that are no profile at all.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from licensectl.core.profiles import (
    PASSTHROUGH_WORKS,
    SERIES_LICENSING,
    CheckResult,
    Series,
    check_feature_type,
    parse_profile,
    profile_series,
)
from licensectl.core.render import VALID_FEATURE_TYPES

# (example profile, its series, the FeatureTypes that license it): NVIDIA Client Licensing User Guide,
# table 1, as docs/design.md#feature-type records it.
TABLE = [
    ("L40S-2Q", Series.Q, {1, 2}),
    ("A40-48Q", Series.Q, {1, 2}),
    ("L4-1B", Series.B, {1, 2}),
    ("M10-0B", Series.B, {1, 2}),
    ("T4-2A", Series.A, {1}),
    ("A16-4A", Series.A, {1}),
    ("A100-4C", Series.C, {1, 2, 4}),
    ("H200-70C", Series.C, {1, 2, 4}),
]
FEATURE_TYPES = range(6)


@pytest.mark.parametrize(("profile", "series", "works"), TABLE, ids=[t[0] for t in TABLE])
@pytest.mark.parametrize("ft", FEATURE_TYPES)
def test_every_series_with_every_feature_type(profile: str, series: Series, works: set[int], ft: int) -> None:
    check = check_feature_type("vgpu", profile, ft)
    assert check.series is series
    assert set(check.works) == works
    if ft in works:
        assert check.result is CheckResult.OK and not check.mismatch
        return
    assert check.result is CheckResult.MISMATCH and check.mismatch
    # The message names the profile, its series, the product it needs, the FeatureType given and those that work.
    row = SERIES_LICENSING[series]
    assert profile in check.message and f"{series}-series" in check.message
    assert row.product in check.message and f"featureType {ft} cannot license it" in check.message
    listed = check.message.split("FeatureTypes that work: ", 1)[1]
    assert [int(part.split(" ", 1)[0]) for part in listed.split("), ")] == list(row.works)


def test_the_table_recommends_1_for_every_series_and_matches_the_documented_one() -> None:
    assert {s: SERIES_LICENSING[s].works for s in Series} == {
        Series.Q: (1, 2), Series.B: (1, 2), Series.A: (1,), Series.C: (1, 4, 2)}
    assert {SERIES_LICENSING[s].recommended for s in Series} == {1}
    assert set(Series) == set(SERIES_LICENSING)
    # Every FeatureType the table names is one gridd accepts.
    assert {ft for row in SERIES_LICENSING.values() for ft in row.works} <= VALID_FEATURE_TYPES
    assert set(PASSTHROUGH_WORKS) == {2, 4}


def test_the_message_marks_the_recommended_feature_type() -> None:
    msg = check_feature_type("vgpu", "A100-4C", 0).message
    assert "1 (NVIDIA vGPU, auto-detected; recommended), 4 (Virtual Compute Server), 2 (RTX Virtual Workstation)" \
        in msg
    assert "stay unlicensed" in msg


def test_a_fitting_but_dearer_feature_type_is_ok_with_a_note() -> None:
    b = check_feature_type("vgpu", "L4-1B", 2)
    assert b.result is CheckResult.OK and "consumes an RTX Virtual Workstation license" in b.message
    c = check_feature_type("vgpu", "A100-4C", 2)
    assert c.result is CheckResult.OK and "RTX Virtual Workstation" in c.message
    assert check_feature_type("vgpu", "A100-4C", 4).message == ""
    assert check_feature_type("vgpu", "L40S-2Q", 1).message == ""


# --- how a profile may be written ---------------------------------------------------------------------
@pytest.mark.parametrize(("written", "name", "series"), [
    ("L40S-2Q", "L40S-2Q", Series.Q),
    ("l40s-2q", "L40S-2Q", Series.Q),
    ("  L40S-2Q\n", "L40S-2Q", Series.Q),
    ("NVIDIA L40S-2Q", "L40S-2Q", Series.Q),
    ("nvidia a100-4c", "A100-4C", Series.C),
    ("NVIDIA_A10-24Q", "A10-24Q", Series.Q),
    ("GRID T4-2A", "T4-2A", Series.A),
    ("nvidia.com/NVIDIA_L40S-2Q", "L40S-2Q", Series.Q),
    ("NVIDIA.COM/GRID_T4-16C", "T4-16C", Series.C),
    ("nvidia.com/L4-1B", "L4-1B", Series.B),
    ("nvidia.com/nvidia l4-1b", "L4-1B", Series.B),
    # MIG-backed types, media extensions, display heads, 512 MB framebuffers, names with spaces.
    ("A100-1-5C", "A100-1-5C", Series.C),
    ("NVIDIA H100-1-10CME", "H100-1-10CME", Series.C),
    ("GRID M10-1B4", "M10-1B4", Series.B),
    ("M10-0B", "M10-0B", Series.B),
    ("A100D-80C", "A100D-80C", Series.C),
    ("NVIDIA RTX6000-4Q", "RTX6000-4Q", Series.Q),
    ("NVIDIA RTX PRO 6000 Blackwell DC-4Q", "RTX PRO 6000 BLACKWELL DC-4Q", Series.Q),
])
def test_prefixes_and_case(written: str, name: str, series: Series) -> None:
    p = parse_profile(written)
    assert p is not None and (p.name, p.series) == (name, series)
    assert profile_series(written) is series
    assert check_feature_type("vgpu", written, 1).result is CheckResult.OK


@pytest.mark.parametrize("written", [
    "", "   ", "L40S", "2Q", "-2Q", "L40S-", "L40S-Q", "L40S-2", "L40S--2Q", "L40S-2-Q", "L40S-2QQ",
    "L40S-2Q-", "L40S 2Q", "nvidia.com/", "NVIDIA ", "NVIDIA", "nvidia.com/nvidia.com/L40S-2Q",
    "L40S-2Q/extra", "L40S-2.5Q", "L40S-2Q\x00", "L40S-\uff12Q", "a" * 99 + "-2Q", "L40S-2Q" + " " * 200,
])
def test_malformed_names_are_no_profile(written: str) -> None:
    assert parse_profile(written) is None
    assert profile_series(written) is None


@pytest.mark.parametrize("written", [
    "L40S-2Q junk", "L40S-2X", "NVIDIA A100-4E", "GRID M60-8M", "T4-2QME", "A100-1-5QX"])
def test_unparsable_or_unknown_series_are_not_checked(written: str) -> None:
    for ft in FEATURE_TYPES:
        check = check_feature_type("vgpu", written, ft)
        assert check.result is CheckResult.UNKNOWN_PROFILE and not check.mismatch
        assert "featureType not checked" in check.message and check.works == ()


def test_an_unknown_series_letter_is_named() -> None:
    p = parse_profile("NVIDIA A100-4E")
    assert p is not None and p.letter == "E" and p.series is None
    assert "series E" in check_feature_type("vgpu", "NVIDIA A100-4E", 1).message


@pytest.mark.parametrize("raw", [5, 1.5, True, ("L40S-2Q",), b"L40S-2Q", "<dict>"])
def test_non_string_profiles_are_unknown(raw: object) -> None:
    assert parse_profile(raw) is None
    assert check_feature_type("vgpu", raw, 1).result is CheckResult.UNKNOWN_PROFILE


@pytest.mark.parametrize("profile", [None, "", "  "])
@pytest.mark.parametrize("ft", [*FEATURE_TYPES, None])
def test_a_vgpu_class_without_a_profile_is_not_checked(profile: str | None, ft: int | None) -> None:
    check = check_feature_type("vgpu", profile, ft)
    assert check.result is CheckResult.NO_PROFILE and check.message == "" and not check.mismatch


# --- passthrough ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", [None, "L40S-2Q", "A100-4C", "garbage"])
@pytest.mark.parametrize("ft", FEATURE_TYPES)
def test_passthrough_needs_2_or_4_whatever_the_profile(profile: str | None, ft: int) -> None:
    check = check_feature_type("passthrough", profile, ft)
    assert check.works == (2, 4)
    if ft in (2, 4):
        assert check.result is CheckResult.OK
    else:
        assert check.result is CheckResult.MISMATCH
        assert "passthrough" in check.message and f"featureType {ft}" in check.message
        assert "1 cannot auto-detect" in check.message


def test_a_passthrough_class_without_a_feature_type_is_not_checked() -> None:
    assert check_feature_type("passthrough", "L40S-2Q", None).result is CheckResult.NO_PROFILE


# --- odd FeatureTypes and modes -------------------------------------------------------------------------
@pytest.mark.parametrize("ft", [None, True, False, "1", 1.0, -1, 1 << 40, "<dict>"])
def test_feature_types_that_are_no_valid_integer_are_mismatches(ft: object) -> None:
    check = check_feature_type("vgpu", "L40S-2Q", ft)
    assert check.result is CheckResult.MISMATCH
    assert ("a missing featureType" if ft is None else "featureType ") in check.message
    assert len(check.message) < 400


@pytest.mark.parametrize("mode", [None, "vGPU", "mig", ""])
def test_an_invalid_mode_is_checked_as_vgpu(mode: str | None) -> None:
    assert check_feature_type(mode, "L40S-2Q", 4).result is CheckResult.MISMATCH
    assert check_feature_type(mode, "L40S-2Q", 1).result is CheckResult.OK


@given(st.text(max_size=120), st.one_of(st.none(), st.integers(-3, 8)), st.sampled_from(["vgpu", "passthrough"]))
def test_any_input_gives_a_bounded_answer(profile: str, ft: int | None, mode: str) -> None:
    """Total: never raises, and a message never carries more than a bounded slice of the input."""
    check = check_feature_type(mode, profile, ft)
    assert check.result in set(CheckResult)
    assert len(check.message) < 600
    assert check.mismatch == (check.result is CheckResult.MISMATCH)
