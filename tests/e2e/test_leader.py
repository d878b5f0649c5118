"""Two `licensectl run` processes with leader election against the real apiserver and the KubeVirt
simulator: one writer, a warm read-only standby, crash failover mid-rollout, graceful handover."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiClient, CoordinationV1Api

from licensectl_dev.devcluster.guest_sim import GuestProfile, SimulatedGuest
from licensectl_dev.testkit.poll import eventually

from .support import (
    REPORT_INTERVAL,
    Rig,
    assert_each_restarted_once,
    controllers,
    leader_pods,
    lease_holder,
)

# Starts `licensectl run` processes itself: cluster tier even if its fixtures change.
pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.cluster]

# Short: a crashed leader's Lease expires within seconds, so the takeover is timed against its duration.
CRASH_LEASE = {"lease_duration_seconds": 3, "renew_deadline_seconds": 2, "retry_period_seconds": 0.5}
# Long: a takeover by expiry would take 15 s; a released Lease is taken within a retry.
HANDOVER_LEASE = {"lease_duration_seconds": 15, "renew_deadline_seconds": 10, "retry_period_seconds": 0.5}


async def probe_loop(guest: SimulatedGuest, stop: asyncio.Event) -> None:
    """The guest's systemd timer: one probe run per report interval."""
    while not stop.is_set():
        await guest.probe()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), REPORT_INTERVAL)


async def test_standby_stays_read_only_then_takes_over_a_rollout_after_the_leader_crashes(
        api_client: ApiClient, rig: Rig) -> None:
    kv, fl = rig.kv, rig.fleet
    async with controllers() as started:
        a, b, vms = await rig.leader_and_standby(started, **CRASH_LEASE)
        assert await leader_pods(api_client, fl.controller_ns) == ["licensectl-a"]

        # The leader takes guest reports (through the Service); the standby refuses them with 503.
        ns0 = fl.tenants[0]
        guest = SimulatedGuest(ns0, "vm1", GuestProfile.licensed())
        direct = SimulatedGuest(ns0, "vm1", GuestProfile.licensed())
        try:
            assert await guest.boot(api_client) == 0, guest.last_stderr
            assert await guest.probe() == 0, guest.last_stderr
            await a.wait_metric("licensectl_guest_license_state", 1, namespace=ns0, vmi="vm1", state="licensed")
            assert await direct.boot(api_client, report_url=b.reports_url) == 0, direct.last_stderr
            assert await direct.probe() != 0  # every attempt answered 503
            sb = await b.must_scrape()
            assert sb.value("licensectl_reports_total", result="not_ready") >= 1
            assert sb.value("licensectl_reports_total", result="accepted") == 0

            stop_probing = asyncio.Event()
            prober = asyncio.create_task(probe_loop(guest, stop_probing))
            try:
                old_rev = await fl.revision()
                await fl.rotate(1)
                await eventually(lambda: rig.accepted_restarts() >= 2, timeout=60, interval=0.05,
                                 what="the leader issued two restarts")
                # The standby, warm and idle: ready, not leader, and it wrote nothing at all.
                sb = await b.must_scrape()
                assert sb.value("licensectl_leader") == 0
                assert sb.value("licensectl_ready") == 1
                assert sb.value("licensectl_replica_writes_total") == 0
                assert sb.value("licensectl_restarts_total") == 0
                assert not [r for r in rig.writes_by("licensectl-b") if r.resource != "pods"], \
                    rig.writes_by("licensectl-b")
                # Its only write is clearing the leader label from its own pod at start.
                assert {(r.verb, r.resource, r.name) for r in rig.writes_by("licensectl-b")} <= {
                    ("patch", "pods", "licensectl-b")}
                synced = sb.by_label("licensectl_informer_synced", "resource")
                assert synced and set(synced.values()) == {1.0}, "standby caches are warm"
                # Rollout and guest series come from the leader only (docs/operations.md#which-pod-exports-what).
                assert not sb.has("licensectl_rollout_vmis") and not sb.has("licensectl_guest_license_state")
                assert (await a.must_scrape()).value("licensectl_rollout_vmis") == len(vms)

                await a.kill()
                killed = time.monotonic()
                assert await lease_holder(api_client, fl.controller_ns) == "licensectl-a"  # a crash releases nothing
                await b.wait_metric("licensectl_leader", 1, timeout=15)
                takeover = time.monotonic() - killed
                assert takeover < CRASH_LEASE["lease_duration_seconds"] + 2.0, takeover
                assert await lease_holder(api_client, fl.controller_ns) == "licensectl-b"
                leader_at = time.monotonic()
                # Guest metrics recover on the new leader with the guest's next report.
                await b.wait_metric("licensectl_guest_license_state", 1, timeout=REPORT_INTERVAL + 6,
                                  namespace=ns0, vmi="vm1", state="licensed")
                assert time.monotonic() - leader_at < REPORT_INTERVAL + 6

                # The pod's container restarts: the old leader comes back as a standby and drops its
                # stale leader label, so the reports Service selects only the new leader.
                a2 = await rig.controller(started, "licensectl-a", **CRASH_LEASE)
                await a2.wait_metric("licensectl_ready", 1)
                await eventually(lambda: _leaders_are(api_client, fl.controller_ns, ["licensectl-b"]), timeout=15,
                                 what="only the new leader's pod carries the leader label")
                assert (await a2.must_scrape()).value("licensectl_leader") == 0

                new_rev = await fl.revision()
                assert new_rev is not None and new_rev != old_rev
                await eventually(lambda: fl.all_done(vms, new_rev), timeout=90, interval=0.25,
                                 what="the new leader finished the rollout")
            finally:
                stop_probing.set()
                await prober
            assert_each_restarted_once(kv, vms)
            assert (await b.must_scrape()).value("licensectl_restarts_total", result="issued") >= 1
            assert await a2.stop() == 0
            assert await b.stop() == 0
        finally:
            guest.cleanup()
            direct.cleanup()


async def _leaders_are(api: ApiClient, ns: str, want: list[str]) -> bool:
    return await leader_pods(api, ns) == want


async def _watch_holders(api: ApiClient, ns: str, out: list[tuple[float, str]], ready: asyncio.Event) -> None:
    co = CoordinationV1Api(api)
    lease = await co.read_namespaced_lease("licensectl", ns)
    out.append((time.monotonic(), lease.spec.holder_identity or ""))
    w = watch.Watch()
    ready.set()
    async with w.stream(co.list_namespaced_lease, ns, field_selector="metadata.name=licensectl",
                        resource_version=lease.metadata.resource_version, timeout_seconds=120) as stream:
        async for ev in stream:
            out.append((time.monotonic(), ev["object"].spec.holder_identity or ""))


async def test_sigterm_finishes_writes_releases_the_lease_and_the_standby_takes_over_at_once(
        api_client: ApiClient, rig: Rig) -> None:
    kv, fl = rig.kv, rig.fleet
    async with controllers() as started:
        a, b, vms = await rig.leader_and_standby(started, **HANDOVER_LEASE)

        holders: list[tuple[float, str]] = []
        watching = asyncio.Event()
        watcher = asyncio.create_task(_watch_holders(api_client, fl.controller_ns, holders, watching))
        await watching.wait()
        try:
            await fl.rotate(1)
            await eventually(lambda: rig.accepted_restarts() >= 1, timeout=60, interval=0.05,
                             what="the leader issued a restart")
            term = time.monotonic()
            rc = await a.stop()
            exited = time.monotonic()
            assert rc == 0, a.log_tail()
            await b.wait_metric("licensectl_leader", 1, timeout=10)
            takeover = time.monotonic() - exited
            assert takeover < 3.0, f"takeover took {takeover:.1f}s: the Lease was not released"
            await eventually(lambda: holders and holders[-1][1] == "licensectl-b", what="watch saw the new holder")
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

        # The Lease went a -> "" (released on exit) -> b, never straight from a to b.
        seq = [h for _, h in holders]
        compact = [h for i, h in enumerate(seq) if i == 0 or seq[i - 1] != h]
        assert compact[-3:] == ["licensectl-a", "", "licensectl-b"], compact
        released_at = next(t for t, h in holders if h == "" and t >= term)
        assert released_at <= exited + 0.5

        # Shutdown order: every write the old leader had started finished (got its response) before
        # it released the Lease; after the release it only unlabelled its own pod.
        writes = rig.writes_by("licensectl-a")
        release = max((r for r in writes if r.resource == "leases" and r.verb == "update"), key=lambda r: r.started)
        assert release.started >= term
        assert all(r.finished and r.status for r in writes), [r for r in writes if not r.finished or not r.status]
        late = [r for r in writes if r.started > release.started]
        assert {(r.verb, r.resource, r.name) for r in late} <= {("patch", "pods", "licensectl-a")}, late
        assert all(r.finished <= release.started for r in writes if r is not release and r not in late), \
            [r for r in writes if r.finished > release.started and r is not release and r not in late]
        events = [e.get("event") for e in a.log_records()]
        assert "lease released" in events and events[-1] == "licensectl stopped", events[-5:]

        await eventually(lambda: _leaders_are(api_client, fl.controller_ns, ["licensectl-b"]), timeout=10,
                         what="leader label moved to the new leader")
        new_rev = await fl.revision()
        assert new_rev is not None
        await eventually(lambda: fl.all_done(vms, new_rev), timeout=90, interval=0.25,
                         what="the new leader finished the rollout")
        assert_each_restarted_once(kv, vms)
        assert await b.stop() == 0
        assert await lease_holder(api_client, fl.controller_ns) == ""
        assert await leader_pods(api_client, fl.controller_ns) == []
