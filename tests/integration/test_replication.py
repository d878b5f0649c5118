"""Replication against the real apiserver: entitlement matrix, drift, conflicts, restarts, faults."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from licensectl.core.model import (
    ANN_ACCEPT_LICENSE_CHANGE,
    ANN_CLASS_LICENSE,
    ANN_CREDENTIAL_KEY,
    ANN_REVISION,
    ANN_REVISION_TIME,
    KEY_GRIDD_CONF,
    KEY_REPORT_CREDENTIAL,
    KEY_TOKEN,
    REVISION_STORE_LABEL,
)
from licensectl.core.render import replica_name
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.controlplane import ControlPlane
from licensectl_dev.testkit.process import run_licensectl

from .support import (
    World,
    events_for,
    eventually,
    make_world,
    metric,
    read_secret,
    running_app,
    secret_bytes,
    unique,
    wait_event,
    world_settings,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


@dataclass
class Env(World):
    kubeconfig: Path = Path()

    def settings(self, **kw: Any) -> Any:
        return world_settings(self, self.kubeconfig, **kw)

    async def claimed(self, n: int) -> list[str]:
        """`n` vGPU tenants under the root, each with a GPUClaim of the class."""
        return [(await self.tenant(claim=True))["metadata"]["name"] for _ in range(n)]


@pytest_asyncio.fixture(loop_scope="session")
async def env(api_client: ApiClient, kubeconfig_path: Path, namespace_factory: Any, cleanup: Any
              ) -> AsyncIterator[Env]:
    w = await make_world(api_client, namespace_factory, cleanup, gridd_conf="# hoster\nFeatureType=4\n")
    yield Env(**vars(w), kubeconfig=kubeconfig_path)


async def replica(env: Env, ns: str, cls: str | None = None) -> Any:
    return await read_secret(env.api, ns, replica_name(cls or env.cls))


async def test_entitlement_matrix_and_middle_revocation(env: Env) -> None:
    a = await env.tenant(env.root, vgpu=True)
    b = await env.tenant(a, vgpu=False)
    c = await env.tenant(b, vgpu=True)
    d = await env.tenant(a, vgpu=None)
    for t in (a, b, c, d):
        await fleet.create_claim(env.api, t["metadata"]["name"], "gpu", class_name=env.cls)
    a_ns, b_ns, c_ns, d_ns = (t["metadata"]["name"] for t in (a, b, c, d))

    async with running_app(env.settings()) as app:
        got = await eventually(lambda: replica(env, a_ns), what="replica in the entitled child")
        assert secret_bytes(got, KEY_TOKEN) == env.token
        conf = secret_bytes(got, KEY_GRIDD_CONF).decode()
        assert "FeatureType=1" in conf and "FeatureType=4" not in conf and "# hoster" in conf
        assert secret_bytes(got, KEY_REPORT_CREDENTIAL)  # filled from the signing key
        await eventually(lambda: metric(app, "licensectl_entitled_namespaces",
                                        {"source_namespace": env.source_ns}) == 1.0, what="entitled metric")
        # b withholds the flag: neither b nor its flagged child c nor the unflagged d are entitled.
        for ns in (b_ns, c_ns, d_ns):
            assert await replica(env, ns) is None

        # Granting on b entitles b and c (c has its own flag); d stays out.
        await fleet.set_vgpu(env.api, b_ns, True)
        await eventually(lambda: replica(env, c_ns), what="replica in grandchild after grant")
        assert await replica(env, b_ns) is not None
        assert await replica(env, d_ns) is None

        # Revoking on the middle tenant a removes every copy below it.
        await fleet.set_vgpu(env.api, a_ns, False)

        async def all_gone() -> bool:
            return all([await replica(env, ns) is None for ns in (a_ns, b_ns, c_ns)])

        await eventually(all_gone, what="copies removed below the revoked tenant")

        async def deleted_event() -> bool:
            return any(e.reason == "ReplicaDeleted" for e in await events_for(env.api, a_ns, a_ns))

        await eventually(deleted_event, what="ReplicaDeleted event on the namespace")


async def test_claim_added_removed_and_class_switched(env: Env) -> None:
    t = await env.tenant(env.root, vgpu=True)
    ns = t["metadata"]["name"]
    pt = unique("pt")
    await fleet.create_gpu_class(env.api, pt, mode="passthrough", feature_type=2)
    try:
        async with running_app(env.settings()):
            await fleet.create_claim(env.api, ns, "g1", class_name=env.cls)
            await eventually(lambda: replica(env, ns), what="replica after claim added")
            await fleet.delete_claim(env.api, ns, "g1")

            async def gone() -> bool:
                return await replica(env, ns) is None

            await eventually(gone, what="replica removed with the claim")
            # A passthrough class is never replicated.
            await fleet.create_claim(env.api, ns, "g2", class_name=pt)
            await fleet.create_claim(env.api, ns, "g3", class_name=env.cls)
            await eventually(lambda: replica(env, ns), what="replica for the vgpu claim")
            assert await read_secret(env.api, ns, replica_name(pt)) is None
    finally:
        await fleet.delete_gpu_class(env.api, pt)


async def test_two_classes_two_sources_in_one_namespace(env: Env) -> None:
    t = await env.tenant(env.root, vgpu=True)
    ns = t["metadata"]["name"]
    vcs = unique("vcs")
    other_token = fleet.fake_token(int(time.time()) + 86400 * 30, extra={"product": "vcs"})
    await fleet.put_source_secret(env.api, env.source_ns, "nls-compute", token=other_token)
    await fleet.create_gpu_class(env.api, vcs, mode="vgpu", secret=(env.source_ns, "nls-compute"), feature_type=4)
    try:
        await fleet.create_claim(env.api, ns, "a", class_name=env.cls)
        await fleet.create_claim(env.api, ns, "b", class_name=vcs)
        async with running_app(env.settings()):
            r1 = await eventually(lambda: replica(env, ns), what="graphics replica")
            r2 = await eventually(lambda: replica(env, ns, vcs), what="compute replica")
            assert secret_bytes(r1, KEY_TOKEN) == env.token
            assert secret_bytes(r2, KEY_TOKEN) == other_token
            assert "FeatureType=4" in secret_bytes(r2, KEY_GRIDD_CONF).decode()
            assert r1.metadata.annotations[ANN_REVISION] != r2.metadata.annotations[ANN_REVISION]
    finally:
        await fleet.delete_gpu_class(env.api, vcs)


async def test_drift_reverted_deleted_replica_recreated_and_foreign_secret_untouched(env: Env) -> None:
    t1 = await env.tenant(env.root, vgpu=True)
    t2 = await env.tenant(env.root, vgpu=True)
    ns1, ns2 = t1["metadata"]["name"], t2["metadata"]["name"]
    core = CoreV1Api(env.api)
    # A foreign Secret already holds the replica's name in ns2.
    await core.create_namespaced_secret(ns2, {"metadata": {"name": replica_name(env.cls)},
                                              "stringData": {"mine": "tenant data"}})
    foreign = await read_secret(env.api, ns2, replica_name(env.cls))
    for ns in (ns1, ns2):
        await fleet.create_claim(env.api, ns, "gpu", class_name=env.cls)
    async with running_app(env.settings()) as app:
        good = await eventually(lambda: replica(env, ns1), what="replica")
        # A tenant edits the token: reverted.
        await core.patch_namespaced_secret(replica_name(env.cls), ns1, {"stringData": {KEY_TOKEN: "tampered"}})

        async def reverted() -> bool:
            s = await replica(env, ns1)
            return s is not None and secret_bytes(s, KEY_TOKEN) == env.token and \
                s.metadata.resource_version != good.metadata.resource_version

        await eventually(reverted, what="drift reverted")
        # Deleted by hand: recreated.
        await core.delete_namespaced_secret(replica_name(env.cls), ns1)
        await eventually(lambda: replica(env, ns1), what="replica recreated")
        # Foreign Secret: conflict reported, never modified.
        await eventually(lambda: metric(app, "licensectl_replicas", {"state": "conflict"}) == 1.0,
                         what="conflict metric")
        after = await read_secret(env.api, ns2, replica_name(env.cls))
        assert after.metadata.resource_version == foreign.metadata.resource_version
        assert after.data == foreign.data
        evs = await wait_event(env.api, ns2, replica_name(env.cls), "ReplicaConflict")
        assert any(e.reason == "ReplicaConflict" and e.type == "Warning" for e in evs)


async def test_source_deleted_keeps_replicas_and_reports(env: Env) -> None:
    [ns] = await env.claimed(1)
    async with running_app(env.settings()) as app:
        before = await eventually(lambda: replica(env, ns), what="replica")
        await CoreV1Api(env.api).delete_namespaced_secret("nls-token", env.source_ns)
        await eventually(lambda: metric(app, "licensectl_source_problem",
                                        {"class": env.cls, "reason": "source_missing"}) == 1.0,
                         what="source problem metric")
        assert metric(app, "licensectl_source_valid", {"class": env.cls}) == 0.0
        kept = await replica(env, ns)
        assert kept is not None and kept.metadata.resource_version == before.metadata.resource_version
        await wait_event(env.api, env.source_ns, "nls-token", "LicenseSourceInvalid")


async def test_invalid_feature_type_and_empty_token_keep_replicas(env: Env) -> None:
    [ns] = await env.claimed(1)
    async with running_app(env.settings()) as app:
        before = await eventually(lambda: replica(env, ns), what="replica")
        await fleet.put_source_secret(env.api, env.source_ns, "nls-token", token=b"   ")
        await eventually(lambda: metric(app, "licensectl_source_problem",
                                        {"class": env.cls, "reason": "token_empty"}) == 1.0, what="empty token")
        kept = await replica(env, ns)
        assert kept.metadata.resource_version == before.metadata.resource_version


async def test_restart_converges_with_zero_writes(env: Env) -> None:
    namespaces = await env.claimed(5)
    async with running_app(env.settings()):
        async def all_there() -> list[Any] | None:
            got = [await replica(env, ns) for ns in namespaces]
            return got if all(got) else None

        first = await eventually(all_there, what="all replicas")
    async with running_app(env.settings()) as app2:
        await eventually(lambda: app2.replication.status.plan is not None, what="second controller pass")
        await app2.replication.reconcile()
        writes = sum(s.value for fam in app2.metrics.registry.collect() for s in fam.samples
                     if s.name == "licensectl_replica_writes_total")
        assert writes == 0
        again = [await replica(env, ns) for ns in namespaces]
        assert [s.metadata.resource_version for s in again] == [s.metadata.resource_version for s in first]
        assert [s.metadata.annotations[ANN_REVISION_TIME] for s in again] == \
            [s.metadata.annotations[ANN_REVISION_TIME] for s in first]


async def test_rotation_updates_every_replica(env: Env) -> None:
    namespaces = await env.claimed(3)
    async with running_app(env.settings()):
        for ns in namespaces:
            await eventually(lambda ns=ns: replica(env, ns), what="replica")
        new = fleet.fake_token(int(time.time()) + 86400 * 365, extra={"rotation": 2})
        await fleet.put_source_secret(env.api, env.source_ns, "nls-token", token=new)

        async def rotated() -> bool:
            got = [await replica(env, ns) for ns in namespaces]
            return all(g is not None and secret_bytes(g, KEY_TOKEN) == new for g in got)

        await eventually(rotated, what="all replicas rotated")
        # One summarising Event on the source, none on each replica (one write per replica change).
        evs = await wait_event(env.api, env.source_ns, "nls-token", "LicenseRotated")
        assert any(f"written to {len(namespaces)} replicas" in e.message for e in evs
                   if e.reason == "LicenseRotated"), [e.message for e in evs]
        assert [e.reason for e in await events_for(env.api, namespaces[0], replica_name(env.cls))] == []


async def test_apiserver_restart_mid_sync_converges_without_deletions(env: Env, control_plane: ControlPlane
                                                                       ) -> None:
    namespaces = await env.claimed(4)
    async with running_app(env.settings()) as app:
        async def all_four() -> list[Any] | None:
            got = [await replica(env, ns) for ns in namespaces]
            return got if all(got) else None

        before = {s.metadata.namespace: s.metadata.uid for s in await eventually(all_four, what="replicas")}
        control_plane.restart_apiserver()
        # New entitlement while the watches reconnect.
        t = await env.tenant(env.root, vgpu=True)
        namespaces.append(t["metadata"]["name"])
        await fleet.create_claim(env.api, namespaces[-1], "gpu", class_name=env.cls)

        async def all_there() -> bool:
            return all([await replica(env, ns) is not None for ns in namespaces])

        await eventually(all_there, timeout=60, what="convergence after apiserver restart")
        # None of this test's replicas was deleted and recreated across the outage.
        after = {ns: (await replica(env, ns)).metadata.uid for ns in before}
        assert after == before
        assert app.ready()


async def test_signing_key_rotation_rewrites_credentials_without_a_new_revision(env: Env) -> None:
    [ns] = await env.claimed(1)
    async with running_app(env.settings()) as app:
        before = await eventually(lambda: replica(env, ns), what="replica")
        old_cred = secret_bytes(before, KEY_REPORT_CREDENTIAL).decode()
        r = await run_licensectl("keys", "rotate", "--namespace", env.controller_ns, kubeconfig=env.kubeconfig)
        assert r.code == 0, r.err
        assert old_cred not in r.out + r.err

        async def rewritten() -> Any:
            s = await replica(env, ns)
            return s if secret_bytes(s, KEY_REPORT_CREDENTIAL).decode() != old_cred else None

        after = await eventually(rewritten, what="credential rewritten with the new key")
        # Same license content: same revision and revision time, so no VM restart is due.
        for ann in (ANN_REVISION, ANN_REVISION_TIME):
            assert after.metadata.annotations[ann] == before.metadata.annotations[ann]
        ring = app.keys.keyring
        assert ring is not None and ring.previous is not None
        # The replica names the key its credential comes from (docs/design.md#key-ring); the webhook stamps it.
        assert after.metadata.annotations[ANN_CREDENTIAL_KEY] == ring.current_id
        assert before.metadata.annotations[ANN_CREDENTIAL_KEY] == ring.older[0].id
        assert ring.verify(ns, old_cred), "guests keep reporting with the previous credential"


async def test_dry_run_writes_nothing(env: Env) -> None:
    [ns] = await env.claimed(1)
    async with running_app(env.settings(dry_run=True)) as app:
        await eventually(lambda: app.replication.status.plan is not None, what="a planning pass")
        await eventually(lambda: (ns, replica_name(env.cls)) in app.replication.status.plan.states,
                         what="the namespace planned")
        assert app.replication.status.plan.states[(ns, replica_name(env.cls))] == "missing"
        # It plans the write it would make (the live content as the first, stable revision) ...
        await eventually(lambda: [d.namespace for d in app.replication.status.plan.creates] == [ns],
                         what="the create it would make planned")
        await asyncio.sleep(1)
        assert await replica(env, ns) is None
        # ... and keeps no revision store either (docs/design.md#safe-rotation).
        stores = await CoreV1Api(env.api).list_namespaced_secret(
            env.controller_ns, label_selector=f"{REVISION_STORE_LABEL}=true")
        assert stores.items == []


async def patch_class(env: Env, patch: dict[str, Any]) -> None:
    """A merge patch of the world's GPUClass, as `kubectl patch` / `kubectl annotate` send it."""
    await CustomObjectsApi(env.api).patch_cluster_custom_object(
        fleet.GPU_GROUP, fleet.GPU_VERSION, "gpuclasses", env.cls, patch,
        _content_type="application/merge-patch+json")


async def test_a_class_edited_in_place_holds_its_replicas_until_the_hoster_accepts(env: Env) -> None:
    """Without the admission policy an in-place edit reaches licensectl: it holds every replica of the
    class (no write, so no VM restart) and says so, until the class's accept annotation names the change."""
    namespaces = await env.claimed(2)
    old, new = f"{env.source_ns}/{env.source_name}:1", f"{env.source_ns}/{env.source_name}:4"
    async with running_app(env.settings()) as app:
        async def all_written() -> dict[str, Any] | None:
            got = {ns: await replica(env, ns) for ns in namespaces}
            return got if all(got.values()) else None

        before = await eventually(all_written, what="replicas")
        assert {r.metadata.annotations[ANN_CLASS_LICENSE] for r in before.values()} == {old}

        await patch_class(env, {"spec": {"license": {"featureType": 4}}})
        await eventually(lambda: metric(app, "licensectl_class_license_changed", {"class": env.cls}) == 1.0,
                         what="class_license_changed metric")
        assert metric(app, "licensectl_replicas", {"state": "held"}) == float(len(namespaces))
        evs = await wait_event(env.api, "default", env.cls, "GPUClassLicenseChanged")
        [ev] = [e for e in evs if e.reason == "GPUClassLicenseChanged"]
        assert ev.type == "Warning" and ev.involved_object.kind == "GPUClass"
        assert f"from {old} to {new}" in ev.message and f"{ANN_ACCEPT_LICENSE_CHANGE}={new}" in ev.message
        await app.replication.reconcile()  # one more full pass: still nothing written
        after = {ns: await replica(env, ns) for ns in namespaces}
        assert {ns: r.metadata.resource_version for ns, r in after.items()} == \
            {ns: r.metadata.resource_version for ns, r in before.items()}
        assert all("FeatureType=1" in secret_bytes(r, KEY_GRIDD_CONF).decode() for r in after.values())

        await patch_class(env, {"metadata": {"annotations": {ANN_ACCEPT_LICENSE_CHANGE: new}}})

        async def updated() -> bool:
            got = [await replica(env, ns) for ns in namespaces]
            return all(r is not None and "FeatureType=4" in secret_bytes(r, KEY_GRIDD_CONF).decode()
                       and r.metadata.annotations.get(ANN_CLASS_LICENSE) == new for r in got)

        await eventually(updated, what="replicas updated after the acceptance")
        rotated = {ns: await replica(env, ns) for ns in namespaces}
        assert all(rotated[ns].metadata.annotations[ANN_REVISION] != before[ns].metadata.annotations[ANN_REVISION]
                   for ns in namespaces), "a new revision: the rollout restarts the VMs"
        await eventually(lambda: metric(app, "licensectl_class_license_changed", {"class": env.cls}) == 0.0,
                         what="class_license_changed back to 0")
        assert metric(app, "licensectl_replicas", {"state": "held"}) == 0.0
