"""Serving TLS, pure parts: SANs, the Secret layout, the caBundle patch, and the CA in replicas."""

from __future__ import annotations

import base64
import datetime as dt

import pytest

from licensectl.core import certs, model
from licensectl.core.render import DesiredReplica, ReplicaAction, render_replica, replica_diff
from licensectl.kube.serving_tls import (
    ANN_TLS,
    ca_bundle_patch,
    self_managed_secret,
    serving_hosts,
    tls_secret_from,
)
from tests.unit.core.test_render import NOW, VWS, observed, rendered, source

CA_PEM = b"-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n"


def replica(*, ca: bytes, existing: model.ReplicaSecret | None = None, now: dt.datetime = NOW) -> DesiredReplica:
    return render_replica(rendered(), namespace="tenant-a", gpu_class=VWS, source=source(),
                          report_url="https://r.example/v1/reports", credential="cred-1", existing=existing,
                          now=now, report_ca=ca)


def test_ca_change_updates_the_replica_without_a_new_revision() -> None:
    first = replica(ca=CA_PEM)
    assert first.data[model.KEY_REPORT_CA] == CA_PEM
    later = NOW + dt.timedelta(hours=5)
    second = replica(ca=CA_PEM.replace(b"ca", b"new-ca"), existing=observed(first), now=later)
    # In-place update: new content, same revision and revision time, so no VMI is stale.
    assert replica_diff(observed(first), second) is ReplicaAction.UPDATE
    assert second.revision == first.revision
    assert second.revision_time == first.revision_time == NOW
    assert second.annotations[model.ANN_REVISION] == first.annotations[model.ANN_REVISION]


def test_replica_omits_the_ca_key_when_there_is_none() -> None:
    plain = replica(ca=b"")
    assert model.KEY_REPORT_CA not in plain.data
    with_ca = replica(ca=CA_PEM)
    assert with_ca.data_digest != plain.data_digest
    assert with_ca.revision == plain.revision


def test_serving_hosts_cover_both_services_and_the_extras() -> None:
    assert serving_hosts("lc", " 127.0.0.1, licensectl.example.com,127.0.0.1") == (
        "licensectl-webhook.lc.svc", "licensectl-webhook.lc.svc.cluster.local",
        "licensectl-reports.lc.svc", "licensectl-reports.lc.svc.cluster.local",
        "127.0.0.1", "licensectl.example.com")
    assert len(serving_hosts("lc", "")) == 4


def test_self_managed_secret_layout_round_trips() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ca = certs.new_ca(now=now)
    leaf = certs.new_leaf(ca, ["a.svc"], now=now)
    body = self_managed_secret(namespace="lc", name="licensectl-tls", ca=ca, leaf=leaf)
    assert body["type"] == "kubernetes.io/tls"
    assert body["metadata"] == {"name": "licensectl-tls", "namespace": "lc",
                                "annotations": {ANN_TLS: "self-managed"}}  # no managed-by label
    body["metadata"]["resourceVersion"] = "9"
    s = tls_secret_from(body)
    assert s is not None and s.self_managed and s.resource_version == "9"
    assert dict(s.data) == {"ca.crt": ca.cert_pem, "ca.key": ca.key_pem, "tls.crt": leaf.cert_pem,
                            "tls.key": leaf.key_pem}
    assert "PRIVATE" not in repr(s)


@pytest.mark.parametrize("obj", [{}, {"metadata": "x"}, {"metadata": {"name": 3}}])
def test_tls_secret_projection_rejects_malformed_objects(obj: dict[str, object]) -> None:
    assert tls_secret_from(obj) is None


def test_tls_secret_projection_skips_undecodable_values_and_foreign_marks() -> None:
    s = tls_secret_from({"metadata": {"name": "t", "annotations": {ANN_TLS: "other"}},
                         "data": {"tls.crt": "!!!", "ok": "eA=="}})
    assert s is not None and not s.self_managed and dict(s.data) == {"ok": b"x"}


def _mwc(*bundles: str | None, rv: str = "42") -> dict[str, object]:
    hooks: list[dict[str, object]] = []
    for b in bundles:
        cc: dict[str, object] = {"url": "https://x"}
        if b is not None:
            cc["caBundle"] = b
        hooks.append({"name": "h", "clientConfig": cc})
    return {"metadata": {"name": "licensectl", "resourceVersion": rv}, "webhooks": hooks}


def test_ca_bundle_patch_sets_only_the_webhooks_that_differ() -> None:
    want = base64.b64encode(CA_PEM).decode()
    assert ca_bundle_patch(_mwc(want, want), CA_PEM) == []
    assert ca_bundle_patch(_mwc(None, want, "b2xk"), CA_PEM) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": want},
        {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": want},
    ]


def test_ca_bundle_patch_handles_no_webhooks_and_missing_client_config() -> None:
    assert ca_bundle_patch({"metadata": {}}, CA_PEM) == []
    assert ca_bundle_patch({"metadata": {}, "webhooks": [{"name": "h"}]}, CA_PEM) == [
        {"op": "add", "path": "/webhooks/0/clientConfig", "value": {"caBundle": base64.b64encode(CA_PEM).decode()}}]
