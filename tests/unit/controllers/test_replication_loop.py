"""The replication loop (controller.py) against in-memory caches and writer: what it writes, when it
holds back, and what it never touches. The same loop runs against the real apiserver in
tests/integration/test_replication.py."""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import threading
from collections.abc import Awaitable, Callable

import pytest

from licensectl.config import Settings
from licensectl.controllers import replication_loop
from licensectl.controllers.replication_loop import CONFLICT_RECHECK_SECONDS, ReplicationController
from licensectl.core.model import (
    KEY_REPORT_CREDENTIAL,
    KEY_TOKEN,
    GpuClaim,
    GpuClass,
    Namespace,
    ObjectRef,
    SourceSecret,
)
from licensectl.core.render import replica_name
from licensectl.core.replication import ReplicationInputs, ReplicationPlan, SourceRevisions, plan_replication
from licensectl.core.rotation import RotationRecord
from licensectl.metrics import Metrics
from licensectl_dev.testkit.memory import (
    ManualClock,
    MemoryCaches,
    MemoryCredentials,
    MemoryEvents,
    MemoryReplicaWriter,
)

SRC = ObjectRef("licensectl-system", "vws-token")
VWS = GpuClass("vws", "uid-vws", "vgpu", SRC, 1)
ROOT = "tenant-root"
PREFIX = "tenant.cozystack.io/"
VGPU_LABEL = "gpu.cozystack.io/vgpu"
TOKEN = b"fake-token-one\n"
REPLICA = replica_name("vws")


def tenant(name: str, *, flag: bool = True) -> Namespace:
    """A Cozystack tenant namespace directly under the root (the root itself when name == ROOT)."""
    labels = {PREFIX + ROOT: "", VGPU_LABEL: "true" if flag else "false"}
    if name != ROOT:
        labels[PREFIX + name] = ""
    parent = None if name == ROOT else ROOT
    return Namespace(name=name, uid=f"uid-{name}", labels=labels, owner_name=parent,
                     owner_uid=f"uid-{parent}" if parent else None)


def source(token: bytes = TOKEN, rv: str = "1") -> SourceSecret:
    return SourceSecret(namespace=SRC.namespace, name=SRC.name, uid="uid-src", resource_version=rv,
                        data={KEY_TOKEN: token})


class World:
    def __init__(self, tenants: list[str], **settings: object) -> None:
        self.clock = ManualClock()
        self.caches = MemoryCaches(with_kubevirt=False)
        self.caches.namespaces.put(tenant(ROOT), *(tenant(t) for t in tenants))
        self.caches.classes.put(VWS)
        self.caches.claims.put(*(GpuClaim(t, "gpu", "vws") for t in [ROOT, *tenants]))
        self.caches.source_secrets[SRC] = source()
        self.writer = MemoryReplicaWriter(self.caches)
        self.events = MemoryEvents()
        self.metrics = Metrics()
        self.loop = ReplicationController(
            caches=self.caches, writer=self.writer, events=self.events, metrics=self.metrics,
            settings=Settings(**settings),  # type: ignore[arg-type]
            credentials=MemoryCredentials(lambda ns: f"cred-{ns}"), report_url="http://reports.invalid/v1/reports",
            clock=self.clock.now, monotonic=self.clock.monotonic)

    def replicas(self) -> set[str]:
        return {ns for ns, name in self.caches.replicas.cache if name == REPLICA}

    def token_in(self, namespace: str) -> bytes:
        return base64.b64decode(self.writer.secrets[(namespace, REPLICA)]["data"][KEY_TOKEN])

    def writes(self) -> list[tuple[str, str, str]]:
        calls = list(self.writer.calls)
        self.writer.calls.clear()
        return calls


async def test_creates_one_replica_per_entitled_namespace_then_stays_quiet() -> None:
    w = World(["tenant-a", "tenant-b"])
    w.caches.namespaces.put(tenant("tenant-c", flag=False))  # not entitled: no replica
    await w.loop.reconcile()
    assert w.replicas() == {ROOT, "tenant-a", "tenant-b"}
    assert sorted(verb for verb, _, _ in w.writes()) == ["create"] * 3
    assert all(w.token_in(ns) == TOKEN for ns in w.replicas())
    # One write per replica: a routine create is counted, not announced by an Event.
    assert [o for o, *_ in w.events.emitted if o.name == REPLICA] == []
    assert w.metrics.registry.get_sample_value(
        "licensectl_replica_writes_total", {"action": "create", "result": "created"}) == 3
    await w.loop.reconcile()
    assert w.writes() == []  # level-based and idempotent: an in-sync world needs no write


async def test_nothing_is_decided_before_every_core_cache_has_listed() -> None:
    w = World(["tenant-a"])
    w.caches.claims.synced = False
    assert await w.loop.reconcile() is None
    assert w.writes() == [] and w.replicas() == set()


async def test_a_new_token_rotates_every_replica() -> None:
    w = World(["tenant-a", "tenant-b"])
    await w.loop.reconcile()
    w.writes()
    w.events.emitted.clear()
    w.caches.source_secrets[SRC] = source(b"fake-token-two\n", rv="2")
    await w.loop.reconcile()
    assert sorted(w.writes()) == [("update", ns, REPLICA) for ns in sorted([ROOT, "tenant-a", "tenant-b"])]
    assert all(w.token_in(ns) == b"fake-token-two\n" for ns in w.replicas())
    # One summarising Event on the source per rotation, none per replica.
    w.events.emitted = [e for e in w.events.emitted if e[2] != "LicenseTokenUnreadable"]  # the fake token
    assert [(o.namespace, o.name, t, r) for o, t, r, _ in w.events.emitted] == \
        [(SRC.namespace, SRC.name, "Normal", "LicenseRotated")]
    assert "written to 3 replicas" in w.events.emitted[0][3] and "class vws" in w.events.emitted[0][3]
    assert w.metrics.registry.get_sample_value(
        "licensectl_replica_writes_total", {"action": "update", "result": "updated"}) == 3


async def test_a_tenant_editing_its_replica_gets_it_reverted() -> None:
    w = World(["tenant-a"])
    await w.loop.reconcile()
    edited = w.writer.secrets[("tenant-a", REPLICA)]
    edited["data"][KEY_TOKEN] = base64.b64encode(b"tampered").decode()
    w.caches.replicas.put(dataclasses.replace(w.caches.replicas.cache[("tenant-a", REPLICA)], data_digest=b"x"))
    w.writes()
    await w.loop.reconcile()
    assert w.writes() == [("update", "tenant-a", REPLICA)]
    assert w.token_in("tenant-a") == TOKEN
    assert "ReplicaReverted" in w.events.reasons()


def with_rotation_record(w: World) -> None:
    """The replicas carry their source revision, as with the controller's rotation records."""
    w.loop.rotations = lambda: {SRC: SourceRevisions(RotationRecord(stable="s" * 64), stable=source(),
                                                     candidate=None)}


def rewrites(w: World) -> list[tuple[str, str, str]]:
    """(reason, object name, message) of the Events about the replicas' writes since the last call."""
    out = [(r, o.name, m) for o, _t, r, m in w.events.emitted
           if r in {"LicenseRotated", "ReplicaReverted", "CredentialRewritten", "CredentialRevoked"}]
    w.events.emitted.clear()
    return out


async def test_a_new_signing_key_is_a_credential_rewrite_not_a_revert() -> None:
    w = World(["tenant-a", "tenant-b"])
    with_rotation_record(w)
    await w.loop.reconcile()
    w.writes(), rewrites(w)
    for n, key in enumerate(["key-one", "key-two"]):  # the first ring's key, then a rotation
        w.loop.credentials = MemoryCredentials(lambda ns, n=n: f"cred{n}-{ns}", key_id=key)
        await w.loop.reconcile()
        assert len(w.writes()) == 3
        ((reason, obj, message),) = rewrites(w)
        assert (reason, obj) == ("CredentialRewritten", SRC.name)
        assert "class vws rewritten in 3 replicas" in message and "no VM restarts" in message, message
    # A tenant's edit under the same key is still drift, written back and said so.
    w.writer.secrets[("tenant-a", REPLICA)]["data"][KEY_TOKEN] = base64.b64encode(b"tampered").decode()
    w.caches.replicas.put(dataclasses.replace(w.caches.replicas.cache[("tenant-a", REPLICA)], data_digest=b"x"))
    await w.loop.reconcile()
    assert [(r, o) for r, o, _ in rewrites(w)] == [("ReplicaReverted", REPLICA)]


async def test_a_key_revocation_is_not_a_license_rotation() -> None:
    w = World(["tenant-a", "tenant-b"])
    with_rotation_record(w)
    w.loop.credentials = MemoryCredentials(lambda ns: f"cred-{ns}", key_id="key-one")
    await w.loop.reconcile()
    w.writes(), rewrites(w)
    w.loop.credentials = MemoryCredentials(lambda ns: f"new-{ns}", key_id="key-two", epoch="key-two")
    await w.loop.reconcile()
    assert len(w.writes()) == 3
    ((reason, obj, message),) = rewrites(w)
    assert (reason, obj) == ("CredentialRevoked", SRC.name), message
    assert message.startswith("Replica revision ") and "signing-key revocation" in message, message
    assert "the license did not change" in message, message
    # Decided from the diff alone: a new leader (nothing in memory) that finds the next key to write says the same.
    w.loop = ReplicationController(
        caches=w.caches, writer=w.writer, events=w.events, metrics=w.metrics, settings=Settings(),
        credentials=MemoryCredentials(lambda ns: f"newer-{ns}", key_id="key-three", epoch="key-three"),
        report_url="http://reports.invalid/v1/reports", clock=w.clock.now, monotonic=w.clock.monotonic)
    with_rotation_record(w)
    await w.loop.reconcile()
    assert [r for r, _, _ in rewrites(w)] == ["CredentialRevoked"]
    # A new token afterwards is a rotation again, named by its source revision.
    w.writes()
    w.loop.rotations = lambda: {SRC: SourceRevisions(RotationRecord(stable="t" * 64), stable=source(b"two\n"),
                                                     candidate=None)}
    await w.loop.reconcile()
    ((reason, obj, message),) = rewrites(w)
    assert reason == "LicenseRotated" and message.startswith("Source revision tttttttttttt"), message


async def test_deletions_wait_until_every_core_cache_is_healthy() -> None:
    w = World(["tenant-a", "tenant-b"])
    await w.loop.reconcile()
    w.writes()
    w.caches.namespaces.put(tenant("tenant-b", flag=False))  # entitlement revoked
    w.caches.claims.healthy = False  # e.g. its watch is down: the picture may be incomplete
    await w.loop.reconcile()
    assert w.writes() == []
    assert w.loop.status.deferred_deletions == 1
    assert "tenant-b" in w.replicas()
    w.caches.claims.healthy = True
    await w.loop.reconcile()
    assert w.writes() == [("delete", "tenant-b", REPLICA)]
    assert w.replicas() == {ROOT, "tenant-a"}
    assert w.loop.status.deferred_deletions == 0
    assert "ReplicaDeleted" in w.events.reasons()


async def test_deletions_never_exceed_the_cap_per_minute() -> None:
    tenants = [f"tenant-t{i}" for i in range(5)]
    w = World(tenants, deletions_per_minute=2)
    await w.loop.reconcile()
    assert len(w.replicas()) == 6
    w.writes()
    for t in tenants:
        w.caches.claims.remove((t, "gpu"))
    deleted: list[int] = []
    for _ in range(3):
        await w.loop.reconcile()
        deleted.append(sum(1 for verb, _, _ in w.writes() if verb == "delete"))
        if w.loop.retry_after is not None:
            assert 1.0 <= w.loop.retry_after <= 60.0
        w.clock.advance(20.0)  # three passes within one minute
    assert deleted == [2, 0, 0]
    assert w.loop.status.deferred_deletions == 3
    assert "DeletionCapHit" in w.events.reasons()
    w.clock.advance(1.0)  # 61 s after the first deletions: the window admits two more
    await w.loop.reconcile()
    assert sum(1 for verb, _, _ in w.writes() if verb == "delete") == 2
    w.clock.advance(61.0)
    await w.loop.reconcile()
    assert w.replicas() == {ROOT}


async def test_a_foreign_secret_under_the_replica_name_is_never_touched() -> None:
    w = World(["tenant-a", "tenant-b"])
    w.writer.put_foreign("tenant-a", REPLICA)
    before = copy.deepcopy(w.writer.secrets[("tenant-a", REPLICA)])
    await w.loop.reconcile()
    assert w.writer.secrets[("tenant-a", REPLICA)] == before
    assert "tenant-a" not in w.replicas()
    assert w.loop.status.conflicts.keys() == {("tenant-a", REPLICA)}
    assert "ReplicaConflict" in w.events.reasons()
    w.writes()
    # Within the recheck interval the name is not tried again; a pass after it tries once more.
    plan = await w.loop.reconcile()
    assert w.writes() == []
    assert plan is not None and plan.states[("tenant-a", REPLICA)] == "conflict"
    w.clock.advance(CONFLICT_RECHECK_SECONDS + 1)
    await w.loop.reconcile()
    assert w.writes() == [("create", "tenant-a", REPLICA)]
    assert w.writer.secrets[("tenant-a", REPLICA)] == before
    # Nor is it ever deleted when the tenant loses its entitlement.
    w.caches.namespaces.put(tenant("tenant-a", flag=False))
    w.clock.advance(CONFLICT_RECHECK_SECONDS + 1)
    await w.loop.reconcile()
    assert [c for c in w.writes() if c[1] == "tenant-a"] == []
    assert w.writer.secrets[("tenant-a", REPLICA)] == before


async def test_once_the_tenant_removes_its_secret_the_replica_appears() -> None:
    w = World(["tenant-a"])
    w.writer.put_foreign("tenant-a", REPLICA)
    await w.loop.reconcile()
    del w.writer.secrets[("tenant-a", REPLICA)]
    w.clock.advance(CONFLICT_RECHECK_SECONDS + 1)
    await w.loop.reconcile()
    assert "tenant-a" in w.replicas() and w.token_in("tenant-a") == TOKEN
    assert w.loop.status.conflicts == {}


async def test_a_standby_plans_but_never_writes() -> None:
    w = World(["tenant-a"])
    plan = await w.loop.reconcile(leader=False)
    assert plan is not None and len(plan.creates) == 2
    assert w.writes() == [] and w.events.emitted == []


async def test_one_failing_write_does_not_stop_the_others() -> None:
    w = World(["tenant-a", "tenant-b"])
    w.writer.failing.add(("tenant-a", REPLICA))
    await w.loop.reconcile()
    assert w.replicas() == {ROOT, "tenant-b"}
    errors = w.metrics.registry.get_sample_value("licensectl_replica_writes_total",
                                                 {"action": "write", "result": "error"})
    assert errors == 1.0
    w.writer.failing.clear()
    await w.loop.reconcile()  # the next pass retries
    assert w.replicas() == {ROOT, "tenant-a", "tenant-b"}


# -- GPU class checks: a changed class holds its replicas, a FeatureType that cannot license its profile --
def gauges(w: World, name: str) -> dict[str, float]:
    return {dict(s.labels).get("class", dict(s.labels).get("state", "")): s.value
            for s in w.loop.samples() if s.name == name}


async def test_a_class_edited_in_place_holds_its_replicas_until_the_hoster_accepts() -> None:
    w = World(["tenant-a", "tenant-b"])
    await w.loop.reconcile()
    w.writes()
    w.caches.classes.put(dataclasses.replace(VWS, feature_type=4))
    await w.loop.reconcile()
    assert w.writes() == []  # no replica written, so no VM restarts
    assert gauges(w, "replicas")["held"] == 3.0
    assert gauges(w, "class_license_changed") == {"vws": 1.0}
    [(obj, type_, message)] = [(o, t, m) for o, t, r, m in w.events.emitted if r == "GPUClassLicenseChanged"]
    assert (obj.kind, obj.name, obj.namespace, type_) == ("GPUClass", "vws", "", "Warning")
    assert "from licensectl-system/vws-token:1 to licensectl-system/vws-token:4" in message
    assert "create a new class" in message
    assert message.endswith("licensectl.io/accept-license-change=licensectl-system/vws-token:4")
    status = w.loop.status_dict()
    assert status["replica_counts"]["held"] == 3
    assert status["classes"]["vws"]["license_change"] == {
        "from": ["licensectl-system/vws-token:1"], "to": "licensectl-system/vws-token:4", "held": 3,
        "accept": "licensectl.io/accept-license-change=licensectl-system/vws-token:4"}
    assert {r["state"] for r in status["replicas"]} == {"held"}

    # The hoster accepts exactly this change: every replica is updated (the rollout restarts the VMs).
    w.caches.classes.put(dataclasses.replace(VWS, feature_type=4,
                                             accept_license_change="licensectl-system/vws-token:4"))
    await w.loop.reconcile()
    assert sorted(w.writes()) == [("update", ns, REPLICA) for ns in sorted([ROOT, "tenant-a", "tenant-b"])]
    conf = base64.b64decode(w.writer.secrets[("tenant-a", REPLICA)]["data"]["gridd.conf"]).decode()
    assert "FeatureType=4" in conf
    assert gauges(w, "class_license_changed") == {"vws": 0.0}
    assert gauges(w, "replicas")["held"] == 0.0 and w.loop.status_dict()["classes"]["vws"]["license_change"] is None


async def test_a_feature_type_that_cannot_license_the_profile_is_written_and_reported() -> None:
    w = World(["tenant-a"])
    w.caches.classes.put(dataclasses.replace(VWS, feature_type=4, profile="NVIDIA L40S-2Q"))
    await w.loop.reconcile()
    assert sorted(verb for verb, _, _ in w.writes()) == ["create", "create"]  # the class decides
    assert gauges(w, "class_feature_type_mismatch") == {"vws": 1.0}
    [(obj, message)] = [(o, m) for o, t, r, m in w.events.emitted if r == "FeatureTypeMismatch"]
    assert (obj.kind, obj.name) == ("GPUClass", "vws")
    assert message.startswith("GPUClass vws: profile L40S-2Q is a Q-series vGPU type")
    assert "featureType 4 cannot license it" in message and "Replicas are written as the class says" in message
    check = w.loop.status_dict()["classes"]["vws"]
    assert check["feature_type_check"] == "mismatch" and "L40S-2Q" in check["feature_type_message"]
    # Fixed (here in place, as a new class would be): the gauge drops, no new Event.
    w.caches.classes.put(dataclasses.replace(VWS, feature_type=1, profile="NVIDIA L40S-2Q",
                                             accept_license_change="licensectl-system/vws-token:1"))
    w.events.emitted.clear()
    await w.loop.reconcile()
    assert gauges(w, "class_feature_type_mismatch") == {"vws": 0.0}
    assert "FeatureTypeMismatch" not in w.events.reasons()
    assert w.loop.status_dict()["classes"]["vws"]["feature_type_check"] == "ok"


async def test_a_standby_reports_class_gauges_but_writes_no_event() -> None:
    w = World(["tenant-a"])
    await w.loop.reconcile()
    w.writes()
    w.events.emitted.clear()
    w.caches.classes.put(dataclasses.replace(VWS, feature_type=2, profile="T4-2A"))
    await w.loop.reconcile(leader=False)
    assert w.writes() == [] and w.events.emitted == []
    assert gauges(w, "class_feature_type_mismatch") == {"vws": 1.0}
    assert gauges(w, "class_license_changed") == {"vws": 1.0}


async def test_the_plan_is_made_off_the_loop_with_the_signing_key_of_the_moment_the_pass_began(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Replication plans in its own thread (docs/design.md#plans-off-the-loop): the loop keeps serving
    meanwhile, and a key rotated while the plan runs does not mix into it -- every replica of the pass
    carries the credential of the key the pass gathered; the next pass writes the new one."""
    w = World(["tenant-a", "tenant-b"])
    ring = ["key1"]
    w.loop.credentials.bound = lambda: (lambda ns, key=ring[0]: f"{key}-{ns}")  # type: ignore[method-assign]
    loop_thread = threading.get_ident()
    loop_ran = threading.Event()
    planned_in: list[int] = []
    real_plan = plan_replication

    def slow_plan(inputs: ReplicationInputs) -> ReplicationPlan:
        planned_in.append(threading.get_ident())
        assert loop_ran.wait(timeout=10), "the event loop did not run while the plan was being made"
        return real_plan(inputs)

    async def rotate_key_meanwhile() -> None:
        await asyncio.sleep(0)
        ring[0] = "key2"
        loop_ran.set()

    monkeypatch.setattr(replication_loop, "plan_replication", slow_plan)
    try:
        task = asyncio.create_task(rotate_key_meanwhile())
        await w.loop.reconcile()
        await task
    finally:
        w.loop.close()
    assert planned_in and planned_in[0] != loop_thread

    def credentials() -> set[str]:
        return {base64.b64decode(w.writer.secrets[(ns, REPLICA)]["data"][KEY_REPORT_CREDENTIAL]).decode()
                for ns in w.replicas()}

    assert credentials() == {f"key1-{ns}" for ns in (ROOT, "tenant-a", "tenant-b")}
    monkeypatch.setattr(replication_loop, "plan_replication", real_plan)
    await w.loop.reconcile()
    assert credentials() == {f"key2-{ns}" for ns in (ROOT, "tenant-a", "tenant-b")}
    w.loop.close()


async def test_writes_run_through_a_bounded_pool_and_one_failure_stops_none_of_the_others() -> None:
    """A rotation's thousands of writes are a few workers, not a task each (docs/design.md#plans-off-the-loop)."""
    w = World([])
    running = [0]
    most = [0]
    done: list[int] = []

    def job(i: int) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            running[0] += 1
            most[0] = max(most[0], running[0])
            await asyncio.sleep(0)
            running[0] -= 1
            if i == 3:
                raise RuntimeError("one write failed")
            done.append(i)
        return run

    await w.loop._run_pool([job(i) for i in range(500)])
    assert sorted(done) == [i for i in range(500) if i != 3]
    assert 1 < most[0] <= 2 * w.loop._concurrency
    await w.loop._run_pool([])  # nothing to do: no worker, no error


async def test_a_pass_copies_a_cache_again_only_when_it_changed() -> None:
    """The gather runs on the event loop: the namespaces, classes, claims and replicas it hands the
    planner are copied again only when that cache's generation moved (a rotation's passes follow its
    replica writes: 20,000 namespaces stay as they were), and then they show the change."""
    w = World(["tenant-a", "tenant-b"])
    first, again = w.loop.gather(), w.loop.gather()
    assert again.namespaces is first.namespaces and again.claims is first.claims
    assert again.classes is first.classes and again.replicas is first.replicas
    await w.loop.reconcile()
    w.caches.namespaces.put(tenant("tenant-c"))
    changed = w.loop.gather()
    assert set(changed.namespaces) == {ROOT, "tenant-a", "tenant-b", "tenant-c"}
    assert set(first.namespaces) == {ROOT, "tenant-a", "tenant-b"}  # a copy handed out earlier never changes
    assert changed.claims is first.claims and changed.classes is first.classes
    assert changed.replicas is not first.replicas
    assert {ns for ns, _ in changed.replicas} == {ROOT, "tenant-a", "tenant-b"} and not first.replicas
