"""Serving TLS against the real apiserver: the shared Secret, renewal, reloads, the webhook caBundle."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from kubernetes_asyncio.client import AdmissionregistrationV1Api, ApiClient, CoreV1Api, RbacAuthorizationV1Api

from licensectl import config
from licensectl.core import certs
from licensectl.kube.client import make_api_client
from licensectl.kube.serving_tls import ANN_TLS, ServingTLS, serving_hosts
from licensectl.metrics import Metrics
from licensectl.serve.http import start_site
from licensectl_dev.devcluster.controlplane import render_kubeconfig
from licensectl_dev.testkit.memory import MemoryEvents

from .support import eventually, running_app, settings_for

pytestmark = pytest.mark.asyncio(loop_scope="session")

UNUSED_KUBECONFIG = Path("unused")  # the App gets the test's client and never reads it


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime.now(dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now


def tls_settings(namespace: str, **kw: Any) -> config.Settings:
    return dataclasses.replace(config.Settings(namespace=namespace, tls_hosts="127.0.0.1",
                                               webhook_configuration=f"licensectl-{namespace}"), **kw)


async def served_serial(port: int, ca_pem: bytes) -> int:
    """A real handshake verified with `ca_pem`: the serial of the certificate the listener presents."""
    ctx = ssl.create_default_context(cadata=ca_pem.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1")
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return int(x509.load_der_x509_certificate(der).serial_number)
    finally:
        writer.close()
        await writer.wait_closed()


async def _ok(_: web.Request) -> web.Response:
    return web.Response(text="ok")


@pytest.fixture
async def stack() -> AsyncIterator[Callable[..., Any]]:
    """Start ServingTLS instances, each with a listener on its context; stopped at the end."""
    started: list[tuple[ServingTLS, web.AppRunner]] = []

    async def make(api: ApiClient, settings: config.Settings, *, leader: bool = True,
                   clock: Callable[[], dt.datetime] | None = None, **kw: Any) -> tuple[ServingTLS, int]:
        tls = ServingTLS(api, settings, is_leader=lambda: leader, clock=clock or Clock(), **kw)
        await tls.start()
        app = web.Application()
        app.router.add_get("/", _ok)
        runner, port = await start_site(app, "127.0.0.1:0", ssl_context=tls.context)
        started.append((tls, runner))
        return tls, port

    yield make
    for tls, runner in started:
        await runner.cleanup()
        await tls.stop()


async def read_secret(api: ApiClient, ns: str, name: str = "licensectl-tls") -> Any:
    return await CoreV1Api(api).read_namespaced_secret(name, ns)


async def test_self_managed_secret_is_created_once_by_racing_replicas(
        api_client: ApiClient, namespace_factory: Any, stack: Any) -> None:
    ns = await namespace_factory("tls")
    s = tls_settings(ns)
    (a, port_a), (b, port_b) = await asyncio.gather(stack(api_client, s), stack(api_client, s, leader=False))
    assert a.ready and b.ready
    assert a.ca_bundle == b.ca_bundle and a.ca_bundle.startswith(b"-----BEGIN CERTIFICATE-----")
    assert a.serial == b.serial
    secret = await read_secret(api_client, ns)
    assert secret.type == "kubernetes.io/tls"
    assert secret.metadata.annotations == {ANN_TLS: "self-managed"}
    assert not (secret.metadata.labels or {})  # the managed-by label selects replicas, not this
    assert sorted(secret.data) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert base64.b64decode(secret.data["ca.crt"]) == a.ca_bundle
    leaf = base64.b64decode(secret.data["tls.crt"])
    assert not certs.needs_renewal(leaf, serving_hosts(ns, "127.0.0.1"), dt.datetime.now(dt.UTC))
    assert await served_serial(port_a, a.ca_bundle) == await served_serial(port_b, b.ca_bundle) == a.serial


async def test_leader_renews_an_expiring_leaf_and_every_replica_reloads_it(
        api_client: ApiClient, namespace_factory: Any, stack: Any) -> None:
    ns = await namespace_factory("tls")
    s = tls_settings(ns)
    clock = Clock()
    clock.now -= dt.timedelta(days=300)  # the first leaf was issued 300 days ago: past 2/3 of its year
    metrics = Metrics()
    leader, port_l = await stack(api_client, s, clock=clock, metrics=metrics)
    standby, port_s = await stack(api_client, s, leader=False, clock=clock)
    ca, first = leader.ca_bundle, leader.serial
    assert await served_serial(port_s, ca) == first

    clock.now = dt.datetime.now(dt.UTC)
    standby.wake()
    await asyncio.sleep(0.5)
    assert (await read_secret(api_client, ns)).metadata.resource_version  # still there
    assert standby.serial == first  # a standby never renews

    leader.wake()
    new = await eventually(lambda: leader.serial != first and standby.serial == leader.serial and leader.serial,
                           what="both replicas loaded the renewed leaf")
    # Listeners started once now present the new certificate, under the same CA.
    assert await served_serial(port_l, ca) == new
    assert await served_serial(port_s, ca) == new
    assert leader.ca_bundle == standby.ca_bundle == ca
    assert metrics.serving_cert_reloads.labels("loaded")._value.get() == 2
    assert metrics.serving_cert_expiry._value.get() > (clock.now + dt.timedelta(days=300)).timestamp()


async def test_secret_mode_reads_only_and_reloads_when_the_secret_is_replaced(
        api_client: ApiClient, namespace_factory: Any, stack: Any) -> None:
    ns = await namespace_factory("tls")
    s = tls_settings(ns, tls_mode="secret")
    tls, port = await stack(api_client, s, start_timeout=2.0)
    assert not tls.ready and "does not exist" in (tls.error or "")  # start returned without the Secret

    now = dt.datetime.now(dt.UTC)
    ca = certs.new_ca(now=now)

    def body(leaf: certs.KeyPair) -> dict[str, Any]:
        data = {"ca.crt": ca.cert_pem, "tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem}
        return {"metadata": {"name": "licensectl-tls"}, "type": "kubernetes.io/tls",
                "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}

    first = certs.new_leaf(ca, ["127.0.0.1"], now=now)
    await CoreV1Api(api_client).create_namespaced_secret(ns, body(first))
    await eventually(lambda: tls.ready, what="loaded from the issuer's Secret")
    assert tls.ca_bundle == ca.cert_pem
    assert await served_serial(port, ca.cert_pem) == certs.serial_of(first.cert_pem)

    second = certs.new_leaf(ca, ["127.0.0.1"], now=now)
    await CoreV1Api(api_client).replace_namespaced_secret("licensectl-tls", ns, body(second))
    await eventually(lambda: tls.serial == certs.serial_of(second.cert_pem), what="reloaded")
    assert await served_serial(port, ca.cert_pem) == certs.serial_of(second.cert_pem)
    secret = await read_secret(api_client, ns)
    assert ANN_TLS not in (secret.metadata.annotations or {})  # never written by licensectl
    assert base64.b64decode(secret.data["tls.crt"]) == second.cert_pem


async def test_foreign_secret_is_never_touched(api_client: ApiClient, namespace_factory: Any, stack: Any) -> None:
    ns = await namespace_factory("tls")
    await CoreV1Api(api_client).create_namespaced_secret(ns, {"metadata": {"name": "licensectl-tls"},
                                                              "data": {"x": "eA=="}})
    tls, _ = await stack(api_client, tls_settings(ns))
    assert not tls.ready and "not created by licensectl" in (tls.error or "")
    secret = await read_secret(api_client, ns)
    assert secret.data == {"x": "eA=="} and not secret.metadata.annotations


async def test_leader_keeps_the_webhook_ca_bundle_current(
        api_client: ApiClient, namespace_factory: Any, stack: Any, cleanup: Any) -> None:
    ns = await namespace_factory("tls")
    s = tls_settings(ns)
    adm = AdmissionregistrationV1Api(api_client)
    hook = {"name": "vmi.licensectl.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Ignore", "clientConfig": {"url": "https://127.0.0.1:1/mutate"},
            "rules": [{"apiGroups": ["example.invalid"], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["nothings"]}]}
    await stack(api_client, s, leader=False, recheck_seconds=0.2)
    # Absent configuration: no error, and a standby never writes it once it exists.
    body = {"metadata": {"name": s.webhook_configuration},
            "webhooks": [hook, {**hook, "name": "vm.licensectl.io"}]}
    await adm.create_mutating_webhook_configuration(body)
    cleanup(lambda: adm.delete_mutating_webhook_configuration(s.webhook_configuration))
    await asyncio.sleep(1.0)
    mwc = await adm.read_mutating_webhook_configuration(s.webhook_configuration)
    assert [w.client_config.ca_bundle for w in mwc.webhooks] == [None, None]

    leader, _ = await stack(api_client, s, recheck_seconds=0.2)
    want = base64.b64encode(leader.ca_bundle).decode()

    async def patched() -> bool:
        m = await adm.read_mutating_webhook_configuration(s.webhook_configuration)
        return [w.client_config.ca_bundle for w in m.webhooks] == [want, want]

    await eventually(patched, what="caBundle of every webhook set to the CA")
    rv = (await adm.read_mutating_webhook_configuration(s.webhook_configuration)).metadata.resource_version
    await asyncio.sleep(1.0)  # several re-checks: equal bundles are not patched again
    assert (await adm.read_mutating_webhook_configuration(s.webhook_configuration)).metadata.resource_version == rv


async def test_a_wrong_configuration_name_is_an_event_and_a_gauge_naming_it(
        api_client: ApiClient, namespace_factory: Any, stack: Any, cleanup: Any, control_plane: Any,
        tmp_path: Path) -> None:
    """RBAC grants get and patch on the installed configuration only: a controller told another name gets
    403 and says so on the configuration it was told, not only in a log line."""
    ns = await namespace_factory("tls")
    installed, wrong = f"licensectl-{ns}", f"licensectl-typo-{ns}"
    core, rbac = CoreV1Api(api_client), RbacAuthorizationV1Api(api_client)
    await core.create_namespaced_service_account(ns, {"metadata": {"name": "controller"}})
    subject = [{"kind": "ServiceAccount", "name": "controller", "namespace": ns}]
    await rbac.create_namespaced_role(ns, {"metadata": {"name": "tls"}, "rules": [{
        "apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch", "create", "update"]}]})
    await rbac.create_namespaced_role_binding(ns, {"metadata": {"name": "tls"}, "subjects": subject, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tls"}})
    await rbac.create_cluster_role({"metadata": {"name": installed}, "rules": [{
        "apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
        "resourceNames": [installed], "verbs": ["get", "patch"]}]})
    cleanup(lambda: rbac.delete_cluster_role(installed))
    await rbac.create_cluster_role_binding({"metadata": {"name": installed}, "subjects": subject, "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": installed}})
    cleanup(lambda: rbac.delete_cluster_role_binding(installed))
    token = (await core.create_namespaced_service_account_token(
        "controller", ns, {"spec": {"expirationSeconds": 600}})).status.token
    kubeconfig = tmp_path / "controller.kubeconfig"
    kubeconfig.write_text(render_kubeconfig(control_plane.server, control_plane.ca_pem, token=token, user="ctl"))
    api = await make_api_client(config.Settings(kubeconfig=str(kubeconfig)))
    events = MemoryEvents()
    try:
        tls, _ = await stack(api, tls_settings(ns, webhook_configuration=wrong), recheck_seconds=0.2, events=events)

        def forbidden() -> bool:
            return any(s.labels == (("kind", "MutatingWebhookConfiguration"), ("name", wrong),
                                    ("problem", "forbidden")) and s.value == 1.0 for s in tls.samples())

        await eventually(forbidden, what="the forbidden configuration in the gauge")
        (obj, type_, _reason, message), *_ = [e for e in events.emitted if e[2] == "WebhookConfigurationProblem"]
        assert (obj.kind, obj.name, type_) == ("MutatingWebhookConfiguration", wrong, "Warning")
        assert f"may not get MutatingWebhookConfiguration {wrong} (HTTP 403)" in message, message
        assert "--webhook-configuration" in message
    finally:
        await api.close()


async def test_reports_listener_serves_tls_verified_by_the_replica_ca(
        api_client: ApiClient, namespace_factory: Any) -> None:
    ns = await namespace_factory("tls")
    s = settings_for(UNUSED_KUBECONFIG, ns)
    async with running_app(s, api_client=api_client, register_webhook=False) as app:
        assert app.tls.ready
        await eventually(app.ready, what="ready, TLS included")
        ctx = ssl.create_default_context(cadata=app.tls.ca_bundle.decode())
        async with aiohttp.ClientSession() as session, session.post(
                f"https://127.0.0.1:{app.reports_port}/v1/reports", data=b"x", ssl=ctx) as r:
            # Reached the handler over verified TLS (which refuses this request as not a report).
            assert (r.status, (await r.json())["error"]) in {(400, "bad_request"), (503, "not_ready")}
        # Replicas carry the same CA to guests (docs/guest.md).
        assert app._report_ca() == app.tls.ca_bundle
        with pytest.raises(aiohttp.ClientError):
            async with aiohttp.ClientSession() as session, session.post(
                    f"http://127.0.0.1:{app.reports_port}/v1/reports", data=b"x") as r:
                await r.read()


async def test_plain_http_opt_out(api_client: ApiClient, namespace_factory: Any) -> None:
    ns = await namespace_factory("tls")
    s = settings_for(UNUSED_KUBECONFIG, ns, reports_plain_http=True)
    async with running_app(s, api_client=api_client, register_webhook=False) as app:
        async with aiohttp.ClientSession() as session, session.post(
                f"http://127.0.0.1:{app.reports_port}/v1/reports", data=b"x") as r:
            assert r.status in (400, 503) and "error" in await r.json()
        assert app._report_ca() == b""
        assert config.report_url_for(dataclasses.replace(s, report_url="")).startswith("http://")
