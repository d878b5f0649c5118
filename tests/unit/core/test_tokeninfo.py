"""Token expiry: decode a JWT payload's `exp` without verifying, never fail loudly.

Tokens are built here from parts, so no token-looking literal lives in the repository.
"""

from __future__ import annotations

import base64
import datetime as dt
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from licensectl.core.tokeninfo import token_expiry, token_info

EXP = 1_767_225_600  # 2026-01-01T00:00:00Z


def b64url(raw: bytes, *, pad: bool = False) -> str:
    s = base64.urlsafe_b64encode(raw).decode()
    return s if pad else s.rstrip("=")


def segment(obj: object, *, pad: bool = False) -> str:
    return b64url(json.dumps(obj).encode(), pad=pad)


def jwt(payload: object, header: object | None = None, *, pad: bool = False) -> bytes:
    head = segment({"alg": "RS256", "typ": "JWT"} if header is None else header, pad=pad)
    signature = b64url(b"\x01not-a-real-signature\xff" * 8)
    return f"{head}.{segment(payload, pad=pad)}.{signature}".encode()


def test_exp_of_a_well_formed_token() -> None:
    token = jwt({"iat": EXP - 86400, "nbf": EXP - 86400, "exp": EXP, "service_url": "https://x"})
    got = token_expiry(token)
    assert got == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert got is not None and got.utcoffset() == dt.timedelta(0)


def test_padding_and_surrounding_whitespace_are_tolerated() -> None:
    assert token_expiry(jwt({"exp": EXP}, pad=True)) == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert token_expiry(b"\n " + jwt({"exp": EXP}) + b"\r\n") == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_fractional_exp() -> None:
    assert token_expiry(jwt({"exp": EXP + 0.5})) == dt.datetime(2026, 1, 1, 0, 0, 0, 500000, tzinfo=dt.UTC)


def test_url_safe_alphabet_is_decoded() -> None:
    # A payload whose base64url form contains "-" or "_" (so the standard alphabet would fail).
    payload = {"exp": EXP, "x": "\u00ff\u00fe>>>???"}
    seg = segment(payload)
    assert "-" in seg or "_" in seg
    assert token_expiry(jwt(payload)) == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


GOOD_HEAD = segment({"alg": "RS256"})
GOOD_BODY = segment({"exp": EXP})
NOT_UTF8 = b64url(bytes([0xFF, 0xFE]))


@pytest.mark.parametrize("token", [
    b"",
    b"just opaque bytes, not a jwt",
    b"\xff\xfe\x00binary",
    f"{GOOD_HEAD}.{GOOD_BODY}".encode(),                     # two parts
    f"{GOOD_HEAD}.{GOOD_BODY}.sig.extra".encode(),           # four parts
    f".{GOOD_BODY}.sig".encode(),                            # empty header
    f"{GOOD_HEAD}..sig".encode(),                            # empty payload
    f"{GOOD_HEAD}.{GOOD_BODY[:-1]}!.sig".encode(),           # bad base64 character
    f"{GOOD_HEAD}.{GOOD_BODY}A.sig".encode(),                # impossible base64 length
    f"{GOOD_HEAD}.{b64url(b'not json')}.sig".encode(),       # payload is not JSON
    f"{b64url(b'{oops')}.{GOOD_BODY}.sig".encode(),          # header is not JSON
    f"{segment([1, 2])}.{GOOD_BODY}.sig".encode(),           # header is not an object
    f"{GOOD_HEAD}.{NOT_UTF8}.sig".encode(),                  # payload not UTF-8
])
def test_not_a_jwt(token: bytes) -> None:
    assert token_expiry(token) is None


@pytest.mark.parametrize("payload", [
    {},
    {"iat": EXP},
    {"exp": str(EXP)},
    {"exp": None},
    {"exp": True},
    {"exp": [EXP]},
    {"exp": 0},
    {"exp": -5},
    {"exp": 10**12},        # year ~33658
    {"exp": 10**400},       # beyond any datetime (and float)
    [EXP],                  # payload is not an object
    "exp",
])
def test_no_sane_numeric_exp(payload: object) -> None:
    assert token_expiry(jwt(payload)) is None


@pytest.mark.parametrize("raw", [b'{"exp": NaN}', b'{"exp": Infinity}', b'{"exp": 1e999}'])
def test_non_finite_exp(raw: bytes) -> None:
    assert token_expiry(f"{GOOD_HEAD}.{b64url(raw)}.sig".encode()) is None


def test_oversized_token_is_not_parsed() -> None:
    assert token_expiry(jwt({"exp": EXP, "pad": "x" * 70_000})) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    got = token_expiry(data)
    assert got is None or got.tzinfo is not None


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 253402300799))
def test_any_sane_exp_round_trips(exp: int) -> None:
    got = token_expiry(jwt({"exp": exp}))
    assert got is not None and int(got.timestamp()) == exp


@pytest.mark.parametrize(("token", "fmt"), [
    (jwt({"exp": EXP}), "jwt"),
    (jwt({"iat": EXP}), "no_expiry"),
    (jwt({"exp": "soon"}), "no_expiry"),
    (b"\xff\xfe\x00binary garbage", "not_jwt"),
    (b"not.a.jwt", "not_jwt"),
    (b"", "not_jwt"),
])
def test_the_format_says_why_the_expiry_is_unknown(token: bytes, fmt: str) -> None:
    info = token_info(token)
    assert info.format.value == fmt
    assert (info.expiry is not None) == (fmt == "jwt")
    assert token not in repr(info).encode() or not token
