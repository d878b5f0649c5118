"""Replicas name the signing key of their credential; a key rotation is an in-place update, no restart.

The rollout restarts a VM only when its replica's revision changes (docs/design.md#safe-rotation), so the
key id must stay outside the revision and the revision time (docs/design.md#key-ring).
"""

from __future__ import annotations

import datetime as dt

from licensectl.core.credentials import KeyRing, derive_credential
from licensectl.core.model import ANN_CREDENTIAL_KEY, ANN_REVISION, ANN_REVISION_TIME, ReplicaSecret
from licensectl.core.render import (
    DesiredReplica,
    RenderedLicense,
    ReplicaAction,
    render_license,
    render_replica,
    replica_diff,
)
from tests.unit.core.test_render import NOW, TOKEN_KEY, VWS, observed, rendered, source

K1, K2 = bytes(range(32)), bytes(range(1, 33))


def replica(key: bytes, *, existing: ReplicaSecret | None = None, now: dt.datetime = NOW,
            with_id: bool = True) -> DesiredReplica:
    ring = KeyRing(current=key)
    return render_replica(rendered(), namespace="tenant-a", gpu_class=VWS, source=source(),
                          report_url="https://r.example/v1/reports", credential=ring.credential("tenant-a"),
                          existing=existing, now=now,
                          credential_key=ring.current_id if with_id else "")


def test_replica_carries_the_key_id_not_the_key() -> None:
    d = replica(K1)
    assert d.annotations[ANN_CREDENTIAL_KEY] == KeyRing(current=K1).current_id
    assert K1.hex() not in repr(d) and K1.hex() not in str(dict(d.annotations))
    assert ANN_CREDENTIAL_KEY not in replica(K1, with_id=False).annotations


def test_key_rotation_updates_in_place_without_a_new_revision() -> None:
    first = replica(K1)
    seen = observed(first)
    second = replica(K2, existing=seen, now=NOW + dt.timedelta(hours=1))
    assert replica_diff(seen, second) is ReplicaAction.UPDATE
    for ann in (ANN_REVISION, ANN_REVISION_TIME):
        assert second.annotations[ann] == first.annotations[ann]
    assert second.revision == first.revision
    assert second.data["report-credential"] == derive_credential(K2, "tenant-a").encode()


def test_a_replica_without_the_annotation_gains_it_with_its_next_write() -> None:
    """Replicas written before the ring: no write per replica at upgrade (an unmarked replica's key counts
    as unknown, so every key is kept); the id comes with the next key rotation, revision unchanged."""
    old = replica(K1, with_id=False)
    seen = observed(old)
    assert replica_diff(seen, replica(K1, existing=seen)) is ReplicaAction.NOOP
    rotated = replica(K2, existing=seen)
    assert replica_diff(seen, rotated) is ReplicaAction.UPDATE
    assert rotated.revision == old.revision
    assert rotated.annotations[ANN_CREDENTIAL_KEY] == KeyRing(current=K2).current_id
    assert replica_diff(observed(rotated), rotated) is ReplicaAction.NOOP


def test_a_revocation_is_part_of_the_revision() -> None:
    """`keys rotate --revoke-older` is a reason to restart every VM: it is part of the revision."""
    plain = rendered()
    assert render_license(source(), VWS, TOKEN_KEY).revision == plain.revision  # unchanged without one
    revoked = render_license(source(), VWS, TOKEN_KEY, credential_epoch="3f0c1a2b3c4d5e6f")
    again = render_license(source(), VWS, TOKEN_KEY, credential_epoch="3f0c1a2b3c4d5e6f")
    other = render_license(source(), VWS, TOKEN_KEY, credential_epoch="0000000000000000")
    assert isinstance(revoked, RenderedLicense) and isinstance(again, RenderedLicense)
    assert isinstance(other, RenderedLicense)
    assert revoked.revision == again.revision != plain.revision  # deterministic, and a new revision
    assert other.revision not in (plain.revision, revoked.revision)  # each revocation is its own
    assert revoked.token == plain.token and revoked.gridd_conf == plain.gridd_conf  # the guest's license is unchanged
