"""Leader election (kube/lease.py) against an in-memory Lease API: acquire, renew, expiry judged on
the local time a record was observed (never on the holder's timestamps), guarded takeover, and
release on shutdown. The multi-process behaviour runs against the real apiserver in
tests/e2e/test_leader.py."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from typing import Any

from licensectl.kube.lease import LeaderElector, LeaseConfig
from licensectl_dev.testkit.memory import ManualClock, MemoryLeases

NS, NAME = "licensectl-system", "licensectl"


def candidate(leases: MemoryLeases, clock: ManualClock, identity: str, *,
              on_change: Callable[[bool], None] | None = None) -> LeaderElector:
    cfg = LeaseConfig(namespace=NS, name=NAME, identity=identity, lease_duration=15.0, renew_deadline=10.0,
                      retry_period=0.01)
    return LeaderElector(leases, cfg, on_change=on_change, wall=clock.now, monotonic=clock.monotonic)


async def test_the_first_candidate_creates_the_lease_and_renews_it() -> None:
    leases, clock = MemoryLeases(), ManualClock()
    a = candidate(leases, clock, "a")
    assert await a.try_acquire_or_renew()
    spec = leases.leases[(NS, NAME)]["spec"]
    assert spec["holderIdentity"] == "a" and spec["leaseTransitions"] == 0 and spec["leaseDurationSeconds"] == 15
    acquired = spec["acquireTime"]
    clock.advance(2.0)
    assert await a.try_acquire_or_renew()
    spec = leases.leases[(NS, NAME)]["spec"]
    assert spec["acquireTime"] == acquired and spec["renewTime"] > acquired and spec["leaseTransitions"] == 0
    assert leases.writes == [("create", "a"), ("replace", "a")]


async def test_a_standby_waits_a_full_lease_duration_from_its_own_observation() -> None:
    leases, clock = MemoryLeases(), ManualClock()
    a, b = candidate(leases, clock, "a"), candidate(leases, clock, "b")
    assert await a.try_acquire_or_renew()
    # The holder's clock is far off: its renewTime says nothing the standby may rely on.
    leases.leases[(NS, NAME)]["spec"]["renewTime"] = "2000-01-01T00:00:00.000000Z"
    assert not await b.try_acquire_or_renew()  # first sight of this record: the clock starts now
    clock.advance(14.0)
    assert not await b.try_acquire_or_renew()
    clock.advance(1.5)  # 15.5 s since b saw the record change
    assert await b.try_acquire_or_renew()
    spec = leases.leases[(NS, NAME)]["spec"]
    assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1


async def test_renewals_keep_a_standby_out() -> None:
    leases, clock = MemoryLeases(), ManualClock()
    a, b = candidate(leases, clock, "a"), candidate(leases, clock, "b")
    assert await a.try_acquire_or_renew()
    for _ in range(10):
        assert not await b.try_acquire_or_renew()
        clock.advance(5.0)
        assert await a.try_acquire_or_renew()  # each renewal is a new record b observes afresh
    assert leases.holder(NS, NAME) == "a"


async def test_two_standbys_racing_for_an_expired_lease_cannot_both_win() -> None:
    leases, clock = MemoryLeases(), ManualClock()
    a, b, c = (candidate(leases, clock, n) for n in "abc")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew() and not await c.try_acquire_or_renew()
    clock.advance(16.0)
    won = await asyncio.gather(b.try_acquire_or_renew(), c.try_acquire_or_renew())
    assert sorted(won) == [False, True]
    assert leases.holder(NS, NAME) == ("b" if won[0] else "c")


async def test_run_leads_then_releases_on_shutdown_and_a_standby_takes_over_at_once() -> None:
    leases, clock = MemoryLeases(), ManualClock()
    changes: list[bool] = []
    a = candidate(leases, clock, "a", on_change=changes.append)
    task = asyncio.create_task(a.run())
    await asyncio.wait_for(a.elected.wait(), 2.0)
    assert a.is_leader and changes == [True]
    b = candidate(leases, clock, "b")
    assert not await b.try_acquire_or_renew()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not a.is_leader and changes == [True, False]
    await a.release()
    spec = leases.leases[(NS, NAME)]["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1
    assert await b.try_acquire_or_renew()  # no clock advance: a released lease is free now
    assert leases.holder(NS, NAME) == "b"


async def test_release_retries_when_a_late_renew_lands_between_read_and_write() -> None:
    leases, clock = MemoryLeases(), ManualClock()
    a = candidate(leases, clock, "a")
    assert await a.try_acquire_or_renew()
    late = candidate(leases, clock, "a")  # the cancelled renew of the same identity, landing late
    real_replace = leases.replace
    landed: list[bool] = []
    pending = [True]

    async def replace_after_late_renew(namespace: str, name: str, body: dict[str, Any]) -> bool:
        if pending:
            pending.clear()
            landed.append(await late.try_acquire_or_renew())  # bumps the resourceVersion first
        return await real_replace(namespace, name, body)

    leases.replace = replace_after_late_renew  # type: ignore[method-assign]
    await a.release()
    assert landed == [True]
    assert leases.holder(NS, NAME) == ""  # released on the second try, not left for expiry


async def test_release_leaves_someone_elses_lease_alone() -> None:
    leases, clock = MemoryLeases(), ManualClock()
    a, b = candidate(leases, clock, "a"), candidate(leases, clock, "b")
    assert await a.try_acquire_or_renew()
    writes = list(leases.writes)
    await b.release()
    assert leases.writes == writes and leases.holder(NS, NAME) == "a"


async def test_leadership_is_given_up_when_renewals_fail_past_the_deadline() -> None:
    leases, clock = MemoryLeases(), ManualClock()
    changes: list[bool] = []
    lost = asyncio.Event()

    def changed(leader: bool) -> None:
        changes.append(leader)
        if not leader:
            lost.set()

    a = candidate(leases, clock, "a", on_change=changed)
    task = asyncio.create_task(a.run())
    try:
        await asyncio.wait_for(a.elected.wait(), 2.0)
        leases.down = True  # the apiserver is unreachable: renewals fail
        await asyncio.sleep(0.05)
        assert a.is_leader  # within the renew deadline it keeps leading
        clock.advance(10.5)
        await asyncio.wait_for(lost.wait(), 2.0)
        assert not a.is_leader and changes == [True, False]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_stamps_use_the_given_wall_clock() -> None:
    leases = MemoryLeases()
    clock = ManualClock(start=dt.datetime(2031, 6, 1, 12, 0, 0, tzinfo=dt.UTC))
    assert await candidate(leases, clock, "a").try_acquire_or_renew()
    assert leases.leases[(NS, NAME)]["spec"]["renewTime"] == "2031-06-01T12:00:00.000000Z"
