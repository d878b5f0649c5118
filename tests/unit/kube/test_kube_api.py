"""licensectl's own Kubernetes client: request shapes, kubeconfig loading, TLS and token rotation.

The controller no longer imports kubernetes-asyncio (kube/api.py says why); these tests pin that the
calls it makes go out exactly as the generated client sent them, against a loopback HTTP(S) server.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from licensectl.config import Settings
from licensectl.core.certs import KeyPair, new_ca, new_leaf
from licensectl.kube import api as kapi
from licensectl.kube import client as kclient
from licensectl.kube import kubeconfig
from licensectl.kube.raw import RawApi, error_type
from licensectl_dev.testkit.local_http import serve

NOW = dt.datetime.now(dt.UTC)


def client_cert(ca: KeyPair) -> KeyPair:
    """A client certificate (clientAuth) signed by `ca`, as an apiserver's client CA issues them."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "admin")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(minutes=5)).not_valid_after(NOW + dt.timedelta(hours=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=key_pem)


class Recorder:
    """A loopback apiserver that records every request and answers from a table."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.status = 200

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append({"method": request.method, "path": request.raw_path.split("?")[0],
                          "query": dict(request.query), "headers": dict(request.headers),
                          "body": json.loads(body) if body else None,
                          "peercert": bool(request.transport and request.transport.get_extra_info("peercert"))})
        if self.status != 200:
            return web.json_response({"kind": "Status", "reason": "Conflict", "message": "the secret bytes xyz"},
                                     status=self.status)
        return web.json_response({"kind": "Thing", "ok": True})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app


@pytest_asyncio.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, str]]:
    rec = Recorder()
    async with serve(rec.app()) as url:
        yield rec, url


def write_kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any], *, context: str = "c") -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": "k", "cluster": cluster}], "users": [{"name": "u", "user": user}],
        "contexts": [{"name": context, "context": {"cluster": "k", "user": "u"}}]}))
    return path


# -- pure pieces ------------------------------------------------------------------------------


def test_query_names_follow_the_generated_client() -> None:
    assert kapi.query_of({"label_selector": "a=b", "field_selector": "metadata.name=x", "watch": True,
                          "allow_watch_bookmarks": False, "resource_version": "7", "timeout_seconds": 30,
                          "limit": 500, "_continue": "tok", "_preload_content": False,
                          "_request_timeout": 5, "_content_type": "x", "body": {}, "dry_run": None}) == [
        ("labelSelector", "a=b"), ("fieldSelector", "metadata.name=x"), ("watch", "true"),
        ("allowWatchBookmarks", "false"), ("resourceVersion", "7"), ("timeoutSeconds", "30"),
        ("limit", "500"), ("continue", "tok")]


def test_an_unknown_argument_is_refused_not_sent() -> None:
    with pytest.raises(TypeError, match="pretty"):
        kapi.query_of({"pretty": "true"})


def test_patch_content_types_match_what_the_generated_client_sent() -> None:
    assert kapi.patch_content_type([{"op": "add"}], strategic=True) == kapi.JSON_PATCH
    assert kapi.patch_content_type({"metadata": {}}, strategic=True) == kapi.STRATEGIC_MERGE_PATCH
    assert kapi.patch_content_type({"metadata": {}}, strategic=False) == kapi.MERGE_PATCH


def test_timeouts_in_every_form() -> None:
    assert kapi.client_timeout(None) == aiohttp.ClientTimeout()
    assert kapi.client_timeout(5).total == 5.0
    assert kapi.client_timeout((1.0, 9.0)).sock_read == 9.0
    t = aiohttp.ClientTimeout(total=3)
    assert kapi.client_timeout(t) is t


def test_the_controller_never_imports_the_generated_client() -> None:
    code = ("import sys, licensectl.cli.main, licensectl.app, licensectl.cli.status, licensectl.cli.actions;"
            "print(sorted(m for m in sys.modules if m.startswith('kubernetes_asyncio')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- requests on the wire ------------------------------------------------------------------------


async def test_every_call_the_controller_makes_goes_out_as_before(recorder: tuple[Recorder, str]) -> None:
    rec, url = recorder
    session = aiohttp.ClientSession()

    async def auth() -> dict[str, str]:
        return {"Authorization": "Bearer t0k"}

    client = kapi.KubeClient(host=url + "/", session=session, auth=auth)
    core, custom = RawApi(kapi.CoreV1Api(client)), RawApi(kapi.CustomObjectsApi(client))
    lease, adm = RawApi(kapi.CoordinationV1Api(client)), RawApi(kapi.AdmissionregistrationV1Api(client))
    try:
        await core.list_namespace(label_selector="x=y")
        await core.list_secret_for_all_namespaces(limit=2)
        await core.read_namespaced_secret("a/b", "ns")
        await core.create_namespaced_secret("ns", {"kind": "Secret"})
        await core.replace_namespaced_secret("s", "ns", {"kind": "Secret"})
        await core.patch_namespaced_secret("s", "ns", {"metadata": {}})
        await core.delete_namespaced_secret("s", "ns", body={"preconditions": {"uid": "u"}})
        await core.create_namespaced_event("ns", {"kind": "Event"})
        await core.patch_namespaced_event("e", "ns", {"count": 2})
        await core.patch_namespaced_pod("p", "ns", {"metadata": {}})
        await custom.list_cluster_custom_object("kubevirt.io", "v1", "virtualmachines", watch=True)
        await custom.get_namespaced_custom_object("kubevirt.io", "v1", "ns", "virtualmachineinstances", "v")
        await custom.patch_namespaced_custom_object("kubevirt.io", "v1", "ns", "virtualmachines", "v",
                                                    {"metadata": {}})
        await custom.delete_namespaced_custom_object("kubevirt.io", "v1", "ns", "virtualmachineinstances", "v",
                                                     body={"preconditions": {"uid": "u"}})
        await lease.read_namespaced_lease("l", "ns")
        await lease.replace_namespaced_lease("l", "ns", {"kind": "Lease"})
        await adm.patch_mutating_webhook_configuration("w", [{"op": "replace", "path": "/x", "value": 1}])
        await RawApi(kapi.VersionApi(client)).get_code()
    finally:
        await session.close()
    got = [(r["method"], r["path"], r["headers"].get("Content-Type"), r["body"]) for r in rec.seen]
    sec = "/api/v1/namespaces/ns/secrets"
    vms = "/apis/kubevirt.io/v1/namespaces/ns"
    assert got == [
        ("GET", "/api/v1/namespaces", "application/json", None),
        ("GET", "/api/v1/secrets", "application/json", None),
        ("GET", f"{sec}/a%2Fb", "application/json", None),
        ("POST", sec, "application/json", {"kind": "Secret"}),
        ("PUT", f"{sec}/s", "application/json", {"kind": "Secret"}),
        ("PATCH", f"{sec}/s", kapi.STRATEGIC_MERGE_PATCH, {"metadata": {}}),
        ("DELETE", f"{sec}/s", "application/json", {"preconditions": {"uid": "u"}}),
        ("POST", "/api/v1/namespaces/ns/events", "application/json", {"kind": "Event"}),
        ("PATCH", "/api/v1/namespaces/ns/events/e", kapi.STRATEGIC_MERGE_PATCH, {"count": 2}),
        ("PATCH", "/api/v1/namespaces/ns/pods/p", kapi.STRATEGIC_MERGE_PATCH, {"metadata": {}}),
        ("GET", "/apis/kubevirt.io/v1/virtualmachines", "application/json", None),
        ("GET", f"{vms}/virtualmachineinstances/v", "application/json", None),
        ("PATCH", f"{vms}/virtualmachines/v", kapi.MERGE_PATCH, {"metadata": {}}),
        ("DELETE", f"{vms}/virtualmachineinstances/v", "application/json", {"preconditions": {"uid": "u"}}),
        ("GET", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", "application/json", None),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", "application/json", {"kind": "Lease"}),
        ("PATCH", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/w", kapi.JSON_PATCH,
         [{"op": "replace", "path": "/x", "value": 1}]),
        ("GET", "/version", "application/json", None),
    ]
    assert rec.seen[0]["query"] == {"labelSelector": "x=y"}
    assert rec.seen[10]["query"] == {"watch": "true"}
    assert {r["headers"].get("Authorization") for r in rec.seen} == {"Bearer t0k"}


async def test_a_refusal_carries_status_and_reason_never_the_body(recorder: tuple[Recorder, str]) -> None:
    rec, url = recorder
    rec.status = 409
    async with aiohttp.ClientSession() as session:
        core = RawApi(kapi.CoreV1Api(kapi.KubeClient(host=url, session=session)))
        with pytest.raises(kapi.ApiException) as err:
            await core.create_namespaced_secret("ns", {"data": {"token": "c2VjcmV0"}})
    assert (err.value.status, err.value.reason) == (409, "Conflict")
    assert "xyz" not in str(err.value) and "c2VjcmV0" not in str(err.value)


async def _answer(status: int) -> dict[str, Any]:
    """A call that succeeds with an empty body (200) or fails with `status`."""
    if status != 200:
        raise kapi.ApiException(status, "Reason")
    return {}


async def test_absent_on_404_reads_not_found_as_none() -> None:
    assert await kapi.absent_on_404(_answer(404)) is None
    assert await kapi.absent_on_404(_answer(200)) == {}  # an empty body is found, not absent


@pytest.mark.parametrize("status", [0, 403, 409, 410, 429, 500])
async def test_absent_on_404_raises_every_other_error(status: int) -> None:
    with pytest.raises(kapi.ApiException) as err:
        await kapi.absent_on_404(_answer(status))
    assert err.value.status == status


async def test_absent_on_404_leaves_other_exceptions_alone() -> None:
    async def refused() -> dict[str, Any]:
        raise ConnectionRefusedError("apiserver down")

    with pytest.raises(ConnectionRefusedError):
        await kapi.absent_on_404(refused())


async def test_absent_on_404_over_the_wire(recorder: tuple[Recorder, str]) -> None:
    rec, url = recorder
    async with aiohttp.ClientSession() as session:
        core = RawApi(kapi.CoreV1Api(kapi.KubeClient(host=url, session=session)))
        assert await kapi.absent_on_404(core.read_namespaced_secret("s", "ns")) == {"kind": "Thing", "ok": True}
        rec.status = 404
        assert await kapi.absent_on_404(core.read_namespaced_secret("s", "ns")) is None
        rec.status = 500
        with pytest.raises(kapi.ApiException):
            await kapi.absent_on_404(core.read_namespaced_secret("s", "ns"))
    assert [r["method"] for r in rec.seen] == ["GET", "GET", "GET"]


async def test_a_library_client_is_borrowed_and_its_errors_keep_their_family(
        recorder: tuple[Recorder, str], tmp_path: Path) -> None:
    from kubernetes_asyncio.client import ApiException as LibraryApiException
    from kubernetes_asyncio.client import CoreV1Api as LibraryCoreV1Api

    from licensectl_dev.devcluster.kubeapi import api_client_from_kubeconfig

    rec, url = recorder
    path = write_kubeconfig(tmp_path / "kc", {"server": url}, {"token": "lib-token"})
    library = await api_client_from_kubeconfig(path)
    try:
        borrowed = kapi.as_kube(library)
        assert borrowed.session is library.rest_client.pool_manager
        await RawApi(kapi.CoreV1Api(library)).read_namespaced_secret("s", "ns")
        await borrowed.close()  # borrowed: the library client still owns its session
        assert not library.rest_client.pool_manager.closed
        assert error_type(LibraryCoreV1Api(library)) is LibraryApiException
        assert error_type(kapi.CoreV1Api(library)) is kapi.ApiException
        rec.status = 409
        with pytest.raises(LibraryApiException):
            await RawApi(LibraryCoreV1Api(library)).read_namespaced_secret("s", "ns")
    finally:
        await library.close()
    assert rec.seen[0]["headers"]["Authorization"] == "Bearer lib-token"
    with pytest.raises(TypeError):
        kapi.as_kube(object())


# -- kubeconfig and in-cluster ---------------------------------------------------------------------


def test_a_kubeconfig_with_inline_tls_material_and_a_token(tmp_path: Path) -> None:
    ca = new_ca(now=NOW)
    client = client_cert(ca)
    path = write_kubeconfig(tmp_path / "kc", {
        "server": "https://10.0.0.1:6443", "tls-server-name": "kubernetes",
        "certificate-authority-data": base64.b64encode(ca.cert_pem).decode()}, {
        "client-certificate-data": base64.b64encode(client.cert_pem).decode(),
        "client-key-data": base64.b64encode(client.key_pem).decode(), "token": "abc"})
    ep = kubeconfig.endpoint_from_kubeconfig(str(path))
    assert ep is not None
    assert (ep.host, ep.token, ep.server_hostname) == ("https://10.0.0.1:6443", "abc", "kubernetes")
    assert ep.ssl_context.verify_mode == ssl.CERT_REQUIRED
    assert len(ep.ssl_context.get_ca_certs()) == 1
    assert list(Path(tmp_path).iterdir()) == [path]  # no key material left behind


def test_files_resolve_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    ca = new_ca(now=NOW)
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    (tmp_path / "tok").write_text("from-file\n")
    path = write_kubeconfig(tmp_path / "kc", {"server": "https://h", "certificate-authority": "ca.crt"},
                            {"tokenFile": "tok"})
    ep = kubeconfig.endpoint_from_kubeconfig(str(path))
    assert ep is not None and ep.token_file == str(tmp_path / "tok")
    assert len(ep.ssl_context.get_ca_certs()) == 1


def test_what_this_loader_does_not_cover_goes_to_the_library(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "get-token"}}
    assert kubeconfig.endpoint_from_kubeconfig(str(write_kubeconfig(tmp_path / "a", {"server": "https://h"},
                                                                    exec_user))) is None
    assert kubeconfig.endpoint_from_kubeconfig(str(write_kubeconfig(
        tmp_path / "b", {"server": "https://h"}, {"auth-provider": {"name": "oidc"}}))) is None
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    assert kubeconfig.endpoint_from_kubeconfig(None) is None


def test_a_broken_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(kubeconfig.KubeconfigError, match="cannot read"):
        kubeconfig.endpoint_from_kubeconfig(str(tmp_path / "missing"))
    path = write_kubeconfig(tmp_path / "kc", {"server": "https://h"}, {"token": "t"})
    with pytest.raises(kubeconfig.KubeconfigError, match="context named 'other'"):
        kubeconfig.endpoint_from_kubeconfig(str(path), "other")
    (tmp_path / "bad").write_text("- a\n- b\n")
    with pytest.raises(kubeconfig.KubeconfigError, match="not a mapping"):
        kubeconfig.endpoint_from_kubeconfig(str(tmp_path / "bad"))
    bad_data = write_kubeconfig(tmp_path / "kc2", {"server": "https://h", "certificate-authority-data": "%%"},
                                {"token": "t"})
    with pytest.raises(kubeconfig.KubeconfigError, match="not base64"):
        kubeconfig.endpoint_from_kubeconfig(str(bad_data))


def test_in_cluster_reads_the_service_and_the_projected_files(tmp_path: Path) -> None:
    ca = new_ca(now=NOW)
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    (tmp_path / "token").write_text("sa")
    ep = kubeconfig.in_cluster_endpoint({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
                                        tmp_path)
    assert ep.host == "https://[fd00::1]:443" and ep.token_file == str(tmp_path / "token")
    with pytest.raises(kubeconfig.KubeconfigError, match="not running in a cluster"):
        kubeconfig.in_cluster_endpoint({}, tmp_path)


async def test_a_rotating_token_file_is_read_again_after_the_period(tmp_path: Path) -> None:
    now = [0.0]
    tok = tmp_path / "token"
    tok.write_text("one")
    source = kubeconfig.TokenSource(token=None, token_file=str(tok), period=60, clock=lambda: now[0])
    assert await source.headers() == {"Authorization": "Bearer one"}
    tok.write_text("two")
    now[0] = 59
    assert await source.headers() == {"Authorization": "Bearer one"}
    now[0] = 60
    assert await source.headers() == {"Authorization": "Bearer two"}
    tok.unlink()  # a failed re-read keeps the last token rather than dropping authentication
    now[0] = 200
    assert await source.headers() == {"Authorization": "Bearer two"}


async def test_client_certificates_authenticate_over_tls(tmp_path: Path) -> None:
    """End to end: make_api_client from a kubeconfig with inline CA and client certificate, against
    a loopback HTTPS server that requires a client certificate signed by the same CA."""
    ca = new_ca(now=NOW)
    server = new_leaf(ca, ["127.0.0.1"], now=NOW)
    client = client_cert(ca)
    (tmp_path / "server.crt").write_bytes(server.cert_pem)
    (tmp_path / "server.key").write_bytes(server.key_pem)
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp_path / "ca.crt"))
    server_ctx.load_cert_chain(str(tmp_path / "server.crt"), str(tmp_path / "server.key"))
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    rec = Recorder()
    async with serve(rec.app(), ssl_context=server_ctx) as url:
        path = write_kubeconfig(tmp_path / "kc", {
            "server": url,
            "certificate-authority-data": base64.b64encode(ca.cert_pem).decode()}, {
            "client-certificate-data": base64.b64encode(client.cert_pem).decode(),
            "client-key-data": base64.b64encode(client.key_pem).decode()})
        api = await kclient.make_api_client(Settings(kubeconfig=str(path)))
        try:
            assert await RawApi(kapi.VersionApi(api)).get_code() == {"kind": "Thing", "ok": True}
        finally:
            await api.close()
        assert api.session.closed
    assert rec.seen[0]["peercert"] and "Authorization" not in rec.seen[0]["headers"]


# -- a request that must not be replayed --------------------------------------------------------


class ActsThenHangsUp:
    """A server that acts on every PUT, then breaks the connection before answering: what a cut
    connection to virt-api looks like from the client's side."""

    def __init__(self) -> None:
        self.acted = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.acted += 1
        assert request.transport is not None
        request.transport.abort()
        return web.Response(status=202)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("PUT", "/{tail:.*}", self.handle)
        return app


async def test_aiohttp_replays_a_put_whose_connection_broke() -> None:
    """Why `replayable=False` exists: left alone, aiohttp sends the PUT a second time."""
    server = ActsThenHangsUp()
    async with serve(server.app()) as url, aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            await kapi.KubeClient(host=url, session=session).request("PUT", "/restart", body={})
    assert server.acted == 2


async def test_a_request_that_must_not_be_replayed_goes_out_once_and_its_outcome_is_unknown() -> None:
    server = ActsThenHangsUp()
    async with serve(server.app()) as url, aiohttp.ClientSession() as session:
        with pytest.raises(kapi.OutcomeUnknown) as err:
            await kapi.KubeClient(host=url, session=session).request("PUT", "/restart", body={}, replayable=False)
    assert server.acted == 1
    assert "PUT /restart" in str(err.value)


async def test_a_request_that_never_connected_keeps_its_own_error() -> None:
    """Nothing was sent, so nothing is unknown: the connector's error is what the caller sees."""
    async with serve(web.Application()) as url:
        pass  # the port is free again: nothing listens there now
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorError):
            await kapi.KubeClient(host=url, session=session).request("PUT", "/restart", body={}, replayable=False)
