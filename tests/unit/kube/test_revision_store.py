"""The revision store's pure parts: which live content may become a revision, and a store body only
ever names revisions whose bytes it holds."""

from __future__ import annotations

from types import MappingProxyType

from licensectl.core.model import ObjectRef, RevisionStore, SourceSecret
from licensectl.core.render import MAX_TOKEN_BYTES
from licensectl.core.rotation import Decision, RotationPhase, RotationRecord, content_revision
from licensectl.kube.revision_store import live_revision, slot_revision, slot_source, store_body, store_name

KEY = "client_configuration_token.tok"
REF = ObjectRef("hoster", "nls")


def src(token: bytes, conf: bytes | None = None) -> SourceSecret:
    data = {KEY: token} | ({"gridd.conf": conf} if conf is not None else {})
    return SourceSecret("hoster", "nls", "uid", "1", MappingProxyType(data))


def test_only_renderable_content_has_a_revision() -> None:
    assert live_revision(src(b"tok"), KEY) == content_revision(b"tok", None)
    assert live_revision(src(b"tok", b"A=1\n"), KEY) == content_revision(b"tok", b"A=1\n")
    for bad in (src(b"   "), src(b"x" * (MAX_TOKEN_BYTES + 1)), src(b"tok", b"\0"), None):
        assert live_revision(bad, KEY) is None
    assert live_revision(SourceSecret("hoster", "nls", "uid", "1", MappingProxyType({})), KEY) is None


def test_bootstrap_then_candidate_then_promotion_move_the_bytes() -> None:
    stable, cand = src(b"old", b"A=1\n"), src(b"new")
    rs, rc = live_revision(stable, KEY), live_revision(cand, KEY)
    assert rs and rc
    first = store_body(namespace="ctl", source=REF, existing=None, live=stable, token_key=KEY,
                       decision=Decision(RotationRecord(stable=rs), snapshot="stable"))
    assert first is not None and first.name == store_name(REF) and first.resource_version == ""
    store = RevisionStore("ctl", first.name, "u", "7", first.annotations, first.data)
    assert slot_revision(store, "stable") == rs and slot_revision(store, "candidate") is None
    canary = RotationRecord(stable=rs, phase=RotationPhase.CANARY, candidate=rc, canary=("a",))
    second = store_body(namespace="ctl", source=REF, existing=store, live=cand, token_key=KEY,
                        decision=Decision(canary, snapshot="candidate"))
    assert second is not None and second.resource_version == "7"
    store = RevisionStore("ctl", second.name, "u", "8", second.annotations, second.data)
    back = slot_source(store, "stable", live=cand, token_key=KEY)
    assert back is not None and back.data == {KEY: b"old", "gridd.conf": b"A=1\n"} and back.ref == cand.ref
    # The next candidate after promotion: the promoted bytes become stable.
    third = src(b"newer")
    r3 = live_revision(third, KEY)
    assert r3
    nxt = RotationRecord(stable=rc, phase=RotationPhase.CANARY, candidate=r3, canary=("b",))
    body = store_body(namespace="ctl", source=REF, existing=store, live=third, token_key=KEY,
                      decision=Decision(nxt, snapshot="candidate", promote=True))
    assert body is not None
    promoted = RevisionStore("ctl", body.name, "u", "9", body.annotations, body.data)
    assert (slot_revision(promoted, "stable"), slot_revision(promoted, "candidate")) == (rc, r3)
    assert "stable.gridd.conf" not in body.data  # the old stable's gridd.conf went with it
    assert "new" not in repr(body) and "old" not in repr(body)  # bytes never in a repr


def test_a_record_the_bytes_cannot_back_is_not_written() -> None:
    stable = src(b"old")
    rs = live_revision(stable, KEY)
    assert rs
    wrong = RotationRecord(stable=content_revision(b"other", None))
    assert store_body(namespace="ctl", source=REF, existing=None, live=stable, token_key=KEY,
                      decision=Decision(wrong, snapshot="stable")) is None
    assert store_body(namespace="ctl", source=REF, existing=None, live=stable, token_key=KEY,
                      decision=Decision(None)) is None
