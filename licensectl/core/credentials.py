"""Per-namespace report credentials, derived from one signing key the controller keeps.

A guest proves which tenant namespace it reports for with a bearer credential that licensectl
writes into that namespace's replica Secret. Credentials are derived (HMAC-SHA256 of the namespace
under a signing key), so nothing per-namespace has to be stored, and rotating the key re-keys every
namespace at once; the previous key stays valid for a grace period because running guests only see
the new credential after their VMI restarts (docs/design.md#kubevirt-secret-disks). Pure: no I/O, time passed in.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from licensectl.core.timecodec import format_micro_time, format_time, parse_time

# Keys of the signing-key Secret the controller keeps in its own namespace.
SECRET_KEY_CURRENT: Final = "current"
SECRET_KEY_PREVIOUS: Final = "previous"
SECRET_KEY_ROTATED_AT: Final = "rotated-at"

KEY_BYTES: Final = 32
MIN_KEY_BYTES: Final = 32
# Domain separation: a key used for anything else can never mint a report credential.
_CONTEXT: Final = b"licensectl.io/report-credential/v1\x00"


def new_signing_key() -> bytes:
    """A fresh random signing key."""
    return secrets.token_bytes(KEY_BYTES)


def derive_credential(key: bytes, namespace: str) -> str:
    """The bearer credential of `namespace`: base64url (unpadded) HMAC-SHA256, 43 characters."""
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"signing key must be at least {MIN_KEY_BYTES} bytes")
    if not namespace:
        raise ValueError("namespace must not be empty")
    mac = hmac.new(key, _CONTEXT + namespace.encode("utf-8"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


def _matches(key: bytes, namespace: str, credential: bytes) -> bool:
    expected = derive_credential(key, namespace).encode("ascii")
    return hmac.compare_digest(expected, credential)


@dataclass(frozen=True, slots=True)
class KeyRing:
    """The current signing key, plus the previous one while its grace period lasts."""

    current: bytes = field(repr=False)
    previous: bytes | None = field(default=None, repr=False)
    rotated_at: dt.datetime | None = None

    def __post_init__(self) -> None:
        if len(self.current) < MIN_KEY_BYTES or (
            self.previous is not None and len(self.previous) < MIN_KEY_BYTES
        ):
            raise ValueError(f"signing keys must be at least {MIN_KEY_BYTES} bytes")
        if self.rotated_at is not None and self.rotated_at.tzinfo is None:
            raise ValueError("rotated_at must be timezone-aware")

    def __repr__(self) -> str:
        prev = "set" if self.previous is not None else "none"
        return f"KeyRing(current=<{len(self.current)} bytes>, previous={prev}, rotated_at={self.rotated_at!r})"

    def credential(self, namespace: str) -> str:
        """What to write into `namespace`'s replica: always derived from the current key."""
        return derive_credential(self.current, namespace)

    def verify(self, namespace: str, credential: str, *, now: dt.datetime, grace: dt.timedelta) -> bool:
        """Constant-time check; the previous key counts only until rotated_at + grace."""
        if not namespace:
            return False
        given = credential.encode("utf-8", "replace")
        ok = _matches(self.current, namespace, given)
        if self.previous is not None and self.rotated_at is not None:
            # Always compute, so timing does not reveal which key matched.
            prev_ok = _matches(self.previous, namespace, given)
            ok = ok or (prev_ok and now < self.rotated_at + grace)
        return ok

    def rotate(self, new_key: bytes, now: dt.datetime) -> KeyRing:
        """A ring whose current key is `new_key`, keeping today's current as the previous key."""
        return KeyRing(current=new_key, previous=self.current, rotated_at=now)

    def prune(self, now: dt.datetime, grace: dt.timedelta) -> KeyRing:
        """Drop the previous key once its grace period is over (so it stops being stored)."""
        if self.previous is not None and (self.rotated_at is None or now >= self.rotated_at + grace):
            return KeyRing(current=self.current, previous=None, rotated_at=self.rotated_at)
        return self


def keyring_from_secret_data(data: Mapping[str, bytes]) -> KeyRing:
    """Read the signing-key Secret (decoded data). Errors name the key, never its bytes."""
    current = data.get(SECRET_KEY_CURRENT)
    if not current:
        raise ValueError(f"signing-key Secret lacks {SECRET_KEY_CURRENT!r}")
    previous = data.get(SECRET_KEY_PREVIOUS) or None
    rotated_at: dt.datetime | None = None
    raw = data.get(SECRET_KEY_ROTATED_AT)
    if raw:
        rotated_at = parse_time(raw.decode("ascii", "replace").strip(), assume_utc=True)
        if rotated_at is None:
            raise ValueError(f"signing-key Secret has a malformed {SECRET_KEY_ROTATED_AT!r}")
    try:
        return KeyRing(current=current, previous=previous, rotated_at=rotated_at)
    except ValueError as e:
        raise ValueError(f"signing-key Secret is invalid: {e}") from None


def keyring_to_secret_data(ring: KeyRing) -> dict[str, bytes]:
    """The data of the signing-key Secret for `ring` (rotated-at as RFC 3339 UTC)."""
    out = {SECRET_KEY_CURRENT: ring.current}
    if ring.previous is not None:
        out[SECRET_KEY_PREVIOUS] = ring.previous
    if ring.rotated_at is not None:
        # Whole seconds unless there is a fraction: the form this key has always had (lossless).
        t = ring.rotated_at
        out[SECRET_KEY_ROTATED_AT] = (format_micro_time(t) if t.microsecond else format_time(t)).encode("ascii")
    return out
