"""Informer against the real kube-apiserver: list+watch, paging, selectors, 410 relist, failed
lists, and reconnects after a cut connection."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from licensectl import config
from licensectl.core import model
from licensectl.core.render import replica_name
from licensectl.kube import client as kclient
from licensectl.kube import contract, projections
from licensectl.kube.api import ApiException as KubeApiError
from licensectl.kube.api import CoreV1Api as KubeCoreV1Api
from licensectl.kube.caches import Caches
from licensectl.kube.raw import RawApi
from licensectl.kube.watch import (
    CACHE_PROBE_SELECTOR,
    REASON_GONE,
    REASON_TIMEOUT,
    Informer,
    InformerHooks,
    InformerOptions,
    Key,
)
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.controlplane import ControlPlane


class Wrapped:
    """A list function wrapper: records calls and lets a test inject failures, hooks and gates."""

    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        self.fn = fn
        self.calls: list[dict[str, Any]] = []
        self.fail_continued_pages = False     # raise on every page after the first
        self.before_watch: Callable[[], Awaitable[None]] | None = None  # runs once, before a watch
        self.watch_gate: asyncio.Event | None = None  # holds watch requests until set
        self.watch_responses: list[Any] = []

    @property
    def lists(self) -> list[dict[str, Any]]:
        """LIST pages (the watch-cache probe before a selector-less LIST is in `probes`)."""
        return [c for c in self.calls if not c.get("watch") and c.get("label_selector") != CACHE_PROBE_SELECTOR]

    @property
    def probes(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if c.get("label_selector") == CACHE_PROBE_SELECTOR]

    @property
    def watches(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if c.get("watch")]

    async def __call__(self, **kw: Any) -> Any:
        if kw.get("watch"):
            if self.before_watch is not None:
                hook, self.before_watch = self.before_watch, None
                await hook()
            if self.watch_gate is not None:
                await self.watch_gate.wait()
        elif kw.get("_continue") and self.fail_continued_pages:
            self.calls.append(dict(kw))
            raise ConnectionResetError("injected failure on a continued page")
        self.calls.append(dict(kw))
        resp = await self.fn(**kw)
        if kw.get("watch"):
            self.watch_responses.append(resp)
        return resp


async def compact_etcd(cp: ControlPlane, core: CoreV1Api, namespace: str) -> None:
    """Compact etcd history up to now (what kube-apiserver does every 5 minutes), so that any older
    resourceVersion is answered with 410 Expired. etcd's JSON gateway: POST /v3/kv/compaction."""
    resp = await core.list_namespaced_event(namespace, limit=1, _preload_content=False)
    rv = int((await resp.json())["metadata"]["resourceVersion"])
    body = {"revision": str(rv), "physical": True}
    async with aiohttp.ClientSession() as s, s.post(f"{cp.etcd_url}/v3/kv/compaction", json=body) as r:
        text = await r.text()
        assert r.status == 200 or "compacted" in text, text


def secret_body(name: str, labels: dict[str, str] | None = None, value: bytes = b"v1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "labels": labels or {}},
            "type": "Opaque", "data": {"k": base64.b64encode(value).decode()}}


async def until(cond: Callable[[], bool], within: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(inf: Informer[Any]) -> AsyncIterator[None]:
    task = asyncio.create_task(inf.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert not inf.running


def recorder() -> tuple[list[tuple[Key, Any, Any]], Callable[[Key, Any, Any], None]]:
    changes: list[tuple[Key, Any, Any]] = []
    return changes, lambda k, o, n: changes.append((k, o, n))


def data_of(inf: Informer[model.SourceSecret], ns: str, name: str) -> bytes | None:
    s = inf.cache.get((ns, name))
    return None if s is None else s.data.get("k")


async def test_list_then_watch_add_modify_delete(api_client: ApiClient, namespace: str) -> None:
    core = CoreV1Api(api_client)
    await core.create_namespaced_secret(namespace, secret_body("a"))
    await core.create_namespaced_secret(namespace, secret_body("b"))
    changes, on_change = recorder()
    restarts: list[str] = []
    inf = Informer("secrets", functools.partial(core.list_namespaced_secret, namespace),
                   projections.source_secret_from, on_change=on_change, options=InformerOptions(watch_timeout=1.0),
                   hooks=InformerHooks(on_watch_restart=lambda n, r: restarts.append(r)))
    async with running(inf):
        assert await inf.wait_synced(15)
        assert set(inf.cache) == {(namespace, "a"), (namespace, "b")}
        assert inf.healthy
        await core.create_namespaced_secret(namespace, secret_body("c"))
        await until(lambda: (namespace, "c") in inf.cache, what="ADDED c")
        await core.patch_namespaced_secret("a", namespace, {"data": {"k": base64.b64encode(b"v2").decode()}})
        await until(lambda: data_of(inf, namespace, "a") == b"v2", what="MODIFIED a")
        await core.delete_namespaced_secret("b", namespace)
        await until(lambda: (namespace, "b") not in inf.cache, what="DELETED b")
        # The server ends each watch after timeoutSeconds (1-2 s here): the informer must resume
        # from its last resourceVersion, not relist, and still see changes made afterwards.
        await until(lambda: REASON_TIMEOUT in restarts, within=10, what="server-side watch timeout")
        await core.create_namespaced_secret(namespace, secret_body("d"))
        await until(lambda: (namespace, "d") in inf.cache, what="ADDED d after resume")
        assert inf.counters["lists"] == 1 and inf.counters["relists"] == 0
    keys = [(k, o is None, n is None) for k, o, n in changes]
    assert ((namespace, "c"), True, False) in keys
    assert ((namespace, "a"), False, False) in keys
    assert ((namespace, "b"), False, True) in keys


async def test_paged_list(api_client: ApiClient, namespace: str) -> None:
    core = CoreV1Api(api_client)
    names = [f"s{i:02d}" for i in range(23)]
    await asyncio.gather(*(core.create_namespaced_secret(namespace, secret_body(n)) for n in names))
    fn = Wrapped(functools.partial(core.list_namespaced_secret, namespace))
    inf = Informer("paged", fn, projections.source_secret_from, options=InformerOptions(page_size=4))
    async with running(inf):
        assert await inf.wait_synced(15)
        assert {k[1] for k in inf.cache} == set(names)
    assert len(fn.lists) == 6  # ceil(23 / 4) pages, all of one LIST
    assert len(fn.probes) == 1  # the real apiserver answered the watch-cache probe: its cache is filled
    assert all(c["limit"] == 4 for c in fn.lists)
    assert sum(1 for c in fn.lists if c.get("_continue")) == 5


async def test_label_selected_secrets_only(api_client: ApiClient, namespace_factory: Any) -> None:
    core = CoreV1Api(api_client)
    ns1, ns2 = await namespace_factory(), await namespace_factory()
    sel = {"test.licensectl.io/run": uuid.uuid4().hex[:12]}
    await core.create_namespaced_secret(ns1, secret_body("in1", sel))
    await core.create_namespaced_secret(ns2, secret_body("in2", sel))
    await core.create_namespaced_secret(ns1, secret_body("out1"))
    label_selector = ",".join(f"{k}={v}" for k, v in sel.items())
    inf = Informer("replicas", core.list_secret_for_all_namespaces, projections.replica_secret_from,
                   label_selector=label_selector)
    async with running(inf):
        assert await inf.wait_synced(15)
        assert set(inf.cache) == {(ns1, "in1"), (ns2, "in2")}
        await core.create_namespaced_secret(ns2, secret_body("out2"))
        # Labelling an object moves it into the selection; unlabelling moves it out (DELETED).
        await core.patch_namespaced_secret("out1", ns1, {"metadata": {"labels": sel}})
        await core.patch_namespaced_secret("in2", ns2, {"metadata": {"labels": {k: None for k in sel}}})
        await until(lambda: set(inf.cache) == {(ns1, "in1"), (ns1, "out1")}, what="selection change")
        await asyncio.sleep(0.5)
        assert (ns2, "out2") not in inf.cache


def cut_connection(resp: Any) -> None:
    """Abort the TCP connection under a streaming response, as a network failure would."""
    conn = getattr(resp, "connection", None)
    transport = getattr(conn, "transport", None) if conn is not None else None
    if transport is not None:
        transport.abort()
    else:
        resp.close()


def event_body(name: str, namespace: str, message: str = "m1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
            "involvedObject": {"kind": "ConfigMap", "name": "x", "namespace": namespace},
            "reason": "Test", "message": message, "type": "Normal"}


def event_message(obj: Any) -> str | None:
    msg = obj.get("message")
    return msg if isinstance(msg, str) else None


# Events are the one core resource kube-apiserver serves without a watch cache (kubernetes/kubernetes
# pkg/kubeapiserver/default_storage_factory_builder.go, DefaultWatchCacheSizes: events -> 0), so their
# watches read etcd directly and a compacted resourceVersion is answered with 410 Expired at once,
# exactly what a long outage does to any resource in production.
async def test_forced_410_relists_and_fixes_cache(api_client: ApiClient, namespace: str,
                                                  control_plane: ControlPlane) -> None:
    core = CoreV1Api(api_client)
    await core.create_namespaced_event(namespace, event_body("keep", namespace))
    await core.create_namespaced_event(namespace, event_body("gone", namespace))
    fn = Wrapped(functools.partial(core.list_namespaced_event, namespace))

    async def change_while_blind() -> None:
        await core.delete_namespaced_event("gone", namespace)
        await core.create_namespaced_event(namespace, event_body("new", namespace))
        await core.patch_namespaced_event("keep", namespace, {"message": "m2"})
        await compact_etcd(control_plane, core, namespace)

    # Between the LIST and the first WATCH the cluster changes and etcd compacts past the list's
    # resourceVersion: the watch gets 410 and only a full relist can repair the cache.
    fn.before_watch = change_while_blind
    changes, on_change = recorder()
    restarts: list[str] = []
    inf = Informer("events", fn, event_message, on_change=on_change,
                   hooks=InformerHooks(on_watch_restart=lambda n, r: restarts.append(r)))
    async with running(inf):
        assert await inf.wait_synced(15)
        list_rv = fn.lists[0].get("resource_version")
        await until(lambda: inf.counters["relists"] == 1 and inf.counters["lists"] == 2, what="relist")
        assert dict(inf.cache) == {(namespace, "keep"): "m2", (namespace, "new"): "m1"}
        assert inf.healthy
        # and the watch after the relist works
        await core.create_namespaced_event(namespace, event_body("after", namespace))
        await until(lambda: (namespace, "after") in inf.cache, what="ADDED after relist")
    assert list_rv is None  # the LIST is a consistent read, not served from a cache
    assert restarts[0] == REASON_GONE
    assert int(fn.watches[1]["resource_version"]) > int(fn.watches[0]["resource_version"])
    relist_diff = {(k, o, n) for k, o, n in changes[2:5]}
    assert relist_diff == {((namespace, "gone"), "m1", None), ((namespace, "new"), None, "m1"),
                           ((namespace, "keep"), "m1", "m2")}


async def test_list_failing_halfway_never_syncs(api_client: ApiClient, namespace: str) -> None:
    core = CoreV1Api(api_client)
    await asyncio.gather(*(core.create_namespaced_secret(namespace, secret_body(f"s{i}")) for i in range(5)))
    fn = Wrapped(functools.partial(core.list_namespaced_secret, namespace))
    fn.fail_continued_pages = True
    inf = Informer("halfway", fn, projections.source_secret_from,
                   options=InformerOptions(page_size=2, backoff_base=0.05, backoff_cap=0.1))
    async with running(inf):
        await until(lambda: inf.counters["list_failures"] >= 3, what="repeated list failures")
        assert not inf.synced and not inf.healthy
        assert dict(inf.cache) == {}  # page 1 was fetched, but nothing of it was published
        assert not await inf.wait_synced(0.2)
        fn.fail_continued_pages = False
        assert await inf.wait_synced(15)
        assert len(inf.cache) == 5 and inf.healthy


async def test_relist_failing_halfway_keeps_cache(api_client: ApiClient, namespace: str,
                                                  control_plane: ControlPlane) -> None:
    core = CoreV1Api(api_client)
    await asyncio.gather(*(core.create_namespaced_event(namespace, event_body(f"e{i}", namespace))
                           for i in range(5)))
    fn = Wrapped(functools.partial(core.list_namespaced_event, namespace))
    inf = Informer("relist-halfway", fn, event_message,
                   options=InformerOptions(page_size=2, backoff_base=0.05, backoff_cap=0.1))
    async with running(inf):
        assert await inf.wait_synced(15)
        before = inf.snapshot()
        assert len(before) == 5 and inf.healthy

        async def break_lists_and_change() -> None:
            fn.fail_continued_pages = True
            await core.delete_namespaced_event("e0", namespace)
            await core.create_namespaced_event(namespace, event_body("e5", namespace))
            await compact_etcd(control_plane, core, namespace)

        # Cut the watch; before it reconnects, history is compacted (-> 410 -> relist) and every
        # relist fails on its second page.
        await until(lambda: len(fn.watch_responses) == 1, what="watch established")
        fn.before_watch = break_lists_and_change
        cut_connection(fn.watch_responses[-1])
        await until(lambda: inf.counters["list_failures"] >= 2, what="failing relists")
        assert inf.counters["relists"] == 1
        assert inf.synced and not inf.healthy
        assert inf.snapshot() == before  # the cache was neither replaced nor shrunk
        fn.fail_continued_pages = False
        await until(lambda: inf.healthy and (namespace, "e0") not in inf.cache, what="recovery")
        assert set(inf.cache) == {(namespace, f"e{i}") for i in range(1, 6)}


async def test_reconnect_after_cut_resumes_without_losing_events(api_client: ApiClient, namespace: str) -> None:
    core = CoreV1Api(api_client)
    await core.create_namespaced_secret(namespace, secret_body("a"))
    await core.create_namespaced_secret(namespace, secret_body("b"))
    fn = Wrapped(functools.partial(core.list_namespaced_secret, namespace))
    restarts: list[str] = []
    inf = Informer("cut", fn, projections.source_secret_from,
                   options=InformerOptions(backoff_base=0.05, backoff_cap=0.1),
                   hooks=InformerHooks(on_watch_restart=lambda n, r: restarts.append(r)))
    async with running(inf):
        assert await inf.wait_synced(15)
        await core.create_namespaced_secret(namespace, secret_body("c"))
        await until(lambda: (namespace, "c") in inf.cache, what="ADDED c")
        rv_before_cut = inf.resource_version
        gate = asyncio.Event()
        fn.watch_gate = gate
        cut_connection(fn.watch_responses[-1])
        await until(lambda: len(restarts) >= 1, what="watch noticed the cut")
        # While the informer is disconnected, the cluster moves on.
        await core.create_namespaced_secret(namespace, secret_body("d"))
        await core.patch_namespaced_secret("a", namespace, {"data": {"k": base64.b64encode(b"v2").decode()}})
        await core.delete_namespaced_secret("b", namespace)
        assert inf.healthy  # a short outage is within the grace
        fn.watch_gate = None
        gate.set()
        await until(lambda: set(inf.cache) == {(namespace, "a"), (namespace, "c"), (namespace, "d")}
                    and data_of(inf, namespace, "a") == b"v2", what="events after reconnect")
    assert fn.watches[-1]["resource_version"] == rv_before_cut or fn.watches[1]["resource_version"] == rv_before_cut
    assert len(fn.lists) == 1  # resumed from the last resourceVersion: no relist
    assert restarts[0] != REASON_GONE


async def test_contract_listers_feed_informers(api_client: ApiClient, namespace: str, cleanup: Any) -> None:
    """The GPU contract and KubeVirt listers reach the CRDs the cluster serves, through the Informer."""
    custom = CustomObjectsApi(api_client)
    settings = config.Settings()
    c = contract.GpuContract.from_settings(settings)
    cls_name = f"test-{uuid.uuid4().hex[:8]}"
    await custom.create_cluster_custom_object(c.group, c.version, c.class_plural, {
        "apiVersion": c.api_version, "kind": contract.GPU_CLASS_KIND, "metadata": {"name": cls_name},
        "spec": {"mode": "vgpu", "license": {"secretRef": {"namespace": namespace, "name": "tok"}, "featureType": 1}},
    })
    cleanup(lambda: custom.delete_cluster_custom_object(c.group, c.version, c.class_plural, cls_name))
    await custom.create_namespaced_custom_object(c.group, c.version, namespace, c.claim_plural, {
        "apiVersion": c.api_version, "kind": contract.GPU_CLAIM_KIND, "metadata": {"name": "claim"},
        "spec": {"className": cls_name},
    })
    classes = Informer("gpuclasses", contract.gpu_class_lister(custom, settings), projections.gpu_class_from)
    claims = Informer("gpuclaims", contract.gpu_claim_lister(custom, settings), projections.gpu_claim_from)
    vms = Informer("vms", contract.vm_lister(custom), projections.vm_from)
    vmis = Informer("vmis", contract.vmi_lister(custom), projections.vmi_from)
    async with running(classes), running(claims), running(vms), running(vmis):
        for inf in (classes, claims, vms, vmis):
            assert await inf.wait_synced(15), inf.name
        assert classes.cache[("", cls_name)] == model.GpuClass(
            cls_name, classes.cache[("", cls_name)].uid, "vgpu", model.ObjectRef(namespace, "tok"), 1)
        assert claims.cache[(namespace, "claim")] == model.GpuClaim(namespace, "claim", cls_name)
        assert all(inf.healthy for inf in (classes, claims, vms, vmis))


async def test_make_api_client_counts_requests(kubeconfig_path: Any, namespace: str) -> None:
    seen: list[tuple[str, int]] = []
    tracing = kclient.request_tracing(on_request=lambda verb, code: seen.append((verb, code)))
    api = await kclient.make_api_client(config.Settings(kubeconfig=str(kubeconfig_path)), trace_configs=[tracing])
    try:
        assert api.session.connector is not None and api.session.connector.limit == kclient.POOL_MAXSIZE
        core = KubeCoreV1Api(api)
        inf = Informer("observed", functools.partial(core.list_namespaced_secret, namespace),
                       projections.source_secret_from)
        async with running(inf):
            assert await inf.wait_synced(15)
            await until(lambda: ("WATCH", 200) in seen, what="watch request observed")
        await RawApi(core).create_namespaced_secret(namespace, secret_body("x"))
        with pytest.raises(KubeApiError) as conflict:
            await RawApi(core).create_namespaced_secret(namespace, secret_body("x"))  # 409 AlreadyExists
        assert conflict.value.status == 409
    finally:
        await api.close()
    assert ("GET", 200) in seen and ("POST", 201) in seen and ("POST", 409) in seen


async def test_the_controllers_vm_caches_hold_only_what_asks_for_a_license(
        api_client: ApiClient, namespace: str) -> None:
    """The VM and VMI informers the controller builds (kube/caches.py) keep the vGPU VMs and VMIs of a
    namespace and none of the ordinary ones beside them; a VMI that starts or stops asking for a license
    enters or leaves the cache (docs/design.md#decision-cache-relevance)."""
    custom: Any = CustomObjectsApi(api_client)  # its stubs lack _content_type (a merge patch)

    async def create(plural: str, body: dict[str, Any]) -> None:
        await custom.create_namespaced_custom_object("kubevirt.io", "v1", namespace, plural, body)

    def vmi(name: str, template: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": name, "namespace": namespace}, "spec": template["spec"]}

    gpu = fleet.vm_body(namespace, "gpu", gpu_claims=("claim",))
    plain = fleet.vm_body(namespace, "plain")
    mounted = fleet.vm_body(namespace, "mounted", license_secret=replica_name("l40s"))
    for body in (gpu, plain, mounted):
        await create("virtualmachines", body)
        await create("virtualmachineinstances", vmi(body["metadata"]["name"], body["spec"]["template"]))
    caches = Caches(api_client, config.Settings(), on_change=lambda _kind: None)
    assert caches.vms is not None and caches.vmis is not None
    vms, vmis = caches.vms, caches.vmis

    def held(inf: Informer[Any]) -> set[str]:
        return {name for (ns, name) in inf.cache if ns == namespace}

    async with running(vms), running(vmis):
        assert await vms.wait_synced(15) and await vmis.wait_synced(15)
        assert held(vms) == held(vmis) == {"gpu", "mounted"}
        assert vmis.counters["ignored_objects"] >= 1 and vmis.counters["invalid_objects"] == 0
        # The plain VMI starts asking (claims by annotation): it is held; it stops: it leaves.
        patch = {"metadata": {"annotations": {model.ANN_GPU_CLAIMS: "claim"}}}
        await custom.patch_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachineinstances",
                                                    "plain", patch, _content_type="application/merge-patch+json")
        await until(lambda: "plain" in held(vmis), what="the plain VMI held once it names a claim")
        unpatch = {"metadata": {"annotations": {model.ANN_GPU_CLAIMS: None}}}
        await custom.patch_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachineinstances",
                                                    "plain", unpatch, _content_type="application/merge-patch+json")
        await until(lambda: "plain" not in held(vmis), what="the plain VMI gone once it names none")
        # A plain VM that carries a licensectl intent is held (the intent outlives its VMI).
        mark = {"metadata": {"annotations": {model.ANN_RESTART_REVISION: "r1"}}}
        await custom.patch_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachines",
                                                    "plain", mark, _content_type="application/merge-patch+json")
        await until(lambda: "plain" in held(vms), what="the plain VM held once it carries an intent")
