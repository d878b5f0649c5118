"""Requests on the wire are byte for byte what they were with the stdlib's `json` (kube/jsoncodec.py).

Every kind of write licensectl makes is sent twice to a loopback server that records the raw request:
once as the controller sends it now (orjson), once with `json.dumps(body, separators=(",", ":"))`,
which is what kube/api.py sent before. Method, path, query, headers and body bytes must be equal.
Bodies carry what real ones can: non-ASCII tenant text, control characters, a DEL, big and negative
integers. A property test then covers bodies of any JSON shape, and decoding the same for any input.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from hypothesis import example, given, settings
from hypothesis import strategies as st

from licensectl.kube import api as kapi
from licensectl.kube import jsoncodec
from licensectl.kube.writer import merged_body
from licensectl_dev.testkit.local_http import serve

# What one kube/api.py call needs: the client's API objects -> the awaitable response.
Call = Callable[[kapi.KubeClient], Awaitable[aiohttp.ClientResponse]]


def stdlib_dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


class RawRecorder:
    """Records each request as (method, path with query, sorted headers without Host, body bytes)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, tuple[tuple[str, str], ...], bytes]] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        headers = tuple(sorted((k, v) for k, v in request.headers.items() if k.lower() != "host"))
        self.seen.append((request.method, request.raw_path, headers, await request.read()))
        return web.json_response({"kind": "Status", "status": "Success"})


@pytest_asyncio.fixture
async def recorder() -> AsyncIterator[tuple[RawRecorder, str]]:
    rec = RawRecorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", rec.handle)
    async with serve(app) as url:
        yield rec, url


class _Want:
    """A replica's desired body as SecretWriter gets it (core.render.DesiredReplica's fields)."""

    name = "vgpu-license-vws"
    namespace = "tenant-ünïcode"
    labels = {"app.kubernetes.io/managed-by": "licensectl"}
    annotations = {"licensectl.io/class": "vws", "licensectl.io/revision": "0" * 64,
                   "licensectl.io/note": "Grüße \u2603 \U0001f600 tab\t del\x7f nul\x00"}
    data = {"client_configuration_token.tok": b"\x00\xffjwt", "gridd.conf": b"FeatureType=1\n"}


REPLICA = merged_body(None, _Want())  # type: ignore[arg-type]
REPLACED = merged_body({"metadata": {"resourceVersion": "12345", "labels": {"other": "kept"},
                                     "annotations": {"x": "y"}}}, _Want())  # type: ignore[arg-type]
EVENT = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "vmi.17a2b3c4d5e6f708", "namespace": "t"},
         "involvedObject": {"kind": "VirtualMachineInstance", "namespace": "t", "name": "vm-é", "uid": "u"},
         "type": "Warning", "reason": "DriverMissing", "message": "Gerät »vgpu« fehlt: \"quoted\" \\ back\nline",
         "source": {"component": "licensectl"}, "reportingComponent": "licensectl",
         "reportingInstance": "licensectl", "firstTimestamp": "2026-12-08T00:00:00Z",
         "lastTimestamp": "2026-12-08T00:00:00Z", "count": 1}
LEASE = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
         "metadata": {"name": "licensectl", "namespace": "licensectl-system", "resourceVersion": "9"},
         "spec": {"holderIdentity": "pod-a_1234", "leaseDurationSeconds": 15, "leaseTransitions": 2**40,
                  "acquireTime": "2026-12-08T00:00:00.000000Z", "renewTime": "2026-12-08T00:00:01.000000Z"}}
PRECONDITIONS = {"preconditions": {"uid": "0b7d", "resourceVersion": "77"}, "propagationPolicy": "Background"}
VM_ANNOTATIONS = {"metadata": {"resourceVersion": "41", "annotations": {"licensectl.io/restart-revision": "ab",
                                                                        "licensectl.io/restart-result": None}}}
CA_PATCH = [{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": "LS0tLS1CRUdJTi0tLS0t"},
            {"op": "test", "path": "/metadata/resourceVersion", "value": "5"}]
PROBE_VMI = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
             "metadata": {"generateName": "licensectl-delivery-probe-", "namespace": "t",
                          "labels": {"licensectl.io/probe": "true"}},
             "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "1Mi"}}},
                      "volumes": [], "terminationGracePeriodSeconds": 0}}
POD_PATCH = {"metadata": {"labels": {"licensectl.io/leader": "true"}}}
SOURCE_ACTION = {"metadata": {"annotations": {"licensectl.io/rollout-retry-at": "2026-12-08T00:00:00.000000Z"}}}
EVENT_BUMP = {"count": 3, "lastTimestamp": "2026-12-08T00:00:02Z"}

V = ("kubevirt.io", "v1")
WRITES: dict[str, Call] = {
    "replica create": lambda c: kapi.CoreV1Api(c).create_namespaced_secret("tenant-ünïcode", REPLICA),
    "replica replace": lambda c: kapi.CoreV1Api(c).replace_namespaced_secret("vgpu-license-vws", "t", REPLACED),
    "replica delete with preconditions": lambda c: kapi.CoreV1Api(c).delete_namespaced_secret(
        "vgpu-license-vws", "t", body=PRECONDITIONS),
    "revision store / signing key / serving TLS create": lambda c: kapi.CoreV1Api(c).create_namespaced_secret(
        "licensectl-system", REPLICA, dry_run="All"),
    "source action patch (CLI)": lambda c: kapi.CoreV1Api(c).patch_namespaced_secret("src", "h", SOURCE_ACTION),
    "event create": lambda c: kapi.CoreV1Api(c).create_namespaced_event("t", EVENT),
    "event bump": lambda c: kapi.CoreV1Api(c).patch_namespaced_event("vmi.17a2b3c4d5e6f708", "t", EVENT_BUMP),
    "own pod patch": lambda c: kapi.CoreV1Api(c).patch_namespaced_pod("pod-a", "licensectl-system", POD_PATCH),
    "lease create": lambda c: kapi.CoordinationV1Api(c).create_namespaced_lease("licensectl-system", LEASE),
    "lease replace": lambda c: kapi.CoordinationV1Api(c).replace_namespaced_lease("licensectl", "licensectl-system",
                                                                                   LEASE),
    "VM annotations merge patch": lambda c: kapi.CustomObjectsApi(c).patch_namespaced_custom_object(
        *V, "t", "virtualmachines", "vm-1", VM_ANNOTATIONS, _content_type=kapi.MERGE_PATCH),
    "VMI delete with preconditions": lambda c: kapi.CustomObjectsApi(c).delete_namespaced_custom_object(
        *V, "t", "virtualmachineinstances", "vm-1", body=PRECONDITIONS),
    "delivery probe dry-run create": lambda c: kapi.CustomObjectsApi(c).create_namespaced_custom_object(
        *V, "t", "virtualmachineinstances", PROBE_VMI, dry_run="All"),
    "mutating webhook caBundle patch": lambda c: kapi.AdmissionregistrationV1Api(c)
    .patch_mutating_webhook_configuration("licensectl", CA_PATCH),
    "validating webhook caBundle patch": lambda c: kapi.AdmissionregistrationV1Api(c)
    .patch_validating_webhook_configuration("licensectl", CA_PATCH),
    "VM restart (empty body)": lambda c: c.request("PUT", "/apis/subresources.kubevirt.io/v1/namespaces/t/"
                                                          "virtualmachines/vm-1/restart", body={}, replayable=False),
}


async def _send_all(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        client = kapi.KubeClient(host=url, session=session)
        for call in WRITES.values():
            resp = await call(client)
            resp.release()


async def test_every_write_goes_out_byte_for_byte_as_with_the_stdlib_encoder(
        recorder: tuple[RawRecorder, str], monkeypatch: pytest.MonkeyPatch) -> None:
    rec, url = recorder
    await _send_all(url)
    now = list(rec.seen)
    rec.seen.clear()
    with monkeypatch.context() as m:
        m.setattr(jsoncodec, "dumps", stdlib_dumps)
        await _send_all(url)
    before = list(rec.seen)
    assert len(now) == len(before) == len(WRITES)
    for kind, got, want in zip(WRITES, now, before, strict=True):
        assert got == want, kind
    assert all(body for _, _, _, body in now)  # every write carried its body
    assert b"\\u00fc" in now[0][3] and b"\\u007f" in now[0][3]  # escaped as json.dumps escapes them


# -- any body, any input ----------------------------------------------------------------------

_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text())
_bodies = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(), inner, max_size=4), max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(_bodies)
@example(float("inf"))
@example({"a": [None, float("-inf")], "b": float("nan")})
@example({"remove": None, "keep": 1.5e300, "small": 6.103515625e-05})
def test_any_json_body_encodes_to_the_stdlib_bytes(body: Any) -> None:
    assert jsoncodec.dumps(body) == stdlib_dumps(body)


@settings(max_examples=300, deadline=None)
@given(_bodies)
def test_what_the_stdlib_writes_decodes_to_the_same_value(body: Any) -> None:
    raw = json.dumps(body)
    assert repr(jsoncodec.loads(raw.encode())) == repr(json.loads(raw))


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe", b'{"a": NaN}', b'{"a": 1e999}', b"[1,]",
                                 b'{"a": 123456789012345678901234567890}', b'"\\ud800"', b'{"a":1,"a":2}'])
def test_odd_input_decodes_or_fails_as_the_stdlib_does(raw: bytes) -> None:
    def outcome(loads: Callable[[bytes], Any]) -> Any:
        try:
            return ("value", repr(loads(raw)))
        except ValueError as e:
            return ("error", isinstance(e, UnicodeDecodeError))
    assert outcome(jsoncodec.loads) == outcome(json.loads)


@pytest.mark.parametrize("body", [{1: "int key"}, {"d": object()}, {"t": (1, 2)}, {True: None}])
def test_what_orjson_refuses_or_encodes_otherwise_falls_back_to_the_stdlib(body: Any) -> None:
    try:
        want: Any = stdlib_dumps(body)
    except TypeError:
        with pytest.raises(TypeError):
            jsoncodec.dumps(body)
        return
    assert jsoncodec.dumps(body) == want
