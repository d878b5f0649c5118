"""A token that is not a JWT is a source problem (status `unreadable`, metric, alert) unless marked opaque."""

from __future__ import annotations

import pytest

from licensectl.cli.status_fetch import UNREADABLE_TOKEN_PROBLEM, status_from_controller
from licensectl.cli.status_render import _valid_cell, status_table
from licensectl.core.model import ANN_TOKEN_OPAQUE
from licensectl.core.tokeninfo import Readability, TokenFormat, readability, token_info
from tests.unit.cli.test_status_client import CONTROLLER_DOC

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
        ({"valid": True, "token": "unreadable"}, "yes, unreadable"),
        ({"valid": True, "token": "opaque"}, "yes"),
        ({"valid": True}, "yes"),  # an older controller does not say
        ({"valid": False, "token": "unreadable"}, "NO"),
    ],
)
def test_status_valid_cell(source: dict[str, object], cell: str) -> None:
    assert _valid_cell(source) == cell


def test_every_view_of_a_non_jwt_token_says_the_same() -> None:
    """Usable and delivered (`valid`, VALID, licensectl_source_valid 1), with the unreadable token as its
    problem in the table and in JSON (and licensectl_source_token_unreadable 1 beside the metric)."""
    raw = {**CONTROLLER_DOC, "replication": {**CONTROLLER_DOC["replication"], "sources": {
        "vws": {"source_revision": "abcdefabcdef", "valid": True, "token": "unreadable"},
        "vcs": {"source_revision": "bcdefabcdefa", "valid": True, "token": "opaque"}}}}
    doc = status_from_controller(raw)
    vws = next(s for s in doc["sources"] if s["class"] == "vws")
    vcs = next(s for s in doc["sources"] if s["class"] == "vcs")
    assert (vws["valid"], vws["token"], vws["problem"]) == (True, "unreadable", UNREADABLE_TOKEN_PROBLEM)
    assert (vcs["valid"], vcs["problem"]) == (True, None)  # knowingly opaque: no problem
    row = next(line for line in status_table(doc).splitlines() if line.startswith("vws "))
    assert "yes, unreadable" in row and UNREADABLE_TOKEN_PROBLEM in row
