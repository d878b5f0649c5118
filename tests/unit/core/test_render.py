"""Render: replica names, the license a guest consumes, the replica Secret and its diff."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import re
from collections.abc import Mapping

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from licensectl.core import model
from licensectl.core.model import data_digest
from licensectl.core.render import (
    GRIDD_CONF_HEADER,
    MAX_GRIDD_CONF_BYTES,
    MAX_TOKEN_BYTES,
    DesiredReplica,
    RenderedLicense,
    ReplicaAction,
    ReplicaState,
    SourceProblem,
    SourceProblemReason,
    render_license,
    render_replica,
    replica_diff,
    replica_name,
    replica_state,
)

TOKEN_KEY = "client_configuration_token.tok"
# A recognizable stand-in for token bytes, so leaks into reprs and messages are detectable.
TOKEN = b"SENTINEL-token-bytes-4b1d\n"
SREF = model.ObjectRef("licensectl-system", "vws-token")
VWS = model.GpuClass("vws", "uid-vws", "vgpu", SREF, 1)
NOW = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def source(data: Mapping[str, bytes] | None = None, **kw: object) -> model.SourceSecret:
    fields: dict[str, object] = dict(namespace=SREF.namespace, name=SREF.name, uid="uid-src",
                                     resource_version="1", data={TOKEN_KEY: TOKEN} if data is None else data)
    fields.update(kw)
    return model.SourceSecret(**fields)  # type: ignore[arg-type]


def rendered(src: model.SourceSecret | None = None, cls: model.GpuClass = VWS) -> RenderedLicense:
    out = render_license(source() if src is None else src, cls, TOKEN_KEY)
    assert isinstance(out, RenderedLicense), out
    return out


def desired(lic: RenderedLicense | None = None, *, existing: model.ReplicaSecret | None = None,
            now: dt.datetime = NOW, credential: str = "cred-1", url: str = "https://r.example/v1/reports",
            src: model.SourceSecret | None = None) -> DesiredReplica:
    return render_replica(lic or rendered(), namespace="tenant-a", gpu_class=VWS, source=src or source(),
                          report_url=url, credential=credential, existing=existing, now=now)


def observed(d: DesiredReplica, *, labels: Mapping[str, str] | None = None,
             annotations: Mapping[str, str] | None = None, digest: bytes | None = None) -> model.ReplicaSecret:
    """The Secret the kube layer would see after writing `d`."""
    return model.ReplicaSecret(namespace=d.namespace, name=d.name, uid="uid-replica", resource_version="7",
                         labels=dict(d.labels) if labels is None else labels,
                         annotations=dict(d.annotations) if annotations is None else annotations,
                         data_digest=d.data_digest if digest is None else digest)


# --- replica names ----------------------------------------------------------------------------

def test_short_names_are_readable() -> None:
    assert replica_name("vws") == "nvidia-vgpu-license-vws"
    assert replica_name("a.b-c") == "nvidia-vgpu-license-a.b-c"


def test_name_length_boundary() -> None:
    fits = "a" * (253 - len("nvidia-vgpu-license-"))
    assert replica_name(fits) == "nvidia-vgpu-license-" + fits
    longer = replica_name(fits + "b")
    assert len(longer) == 253 and longer != replica_name(fits)
    assert re.fullmatch(r"nvidia-vgpu-license-a+-[0-9a-f]{16}", longer)


def test_truncation_at_a_dot_stays_valid() -> None:
    # The cut falls right after a "." in the class name: "x.-hash" would be invalid.
    name = "a" * 215 + "." + "b" * 30
    out = replica_name(name)
    assert len(out) == 253 and DNS_SUBDOMAIN.fullmatch(out), out


_ALNUM = "abcdefghijklmnopqrstuvwxyz0123456789"
_label = st.one_of(
    st.sampled_from(_ALNUM),
    st.builds(lambda a, mid, b: a + mid + b, st.sampled_from(_ALNUM),
              st.text(alphabet=_ALNUM + "-", max_size=61), st.sampled_from(_ALNUM)),
)
# Long shared heads make truncation (and so the hash) decide distinctness.
_heads = st.sampled_from(["", "a" * 60 + ".", "b" * 61 + "." + "c" * 61 + "." + "d" * 61 + ".",
                          "e" * 215 + "."])
dns_names = st.builds(lambda head, labels: head + ".".join(labels), _heads,
                      st.lists(_label, min_size=1, max_size=4)).filter(lambda s: len(s) <= 253)
@settings(max_examples=300, deadline=None)
@given(dns_names)
def test_names_are_valid_dns_subdomains(name: str) -> None:
    out = replica_name(name)
    assert len(out) <= 253
    assert DNS_SUBDOMAIN.fullmatch(out), out
    assert replica_name(name) == out


@settings(max_examples=200, deadline=None)
@given(st.sets(dns_names, min_size=2, max_size=20))
def test_distinct_classes_get_distinct_names(names: set[str]) -> None:
    assert len({replica_name(n) for n in names}) == len(names)


def test_long_names_differing_only_at_the_end_are_distinct() -> None:
    base = "x" * 240
    assert replica_name(base + "1") != replica_name(base + "2")


# --- render_license ---------------------------------------------------------------------------

def test_minimal_render() -> None:
    lic = rendered()
    assert lic.token == TOKEN
    assert lic.gridd_conf == (GRIDD_CONF_HEADER + "FeatureType=1\n").encode()
    assert lic.feature_type == 1
    assert re.fullmatch(r"[0-9a-f]{64}", lic.revision)
    assert lic.token_sha256 == hashlib.sha256(TOKEN).hexdigest()


def test_class_feature_type_wins_over_the_source_lines() -> None:
    hoster = (b"\n# hoster settings\nFeatureType=4\r\nServerPort=443   \r\n  featuretype = 2\n"
              b"#FeatureType=9\nEnableUI=FALSE\n\n\n")
    lic = rendered(source({TOKEN_KEY: TOKEN, "gridd.conf": hoster}), dataclasses.replace(VWS, feature_type=2))
    assert lic.gridd_conf.decode() == GRIDD_CONF_HEADER + (
        "# hoster settings\nServerPort=443\n#FeatureType=9\nEnableUI=FALSE\nFeatureType=2\n")
    active = [ln for ln in lic.gridd_conf.decode().splitlines()
              if ln.replace(" ", "").lower().startswith("featuretype=")]
    assert active == ["FeatureType=2"]


def _rev(token: bytes = TOKEN, conf: bytes | None = None, ft: int = 1, **kw: object) -> str:
    data = {TOKEN_KEY: token} | ({"gridd.conf": conf} if conf is not None else {})
    return rendered(source(data, **kw), dataclasses.replace(VWS, feature_type=ft)).revision


def test_revision_changes_exactly_with_token_or_effective_gridd_conf() -> None:
    base = _rev(conf=b"ServerPort=443\n")
    assert _rev(conf=b"ServerPort=443\n") == base
    # Same effective content: metadata, line endings, trailing blanks, a dropped FeatureType line.
    assert _rev(conf=b"ServerPort=443\n", uid="other", resource_version="99") == base
    assert _rev(conf=b"ServerPort=443\r\n\n\n") == base
    assert _rev(conf=b"FeatureType=4\nServerPort=443") == base
    # Different effective content.
    assert _rev(token=TOKEN + b"x", conf=b"ServerPort=443\n") != base
    assert _rev(conf=b"ServerPort=7070\n") != base
    assert _rev(conf=b"ServerPort=443\n", ft=4) != base


def test_unrelated_source_keys_do_not_change_the_revision() -> None:
    a = rendered(source({TOKEN_KEY: TOKEN}))
    b = rendered(source({TOKEN_KEY: TOKEN, "notes.txt": b"hello"}))
    assert a.revision == b.revision


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.binary(min_size=1, max_size=64),
       st.text(alphabet="abcXY=\n ", max_size=30), st.text(alphabet="abcXY=\n ", max_size=30))
def test_revision_equal_iff_consumed_content_equal(t1: bytes, t2: bytes, c1: str, c2: str) -> None:
    assume(t1.strip() and t2.strip())
    a = rendered(source({TOKEN_KEY: t1, "gridd.conf": c1.encode()}))
    b = rendered(source({TOKEN_KEY: t2, "gridd.conf": c2.encode()}))
    same = (a.token, a.gridd_conf) == (b.token, b.gridd_conf)
    assert (a.revision == b.revision) is same


def _problem(src: model.SourceSecret | None, cls: model.GpuClass = VWS) -> SourceProblem:
    out = render_license(src, cls, TOKEN_KEY)
    assert isinstance(out, SourceProblem), out
    assert TOKEN.decode().strip() not in out.message
    return out


def test_source_missing() -> None:
    p = _problem(None)
    assert p.reason is SourceProblemReason.SOURCE_MISSING and p.ref == SREF
    assert str(SREF) in p.message and "vws" in p.message


def test_secret_ref_missing() -> None:
    p = _problem(source(), dataclasses.replace(VWS, secret_ref=None))
    assert p.reason is SourceProblemReason.SECRET_REF_MISSING and p.ref == model.ObjectRef("", "vws")


@pytest.mark.parametrize("mode", ["passthrough", "mig", None])
def test_invalid_mode(mode: str | None) -> None:
    p = _problem(source(), dataclasses.replace(VWS, mode=mode))
    assert p.reason is SourceProblemReason.INVALID_MODE


@pytest.mark.parametrize("ft", [True, False, "1", 1.0, None, -1, 3, 5, 2**70])
def test_invalid_feature_type(ft: object) -> None:
    p = _problem(source(), dataclasses.replace(VWS, feature_type=ft))
    assert p.reason is SourceProblemReason.INVALID_FEATURE_TYPE


@pytest.mark.parametrize("ft", [0, 1, 2, 4])
def test_valid_feature_types(ft: int) -> None:
    assert rendered(cls=dataclasses.replace(VWS, feature_type=ft)).gridd_conf.endswith(
        f"FeatureType={ft}\n".encode())


def test_token_key_missing() -> None:
    p = _problem(source({"other.tok": TOKEN}))
    assert p.reason is SourceProblemReason.TOKEN_KEY_MISSING and p.ref == SREF
    assert TOKEN_KEY in p.message


@pytest.mark.parametrize("token", [b"", b" \n\t"])
def test_token_empty(token: bytes) -> None:
    assert _problem(source({TOKEN_KEY: token})).reason is SourceProblemReason.TOKEN_EMPTY


def test_token_size_limit() -> None:
    assert rendered(source({TOKEN_KEY: b"t" * MAX_TOKEN_BYTES})).token == b"t" * MAX_TOKEN_BYTES
    p = _problem(source({TOKEN_KEY: b"t" * (MAX_TOKEN_BYTES + 1)}))
    assert p.reason is SourceProblemReason.TOKEN_TOO_LARGE


@pytest.mark.parametrize("conf", [b"\xff\xfeServerPort=1", b"Server\0Port=1", b"#" * (MAX_GRIDD_CONF_BYTES + 1)])
def test_gridd_conf_invalid(conf: bytes) -> None:
    p = _problem(source({TOKEN_KEY: TOKEN, "gridd.conf": conf}))
    assert p.reason is SourceProblemReason.GRIDD_CONF_INVALID


def test_every_reason_is_covered() -> None:
    covered = {
        _problem(None).reason,
        _problem(source(), dataclasses.replace(VWS, secret_ref=None)).reason,
        _problem(source(), dataclasses.replace(VWS, mode="passthrough")).reason,
        _problem(source(), dataclasses.replace(VWS, feature_type=3)).reason,
        _problem(source({})).reason,
        _problem(source({TOKEN_KEY: b""})).reason,
        _problem(source({TOKEN_KEY: b"t" * (MAX_TOKEN_BYTES + 1)})).reason,
        _problem(source({TOKEN_KEY: TOKEN, "gridd.conf": b"\xff"})).reason,
    }
    assert covered == set(SourceProblemReason)


def test_token_bytes_never_in_reprs() -> None:
    lic = rendered()
    d = desired(lic)
    for obj in (lic, d, source()):
        assert "SENTINEL" not in repr(obj) and "SENTINEL" not in str(obj)


# --- render_replica ---------------------------------------------------------------------------

def test_replica_content() -> None:
    lic = rendered()
    d = desired(lic)
    assert (d.namespace, d.name, d.class_name) == ("tenant-a", "nvidia-vgpu-license-vws", "vws")
    assert dict(d.data) == {
        model.KEY_TOKEN: TOKEN,
        model.KEY_GRIDD_CONF: lic.gridd_conf,
        model.KEY_REPORT_URL: b"https://r.example/v1/reports",
        model.KEY_REPORT_NAMESPACE: b"tenant-a",
        model.KEY_REPORT_CREDENTIAL: b"cred-1",
    }
    assert dict(d.labels) == {model.MANAGED_BY_LABEL: model.MANAGED_BY_VALUE}
    assert dict(d.annotations) == {
        model.ANN_SOURCE_NAMESPACE: SREF.namespace, model.ANN_SOURCE_NAME: SREF.name, model.ANN_SOURCE_UID: "uid-src",
        model.ANN_CLASS: "vws", model.ANN_REVISION: lic.revision, model.ANN_REVISION_TIME: "2024-05-01T12:00:00Z",
        model.ANN_CLASS_LICENSE: "licensectl-system/vws-token:1",
    }
    assert d.revision == lic.revision and d.revision_time == NOW
    assert d.data_digest == data_digest(d.data)


def test_revision_time_is_utc_whole_seconds() -> None:
    cest = dt.timezone(dt.timedelta(hours=2))
    d = desired(now=dt.datetime(2024, 5, 1, 14, 0, 0, 999_999, tzinfo=cest))
    assert d.annotations[model.ANN_REVISION_TIME] == "2024-05-01T12:00:00Z"
    assert d.revision_time == NOW


def test_naive_now_is_rejected() -> None:
    with pytest.raises(ValueError, match="aware"):
        desired(now=dt.datetime(2024, 5, 1))


LATER = NOW + dt.timedelta(hours=3)


def test_revision_time_kept_for_the_same_revision() -> None:
    first = desired()
    again = desired(existing=observed(first), now=LATER)
    assert again.revision_time == NOW
    assert again.annotations == first.annotations
    assert replica_diff(observed(first), again) is ReplicaAction.NOOP


def test_revision_time_kept_when_only_the_credential_rotates() -> None:
    first = desired()
    rotated = desired(existing=observed(first), now=LATER, credential="cred-2")
    assert rotated.revision == first.revision and rotated.revision_time == NOW
    assert rotated.data_digest != first.data_digest
    assert replica_diff(observed(first), rotated) is ReplicaAction.UPDATE


def test_revision_time_renewed_for_a_new_revision() -> None:
    first = desired()
    new_lic = rendered(source({TOKEN_KEY: TOKEN + b"2"}))
    second = desired(new_lic, existing=observed(first), now=LATER)
    assert second.revision != first.revision and second.revision_time == LATER


@pytest.mark.parametrize("time_value", ["not-a-time", "", "2024-05-01T12:00:00", "2999-01-01T00:00:00Z"])
def test_revision_time_renewed_when_the_kept_time_is_unusable(time_value: str) -> None:
    first = desired()
    ann = dict(first.annotations) | {model.ANN_REVISION_TIME: time_value}
    again = desired(existing=observed(first, annotations=ann), now=LATER)
    assert again.revision_time == LATER


def test_revision_time_kept_with_an_offset_form() -> None:
    first = desired()
    ann = dict(first.annotations) | {model.ANN_REVISION_TIME: "2024-05-01T14:00:00+02:00"}
    assert desired(existing=observed(first, annotations=ann), now=LATER).revision_time == NOW


@pytest.mark.parametrize("time_value", [" 2024-05-01T12:00:00Z\n", "2024-05-01T12:00:00.750000Z"])
def test_revision_time_read_as_the_rollout_reads_it(time_value: str) -> None:
    """A hand edit's whitespace is forgiven (as the rollout planner does) and a fraction is cut."""
    first = desired()
    ann = dict(first.annotations) | {model.ANN_REVISION_TIME: time_value}
    again = desired(existing=observed(first, annotations=ann), now=LATER)
    assert again.revision_time == NOW
    assert again.annotations[model.ANN_REVISION_TIME] == "2024-05-01T12:00:00Z"


def test_revision_time_not_taken_from_a_foreign_secret() -> None:
    first = desired()
    foreign = observed(first, labels={})
    assert desired(existing=foreign, now=LATER).revision_time == LATER


# --- data_digest ------------------------------------------------------------------------------

def test_data_digest_is_order_independent_and_framed() -> None:
    assert data_digest({"a": b"1", "b": b"2"}) == data_digest({"b": b"2", "a": b"1"})
    assert data_digest({"a": b"bc"}) != data_digest({"ab": b"c"})
    assert data_digest({"a": b"", "b": b""}) != data_digest({"a": b"b"})
    assert data_digest({}) != data_digest({"": b""})
    assert len(data_digest({})) == 32  # raw SHA-256: cached once per replica, only compared


# --- replica_diff / replica_state -------------------------------------------------------------

def test_diff_missing_creates() -> None:
    d = desired()
    assert replica_diff(None, d) is ReplicaAction.CREATE
    assert replica_state(None, d) is ReplicaState.MISSING


def test_diff_in_sync_ignores_keys_added_by_others() -> None:
    d = desired()
    assert replica_diff(observed(d), d) is ReplicaAction.NOOP
    extra = observed(d, labels=dict(d.labels) | {"team": "x"},
                     annotations=dict(d.annotations) | {"kubectl.kubernetes.io/last-applied": "{}"})
    assert replica_diff(extra, d) is ReplicaAction.NOOP
    assert replica_state(extra, d) is ReplicaState.IN_SYNC


def test_diff_data_drift_updates() -> None:
    d = desired()
    drifted = observed(d, digest=b"0" * 32)
    assert replica_diff(drifted, d) is ReplicaAction.UPDATE
    assert replica_state(drifted, d) is ReplicaState.DRIFTED


@pytest.mark.parametrize("key", [model.ANN_SOURCE_NAMESPACE, model.ANN_SOURCE_NAME, model.ANN_SOURCE_UID,
                                 model.ANN_REVISION, model.ANN_REVISION_TIME])
def test_diff_owned_annotation_changed_or_missing_updates(key: str) -> None:
    d = desired()
    changed = observed(d, annotations=dict(d.annotations) | {key: "edited"})
    missing = observed(d, annotations={k: v for k, v in d.annotations.items() if k != key})
    assert replica_diff(changed, d) is ReplicaAction.UPDATE
    assert replica_diff(missing, d) is ReplicaAction.UPDATE


def test_diff_foreign_secret_is_a_conflict() -> None:
    d = desired()
    no_label = observed(d, labels={"app": "someone-else"})
    other_manager = observed(d, labels={model.MANAGED_BY_LABEL: "helm"})
    no_class = observed(d, annotations={k: v for k, v in d.annotations.items() if k != model.ANN_CLASS})
    for foreign in (no_label, other_manager, no_class):
        assert not foreign.owned
        assert replica_diff(foreign, d) is ReplicaAction.CONFLICT
        assert replica_state(foreign, d) is ReplicaState.CONFLICT


def test_diff_owned_by_another_class_is_a_conflict() -> None:
    d = desired()
    other = observed(d, annotations=dict(d.annotations) | {model.ANN_CLASS: "vcs"})
    assert other.owned
    assert replica_diff(other, d) is ReplicaAction.CONFLICT


def test_diff_rejects_a_secret_of_another_name() -> None:
    d = desired()
    wrong = dataclasses.replace(observed(d), name="something-else")
    with pytest.raises(ValueError, match="something-else"):
        replica_diff(wrong, d)



def test_a_replica_without_the_source_revision_mark_is_not_rewritten_for_it_alone() -> None:
    """Upgrade from a release before safe rotation: same revision, no `source-revision` mark -> no write;
    a new revision brings the mark along; a wrong mark is drift."""
    d = render_replica(rendered(), namespace="t", gpu_class=VWS, source=source(), report_url="u", credential="c",
                       existing=None, now=NOW, source_revision="s1")
    old_ann = {k: v for k, v in d.annotations.items() if k != model.ANN_SOURCE_REVISION}
    old = model.ReplicaSecret("t", d.name, "uid", "1", labels=d.labels, annotations=old_ann,
                              data_digest=d.data_digest)
    assert replica_diff(old, d) is ReplicaAction.NOOP
    other = dataclasses.replace(d, revision="r2", annotations={**d.annotations, model.ANN_REVISION: "r2"})
    assert replica_diff(old, other) is ReplicaAction.UPDATE
    marked = dataclasses.replace(old, annotations={**old_ann, model.ANN_SOURCE_REVISION: "s0"})
    assert replica_diff(marked, d) is ReplicaAction.UPDATE
