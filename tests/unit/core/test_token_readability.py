"""A token that is not a JWT is a source problem (status `unreadable`, metric, alert) unless marked opaque."""

from __future__ import annotations

import pytest

from licensectl.cli.status_render import _valid_cell
from licensectl.core.model import ANN_TOKEN_OPAQUE
from licensectl.core.tokeninfo import Readability, TokenFormat, readability, token_info

JWT = b"eyJhbGciOiJSUzI1NiJ9.eyJleHAiOjE4MDAwMDAwMDB9.c2ln"


@pytest.mark.parametrize(
    ("fmt", "annotations", "expected"),
    [
        (TokenFormat.JWT, {}, Readability.READABLE),
        (TokenFormat.NO_EXPIRY, {}, Readability.READABLE),  # a JWT: the documented format, exp just absent
        (TokenFormat.JWT, {ANN_TOKEN_OPAQUE: "true"}, Readability.READABLE),
        (TokenFormat.NOT_JWT, {}, Readability.UNREADABLE),
        (TokenFormat.NOT_JWT, {ANN_TOKEN_OPAQUE: "true"}, Readability.OPAQUE),
        (TokenFormat.NOT_JWT, {ANN_TOKEN_OPAQUE: " True\n"}, Readability.OPAQUE),
        (TokenFormat.NOT_JWT, {ANN_TOKEN_OPAQUE: "false"}, Readability.UNREADABLE),
        (TokenFormat.NOT_JWT, {ANN_TOKEN_OPAQUE: "yes"}, Readability.UNREADABLE),  # only "true" marks it
    ],
)
def test_readability(fmt: TokenFormat, annotations: dict[str, str], expected: Readability) -> None:
    assert readability(fmt, annotations) is expected


def test_from_token_bytes() -> None:
    assert readability(token_info(JWT).format, {}) is Readability.READABLE
    assert readability(token_info(b"opaque-bytes-from-the-wrong-file").format, {}) is Readability.UNREADABLE


@pytest.mark.parametrize(
    ("source", "cell"),
    [
        ({"valid": True, "token": "readable"}, "yes"),
        ({"valid": True, "token": "unreadable"}, "unreadable"),
        ({"valid": True, "token": "opaque"}, "yes"),
        ({"valid": True}, "yes"),  # an older controller does not say
        ({"valid": False, "token": "unreadable"}, "NO"),
    ],
)
def test_status_valid_cell(source: dict[str, object], cell: str) -> None:
    assert _valid_cell(source) == cell
