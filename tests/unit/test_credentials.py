"""credentials: derivation, verification across a key rotation, Secret round trip, no key leaks."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from licensectl.core.credentials import (
    SECRET_KEY_CURRENT,
    SECRET_KEY_PREVIOUS,
    SECRET_KEY_ROTATED_AT,
    KeyRing,
    derive_credential,
    keyring_from_secret_data,
    keyring_to_secret_data,
    new_signing_key,
)

K1 = bytes(range(32))
K2 = bytes(range(1, 33))
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
GRACE = dt.timedelta(days=7)


def test_derive_is_deterministic_per_key_and_namespace() -> None:
    c = derive_credential(K1, "tenant-foo")
    assert c == derive_credential(K1, "tenant-foo")
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", c)
    assert c != derive_credential(K1, "tenant-bar")
    assert c != derive_credential(K2, "tenant-foo")
    # Domain separation: not the plain HMAC of the namespace.
    import base64
    import hashlib
    import hmac
    plain = base64.urlsafe_b64encode(hmac.new(K1, b"tenant-foo", hashlib.sha256).digest()).rstrip(b"=").decode()
    assert c != plain


@pytest.mark.parametrize(("key", "ns"), [(b"short", "ns"), (K1, "")])
def test_derive_rejects_weak_input(key: bytes, ns: str) -> None:
    with pytest.raises(ValueError):
        derive_credential(key, ns)


def test_new_signing_key_is_random_32_bytes() -> None:
    a, b = new_signing_key(), new_signing_key()
    assert len(a) == 32 and a != b


def test_verify_current_key() -> None:
    ring = KeyRing(current=K1)
    c = ring.credential("tenant-foo")
    assert ring.verify("tenant-foo", c, now=T0, grace=GRACE)
    assert not ring.verify("tenant-bar", c, now=T0, grace=GRACE)  # another namespace's credential
    assert not ring.verify("tenant-foo", c[:-1] + ("A" if c[-1] != "A" else "B"), now=T0, grace=GRACE)  # forged
    assert not ring.verify("tenant-foo", "", now=T0, grace=GRACE)
    assert not ring.verify("", c, now=T0, grace=GRACE)
    assert not ring.verify("tenant-foo", "\u00e9" * 43, now=T0, grace=GRACE)  # non-ASCII must not raise


def test_previous_key_accepted_only_within_grace() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0)
    old = derive_credential(K1, "tenant-foo")
    new = derive_credential(K2, "tenant-foo")
    assert ring.credential("tenant-foo") == new
    assert ring.verify("tenant-foo", new, now=T0 + GRACE * 10, grace=GRACE)
    assert ring.verify("tenant-foo", old, now=T0 + GRACE - dt.timedelta(seconds=1), grace=GRACE)
    assert not ring.verify("tenant-foo", old, now=T0 + GRACE, grace=GRACE)
    assert not ring.verify("tenant-bar", old, now=T0, grace=GRACE)


def test_previous_key_without_rotation_time_is_not_trusted() -> None:
    ring = KeyRing(current=K2, previous=K1)
    assert not ring.verify("ns", derive_credential(K1, "ns"), now=T0, grace=GRACE)


def test_prune_drops_previous_after_grace() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0)
    assert ring.prune(T0 + dt.timedelta(days=1), GRACE) is ring
    pruned = ring.prune(T0 + GRACE, GRACE)
    assert pruned.previous is None and pruned.current == K2


def test_repr_and_str_hide_keys() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0)
    for text in (repr(ring), str(ring)):
        assert K1.hex() not in text and K2.hex() not in text and repr(K1) not in text and repr(K2) not in text
        assert "32 bytes" in text


def test_keyring_validation() -> None:
    with pytest.raises(ValueError):
        KeyRing(current=b"short")
    with pytest.raises(ValueError):
        KeyRing(current=K1, previous=b"x")
    with pytest.raises(ValueError):
        KeyRing(current=K1, rotated_at=dt.datetime(2026, 1, 1))  # naive


def test_secret_round_trip() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0)
    data = keyring_to_secret_data(ring)
    assert data == {SECRET_KEY_CURRENT: K2, SECRET_KEY_PREVIOUS: K1, SECRET_KEY_ROTATED_AT: b"2026-01-01T00:00:00Z"}
    assert keyring_from_secret_data(data) == ring
    only = keyring_to_secret_data(KeyRing(current=K1))
    assert only == {SECRET_KEY_CURRENT: K1}
    assert keyring_from_secret_data(only) == KeyRing(current=K1)


def test_rotated_at_keeps_its_stored_form() -> None:
    """Whole seconds, microseconds only when there are some; zone-less values are read as UTC."""
    ring = KeyRing(current=K1).rotate(K2, T0 + dt.timedelta(microseconds=250_000))
    data = keyring_to_secret_data(ring)
    assert data[SECRET_KEY_ROTATED_AT] == b"2026-01-01T00:00:00.250000Z"
    assert keyring_from_secret_data(data) == ring
    by_hand = keyring_from_secret_data({SECRET_KEY_CURRENT: K1, SECRET_KEY_ROTATED_AT: b" 2026-01-01T01:00:00+01:00\n"})
    assert by_hand.rotated_at == T0
    zone_less = keyring_from_secret_data({SECRET_KEY_CURRENT: K1, SECRET_KEY_ROTATED_AT: b"2026-01-01T00:00:00"})
    assert zone_less.rotated_at == T0


@pytest.mark.parametrize(
    "data",
    [
        {},
        {SECRET_KEY_CURRENT: b""},
        {SECRET_KEY_CURRENT: b"tooshort-secret-bytes"},
        {SECRET_KEY_CURRENT: K1, SECRET_KEY_ROTATED_AT: b"yesterday"},
        {SECRET_KEY_CURRENT: K1, SECRET_KEY_PREVIOUS: b"tiny-secret-bytes", SECRET_KEY_ROTATED_AT: b"2026-01-01"},
    ],
)
def test_bad_secret_data_errors_name_no_bytes(data: dict[str, bytes]) -> None:
    with pytest.raises(ValueError) as e:
        keyring_from_secret_data(data)
    assert "secret-bytes" not in str(e.value)
