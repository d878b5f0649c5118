"""The time codec: exact written forms, what the parser accepts and rejects, round-trips."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from licensectl.core.timecodec import (
    annotation_time,
    format_micro_time,
    format_time,
    from_epoch_us,
    parse_time,
    to_epoch_us,
    to_utc,
)

UTC = dt.UTC
CEST = dt.timezone(dt.timedelta(hours=2))
T = dt.datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)

SECONDS_FORM = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
MICRO_FORM = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")

# Whole-minute offsets only: RFC 3339 offsets have no seconds.
offsets = st.integers(min_value=-(24 * 60 - 1), max_value=24 * 60 - 1).map(
    lambda m: dt.timezone(dt.timedelta(minutes=m)))
# Away from the ends of datetime's range, where converting to UTC would overflow.
aware = st.datetimes(min_value=dt.datetime(2, 1, 1), max_value=dt.datetime(9998, 12, 31), timezones=offsets)


# --- written forms ------------------------------------------------------------------------------
def test_format_time_is_whole_seconds_utc() -> None:
    t = dt.datetime(2024, 5, 1, 12, 0, 1, 999_999, tzinfo=CEST)
    assert format_time(t) == "2024-05-01T10:00:01Z"


def test_format_micro_time_has_six_digits() -> None:
    assert format_micro_time(T) == "2024-05-01T10:00:00.000000Z"
    assert format_micro_time(dt.datetime(2024, 5, 1, 12, 0, 1, 250_000, tzinfo=CEST)) == "2024-05-01T10:00:01.250000Z"


def test_naive_datetimes_are_written_as_utc_not_local_time() -> None:
    naive = dt.datetime(2024, 5, 1, 10, 0, 0, 5)
    assert format_time(naive) == "2024-05-01T10:00:00Z"
    assert format_micro_time(naive) == "2024-05-01T10:00:00.000005Z"
    assert to_utc(naive) == dt.datetime(2024, 5, 1, 10, 0, 0, 5, tzinfo=UTC)


def test_early_years_are_zero_padded() -> None:
    assert format_time(dt.datetime(999, 1, 2, tzinfo=UTC)) == "0999-01-02T00:00:00Z"
    assert format_micro_time(dt.datetime(1, 1, 1, tzinfo=UTC)) == "0001-01-01T00:00:00.000000Z"


@given(aware)
def test_written_forms_match_their_grammar(t: dt.datetime) -> None:
    assert SECONDS_FORM.fullmatch(format_time(t))
    assert MICRO_FORM.fullmatch(format_micro_time(t))


# --- parsing ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "expected"), [
    ("2024-05-01T10:00:00Z", T),
    ("2024-05-01T12:00:00+02:00", T),
    ("2024-05-01T07:30:00-02:30", T),
    ("2024-05-01T12:00:00+0200", T),  # journald short-iso: offset without colon
    ("2024-05-01t10:00:00z", T),
    ("2024-05-01 10:00:00Z", T),
    ("2024-05-01T10:00:00.5Z", T.replace(microsecond=500_000)),
    ("2024-05-01T10:00:00.000000Z", T),
    ("2024-05-01T10:00:00.123456Z", T.replace(microsecond=123_456)),
    ("2024-05-01T10:00:00.123456789Z", T.replace(microsecond=123_456)),  # Go RFC3339Nano: cut, not rounded
    ("2024-05-01T10:00:00.999999999+00:00", T.replace(microsecond=999_999)),
])
def test_parse_accepts(raw: str, expected: dt.datetime) -> None:
    got = parse_time(raw)
    assert got == expected
    assert got is not None and got.tzinfo is UTC


@pytest.mark.parametrize("raw", [
    None, 1714557600, 1714557600.0, b"2024-05-01T10:00:00Z", T, [], "",
    "yesterday",
    "2024-05-01",  # a date is not a time
    "2024-05-01T10:00Z",  # seconds are required
    "2024-13-01T10:00:00Z", "2024-02-30T10:00:00Z", "2024-05-01T24:00:00Z", "2024-05-01T10:60:00Z",
    "2024-05-01T10:00:60Z",  # leap seconds are not representable
    "2024-05-01T10:00:00+24:00", "2024-05-01T10:00:00+02:60", "2024-05-01T10:00:00+2:00",
    "2024-05-01T10:00:00.Z", "2024-05-01T10:00:00,5Z",
    " 2024-05-01T10:00:00Z", "2024-05-01T10:00:00Z\n",  # whitespace is the caller's to strip
    "2024-05-01T10:00:00ZZ", "2024-5-1T10:00:00Z", "+2024-05-01T10:00:00Z",
    "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",  # out of datetime's range in UTC
    "0000-01-01T00:00:00Z",
    "\uff12\uff10\uff12\uff14-05-01T10:00:00Z",  # full-width digits
])
def test_parse_rejects(raw: object) -> None:
    assert parse_time(raw) is None
    assert parse_time(raw, assume_utc=True) is None


def test_zone_less_values_are_rejected_unless_assumed_utc() -> None:
    assert parse_time("2024-05-01T10:00:00") is None
    assert parse_time("2024-05-01T10:00:00.25") is None
    assert parse_time("2024-05-01T10:00:00", assume_utc=True) == T
    assert parse_time("2024-05-01T10:00:00.25", assume_utc=True) == T.replace(microsecond=250_000)


def test_the_ends_of_the_range_parse() -> None:
    assert parse_time("0001-01-01T00:00:00Z") == dt.datetime(1, 1, 1, tzinfo=UTC)
    assert parse_time("9999-12-31T23:59:59.999999Z") == dt.datetime.max.replace(tzinfo=UTC)


# --- annotations --------------------------------------------------------------------------------
def test_annotation_time_forgives_the_whitespace_of_hand_edits() -> None:
    ann = {"a": "2024-05-01T10:00:00Z", "b": " 2024-05-01T12:00:00+02:00\n", "c": "2024-05-01T10:00:00",
           "d": "soon", "e": ""}
    assert annotation_time(ann, "a") == T
    assert annotation_time(ann, "b") == T
    assert annotation_time(ann, "c") is None  # still no zone, no guess
    assert annotation_time(ann, "d") is None
    assert annotation_time(ann, "e") is None
    assert annotation_time(ann, "missing") is None


@given(aware)
def test_annotation_values_written_before_the_codec_still_parse(t: dt.datetime) -> None:
    """The forms licensectl wrote before this module existed (strftime, isoformat) read back."""
    u = t.astimezone(UTC)
    old_forms = [(u.isoformat().replace("+00:00", "Z"), u)]  # the signing key's rotated-at
    if u.year >= 1000:  # strftime("%Y") pads to four digits only from there on (glibc)
        old_forms += [(u.strftime("%Y-%m-%dT%H:%M:%SZ"), u.replace(microsecond=0)),  # revision-time, Events
                      (u.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), u)]  # restart annotations, Lease
        assert format_time(t) == old_forms[1][0] and format_micro_time(t) == old_forms[2][0]
    for raw, expected in old_forms:
        assert annotation_time({"k": raw}, "k") == expected


# --- round trips --------------------------------------------------------------------------------
@given(aware)
def test_micro_time_round_trips_exactly(t: dt.datetime) -> None:
    got = parse_time(format_micro_time(t))
    assert got == t and got is not None and got.tzinfo is UTC


@given(aware)
def test_seconds_time_round_trips_to_the_second(t: dt.datetime) -> None:
    assert parse_time(format_time(t)) == t.replace(microsecond=0)


@given(aware)
def test_python_isoformat_with_offset_parses(t: dt.datetime) -> None:
    assert parse_time(t.isoformat()) == t
    assert parse_time(t.isoformat(sep=" ", timespec="seconds")) == t.replace(microsecond=0)


@given(aware)
def test_naive_isoformat_parses_only_when_assumed_utc(t: dt.datetime) -> None:
    naive = t.astimezone(UTC).replace(tzinfo=None).isoformat()
    assert parse_time(naive) is None
    assert parse_time(naive, assume_utc=True) == t


@given(aware)
def test_formatting_a_parsed_value_reproduces_it(t: dt.datetime) -> None:
    for fmt in (format_time, format_micro_time):
        s = fmt(t)
        parsed = parse_time(s)
        assert parsed is not None and fmt(parsed) == s


@given(st.text(max_size=40))
def test_parse_is_total(raw: str) -> None:
    got = parse_time(raw, assume_utc=True)
    assert got is None or got.tzinfo is UTC


# --- epoch microseconds (how the caches keep VMI times) ------------------------------------------
@given(st.datetimes(min_value=dt.datetime(1686, 1, 1), max_value=dt.datetime(2254, 12, 31, 23, 59, 59, 999_999),
                    timezones=offsets))
def test_epoch_microseconds_round_trip_exactly_in_the_documented_range(t: dt.datetime) -> None:
    got = from_epoch_us(to_epoch_us(t))
    assert got == t and got.tzinfo is UTC


def test_epoch_microseconds_count_from_the_unix_epoch_and_take_naive_as_utc() -> None:
    assert to_epoch_us(dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)) == 1_000_000.0
    assert to_epoch_us(dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)) == -1.0
    assert to_epoch_us(T.replace(tzinfo=None)) == to_epoch_us(T) == to_epoch_us(T.astimezone(CEST))
    assert isinstance(to_epoch_us(T), float)


@given(aware)
def test_epoch_microseconds_order_like_the_times_and_stay_in_range(t: dt.datetime) -> None:
    """Beyond the exact range a time moves by less than a millisecond, never out of datetime's range."""
    got = from_epoch_us(to_epoch_us(t))
    assert abs(got - t) < dt.timedelta(milliseconds=1)
    later = t + dt.timedelta(seconds=1)
    assert to_epoch_us(later) > to_epoch_us(t)


def test_epoch_microseconds_at_the_ends_of_datetimes_range() -> None:
    for end in (dt.datetime.min.replace(tzinfo=UTC), dt.datetime.max.replace(tzinfo=UTC)):
        assert abs(from_epoch_us(to_epoch_us(end)) - end) < dt.timedelta(microseconds=64)
