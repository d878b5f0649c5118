"""The delivery stamp, the backstop's delivery blocker and the readiness probe (pure core + projection)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from licensectl.core.delivery import (
    BLOCKING,
    SERIAL,
    Skip,
    Wanted,
    delivery_blocker,
    delivery_refusal,
    is_probe,
    parse_stamp,
    plan_delivery,
    probe_answered,
    probe_patch,
    probe_vmi,
    render_stamp,
    replica_volume_name,
    volume_name,
    wanted_replicas,
)
from licensectl.core.model import (
    ANN_CLASS,
    ANN_CREDENTIAL_KEY,
    ANN_DELIVERED_KEY,
    ANN_DELIVERED_REVISION,
    ANN_DELIVERY_PROBE,
    ANN_DELIVERY_PROBE_ANSWER,
    ANN_REVISION,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    ReplicaSecret,
    Vmi,
)
from licensectl.core.render import replica_name
from licensectl.kube.projections import vmi_from
from tests.unit.core.test_delivery import apply_patch, view, vmi

VWS, VCS = replica_name("vws"), replica_name("vcs")


def stamped_replica(ns: str, cls: str, revision: str | None, key: str | None = None) -> ReplicaSecret:
    ann = {ANN_CLASS: cls, **({ANN_REVISION: revision} if revision else {}),
           **({ANN_CREDENTIAL_KEY: key} if key else {})}
    return ReplicaSecret(ns, replica_name(cls), "u", "1", labels={MANAGED_BY_LABEL: MANAGED_BY_VALUE}, annotations=ann)


def stamped_view(*, key: str | None = "k1") -> Any:
    return view(replicas=(stamped_replica("t1", "vws", "aaa", key), stamped_replica("t1", "vcs", "bbb", key)))


def annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


# -- the stamp --------------------------------------------------------------------------------------
def test_stamp_renders_and_parses_pairs() -> None:
    pairs = ((VWS, "aaa"), (VCS, "bbb"))
    assert render_stamp(pairs) == f"{VWS}=aaa,{VCS}=bbb"
    assert parse_stamp(render_stamp(pairs)) == pairs


@pytest.mark.parametrize(("raw", "want"), [
    (None, ()), ("", ()), ("junk", ()), ("=x", ()), ("a=", ()), ("a=b=c", ()),
    (" a = b , ,c=d", (("a", "b"), ("c", "d"))),
])
def test_stamp_parsing_drops_malformed_entries(raw: str | None, want: tuple[tuple[str, str], ...]) -> None:
    assert parse_stamp(raw) == want


@given(st.text(max_size=40))
def test_stamp_parsing_never_raises(raw: str) -> None:
    for name, revision in parse_stamp(raw):
        assert name and revision and "," not in name + revision


def test_a_delivered_vmi_is_stamped_with_revisions_and_key() -> None:
    obj = vmi("gpu", "compute")
    d = plan_delivery(obj, wanted_replicas("t1", ["gpu", "compute"], stamped_view()))
    out = apply_patch(obj, d.patch)
    assert d.mutated and d.stamped
    assert annotations(out) == {ANN_DELIVERED_REVISION: f"{VWS}=aaa,{VCS}=bbb", ANN_DELIVERED_KEY: "k1"}
    # Reinvocation: nothing left to change, byte-identical.
    again = plan_delivery(out, wanted_replicas("t1", ["gpu", "compute"], stamped_view()))
    assert again.patch == () and not again.stamped


def test_a_vmi_already_carrying_its_volume_is_stamped_and_a_stale_stamp_replaced() -> None:
    own = {"name": "mine", "secret": {"secretName": VWS}}
    obj = vmi("gpu", volumes=[own])
    obj["metadata"]["annotations"] = {"user": "x", ANN_DELIVERED_REVISION: f"{VWS}=old", ANN_DELIVERED_KEY: "k0"}
    d = plan_delivery(obj, wanted_replicas("t1", ["gpu"], stamped_view()))
    out = apply_patch(obj, d.patch)
    assert not d.mutated and d.stamped and d.present == (VWS,)
    assert out["spec"] == obj["spec"]
    assert annotations(out) == {"user": "x", ANN_DELIVERED_REVISION: f"{VWS}=aaa", ANN_DELIVERED_KEY: "k1"}


def test_no_credential_key_removes_a_stale_key_stamp_and_sets_none() -> None:
    obj = vmi("gpu")
    obj["metadata"]["annotations"] = {ANN_DELIVERED_KEY: "k0"}
    out = apply_patch(obj, plan_delivery(obj, wanted_replicas("t1", ["gpu"], stamped_view(key=None))).patch)
    assert annotations(out) == {ANN_DELIVERED_REVISION: f"{VWS}=aaa"}
    fresh = vmi("gpu")
    out = apply_patch(fresh, plan_delivery(fresh, wanted_replicas("t1", ["gpu"], stamped_view(key=None))).patch)
    assert annotations(out) == {ANN_DELIVERED_REVISION: f"{VWS}=aaa"}


def test_nothing_delivered_nothing_stamped() -> None:
    # Not entitled, refused, or a replica without a revision: no stamp (the rollout falls back to time).
    for obj, w in ((vmi("gpu"), Wanted((), ())),
                   (vmi("gpu", disks=[{"name": "x", "serial": SERIAL}]),
                    wanted_replicas("t1", ["gpu"], stamped_view())),
                   (vmi("gpu"), wanted_replicas("t1", ["gpu"], view()))):
        assert ANN_DELIVERED_REVISION not in annotations(apply_patch(obj, plan_delivery(obj, w).patch))


def test_stamp_escapes_the_annotation_key_as_a_json_pointer() -> None:
    obj = vmi("gpu")
    obj["metadata"]["annotations"] = {}
    d = plan_delivery(obj, wanted_replicas("t1", ["gpu"], stamped_view()))
    paths = [op["path"] for op in d.patch if op["path"].startswith("/metadata")]
    assert paths == ["/metadata/annotations/licensectl.io~1delivered-revision",
                     "/metadata/annotations/licensectl.io~1delivered-key"]


def test_a_vmi_without_a_usable_annotations_map_gets_its_volume_unstamped() -> None:
    obj = vmi("gpu")
    obj["metadata"]["annotations"] = ["junk"]
    d = plan_delivery(obj, wanted_replicas("t1", ["gpu"], stamped_view()))
    assert d.mutated and not d.stamped


# -- the projection ---------------------------------------------------------------------------------
def test_projection_reads_volume_names_serials_and_the_stamp() -> None:
    obj = vmi("gpu", volumes=[{"name": "lic", "secret": {"secretName": VWS, "volumeLabel": "LBL"}}],
              disks=[{"name": "lic", "serial": "SER"}, {"name": "dup", "serial": "SER"}])
    obj["metadata"]["annotations"] = {ANN_DELIVERED_REVISION: f"{VWS}=aaa,junk", ANN_DELIVERED_KEY: "k1"}
    v = vmi_from(obj)
    assert v is not None
    assert v.volume_names == ("root", "lic")
    assert v.disk_serials == ("SER", "LBL")
    assert v.delivered_revisions == ((VWS, "aaa"),)
    assert v.delivered_key == "k1"
    bare = vmi_from(vmi())
    assert bare is not None and bare.delivered_revisions == () and bare.delivered_key is None


def test_projection_tolerates_garbage_in_the_new_fields() -> None:
    obj = vmi()
    obj["spec"]["volumes"] = [{"name": 3}, "x", {"secret": {"volumeLabel": 5}}]
    obj["spec"]["domain"]["devices"]["disks"] = [{"serial": []}, 7]
    obj["metadata"]["annotations"] = {ANN_DELIVERED_REVISION: 5, ANN_DELIVERED_KEY: ""}
    v = vmi_from(obj)
    assert v is not None and v.volume_names == () and v.disk_serials == ()
    assert v.delivered_revisions == () and v.delivered_key is None


# -- the blocker ------------------------------------------------------------------------------------
def running(obj: dict[str, Any]) -> Vmi:
    v = vmi_from(obj)
    assert v is not None
    return v


def test_replica_volume_name_is_the_webhooks() -> None:
    for cls in ("vws", "a.b", "x" * 60, "UPPER"):
        assert replica_volume_name(replica_name(cls)) == volume_name(cls)


@pytest.mark.parametrize(("volumes", "disks", "wanted", "want"), [
    ([], [], (VWS,), None),
    ([], [], (), None),
    ([{"name": "licensectl-vws", "emptyDisk": {}}], [], (VWS,), Skip.VOLUME_NAME_TAKEN),
    ([], [{"name": "x", "serial": SERIAL}], (VWS,), Skip.SERIAL_TAKEN),
    ([{"name": "x", "secret": {"secretName": "other", "volumeLabel": SERIAL}}], [], (VWS,), Skip.SERIAL_TAKEN),
    # Already carrying it: nothing to deliver, whatever else is taken.
    ([{"name": "licensectl-vws", "secret": {"secretName": VWS}}], [{"name": "x", "serial": SERIAL}], (VWS,), None),
    # One license volume present: the next takes LICENSECTL-2, a taken LICENSECTL does not block.
    ([{"name": "m", "secret": {"secretName": VWS}}], [{"name": "x", "serial": SERIAL}], (VWS, VCS), None),
    ([{"name": "m", "secret": {"secretName": VWS}}, {"name": "licensectl-vcs", "emptyDisk": {}}], [], (VWS, VCS),
     Skip.VOLUME_NAME_TAKEN),
    # The first wanted is refused by name: the second is then the first volume, and needs the serial.
    ([{"name": "licensectl-vws", "emptyDisk": {}}], [], (VWS, VCS), Skip.VOLUME_NAME_TAKEN),
    ([], [{"name": "x", "serial": f"{SERIAL}-2"}], (VWS, VCS), None),
])
def test_blocker_cases(volumes: list[dict[str, Any]], disks: list[dict[str, Any]], wanted: tuple[str, ...],
                       want: Skip | None) -> None:
    assert delivery_blocker(running(vmi("gpu", volumes=volumes, disks=disks)), wanted) == want
    refused = delivery_refusal(running(vmi("gpu", volumes=volumes, disks=disks)), wanted)
    # The refused volume is the one of the first wanted replica the spec blocks.
    assert refused == (None if want is None else (want, refused[1] if refused else ""))
    if want is Skip.VOLUME_NAME_TAKEN:
        assert refused is not None and any(v["name"] == refused[1] for v in volumes)


def test_blocking_reasons_are_spec_reasons_only() -> None:
    assert {Skip.VOLUME_NAME_TAKEN, Skip.SERIAL_TAKEN} <= BLOCKING
    assert not {Skip.NOT_ENTITLED, Skip.REPLICA_MISSING, Skip.CLAIM_NOT_FOUND, Skip.CLASS_NOT_FOUND} & BLOCKING


NAMES = ["licensectl-vws", "licensectl-vcs", "root2", "m"]
IDS = [SERIAL, f"{SERIAL}-2", "OTHER", None]


@st.composite
def specs(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Valid VMI specs (every disk has its volume, names unique): user volumes, some licensectl's own."""
    volumes: list[dict[str, Any]] = []
    disks: list[dict[str, Any]] = []
    for name in draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=4)):
        secret = draw(st.sampled_from([None, VWS, VCS, "other"]))
        label, serial = draw(st.sampled_from(IDS)), draw(st.sampled_from(IDS))
        vol: dict[str, Any] = {"name": name}
        if secret is None:
            vol["emptyDisk"] = {}
        else:
            vol["secret"] = {"secretName": secret, **({"volumeLabel": label} if label else {})}
        volumes.append(vol)
        disks.append({"name": name, **({"serial": serial} if serial else {})})
    return volumes, disks


@given(specs(), st.lists(st.sampled_from(["gpu", "compute"]), min_size=1, max_size=2, unique=True))
def test_blocker_agrees_with_the_webhook(spec: tuple[list[dict[str, Any]], list[dict[str, Any]]],
                                         claims: list[str]) -> None:
    """None exactly when the webhook, asked about a new VMI built from this spec, adds every missing
    replica; otherwise the webhook's first refusal."""
    volumes, disks = spec
    obj = vmi(*claims, volumes=volumes, disks=disks)
    w = wanted_replicas("t1", claims, view())
    d = plan_delivery(obj, w)
    missing = tuple(r for _, r in w.replicas if r not in d.present)
    refusals = [reason for _, reason in d.skipped if reason in BLOCKING]
    blocker = delivery_blocker(running(obj), tuple(r for _, r in w.replicas))
    assert (blocker is None) == (d.added == missing)
    assert blocker == (refusals[0] if refusals else None)


# -- the readiness probe ----------------------------------------------------------------------------
def test_probe_is_recognized_only_as_a_dry_run_in_our_namespace() -> None:
    body = probe_vmi("n1")
    assert is_probe(body, namespace="lc", own_namespace="lc", dry_run=True)
    assert not is_probe(body, namespace="lc", own_namespace="lc", dry_run=False)
    assert not is_probe(body, namespace="tenant", own_namespace="lc", dry_run=True)
    assert not is_probe(body, namespace="", own_namespace="", dry_run=True)
    assert not is_probe(vmi("gpu"), namespace="lc", own_namespace="lc", dry_run=True)


def test_probe_answer_round_trip() -> None:
    body = probe_vmi("n1")
    body["metadata"]["name"] = "x"
    answered = apply_patch(body, probe_patch("pod-a"))
    assert annotations(answered)[ANN_DELIVERY_PROBE_ANSWER] == "pod-a"
    assert probe_answered(answered, "n1")
    assert not probe_answered(answered, "n2")  # another probe's answer is no evidence for this one
    assert not probe_answered(body, "n1") and not probe_answered(None, "n1") and not probe_answered({}, "n1")
    assert annotations(body)[ANN_DELIVERY_PROBE] == "n1"


def test_probe_passes_the_shipped_match_conditions_and_claims_nothing() -> None:
    from licensectl.kube.projections import vmi_gpu_claims

    body = probe_vmi("n1")
    assert "licensectl.io/gpu-claims" in body["metadata"]["annotations"]
    assert vmi_gpu_claims(body) == ()


# -- the webhook configuration check ----------------------------------------------------------------
@pytest.mark.parametrize(("obj", "want"), [
    (None, "missing"),
    ({"webhooks": [{"clientConfig": {"caBundle": "Y2E=", "service": {}}}]}, None),
    ({"webhooks": [{"clientConfig": {"caBundle": "Y2E="}}, {"clientConfig": {"url": "https://x"}}]}, "no_ca_bundle"),
    ({"webhooks": [{"clientConfig": {"caBundle": ""}}]}, "no_ca_bundle"),
    ({"webhooks": [{"name": "no-client-config"}]}, "no_ca_bundle"),
    ({"webhooks": []}, None),
    ({"webhooks": "junk"}, None),
])
def test_configuration_problem(obj: Any, want: str | None) -> None:
    from licensectl.core.delivery import configuration_problem

    assert configuration_problem(obj) == want
