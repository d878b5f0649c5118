"""Bad-inputs catalogue against the real apiserver, with licensectl running in-process.

Every case injects one malformed or hostile input next to a healthy tenant. It is *handled* when
(1) a clear Event and/or metric names the offending object (or, for guest reports, the rejection
reason), and (2) the unrelated healthy tenant keeps being served: a rotation of its own source still
reaches its replica while the bad input is present. No token or credential may appear in the Events
or /metrics output produced meanwhile.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api
from prometheus_client import generate_latest

from licensectl import logs
from licensectl.app import App
from licensectl.core.guest_report import render_report
from licensectl.core.model import KEY_REPORT_CREDENTIAL, KEY_TOKEN
from licensectl.core.render import replica_name
from licensectl_dev.devcluster import fleet
from licensectl_dev.testkit.poll import eventually

from ..integration.support import metric, running_app, settings_for
from ..integration.support import read_secret as _read_secret
from . import invariants as inv
from .scenarios import SOURCE_NAME, World, build_world, unique


@dataclass
class Ctx:
    """One case's world: a healthy tenant on the main class, plus whatever the case adds."""

    api: ApiClient
    world: World
    app: App
    healthy: str
    tokens: list[bytes] = field(default_factory=list)
    extra_classes: list[str] = field(default_factory=list)
    extra_namespaces: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    log: io.StringIO = field(default_factory=io.StringIO)

    def logged(self, event: str, **fields: str) -> bool:
        """A JSON log line with this event and these fields was written by the controller."""
        for line in self.log.getvalue().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if rec.get("event") == event and all(rec.get(k) == v for k, v in fields.items()):
                    return True
        return False

    async def bad_class(self, *, mode: str = "vgpu", secret: str | None = "bad-src", feature_type: Any = 1,
                        token: bytes | None = None, data: dict[str, bytes] | None = None) -> tuple[str, str]:
        """A second class (and its source Secret) claimed by a second tenant; returns (class, tenant)."""
        cls = unique("bad")
        if data is not None or token is not None:
            raw = data if data is not None else {KEY_TOKEN: token or b""}
            body = {"metadata": {"name": "bad-src"},
                    "data": {k: base64.b64encode(v).decode() for k, v in raw.items()}}
            core: Any = CoreV1Api(self.api)
            await core.create_namespaced_secret(self.world.source_ns, body)
        await fleet.create_gpu_class(self.api, cls, mode=mode, feature_type=feature_type,
                                     secret=(self.world.source_ns, secret) if secret else None)
        self.extra_classes.append(cls)
        t = await self.world.add_tenant(claim=False)
        await fleet.create_claim(self.api, t["metadata"]["name"], "gpu", class_name=cls)
        return cls, t["metadata"]["name"]

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        return metric(self.app, name, labels) or 0.0

    async def warning_for(self, namespace: str, name: str, reason: str | None = None) -> bool:
        evs = await CoreV1Api(self.api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        return any(e.type == "Warning" and (reason is None or e.reason == reason) for e in evs.items)

    async def event_for(self, namespace: str, name: str, reason: str) -> bool:
        evs = await CoreV1Api(self.api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        return any(e.reason == reason for e in evs.items)


Check = Callable[[Ctx], Awaitable[Any]]


async def read_secret(api: ApiClient, namespace: str, name: str) -> Any:
    """The Secret (typed model) or None; Any, because each caller checks what it needs."""
    return await _read_secret(api, namespace, name)


@dataclass(frozen=True)
class BadInput:
    name: str
    inject: Check
    handled: Check  # polled until truthy
    what: str
    after: Check | None = None  # checked once the healthy tenant's rotation went through


# -- source Secrets ----------------------------------------------------------------------------
def _source_problem(reason: str) -> Check:
    async def handled(c: Ctx) -> bool:
        cls = c.state["class"]
        return (c.metric("licensectl_source_problem", {"class": cls, "reason": reason}) == 1.0
                and await c.warning_for(c.world.source_ns, "bad-src", "LicenseSourceInvalid")
                and await c.warning_for("default", cls, "LicenseSourceInvalid"))
    return handled


def _inject_source(data: dict[str, bytes]) -> Check:
    async def inject(c: Ctx) -> None:
        c.tokens.extend(v for v in data.values() if len(v) >= 16)
        c.state["class"], c.state["tenant"] = await c.bad_class(data=data)
    return inject


async def _binary_token(c: Ctx) -> None:
    junk = b"\xff\xfe" + os.urandom(400)
    c.tokens.append(junk)
    c.state["junk"] = junk
    c.state["class"], c.state["tenant"] = await c.bad_class(token=junk)


async def _binary_token_handled(c: Ctx) -> bool:
    """Not a JWT: still delivered byte for byte (opaque), reported as expiry unknown, with a Warning
    Event naming the source Secret, a format metric and a warning log line."""
    r = await read_secret(c.api, c.state["tenant"], replica_name(c.state["class"]))
    delivered = r is not None and base64.b64decode(r.data[KEY_TOKEN]) == c.state["junk"]
    src = {"source_namespace": c.world.source_ns, "source_name": "bad-src"}
    return (delivered and c.metric("licensectl_token_expiry_known", src) == 0.0
            and c.metric("licensectl_token_format", {**src, "format": "not_jwt"}) == 1.0
            and c.metric("licensectl_token_format", {"source_name": SOURCE_NAME, "format": "jwt"}) == 1.0
            and await c.warning_for(c.world.source_ns, "bad-src", "LicenseTokenUnreadable")
            and c.logged("license token expiry unknown", source_name="bad-src", format="not_jwt"))


# -- GPU classes and claims --------------------------------------------------------------------
def _inject_class(**kw: Any) -> Check:
    async def inject(c: Ctx) -> None:
        token = fleet.fake_token(int(time.time()) + 86400)
        c.tokens.append(token)
        c.state["class"], c.state["tenant"] = await c.bad_class(token=token, **kw)
    return inject


def _class_problem(kind_metric: tuple[str, dict[str, str]] | None, reason: str | None) -> Check:
    async def handled(c: Ctx) -> bool:
        cls = c.state["class"]
        ok = True
        if kind_metric is not None:
            name, labels = kind_metric
            ok = c.metric(name, {k: (cls if v == "{class}" else v) for k, v in labels.items()}) >= 1.0
        no_replica = await read_secret(c.api, c.state["tenant"], replica_name(cls)) is None
        return ok and no_replica and await c.warning_for("default", cls, reason)
    return handled


async def _claim_missing_class(c: Ctx) -> None:
    t = await c.world.add_tenant(claim=False)
    c.state["tenant"] = t["metadata"]["name"]
    await fleet.create_claim(c.api, c.state["tenant"], "ghost", class_name="no-such-class")


async def _claim_missing_class_handled(c: Ctx) -> bool:
    return (c.metric("licensectl_tenant_problems", {"kind": "unknown_class"}) >= 1.0
            and await c.warning_for(c.state["tenant"], "ghost", "UnknownClass"))


# -- tenant links ------------------------------------------------------------------------------
async def _tenant_cycle(c: Ctx) -> None:
    core = CoreV1Api(c.api)
    a_name = f"tenant-{unique('cyc')}"
    a = await fleet.create_tenant(c.api, a_name, vgpu=True)
    b = await fleet.create_tenant(c.api, f"{a_name}-{unique('b')}", parent=a, vgpu=True)
    c.extra_namespaces += [a_name, b["metadata"]["name"]]
    await core.patch_namespace(a_name, {"metadata": {"ownerReferences": [{
        "apiVersion": "v1", "kind": "Namespace", "name": b["metadata"]["name"], "uid": b["metadata"]["uid"],
        "controller": True, "blockOwnerDeletion": False}]}})
    for ns in (a_name, b["metadata"]["name"]):
        await fleet.create_claim(c.api, ns, "gpu", class_name=c.world.cls)
    c.state["tenant"] = a_name
    c.state["members"] = [a_name, b["metadata"]["name"]]


async def _tenant_cycle_handled(c: Ctx) -> bool:
    for ns in c.state["members"]:
        if await read_secret(c.api, ns, c.world.replica) is not None:
            return False
        if not await c.warning_for(ns, ns, "Cycle"):
            return False
    return c.metric("licensectl_tenant_problems", {"kind": "cycle"}) >= 2.0


async def _link_mismatch(c: Ctx) -> None:
    """A child whose name says parent P while its ownerReference points at another tenant."""
    p = await c.world.add_tenant(decoy=False)
    other = await c.world.add_tenant(decoy=False)
    name = f"{p['metadata']['name']}-{unique('x')}"
    await fleet.create_tenant(c.api, name, parent=other, vgpu=True)
    c.world.tenants.append(name)
    await fleet.create_claim(c.api, name, "gpu", class_name=c.world.cls)
    c.state["tenant"] = name


async def _link_mismatch_handled(c: Ctx) -> bool:
    ns = c.state["tenant"]
    return (c.metric("licensectl_tenant_problems", {"kind": "link_mismatch"}) >= 1.0
            and await read_secret(c.api, ns, c.world.replica) is None
            and await c.warning_for(ns, ns, "LinkMismatch"))


# -- replicas tampered with by a tenant --------------------------------------------------------
async def _tamper_token(c: Ctx) -> None:
    r = await read_secret(c.api, c.healthy, c.world.replica)
    c.state["rv"] = r.metadata.resource_version
    await CoreV1Api(c.api).patch_namespaced_secret(c.world.replica, c.healthy,
                                                   {"stringData": {KEY_TOKEN: "tenant-was-here"}})


async def _tamper_token_handled(c: Ctx) -> bool:
    r = await read_secret(c.api, c.healthy, c.world.replica)
    return (r is not None and base64.b64decode(r.data[KEY_TOKEN]) == c.world.tokens[-1]
            and await c.event_for(c.healthy, c.world.replica, "ReplicaReverted"))


async def _tamper_annotations(c: Ctx) -> None:
    await CoreV1Api(c.api).patch_namespaced_secret(c.world.replica, c.healthy, {"metadata": {"annotations": {
        "licensectl.io/revision": "0" * 64, "licensectl.io/source-name": "elsewhere"}}})


async def _tamper_annotations_handled(c: Ctx) -> bool:
    r = await read_secret(c.api, c.healthy, c.world.replica)
    rev = await c.world.revision()
    return (r is not None and r.metadata.annotations.get("licensectl.io/revision") == rev
            and r.metadata.annotations.get("licensectl.io/source-name") == SOURCE_NAME
            and await c.event_for(c.healthy, c.world.replica, "ReplicaReverted"))


async def _tamper_delete(c: Ctx) -> None:
    r = await read_secret(c.api, c.healthy, c.world.replica)
    c.state["uid"] = r.metadata.uid
    c.state["created"] = c.metric("licensectl_replica_writes_total", {"action": "create", "result": "created"})
    await CoreV1Api(c.api).delete_namespaced_secret(c.world.replica, c.healthy)


async def _tamper_delete_handled(c: Ctx) -> bool:
    r = await read_secret(c.api, c.healthy, c.world.replica)
    # A re-create is a routine write: counted, not announced by an Event.
    return r is not None and r.metadata.uid != c.state["uid"] and \
        c.metric("licensectl_replica_writes_total", {"action": "create", "result": "created"}) > c.state["created"]


async def _squat_replica_name(c: Ctx) -> None:
    t = await c.world.add_tenant(claim=False)
    ns = t["metadata"]["name"]
    core: Any = CoreV1Api(c.api)
    await core.create_namespaced_secret(ns, {"metadata": {"name": c.world.replica},
                                                         "stringData": {"mine": "tenant data"}})
    c.state["tenant"] = ns
    c.state["rv"] = (await read_secret(c.api, ns, c.world.replica)).metadata.resource_version
    await fleet.create_claim(c.api, ns, "gpu", class_name=c.world.cls)


async def _squat_handled(c: Ctx) -> bool:
    ns = c.state["tenant"]
    r = await read_secret(c.api, ns, c.world.replica)
    return (r is not None and r.metadata.resource_version == c.state["rv"]
            and c.metric("licensectl_replicas", {"state": "conflict"}) >= 1.0
            and await c.warning_for(ns, c.world.replica, "ReplicaConflict"))


async def _labelled_squat(c: Ctx) -> None:
    """A Secret under the replica's name carrying licensectl's managed-by label but none of its
    annotations: it is in licensectl's replica cache, so no write ever runs into it."""
    t = await c.world.add_tenant(claim=False)
    ns = t["metadata"]["name"]
    core: Any = CoreV1Api(c.api)
    await core.create_namespaced_secret(ns, {"metadata": {
        "name": c.world.replica, "labels": {"app.kubernetes.io/managed-by": "licensectl"}},
        "stringData": {"mine": "tenant data"}})
    c.state["tenant"] = ns
    c.state["conflicts_before"] = c.metric("licensectl_replica_conflicts_total")
    c.state["rv"] = (await read_secret(c.api, ns, c.world.replica)).metadata.resource_version
    await fleet.create_claim(c.api, ns, "gpu", class_name=c.world.cls)


async def _labelled_squat_handled(c: Ctx) -> bool:
    ns = c.state["tenant"]
    r = await read_secret(c.api, ns, c.world.replica)
    if r is None or r.metadata.resource_version != c.state["rv"] or set(r.data) != {"mine"}:
        raise AssertionError("the labelled foreign Secret was changed or deleted")
    return (c.metric("licensectl_replicas", {"state": "conflict"}) >= 1.0
            and c.metric("licensectl_replica_conflicts_total") == c.state["conflicts_before"] + 1.0
            and await c.warning_for(ns, c.world.replica, "ReplicaConflict"))


async def _labelled_squat_counted_once(c: Ctx) -> None:
    """Later passes (the rotation below runs several) neither change it nor count it again."""
    r = await read_secret(c.api, c.state["tenant"], c.world.replica)
    assert r.metadata.resource_version == c.state["rv"]
    assert c.metric("licensectl_replica_conflicts_total") == c.state["conflicts_before"] + 1.0


# -- guest reports -----------------------------------------------------------------------------
async def _post(c: Ctx, body: bytes, *, namespace: str, credential: str | None,
                content_type: str = "text/plain; charset=utf-8") -> tuple[int, str]:
    headers = {"X-Licensectl-Namespace": namespace, "Content-Type": content_type}
    if credential is not None:
        headers["Authorization"] = f"Bearer {credential}"
    tls = ssl.create_default_context(cadata=c.app.tls.ca_bundle.decode())
    async with aiohttp.ClientSession() as s, s.post(f"https://127.0.0.1:{c.app.reports_port}/v1/reports",
                                                    data=body, headers=headers, ssl=tls) as r:
        return r.status, await r.text()


async def _credential(c: Ctx, ns: str) -> str:
    r = await read_secret(c.api, ns, c.world.replica)
    return base64.b64decode(r.data[KEY_REPORT_CREDENTIAL]).decode()


def _valid_report() -> bytes:
    return render_report(uuid=str(uuid.uuid4()), hostname="guest", clock=int(time.time()), token_sha256=None,
                         probe_version="1.0")


async def _reports(c: Ctx) -> None:
    """Forged, garbage and oversized reports; each answer must be 4xx and never echo a credential."""
    healthy_cred = await _credential(c, c.healthy)
    other = await c.world.add_tenant()
    await eventually(lambda: read_secret(c.api, other["metadata"]["name"], c.world.replica), timeout=30,
               what="second tenant replica")
    other_cred = await _credential(c, other["metadata"]["name"])
    c.state["creds"] = [healthy_cred, other_cred]
    cases: list[tuple[str, int, Awaitable[tuple[int, str]]]] = [
        ("unauthorized", 401, _post(c, _valid_report(), namespace=c.healthy, credential=None)),
        ("unauthorized", 401, _post(c, _valid_report(), namespace=c.healthy, credential=other_cred)),
        ("unauthorized", 401, _post(c, _valid_report(), namespace=c.healthy, credential="A" * 43)),
        ("bad_format", 400, _post(c, b"GET / HTTP/1.0\r\n\r\n" + healthy_cred.encode(), namespace=c.healthy,
                                  credential=healthy_cred)),
        ("bad_encoding", 400, _post(c, b"\xff\xfe\x00junk", namespace=c.healthy, credential=healthy_cred)),
        ("too_large", 413, _post(c, b"x" * (600 * 1024), namespace=c.healthy, credential=healthy_cred)),
        ("bad_content_type", 415, _post(c, _valid_report(), namespace=c.healthy, credential=healthy_cred,
                                        content_type="application/json")),
        ("bad_request", 400, _post(c, _valid_report(), namespace="Not_A_Namespace", credential=healthy_cred)),
        ("unknown_uuid", 403, _post(c, _valid_report(), namespace=c.healthy, credential=healthy_cred)),
        ("bad_xml", 400, _post(c, render_report(
            uuid=str(uuid.uuid4()), hostname="guest", clock=int(time.time()), token_sha256=None,
            probe_version="1.0", sections=[("nvidia-smi-xml", '<!DOCTYPE x [<!ENTITY e "boom">]><x>&e;</x>')]),
            namespace=c.healthy, credential=healthy_cred)),
    ]
    answers = []
    for reason, want, call in cases:
        status, text = await call
        answers.append((reason, want, status, text))
    c.state["answers"] = answers


async def _reports_handled(c: Ctx) -> bool:
    answers = c.state["answers"]
    for reason, want, status, text in answers:
        if reason in ("bad_xml",):
            if not 400 <= status < 500:  # defusedxml refuses the DTD: bad_xml or xml_forbidden
                return False
        elif status != want:
            raise AssertionError(f"report case {reason}: HTTP {status}, want {want}")
        if any(cred in text for cred in c.state["creds"]):
            raise AssertionError(f"report case {reason}: the answer echoes a credential")
    counted = {r for r, *_ in answers if r != "bad_xml"}
    return all(c.metric("licensectl_reports_total", {"result": r}) >= 1.0 for r in counted)


CATALOGUE: list[BadInput] = [
    BadInput("source_missing_token_key", _inject_source({"gridd.conf": b"ServerPort=443\n"}),
             _source_problem("token_key_missing"), "source Secret without the token key"),
    BadInput("source_empty_token", _inject_source({KEY_TOKEN: b""}), _source_problem("token_empty"),
             "source Secret with an empty token"),
    BadInput("source_huge_token", _inject_source({KEY_TOKEN: b"h" * (64 * 1024 + 1)}),
             _source_problem("token_too_large"), "token larger than 64 KiB"),
    BadInput("source_gridd_conf_nul", _inject_source({KEY_TOKEN: fleet.fake_token(2_000_000_000),
                                                      "gridd.conf": b"A=1\x00B"}),
             _source_problem("gridd_conf_invalid"), "gridd.conf with a NUL byte"),
    BadInput("source_binary_token", _binary_token, _binary_token_handled,
             "binary junk token: delivered opaque, expiry unknown"),
    BadInput("class_invalid_mode", _inject_class(mode="vgpux"),
             _class_problem(("licensectl_tenant_problems", {"kind": "invalid_class"}), "InvalidClass"),
             "GPUClass with mode vgpux"),
    BadInput("class_invalid_feature_type", _inject_class(feature_type=3),
             _class_problem(("licensectl_source_problem", {"class": "{class}", "reason": "invalid_feature_type"}),
                            "LicenseSourceInvalid"), "GPUClass with featureType 3"),
    BadInput("class_missing_secret_ref", _inject_class(secret=None),
             _class_problem(("licensectl_tenant_problems", {"kind": "invalid_class"}), "InvalidClass"),
             "vgpu GPUClass without secretRef"),
    BadInput("class_secret_ref_missing_secret", _inject_class(secret="does-not-exist"),
             _class_problem(("licensectl_source_problem", {"class": "{class}", "reason": "source_missing"}),
                            "LicenseSourceInvalid"), "GPUClass naming a Secret that does not exist"),
    BadInput("claim_missing_class", _claim_missing_class, _claim_missing_class_handled,
             "GPUClaim naming a class that does not exist"),
    BadInput("tenant_cycle", _tenant_cycle, _tenant_cycle_handled, "tenant ownerReferences forming a cycle"),
    BadInput("tenant_link_mismatch", _link_mismatch, _link_mismatch_handled,
             "tenant whose name and ownerReference disagree"),
    BadInput("replica_token_tampered", _tamper_token, _tamper_token_handled, "tenant edits the replica token"),
    BadInput("replica_annotations_tampered", _tamper_annotations, _tamper_annotations_handled,
             "tenant edits the replica's revision/source annotations"),
    BadInput("replica_deleted_by_tenant", _tamper_delete, _tamper_delete_handled, "tenant deletes the replica"),
    BadInput("replica_name_squatted", _squat_replica_name, _squat_handled,
             "foreign Secret under the replica's name"),
    BadInput("replica_name_squatted_with_label", _labelled_squat, _labelled_squat_handled,
             "foreign Secret under the replica's name with licensectl's label but not its annotations",
             after=_labelled_squat_counted_once),
    BadInput("guest_reports_forged_and_garbage", _reports, _reports_handled,
             "forged credentials, garbage, oversized, wrong type, XML entities"),
]


@contextlib.contextmanager
def captured_log() -> Iterator[io.StringIO]:
    """The controller's JSON log lines (as rendered in a cluster, redaction included) for this case."""
    before = structlog.get_config()
    buf = io.StringIO()
    logs.configure("json", "info", stream=buf)
    try:
        yield buf
    finally:
        structlog.configure(**before)


@contextlib.asynccontextmanager
async def case_context(api: ApiClient, kubeconfig: Path) -> AsyncIterator[Ctx]:
    world = await build_world(api, tenants=1)
    healthy = world.tenants[0]
    try:
        with captured_log() as log:
            async with running_app(settings_for(kubeconfig, world.controller_ns,
                                                root_tenant=world.root_name)) as app:
                await eventually(lambda: world.replicas_present([healthy]), timeout=30, what="healthy replica")
                yield Ctx(api, world, app, healthy, log=log)
    finally:
        await world.teardown()


async def _cleanup(c: Ctx) -> None:
    core = CoreV1Api(c.api)
    for cls in c.extra_classes:
        await fleet.delete_gpu_class(c.api, cls)
    for ns in c.extra_namespaces:
        with contextlib.suppress(ApiException):
            await core.delete_namespace(ns)


async def run_case(api: ApiClient, kubeconfig: Path, case: BadInput) -> tuple[bool, str]:
    """(handled, detail). Handled = evidence found, healthy tenant served, nothing leaked."""
    async with case_context(api, kubeconfig) as c:
        try:
            await case.inject(c)
            try:
                await eventually(lambda: case.handled(c), timeout=30, interval=0.3, what=f"{case.name} reported")
            except TimeoutError as e:
                return False, str(e)
            # The healthy tenant keeps being served: its source rotates, its replica follows.
            token = await c.world.rotate(9)
            rev = await c.world.revision()
            try:
                await eventually(lambda: c.world.replicas_at([c.healthy], rev), timeout=30,
                           what="healthy tenant served")
            except TimeoutError as e:
                return False, str(e)
            r = await read_secret(api, c.healthy, c.world.replica)
            if base64.b64decode(r.data[KEY_TOKEN]) != token:
                return False, "healthy tenant's replica does not hold the rotated token"
            if case.after is not None:
                await case.after(c)
            verdict = inv.Verdict()
            texts = [("/metrics", generate_latest(c.app.metrics.registry).decode()), ("log", c.log.getvalue())]
            texts += await inv.event_texts(api, [*c.world.namespaces, "default", *c.extra_namespaces])
            needles = [n for i, t in enumerate([*c.world.tokens, *c.tokens])
                       for n in inv.token_needles(f"token #{i}", t)]
            needles += [inv.Needle("report credential", s) for s in c.state.get("creds", [])]
            # Bytes that are not text could only leak as Python's repr or as hex (e.g. in a log line).
            needles += [inv.Needle(f"case token #{i} ({form})", text) for i, t in enumerate(c.tokens) if len(t) >= 16
                        for form, text in (("repr", repr(t)[2:34]), ("hex", t.hex()[:32]))]
            inv.scan(verdict, texts, needles)
            if not verdict.ok:
                return False, "; ".join(verdict.violations)
            return True, "ok"
        finally:
            await _cleanup(c)


async def run_catalogue(api: ApiClient, kubeconfig: Path) -> list[tuple[str, bool, str]]:
    out = []
    for case in CATALOGUE:
        try:
            handled, detail = await run_case(api, kubeconfig, case)
        except Exception as e:
            handled, detail = False, f"{type(e).__name__}: {e}"[:500]
        out.append((case.name, handled, detail))
    return out


@pytest.mark.parametrize("case", CATALOGUE, ids=[c.name for c in CATALOGUE])
@pytest.mark.asyncio(loop_scope="session")
async def test_bad_input_is_reported_and_healthy_tenant_served(case: BadInput, api_client: ApiClient,
                                                               kubeconfig_path: Path) -> None:
    handled, detail = await run_case(api_client, kubeconfig_path, case)
    assert handled, f"{case.name}: {detail}"


def test_catalogue_names_are_unique() -> None:
    assert len({c.name for c in CATALOGUE}) == len(CATALOGUE)

