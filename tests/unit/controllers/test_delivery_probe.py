"""The delivery readiness checker (controllers/delivery_probe.py) against a fake API: evidence, freshness,
backoff, and what counts as an answer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from licensectl.controllers.delivery_probe import ERROR, MUTATED, UNCHANGED, DeliveryProbe
from licensectl.core.delivery import probe_patch
from licensectl.kube.admission_probe import VmiDryRunApi
from licensectl.kube.api import ApiException
from licensectl.metrics import Metrics
from licensectl_dev.testkit.memory import MemoryVmiDryRun
from tests.unit.core.test_delivery import apply_patch


class FakeApi:
    """Answers a dry-run create the way the apiserver would: `mode` says who answered."""

    def __init__(self) -> None:
        self.mode = "webhook"  # webhook | unchanged | forbidden | other-nonce
        self.calls: list[dict[str, Any]] = []

    async def create_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                              body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        assert (group, version, plural) == ("kubevirt.io", "v1", "virtualmachineinstances")
        self.calls.append({"namespace": namespace, "body": body, **kw})
        if self.mode == "forbidden":
            raise ApiException(403, "Forbidden")
        obj = {**body, "metadata": {**body["metadata"], "name": "licensectl-delivery-probe-x"}}
        if self.mode == "webhook":
            return apply_patch(obj, probe_patch("pod-a"))
        if self.mode == "other-nonce":
            answered = apply_patch(obj, probe_patch("pod-a"))
            answered["metadata"]["annotations"]["licensectl.io/delivery-probe"] = "someone-else"
            return answered
        return obj


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def probe(api: FakeApi, clock: Clock, metrics: Metrics | None = None,
          changes: list[bool] | None = None) -> DeliveryProbe:
    return DeliveryProbe(VmiDryRunApi(api), "lc-system", metrics=metrics, clock=clock, interval=10.0,
                         on_change=None if changes is None else changes.append)


async def test_answered_probe_is_evidence_until_it_goes_stale() -> None:
    api, clock, changes = FakeApi(), Clock(), []
    p = probe(api, clock, changes=changes)
    assert not p.ready()
    assert await p.probe_once()
    assert p.ready() and changes == [True] and p.last_result == MUTATED
    call = api.calls[0]
    assert call["dry_run"] == "All" and call["namespace"] == "lc-system"
    clock.t += 3 * 10.0
    assert p.ready()
    clock.t += 0.1
    assert not p.ready()  # older than max_age: no evidence


@pytest.mark.parametrize(("mode", "result"), [("unchanged", UNCHANGED), ("forbidden", ERROR),
                                              ("other-nonce", UNCHANGED)])
async def test_anything_but_our_answer_is_no_evidence(mode: str, result: str) -> None:
    api, clock, changes = FakeApi(), Clock(), []
    metrics = Metrics()
    p = probe(api, clock, metrics, changes)
    assert await p.probe_once()
    api.mode = mode
    assert not await p.probe_once()
    assert not p.ready() and p.last_result == result and p.error
    assert changes == [True, False]
    assert p.status_dict()["ready"] is False and p.status_dict()["consecutive_failures"] == 1
    samples = {s.name: s.value for s in p.samples()}
    assert samples == {"delivery_ready": 0.0}
    assert metrics.delivery_probes.labels(result)._value.get() == 1


async def test_backoff_doubles_to_a_ceiling_and_resets_on_success() -> None:
    api, clock = FakeApi(), Clock()
    p = probe(api, clock)
    api.mode = "unchanged"
    delays = []
    for _ in range(6):
        await p.probe_once()
        delays.append(p.next_delay())
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    p.failures = 10_000
    assert p.next_delay() == 8.0  # no overflow, however long it fails
    api.mode = "webhook"
    await p.probe_once()
    assert p.next_delay() == 10.0


async def test_run_loop_probes_again_when_woken() -> None:
    api, clock = FakeApi(), Clock()
    p = probe(api, clock)
    task = asyncio.create_task(p.run())
    try:
        for _ in range(100):
            if api.calls:
                break
            await asyncio.sleep(0.01)
        n = len(api.calls)
        p.wake()
        for _ in range(100):
            if len(api.calls) > n:
                break
            await asyncio.sleep(0.01)
        assert len(api.calls) > n
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_only_the_leader_probes_and_a_lost_leadership_drops_the_evidence() -> None:
    """A standby stays read-only (no create request, not even a dry run) and exports no readiness; a replica
    that loses the lease forgets its evidence, so a later takeover probes afresh before any restart."""
    api, clock = FakeApi(), Clock()
    leader = [False]
    p = DeliveryProbe(VmiDryRunApi(api), "lc-system", clock=clock, interval=0.05, active=lambda: leader[0])
    task = asyncio.create_task(p.run())
    try:
        await asyncio.sleep(0.2)
        assert api.calls == [] and p.samples() == [] and not p.ready()
        leader[0] = True
        p.wake()
        for _ in range(100):
            if p.ready():
                break
            await asyncio.sleep(0.01)
        assert p.ready() and [s.value for s in p.samples()] == [1.0]
        leader[0] = False
        p.wake()
        await asyncio.sleep(0.2)
        calls = len(api.calls)
        assert not p.ready() and p.status_dict()["prober"] is False and p.samples() == []
        await asyncio.sleep(0.2)
        assert len(api.calls) == calls
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_the_probe_asks_through_the_dry_run_port() -> None:
    dry = MemoryVmiDryRun()
    p = DeliveryProbe(dry, "lc-system", clock=Clock(), interval=10.0)
    assert await p.probe_once() and p.ready()
    assert [ns for ns, _ in dry.created] == ["lc-system"]
    dry.answer = None
    assert not await p.probe_once() and p.last_result == UNCHANGED
    dry.error = ApiException(403, "Forbidden")
    assert not await p.probe_once() and p.last_result == ERROR
    assert p.error == "dry-run create failed: Forbidden HTTP 403"


async def test_a_restart_back_without_its_volume_drops_the_evidence_until_a_fresh_probe_answers() -> None:
    api, clock, changes = FakeApi(), Clock(), []
    p = probe(api, clock, changes=changes)
    assert await p.probe_once() and p.ready()
    p.recheck()
    assert not p.ready() and changes == [True, False]  # no restart goes out on the old evidence
    assert p.status_dict()["error"].startswith("re-checking")
    p.recheck()  # twice before the probe: said once
    assert changes == [True, False]
    api.mode = "unchanged"
    assert not await p.probe_once() and not p.ready()
    api.mode = "webhook"
    assert await p.probe_once() and p.ready() and changes == [True, False, True]
