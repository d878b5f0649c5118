"""The expiry a client configuration token carries about itself.

The NLS token is a signed JWT (RS256) whose payload holds `exp` (docs/design.md#token-expiry). licensectl only
reports that time (metric, alert before it runs out), so it decodes the payload *without*
verifying the signature; a token that is not a decodable JWT is still delivered as opaque bytes,
its expiry is just unknown. Nothing here may leak token content: every failure is swallowed and
becomes None.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from licensectl.core.model import ANN_TOKEN_OPAQUE

# Tokens are a few KiB; refuse to parse anything absurd.
_MAX_TOKEN_BYTES = 64 * 1024
# Latest instant a datetime can hold (9999-12-31T23:59:59Z); later values are nonsense.
_MAX_EXP = 253402300799


class TokenFormat(StrEnum):
    """What licensectl could read from a token (never its content): a metric label and Event reason."""

    JWT = "jwt"  # a JWT with a sane numeric exp
    NOT_JWT = "not_jwt"  # not three base64url segments with JSON header and payload (opaque bytes)
    NO_EXPIRY = "no_expiry"  # a JWT without a usable exp claim


@dataclass(frozen=True, slots=True)
class TokenInfo:
    format: TokenFormat
    expiry: dt.datetime | None


def _b64url_json(segment: str) -> object:
    raw = segment.encode("ascii")
    raw += b"=" * (-len(raw) % 4)
    return json.loads(base64.b64decode(raw, altchars=b"-_", validate=True).decode("utf-8"))


def _payload(token: bytes) -> dict[str, object] | None:
    """The JWT payload, or None when the token is not a decodable JWT."""
    if len(token) > _MAX_TOKEN_BYTES:
        return None
    text = token.decode("ascii").strip()
    parts = text.split(".")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        return None
    header = _b64url_json(parts[0])
    payload = _b64url_json(parts[1])
    if not isinstance(header, dict) or not isinstance(payload, dict):
        return None
    return payload


def _exp(payload: dict[str, object]) -> dt.datetime | None:
    exp = payload.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return None
    if not math.isfinite(exp) or not 0 < exp <= _MAX_EXP:
        return None
    return dt.datetime.fromtimestamp(exp, tz=dt.UTC)


def token_info(token: bytes) -> TokenInfo:
    """Classify a token and read its `exp`, without verifying it and without raising."""
    try:
        payload = _payload(token)
        if payload is None:
            return TokenInfo(TokenFormat.NOT_JWT, None)
        exp = _exp(payload)
    except Exception:
        # Any failure means "not a JWT"; the exception is dropped on purpose, as its text could
        # quote token bytes.
        return TokenInfo(TokenFormat.NOT_JWT, None)
    return TokenInfo(TokenFormat.JWT if exp is not None else TokenFormat.NO_EXPIRY, exp)


def token_expiry(token: bytes) -> dt.datetime | None:
    """`exp` of a JWT token as an aware UTC datetime; None if not a JWT or no sane numeric exp."""
    return token_info(token).expiry


class Readability(StrEnum):
    """Whether licensectl can read a source's token, as status and the unreadable-token alert show it."""

    READABLE = "readable"  # a JWT (with or without exp): its format is the one NVIDIA documents
    UNREADABLE = "unreadable"  # not a JWT: probably the wrong file, delivered anyway (a source problem)
    OPAQUE = "opaque"  # not a JWT, and the hoster marked the source as knowingly opaque


def readability(fmt: TokenFormat, source_annotations: Mapping[str, str]) -> Readability:
    """A token that is not a JWT is a source problem unless the hoster annotated the source
    `licensectl.io/token-opaque: "true"` (docs/operations.md#opaque-tokens)."""
    if fmt is not TokenFormat.NOT_JWT:
        return Readability.READABLE
    if source_annotations.get(ANN_TOKEN_OPAQUE, "").strip().lower() == "true":
        return Readability.OPAQUE
    return Readability.UNREADABLE
