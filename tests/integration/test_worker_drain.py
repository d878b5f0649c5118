"""Tenant-cluster workers, the conditions around a drain (docs/design.md#tenant-worker-drain), in-process
against the real apiserver, the KubeVirt simulator and, where a tenant cluster answers, a real tenant
control plane with the node agent:

* a tenant cluster that cannot be reached holds its worker (Event, metric) without spending the restart
  budget: a plain VM elsewhere is restarted meanwhile; the hoster's opt-in on the Cluster then restarts
  the worker without a drain;
* a Machine annotated exclude-node-draining is restarted without a cordon or an eviction;
* unreadable drain annotations are never guessed at: a Node cordoned under the VM's marker is
  uncordoned and the VM blocked (IntentUnreadable), never restarted.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from licensectl.core import drain
from licensectl.core.model import ANN_RESTART_RESULT, ANN_RESTART_REVISION, LABEL_CAPI_CLUSTER_NAME, LABEL_CAPI_ROLE
from licensectl_dev.devcluster.fleet import put_secret

from ..conftest import KubevirtEnv, TenantClusterFactory
from .support import eventually, make_world, metric, running_app
from .test_rollout import Fleet as RolloutFleet

pytestmark = pytest.mark.asyncio(loop_scope="session")


@dataclass
class Fleet(RolloutFleet):
    """The rollout tests' fleet, one restart at a time, with short drain timings."""

    def settings(self, **kw: Any) -> Any:
        return super().settings(**{"max_unavailable": "1", "done_gate": "ready", "drain_retry_seconds": 1.0,
                                   "drain_timeout_seconds": 20.0, "worker_boot_timeout_seconds": 30.0, **kw})

    async def annotations(self, ns: str, name: str) -> dict[str, str]:
        return dict((await self.vm_obj(ns, name))["metadata"].get("annotations") or {})

    async def boot(self, vms: list[tuple[str, str, dict[str, str] | None]]) -> None:
        for ns in self.tenants:
            await eventually(lambda ns=ns: self.replica_revision(ns), what=f"replica in {ns}")
        await asyncio.sleep(1.1)  # one-second revision times: boot after the revision
        for ns, name, labels in vms:
            await self.vm(ns, name, labels=labels)
        for ns, name, _ in vms:
            await eventually(lambda ns=ns, name=name: self.ready(ns, name), timeout=60, what=f"{ns}/{name} ready")
        await asyncio.sleep(1.1)

    async def rotate_and_wait(self) -> str:
        old = await self.replica_revision(self.tenants[0])
        await self.rotate(1)

        async def changed() -> str | None:
            rev = await self.replica_revision(self.tenants[0])
            return rev if rev != old else None

        return await eventually(changed, timeout=30, what="the new revision")


@pytest_asyncio.fixture(loop_scope="session")
async def rig(api_client: ApiClient, kubevirt: KubevirtEnv, namespace_factory: Any, cleanup: Any
              ) -> AsyncIterator[Fleet]:
    w = await make_world(api_client, namespace_factory, cleanup, token_days=1)
    f = Fleet(**vars(w), kv=kubevirt)
    for _ in range(2):
        await f.tenant(claim=True)
    yield f


def worker(cluster: str) -> dict[str, str]:
    return {LABEL_CAPI_CLUSTER_NAME: cluster, LABEL_CAPI_ROLE: "worker"}


async def create_capi(api: ApiClient, ns: str, plural: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    group, version = (("infrastructure.cluster.x-k8s.io", "v1alpha1") if plural == "kubevirtmachines"
                      else ("cluster.x-k8s.io", "v1beta1"))
    kind = {"clusters": "Cluster", "machines": "Machine", "kubevirtmachines": "KubevirtMachine"}[plural]
    return await CustomObjectsApi(api).create_namespaced_custom_object(group, version, ns, plural, {
        "apiVersion": f"{group}/{version}", "kind": kind, **body,
        "metadata": {"name": name, "namespace": ns, **body.get("metadata", {})}})


async def test_an_unreachable_cluster_holds_its_worker_spends_no_budget_and_the_opt_in_restarts_it(
        rig: Fleet) -> None:
    f = rig
    ns = f.tenants[0]
    # One namespace, one restart at a time: the worker sorts first, so the plain VM can only be restarted
    # if the held worker leaves the one slot free.
    async with running_app(f.settings()) as app:
        await f.boot([(ns, "a-w0", worker("ghost")), (ns, "b-plain", None)])
        revision = await f.rotate_and_wait()

        async def held() -> bool:
            return (await f.annotations(ns, "a-w0")).get(drain.ANN_DRAIN_HELD) == drain.BlockReason.CLUSTER_UNREACHABLE

        await eventually(held, timeout=30, what="the worker held: its cluster cannot be reached")

        async def plain_done() -> bool:
            ann = await f.annotations(ns, "b-plain")
            return ann.get(ANN_RESTART_REVISION) == revision and ann.get(ANN_RESTART_RESULT) == "done"

        await eventually(plain_done, timeout=60, what="the plain VM restarted while the worker is held")
        ann = await f.annotations(ns, "a-w0")
        assert drain.ANN_DRAIN_STEP not in ann  # no cycle was opened: nothing was cordoned
        assert f.kv.record.restarts_for(ns, "a-w0") == []
        events = (await CoreV1Api(f.api).list_namespaced_event(
            ns, field_selector="involvedObject.name=a-w0,reason=WorkerDrainBlocked")).items
        assert events and "ghost-kubeconfig" in events[0].message and "ClusterUnreachable" in events[0].message
        assert metric(app, "licensectl_worker_drain_blocked",
                      {"namespace": ns, "vm": "a-w0", "reason": "ClusterUnreachable"}) == 1.0
        # Held, the worker is tried again once per hold (3 retry intervals: 3 s here), not on every pass.
        versions = set()
        for _ in range(30):
            vm = await CustomObjectsApi(f.api).get_namespaced_custom_object(
                "kubevirt.io", "v1", ns, "virtualmachines", "a-w0")
            versions.add(vm["metadata"]["resourceVersion"])
            assert drain.ANN_DRAIN_HELD in (vm["metadata"].get("annotations") or {})
            await asyncio.sleep(0.1)
        assert len(versions) <= 3, f"{len(versions)} writes of the held worker in 3 s"

        # The hoster opts the cluster in: restarted without a drain once the hold has passed.
        await create_capi(f.api, ns, "clusters", "ghost",
                          {"metadata": {"annotations": {drain.ANN_RESTART_WITHOUT_DRAIN: "true"}}})

        async def worker_done() -> bool:
            a = await f.annotations(ns, "a-w0")
            return (a.get(ANN_RESTART_REVISION) == revision and a.get(ANN_RESTART_RESULT) == "done"
                    and drain.ANN_DRAIN_HELD not in a and drain.ANN_DRAIN_STEP not in a)

        await eventually(worker_done, timeout=60, what="the opted-in worker restarted and its hold cleared")
        assert len(f.kv.record.restarts_for(ns, "a-w0")) == 1
        await eventually(lambda: metric(app, "licensectl_worker_drain_blocked", {"vm": "a-w0"}) is None,
                         what="the blocked series gone")


@contextlib.asynccontextmanager
async def sampling(api: ApiClient, node: str) -> AsyncIterator[list[bool]]:
    """Whether `node` was unschedulable, sampled every 0.1 s while the block runs."""
    seen: list[bool] = []
    stop = asyncio.Event()

    async def loop() -> None:
        while not stop.is_set():
            n = await CoreV1Api(api).read_node(node)
            seen.append(bool(n.spec.unschedulable))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    task = asyncio.create_task(loop())
    try:
        yield seen
    finally:
        stop.set()
        await task


async def test_a_machine_excluded_from_draining_is_restarted_without_a_cordon(
        rig: Fleet, tenant_cluster_factory: TenantClusterFactory) -> None:
    f = rig
    ns = f.tenants[0]
    t = await tenant_cluster_factory(ns, "kx", kubevirt=f.kv, fresh=True)
    machine = await create_capi(f.api, ns, "machines", "kx-md-0-m", {
        "metadata": {"annotations": {drain.ANN_EXCLUDE_NODE_DRAINING: ""}}, "spec": {"clusterName": "kx"}})
    # The owner's real UID: with any other, the garbage collector deletes the KubevirtMachine as an orphan.
    await create_capi(f.api, ns, "kubevirtmachines", "kx-md-0", {"metadata": {"ownerReferences": [
        {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": "kx-md-0-m",
         "uid": machine["metadata"]["uid"], "controller": True}]}})
    async with running_app(f.settings()):
        await f.boot([(ns, "kx-md-0", worker("kx"))])
        await eventually(lambda: _node_ready(t.api, "kx-md-0"), timeout=60, what="the worker's Node Ready")
        async with sampling(t.api, "kx-md-0") as unschedulable:
            revision = await f.rotate_and_wait()

            async def done() -> bool:
                a = await f.annotations(ns, "kx-md-0")
                return (a.get(ANN_RESTART_REVISION) == revision and a.get(ANN_RESTART_RESULT) == "done"
                        and drain.ANN_DRAIN_STEP not in a)

            await eventually(done, timeout=60, what="the excluded worker restarted and its cycle closed")
    assert len(f.kv.record.restarts_for(ns, "kx-md-0")) == 1
    assert unschedulable and not any(unschedulable), "an excluded Machine's Node is never cordoned"
    assert len(t.agent.record.boot_ids["kx-md-0"]) == 2  # it did reboot


async def test_unreadable_drain_annotations_undo_our_cordon_and_block_without_a_restart(
        rig: Fleet, tenant_cluster_factory: TenantClusterFactory) -> None:
    f = rig
    ns = f.tenants[0]
    t = await tenant_cluster_factory(ns, "ku", kubevirt=f.kv, fresh=True)
    async with running_app(f.settings()) as app:
        await f.boot([(ns, "ku-md-0", worker("ku"))])
        await eventually(lambda: _node_ready(t.api, "ku-md-0"), timeout=60, what="the worker's Node Ready")
        # What a crash plus a bad hand edit could leave: the Node cordoned under this VM's marker, and a
        # drain record no one can read.
        await CoreV1Api(t.api).patch_node("ku-md-0", {"metadata": {"annotations": {
            drain.ANN_CORDONED_BY: f"{ns}/ku-md-0"}}, "spec": {"unschedulable": True}})
        await CustomObjectsApi(f.api).patch_namespaced_custom_object(
            "kubevirt.io", "v1", ns, "virtualmachines", "ku-md-0",
            {"metadata": {"annotations": {drain.ANN_DRAIN_STEP: "sideways", drain.ANN_DRAIN_REVISION: "x"}}},
            _content_type="application/merge-patch+json")
        await f.rotate_and_wait()

        async def blocked() -> bool:
            a = await f.annotations(ns, "ku-md-0")
            return (a.get(drain.ANN_DRAIN_STEP) == drain.Step.BLOCKED
                    and a.get(drain.ANN_DRAIN_REASON) == drain.BlockReason.INTENT_UNREADABLE)

        await eventually(blocked, timeout=60, what="the unreadable record replaced by a block")
        node = await CoreV1Api(t.api).read_node("ku-md-0")
        assert not node.spec.unschedulable
        assert drain.ANN_CORDONED_BY not in (node.metadata.annotations or {})
        await asyncio.sleep(3)  # more passes: the blocked worker is still not restarted
        assert f.kv.record.restarts_for(ns, "ku-md-0") == []
        assert metric(app, "licensectl_worker_drain_blocked",
                      {"namespace": ns, "vm": "ku-md-0", "reason": "IntentUnreadable"}) == 1.0


async def _node_ready(api: ApiClient, name: str) -> bool:
    try:
        n = await CoreV1Api(api).read_node(name)
    except Exception:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])


async def test_a_node_cordoned_by_someone_else_spends_the_budget_and_the_next_worker_waits_named(
        rig: Fleet, tenant_cluster_factory: TenantClusterFactory) -> None:
    """Cluster API's MachineDeployment maxUnavailable counts a Machine unavailable whatever the cause: a Node
    cordoned by the tenant holds the cluster's one slot, so the other worker waits with a named hold."""
    f = rig
    ns = f.tenants[0]
    t = await tenant_cluster_factory(ns, "kc", kubevirt=f.kv, fresh=True)
    async with running_app(f.settings()) as app:
        await f.boot([(ns, "kc-md-0", worker("kc")), (ns, "kc-md-1", worker("kc"))])
        for name in ("kc-md-0", "kc-md-1"):
            await eventually(lambda name=name: _node_ready(t.api, name), timeout=60, what=f"{name}'s Node Ready")
        await CoreV1Api(t.api).patch_node("kc-md-1", {"spec": {"unschedulable": True}})  # the tenant's cordon
        revision = await f.rotate_and_wait()

        async def held() -> bool:
            return (await f.annotations(ns, "kc-md-0")).get(drain.ANN_DRAIN_HELD) == drain.BlockReason.BUDGET_SPENT

        await eventually(held, timeout=60, what="kc-md-0 held: its cluster's budget is spent")
        assert drain.ANN_DRAIN_STEP not in await f.annotations(ns, "kc-md-0")  # no cycle opened
        assert f.kv.record.restarts_for(ns, "kc-md-0") == []
        assert not (await CoreV1Api(t.api).read_node("kc-md-0")).spec.unschedulable
        events = (await CoreV1Api(f.api).list_namespaced_event(
            ns, field_selector="involvedObject.name=kc-md-0,reason=WorkerDrainBlocked")).items
        assert events and "DisruptionBudgetSpent" in events[0].message
        assert metric(app, "licensectl_worker_drain_blocked",
                      {"namespace": ns, "vm": "kc-md-0", "reason": "DisruptionBudgetSpent"}) == 1.0

        # The tenant lifts its cordon: kc-md-0 goes through its cycle once its hold has passed.
        await CoreV1Api(t.api).patch_node("kc-md-1", {"spec": {"unschedulable": False}})

        async def done() -> bool:
            a = await f.annotations(ns, "kc-md-0")
            return (a.get(ANN_RESTART_REVISION) == revision and a.get(ANN_RESTART_RESULT) == "done"
                    and drain.ANN_DRAIN_STEP not in a and drain.ANN_DRAIN_HELD not in a)

        await eventually(done, timeout=90, what="kc-md-0 drained and restarted after the cordon was lifted")
        assert len(f.kv.record.restarts_for(ns, "kc-md-0")) == 1


def _kubeconfig_data(cluster: dict[str, Any]) -> dict[str, str]:
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
           "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
           "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443", **cluster}}],
           "users": [{"name": "u", "user": {"token": "t0ken"}}]}
    return {"value": base64.b64encode(yaml.safe_dump(doc).encode()).decode()}


@pytest.mark.parametrize(("secret_data", "field"), [
    ({"kubeconfig": "eA=="}, "key 'value' is missing"),
    (_kubeconfig_data({"server": "https://127.0.0.1:99999"}), "server"),
    (_kubeconfig_data({"tls-server-name": 42}), "tls-server-name"),
    (_kubeconfig_data({"proxy-url": "not a url"}), "proxy-url"),
])
async def test_a_malformed_kubeconfig_is_a_named_hold_and_the_plain_vm_beside_it_restarts(
        rig: Fleet, secret_data: dict[str, str], field: str) -> None:
    f = rig
    ns = f.tenants[0]
    await put_secret(f.api, {"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
                             "metadata": {"name": "kbad-kubeconfig", "namespace": ns}, "data": secret_data})
    # One namespace, one restart at a time, the worker sorting first: the plain VM restarts only if the
    # held worker leaves the slot free.
    async with running_app(f.settings()) as app:
        await f.boot([(ns, "a-kbad", worker("kbad")), (ns, "b-plain", None)])
        revision = await f.rotate_and_wait()

        async def held() -> bool:
            ann = await f.annotations(ns, "a-kbad")
            return ann.get(drain.ANN_DRAIN_HELD) == drain.BlockReason.CLUSTER_UNREACHABLE

        await eventually(held, timeout=60, what="the worker held: its kubeconfig cannot be used")

        async def named() -> bool:  # the Event follows the hold's record (written first, for a new leader)
            events = (await CoreV1Api(f.api).list_namespaced_event(
                ns, field_selector="involvedObject.name=a-kbad,reason=WorkerDrainBlocked")).items
            return any(f"Secret {ns}/kbad-kubeconfig: {field}" in e.message for e in events)

        await eventually(named, timeout=10, what=f"a WorkerDrainBlocked Event naming the Secret and {field}")
        assert metric(app, "licensectl_worker_drain_blocked",
                      {"namespace": ns, "vm": "a-kbad", "reason": "ClusterUnreachable"}) == 1.0

        async def plain_done() -> bool:
            ann = await f.annotations(ns, "b-plain")
            return ann.get(ANN_RESTART_REVISION) == revision and ann.get(ANN_RESTART_RESULT) == "done"

        await eventually(plain_done, timeout=60, what="the plain VM restarted beside the held worker")
        assert f.kv.record.restarts_for(ns, "a-kbad") == []
