"""Per-namespace report credentials, derived from a ring of signing keys the controller keeps.

A guest proves which tenant namespace it reports for with a bearer credential that licensectl
writes into that namespace's replica Secret. Credentials are derived (HMAC-SHA256 of the namespace
under a signing key), so nothing per-namespace has to be stored, and rotating the key re-keys every
namespace at once. A running guest only learns a new credential when its VMI restarts (KubeVirt
builds the license disk at VMI start, docs/design.md#kubevirt-secret-disks), so an older key stays in
the ring for as long as a running VMI may still hold a credential derived from it: decided from
cluster state (the key id the admission webhook stamped on each VMI), never from a timer
(docs/design.md#key-ring). Pure: no I/O, time passed in.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import secrets
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from licensectl.core.model import Vmi
from licensectl.core.timecodec import format_micro_time, format_time, parse_time

# Keys of the signing-key Secret the controller keeps in its own namespace.
SECRET_KEY_CURRENT: Final = "current"
# The newest older key, also written under this name so a release that knows only one previous key
# still accepts it after a downgrade; read as an older key retired at `rotated-at` when no
# `older.*` entries exist (the form before the ring).
SECRET_KEY_PREVIOUS: Final = "previous"
SECRET_KEY_ROTATED_AT: Final = "rotated-at"
# The id of the key made current by the last `keys rotate --revoke-older`: part of every replica's
# revision, so a revocation rolls every VM onto the new credential (docs/design.md#key-ring).
SECRET_KEY_REVOCATION: Final = "revocation"
# Older keys: `older.<key id>` holds the key, `older.<key id>.retired-at` when it stopped being current.
SECRET_OLDER_PREFIX: Final = "older."
SECRET_RETIRED_SUFFIX: Final = ".retired-at"

KEY_BYTES: Final = 32
MIN_KEY_BYTES: Final = 32
# The ring holds the current key and at most MAX_KEYS - 1 older ones. At the bound a rotation first
# drops older keys no running VMI holds; if every one is still held it is refused (`RingFull`) and
# names the VMIs holding the oldest key: restart them, or revoke on purpose (docs/design.md#key-ring).
MAX_KEYS: Final = 8
# An older key no VMI is seen holding is still kept this long after it was retired: a VMI admitted
# with the old credential just before the replicas were rewritten needs a moment to show up in the
# VMI cache with its stamp.
MIN_RETENTION: Final = dt.timedelta(minutes=10)
# Domain separation: a key used for anything else can never mint a report credential.
_CONTEXT: Final = b"licensectl.io/report-credential/v1\x00"
# Separate domain for the public key id: knowing an id reveals nothing usable about the key.
_ID_CONTEXT: Final = b"licensectl.io/signing-key-id/v1\x00"
KEY_ID_CHARS: Final = 16


def new_signing_key() -> bytes:
    """A fresh random signing key."""
    return secrets.token_bytes(KEY_BYTES)


def key_id(key: bytes) -> str:
    """The non-secret id of a signing key (16 hex characters): what replicas and VMIs are annotated with."""
    return hashlib.sha256(_ID_CONTEXT + key).hexdigest()[:KEY_ID_CHARS]


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


def _aware(t: dt.datetime | None, what: str) -> None:
    if t is not None and t.tzinfo is None:
        raise ValueError(f"{what} must be timezone-aware")


@dataclass(frozen=True, slots=True)
class OlderKey:
    """A key that is no longer current; `retired_at` is when the next key replaced it."""

    key: bytes = field(repr=False)
    retired_at: dt.datetime | None

    @property
    def id(self) -> str:
        return key_id(self.key)


class RingFull(ValueError):
    """A rotation would exceed MAX_KEYS while every older key is still held by a running VMI."""

    def __init__(self, oldest: str, holders: tuple[str, ...]) -> None:
        self.oldest = oldest
        self.holders = holders
        super().__init__(f"the key ring is full ({MAX_KEYS} keys) and its oldest key {oldest} is still held by "
                         f"{len(holders)} running VMI(s); restart them or rotate with --revoke-older")


@dataclass(frozen=True, slots=True)
class Holders:
    """Which key ids running VMIs may hold, from cluster state (`holders_from`).

    `by_key`: key id -> "namespace/name" of the VMIs stamped with it. `unknown`: VMIs whose key cannot
    be told (no stamp: admitted before the stamp existed, or by a webhook that did not stamp); while
    there is any, or while the VMI cache is not complete (`complete=False`), every key is kept.
    """

    by_key: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()
    complete: bool = True

    @property
    def keeps_everything(self) -> bool:
        return bool(self.unknown) or not self.complete

    def holding(self, kid: str) -> tuple[str, ...]:
        """VMIs that may hold `kid`: those stamped with it, plus every unstamped one."""
        return tuple(sorted({*self.by_key.get(kid, ()), *self.unknown}))


@dataclass(frozen=True, slots=True)
class VmiKey:
    """The part of a VMI the ring decides from: does it carry a licensectl credential, and which key."""

    namespace: str
    name: str
    mounts_replica: bool  # it has a licensectl replica volume, so a report credential on its disk
    finished: bool  # phase Succeeded/Failed: its guest runs no more
    delivered_key: str | None  # the webhook's stamp, None when absent


FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})


def vmi_keys(vmis: Iterable[Vmi], replicas: Collection[tuple[str, str]]) -> list[VmiKey]:
    """The ring's view of cached VMIs; `replicas` are the (namespace, name) of licensectl's replicas."""
    return [VmiKey(namespace=v.namespace, name=v.name,
                   mounts_replica=any((v.namespace, s) in replicas for s in v.secret_volumes),
                   finished=v.phase in FINISHED_PHASES, delivered_key=v.delivered_key) for v in vmis]


def holders_from(vmis: Iterable[VmiKey] | None) -> Holders:
    """Key holders among running VMIs; `vmis=None` (cache not synced) keeps every key."""
    if vmis is None:
        return Holders(complete=False)
    by_key: dict[str, list[str]] = {}
    unknown: list[str] = []
    for v in vmis:
        if not v.mounts_replica or v.finished:
            continue
        ref = f"{v.namespace}/{v.name}"
        if v.delivered_key:
            by_key.setdefault(v.delivered_key, []).append(ref)
        else:
            unknown.append(ref)
    return Holders(by_key={k: tuple(sorted(r)) for k, r in by_key.items()}, unknown=tuple(sorted(unknown)))


@dataclass(frozen=True, slots=True)
class KeyRing:
    """The current signing key and the older keys running guests may still hold (newest first)."""

    current: bytes = field(repr=False)
    older: tuple[OlderKey, ...] = ()
    rotated_at: dt.datetime | None = None  # when `current` became current
    # Key id made current by the last revocation ("" if none): kept across later rotations, so the
    # replica revision it is part of changes once per revocation and never back.
    revocation: str = ""

    def __post_init__(self) -> None:
        if len(self.current) < MIN_KEY_BYTES or any(len(o.key) < MIN_KEY_BYTES for o in self.older):
            raise ValueError(f"signing keys must be at least {MIN_KEY_BYTES} bytes")
        _aware(self.rotated_at, "rotated_at")
        for o in self.older:
            _aware(o.retired_at, "retired_at")
        if len(self.older) + 1 > MAX_KEYS:
            raise ValueError(f"a key ring holds at most {MAX_KEYS} keys")
        ids = [self.current_id, *(o.id for o in self.older)]
        if len(set(ids)) != len(ids):
            raise ValueError("a key ring must not hold the same key twice")

    def __repr__(self) -> str:
        return (f"KeyRing(current={self.current_id}, older={[o.id for o in self.older]}, "
                f"rotated_at={self.rotated_at!r})")

    @property
    def current_id(self) -> str:
        return key_id(self.current)

    @property
    def ids(self) -> tuple[str, ...]:
        """Every key id in the ring, current first."""
        return (self.current_id, *(o.id for o in self.older))

    @property
    def previous(self) -> bytes | None:
        """The newest older key (what a release before the ring called the previous key)."""
        return self.older[0].key if self.older else None

    def credential(self, namespace: str) -> str:
        """What to write into `namespace`'s replica: always derived from the current key."""
        return derive_credential(self.current, namespace)

    def verify(self, namespace: str, credential: str) -> bool:
        """Constant-time check against every key in the ring (each is computed, so timing tells no key)."""
        if not namespace:
            return False
        given = credential.encode("utf-8", "replace")
        ok = False
        for key in (self.current, *(o.key for o in self.older)):
            ok = _matches(key, namespace, given) or ok
        return ok

    def prune(self, holders: Holders, now: dt.datetime, *, min_retention: dt.timedelta = MIN_RETENTION) -> KeyRing:
        """Drop older keys no running VMI may hold (and retired at least `min_retention` ago)."""
        if holders.keeps_everything:
            return self
        keep = tuple(o for o in self.older if holders.by_key.get(o.id)
                     or o.retired_at is None or now - o.retired_at < min_retention)
        return self if keep == self.older else KeyRing(current=self.current, older=keep, rotated_at=self.rotated_at,
                                                        revocation=self.revocation)

    def next_prune_at(self, holders: Holders, *, min_retention: dt.timedelta = MIN_RETENTION) -> dt.datetime | None:
        """When the first older key no running VMI holds may be dropped (None: none will be, as things stand)."""
        if holders.keeps_everything:
            return None
        due = [o.retired_at + min_retention for o in self.older
               if o.retired_at is not None and not holders.by_key.get(o.id)]
        return min(due) if due else None

    def rotate(self, new_key: bytes, now: dt.datetime, holders: Holders, *,
               retention: dt.timedelta = MIN_RETENTION) -> KeyRing:
        """A ring whose current key is `new_key`; today's current becomes the newest older key.

        Unheld older keys past `retention` are pruned first; at the bound, unheld ones past MIN_RETENTION
        too. If the ring would still exceed MAX_KEYS, `RingFull` names the oldest key and its holders:
        nothing is dropped that a running guest may need.
        """
        pruned = self.prune(holders, now, min_retention=retention)
        if len(pruned.older) + 2 > MAX_KEYS:
            pruned = pruned.prune(holders, now, min_retention=min(retention, MIN_RETENTION))
        older = (OlderKey(self.current, now), *pruned.older)
        if len(older) + 1 > MAX_KEYS:
            oldest = pruned.older[-1].id
            raise RingFull(oldest, holders.holding(oldest))
        return KeyRing(current=new_key, older=older, rotated_at=now, revocation=self.revocation)

    def revoke_older(self, new_key: bytes, now: dt.datetime) -> KeyRing:
        """Rotate and end every older key on purpose: only credentials of `new_key` verify afterwards.

        The new `revocation` changes every replica's revision, so the rollout restarts every VM (each
        one running now holds an older key) onto the new credential, paced like a token rollout."""
        return KeyRing(current=new_key, older=(), rotated_at=now, revocation=key_id(new_key))

    def stale_holders(self, holders: Holders) -> tuple[str, ...]:
        """Running VMIs that hold (or may hold) a key other than the current one."""
        cur = self.current_id
        out = {ref for kid, refs in holders.by_key.items() if kid != cur for ref in refs}
        return tuple(sorted(out | set(holders.unknown)))


def _parse_when(raw: bytes | None, name: str) -> dt.datetime | None:
    if not raw:
        return None
    t = parse_time(raw.decode("ascii", "replace").strip(), assume_utc=True)
    if t is None:
        raise ValueError(f"signing-key Secret has a malformed {name!r}")
    return t


def _format_when(t: dt.datetime) -> bytes:
    # Whole seconds unless there is a fraction: the form this key has always had (lossless).
    return (format_micro_time(t) if t.microsecond else format_time(t)).encode("ascii")


def keyring_from_secret_data(data: Mapping[str, bytes]) -> KeyRing:
    """Read the signing-key Secret (decoded data). Errors name the key, never its bytes."""
    current = data.get(SECRET_KEY_CURRENT)
    if not current:
        raise ValueError(f"signing-key Secret lacks {SECRET_KEY_CURRENT!r}")
    rotated_at = _parse_when(data.get(SECRET_KEY_ROTATED_AT), SECRET_KEY_ROTATED_AT)
    older: list[OlderKey] = []
    for name in sorted(data):
        if not name.startswith(SECRET_OLDER_PREFIX) or name.endswith(SECRET_RETIRED_SUFFIX):
            continue
        key = data[name]
        retired = _parse_when(data.get(name + SECRET_RETIRED_SUFFIX), name + SECRET_RETIRED_SUFFIX)
        older.append(OlderKey(key=key, retired_at=retired))
    previous = data.get(SECRET_KEY_PREVIOUS) or None
    if previous is not None and all(o.key != previous for o in older):
        older.append(OlderKey(key=previous, retired_at=rotated_at))
    epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
    older.sort(key=lambda o: o.retired_at or epoch, reverse=True)  # newest first; unknown time last
    revocation = (data.get(SECRET_KEY_REVOCATION) or b"").decode("ascii", "replace").strip()
    try:
        return KeyRing(current=current, older=tuple(older), rotated_at=rotated_at, revocation=revocation)
    except ValueError as e:
        raise ValueError(f"signing-key Secret is invalid: {e}") from None


def keyring_to_secret_data(ring: KeyRing) -> dict[str, bytes]:
    """The data of the signing-key Secret for `ring` (times as RFC 3339 UTC)."""
    out = {SECRET_KEY_CURRENT: ring.current}
    if ring.previous is not None:
        out[SECRET_KEY_PREVIOUS] = ring.previous
    for o in ring.older:
        out[SECRET_OLDER_PREFIX + o.id] = o.key
        if o.retired_at is not None:
            out[SECRET_OLDER_PREFIX + o.id + SECRET_RETIRED_SUFFIX] = _format_when(o.retired_at)
    if ring.rotated_at is not None:
        out[SECRET_KEY_ROTATED_AT] = _format_when(ring.rotated_at)
    if ring.revocation:
        out[SECRET_KEY_REVOCATION] = ring.revocation.encode("ascii")
    return out
