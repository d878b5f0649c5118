"""credentials: derivation, the key ring (holders, prune, bound, revoke), Secret round trip, no key leaks."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from licensectl.core.credentials import (
    MAX_KEYS,
    MIN_RETENTION,
    SECRET_KEY_CURRENT,
    SECRET_KEY_PREVIOUS,
    SECRET_KEY_ROTATED_AT,
    Holders,
    KeyRing,
    OlderKey,
    RingFull,
    VmiKey,
    derive_credential,
    holders_from,
    key_id,
    keyring_from_secret_data,
    keyring_to_secret_data,
    new_signing_key,
    vmi_keys,
)
from licensectl.core.model import Vmi

K1 = bytes(range(32))
K2 = bytes(range(1, 33))
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
GRACE = dt.timedelta(days=7)
K3, K4 = bytes(range(2, 34)), bytes(range(3, 35))
KEYS = [bytes([i]) * 32 for i in range(1, 20)]
NONE = Holders()  # a complete VMI list in which nobody holds anything


def held(**by_key: tuple[str, ...]) -> Holders:
    return Holders(by_key=dict(by_key))


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
    assert ring.verify("tenant-foo", c)
    assert not ring.verify("tenant-bar", c)  # another namespace's credential
    assert not ring.verify("tenant-foo", c[:-1] + ("A" if c[-1] != "A" else "B"))  # forged
    assert not ring.verify("tenant-foo", "")
    assert not ring.verify("", c)
    assert not ring.verify("tenant-foo", "\u00e9" * 43)  # non-ASCII must not raise


def test_key_id_is_short_stable_and_not_the_key() -> None:
    assert key_id(K1) == key_id(K1) != key_id(K2)
    assert len(key_id(K1)) == 16 and int(key_id(K1), 16) >= 0
    assert key_id(K1) not in K1.hex() and key_id(K1) not in derive_credential(K1, "ns")


def test_every_key_in_the_ring_verifies_until_it_leaves_it() -> None:
    """Two rotations in a row: guests on the first and the second key keep reporting (the issue's lockout)."""
    ring = KeyRing(current=K1).rotate(K2, T0, NONE).rotate(K3, T0 + dt.timedelta(seconds=30), NONE)
    assert ring.ids == (key_id(K3), key_id(K2), key_id(K1))
    for k in (K1, K2, K3):
        assert ring.verify("ns", derive_credential(k, "ns"))
    assert ring.credential("ns") == derive_credential(K3, "ns")
    assert not ring.verify("ns", derive_credential(K4, "ns"))
    # No timer: years later an unpruned older key still verifies.
    assert ring.verify("ns", derive_credential(K1, "ns"))


def test_holders_from_vmis() -> None:
    vmis = [
        VmiKey("a", "vm1", mounts_replica=True, finished=False, delivered_key="k1"),
        VmiKey("a", "vm2", mounts_replica=True, finished=False, delivered_key="k1"),
        VmiKey("b", "vm3", mounts_replica=True, finished=False, delivered_key="k2"),
        VmiKey("b", "done", mounts_replica=True, finished=True, delivered_key="k0"),  # guest no longer runs
        VmiKey("b", "plain", mounts_replica=False, finished=False, delivered_key=None),  # no license disk
        VmiKey("c", "old", mounts_replica=True, finished=False, delivered_key=None),  # no stamp
    ]
    h = holders_from(vmis)
    assert h.by_key == {"k1": ("a/vm1", "a/vm2"), "k2": ("b/vm3",)}
    assert h.unknown == ("c/old",) and h.keeps_everything
    assert h.holding("k1") == ("a/vm1", "a/vm2", "c/old")
    assert h.holding("k0") == ("c/old",)
    assert not holders_from(vmis[:3]).keeps_everything
    assert holders_from(None).keeps_everything and not holders_from(None).complete


def test_vmi_keys_from_model() -> None:
    def vmi(name: str, vols: tuple[str, ...], phase: str = "Running", key: str | None = None) -> Vmi:
        return Vmi("a", name, "u", 0.0, None, phase, True, None, vols, None, delivered_key=key)

    got = vmi_keys([vmi("x", ("licensectl-c",), key="k"), vmi("y", ("other",)), vmi("z", ("licensectl-c",), "Failed")],
                   {("a", "licensectl-c")})
    assert got == [VmiKey("a", "x", True, False, "k"), VmiKey("a", "y", False, False, None),
                   VmiKey("a", "z", True, True, None)]


def test_prune_keeps_held_keys_and_drops_unheld_ones_after_retention() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0, NONE).rotate(K3, T0 + dt.timedelta(hours=1), NONE, retention=GRACE)
    later = T0 + dt.timedelta(days=1)
    # Nobody holds K1 or K2: both go (retired long enough ago).
    assert ring.prune(NONE, later).ids == (key_id(K3),)
    # A VMI stamped with K1 keeps K1, K2 goes.
    assert ring.prune(held(**{key_id(K1): ("a/vm",)}), later).ids == (key_id(K3), key_id(K1))
    # Just retired: kept for MIN_RETENTION (a VMI admitted with it may not be cached yet).
    just = T0 + dt.timedelta(hours=1) + MIN_RETENTION - dt.timedelta(seconds=1)
    assert ring.prune(NONE, just).ids == (key_id(K3), key_id(K2))
    # A longer retention (the grace setting) keeps unheld keys longer.
    assert ring.prune(NONE, later, min_retention=GRACE) is ring
    assert ring.prune(NONE, T0 + GRACE + dt.timedelta(hours=1), min_retention=GRACE).ids == (key_id(K3),)


@pytest.mark.parametrize("holders", [Holders(unknown=("a/unstamped",)), Holders(complete=False)])
def test_prune_keeps_everything_when_holders_cannot_be_told(holders: Holders) -> None:
    ring = KeyRing(current=K1).rotate(K2, T0, NONE)
    assert ring.prune(holders, T0 + dt.timedelta(days=365)) is ring


def test_prune_keeps_an_older_key_of_unknown_retirement() -> None:
    ring = KeyRing(current=K2, older=(OlderKey(K1, None),))
    assert ring.prune(NONE, T0) is ring


def test_rotate_prunes_first_and_keeps_what_is_held() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0, NONE)
    later = T0 + dt.timedelta(days=1)
    assert ring.rotate(K3, later, NONE).ids == (key_id(K3), key_id(K2))  # K1 unheld: gone
    kept = ring.rotate(K3, later, held(**{key_id(K1): ("a/vm",)}))
    assert kept.ids == (key_id(K3), key_id(K2), key_id(K1)) and kept.rotated_at == later
    assert kept.older[0] == OlderKey(K2, later)


def test_ring_bound_refuses_when_every_older_key_is_held() -> None:
    now = T0
    ring = KeyRing(current=KEYS[0])
    holders = {}
    for i in range(1, MAX_KEYS):
        holders[key_id(KEYS[i - 1])] = (f"ns/vm{i - 1}",)
        now += dt.timedelta(hours=1)
        ring = ring.rotate(KEYS[i], now, Holders(by_key=dict(holders)))
    assert len(ring.ids) == MAX_KEYS
    holders[key_id(KEYS[MAX_KEYS - 1])] = ("ns/newest",)
    with pytest.raises(RingFull) as e:
        ring.rotate(KEYS[MAX_KEYS], now + dt.timedelta(hours=1), Holders(by_key=dict(holders)))
    assert e.value.oldest == key_id(KEYS[0]) and e.value.holders == ("ns/vm0",)
    assert "--revoke-older" in str(e.value) and KEYS[0].hex() not in str(e.value)
    # Once the oldest key's VMI is gone, the rotation goes through and drops it.
    del holders[key_id(KEYS[0])]
    ring2 = ring.rotate(KEYS[MAX_KEYS], now + dt.timedelta(hours=1), Holders(by_key=dict(holders)))
    assert len(ring2.ids) == MAX_KEYS and key_id(KEYS[0]) not in ring2.ids


def test_ring_bound_drops_unheld_keys_inside_the_grace_period() -> None:
    ring = KeyRing(current=KEYS[0])
    now = T0
    for i in range(1, MAX_KEYS):
        now += dt.timedelta(hours=1)
        ring = ring.rotate(KEYS[i], now, NONE, retention=GRACE)
    assert len(ring.ids) == MAX_KEYS  # all unheld, all within the 7-day grace
    now += dt.timedelta(hours=1)
    ring = ring.rotate(KEYS[MAX_KEYS], now, NONE, retention=GRACE)
    assert len(ring.ids) == 2  # at the bound unheld keys past MIN_RETENTION go regardless of grace


def test_revoke_older_ends_every_older_key_and_names_holders() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0, NONE)
    h = Holders(by_key={key_id(K1): ("a/old",), key_id(K2): ("a/new",)}, unknown=("b/unstamped",))
    assert ring.stale_holders(h) == ("a/old", "b/unstamped")
    revoked = ring.revoke_older(K3, T0 + dt.timedelta(hours=1))
    assert revoked.ids == (key_id(K3),)
    for k in (K1, K2):
        assert not revoked.verify("ns", derive_credential(k, "ns"))
    assert revoked.verify("ns", derive_credential(K3, "ns"))


def test_repr_and_str_hide_keys() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0, NONE)
    for text in (repr(ring), str(ring)):
        assert K1.hex() not in text and K2.hex() not in text and repr(K1) not in text and repr(K2) not in text
        assert key_id(K2) in text
    assert K1.hex() not in repr(ring.older[0])


def test_keyring_validation() -> None:
    with pytest.raises(ValueError):
        KeyRing(current=b"short")
    with pytest.raises(ValueError):
        KeyRing(current=K1, older=(OlderKey(b"x", None),))
    with pytest.raises(ValueError):
        KeyRing(current=K1, rotated_at=dt.datetime(2026, 1, 1))  # naive
    with pytest.raises(ValueError):
        KeyRing(current=K1, older=(OlderKey(K2, dt.datetime(2026, 1, 1)),))  # naive
    with pytest.raises(ValueError, match="same key twice"):
        KeyRing(current=K1, older=(OlderKey(K1, T0),))
    with pytest.raises(ValueError, match="at most"):
        KeyRing(current=KEYS[0], older=tuple(OlderKey(k, T0) for k in KEYS[1:MAX_KEYS + 1]))


def test_secret_round_trip() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0, NONE)
    data = keyring_to_secret_data(ring)
    assert data == {SECRET_KEY_CURRENT: K2, SECRET_KEY_PREVIOUS: K1, SECRET_KEY_ROTATED_AT: b"2026-01-01T00:00:00Z",
                    f"older.{key_id(K1)}": K1, f"older.{key_id(K1)}.retired-at": b"2026-01-01T00:00:00Z"}
    assert keyring_from_secret_data(data) == ring
    only = keyring_to_secret_data(KeyRing(current=K1))
    assert only == {SECRET_KEY_CURRENT: K1}
    assert keyring_from_secret_data(only) == KeyRing(current=K1)
    three = ring.rotate(K3, T0 + dt.timedelta(hours=2), held(**{key_id(K1): ("a/vm",)}))
    assert keyring_from_secret_data(keyring_to_secret_data(three)) == three


def test_reads_the_form_before_the_ring() -> None:
    """`current` + `previous` + `rotated-at` (one previous key): the previous key is an older key."""
    ring = keyring_from_secret_data({SECRET_KEY_CURRENT: K2, SECRET_KEY_PREVIOUS: K1,
                                     SECRET_KEY_ROTATED_AT: b"2026-01-01T00:00:00Z"})
    assert ring.older == (OlderKey(K1, T0),) and ring.rotated_at == T0
    assert ring.verify("ns", derive_credential(K1, "ns"))


def test_rotated_at_keeps_its_stored_form() -> None:
    """Whole seconds, microseconds only when there are some; zone-less values are read as UTC."""
    ring = KeyRing(current=K1).rotate(K2, T0 + dt.timedelta(microseconds=250_000), NONE)
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
        {SECRET_KEY_CURRENT: K1, "older.x": b"tiny-secret-bytes"},
        {SECRET_KEY_CURRENT: K1, "older.x": K2, "older.x.retired-at": b"soon"},
    ],
)
def test_bad_secret_data_errors_name_no_bytes(data: dict[str, bytes]) -> None:
    with pytest.raises(ValueError) as e:
        keyring_from_secret_data(data)
    assert "secret-bytes" not in str(e.value)


def test_next_prune_at_is_when_the_first_unheld_key_may_go() -> None:
    t1 = T0 + dt.timedelta(hours=1)
    ring = KeyRing(current=K1).rotate(K2, T0, NONE).rotate(K3, t1, NONE, retention=GRACE)
    assert ring.next_prune_at(NONE, min_retention=GRACE) == T0 + GRACE  # K1 first, then K2
    assert ring.next_prune_at(held(**{key_id(K1): ("a/vm",)}), min_retention=GRACE) == t1 + GRACE
    both = held(**{key_id(K1): ("a/vm",), key_id(K2): ("b/vm",)})
    assert ring.next_prune_at(both) is None  # everything held: nothing to come back for
    assert ring.next_prune_at(Holders(unknown=("c/old",))) is None
    assert KeyRing(current=K1).next_prune_at(NONE) is None


def test_revocation_is_kept_across_rotations_and_stored() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0, NONE)
    assert ring.revocation == ""
    revoked = ring.revoke_older(K3, T0 + dt.timedelta(hours=1))
    assert revoked.revocation == key_id(K3)
    later = revoked.rotate(K4, T0 + dt.timedelta(hours=2), NONE)
    assert later.revocation == key_id(K3)  # a plain rotation never changes it (no restart)
    assert later.prune(NONE, T0 + dt.timedelta(days=30)).revocation == key_id(K3)
    data = keyring_to_secret_data(later)
    assert data["revocation"] == key_id(K3).encode()
    assert keyring_from_secret_data(data) == later
    assert "revocation" not in keyring_to_secret_data(ring)
