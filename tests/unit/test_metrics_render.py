"""/metrics rendering: the snapshot is taken on the event loop, the text is formatted off it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from licensectl.metrics import Deferred, GaugeSample, Metrics, render

pytestmark = pytest.mark.asyncio


class ThreadSpy(Collector):
    def __init__(self) -> None:
        self.threads: list[int] = []

    def collect(self) -> Iterator[Metric]:
        self.threads.append(threading.get_ident())
        yield GaugeMetricFamily("spy", "which thread collected", value=1.0)


async def test_providers_run_on_the_loop_and_formatting_in_a_worker_thread() -> None:
    m = Metrics()
    loop_thread = threading.get_ident()
    provider_threads: list[int] = []

    def provider() -> list[GaugeSample]:
        provider_threads.append(threading.get_ident())
        return [GaugeSample("leader", (), 1.0)]

    m.snapshots.add(provider)
    spy = ThreadSpy()
    m.registry.register(spy)
    spy.threads.clear()  # the registry's auto-describe collected once at registration
    body = (await render(m)).decode()
    assert "licensectl_leader 1.0" in body and "spy 1.0" in body
    assert provider_threads == [loop_thread]
    assert spy.threads and all(t != loop_thread for t in spy.threads)


async def test_a_render_shows_the_samples_taken_when_it_started() -> None:
    m = Metrics()
    value = [1.0]
    m.snapshots.add(lambda: [GaugeSample("leader", (), value[0])])
    first = asyncio.create_task(render(m))
    second = asyncio.create_task(render(m))
    await asyncio.sleep(0)
    value[0] = 0.0  # the loop moves on while the first render formats
    bodies = [b.decode() for b in await asyncio.gather(first, second)]
    assert "licensectl_leader 1.0" in bodies[0]
    assert "licensectl_leader 0.0" in bodies[1]


async def test_outside_a_render_the_registry_collects_live() -> None:
    m = Metrics()
    value = [1.0]
    m.snapshots.add(lambda: [GaugeSample("leader", (), value[0])])
    value[0] = 0.0
    got = {s.name: s.value for fam in m.registry.collect() for s in fam.samples}
    assert got["licensectl_leader"] == 0.0


async def test_a_deferred_part_is_computed_in_the_render_thread_from_what_the_loop_copied() -> None:
    """A walk over every guest runs in the render thread, over the copy the provider took on the loop: a
    change the loop makes after the scrape began is not in it."""
    m = Metrics()
    loop_thread = threading.get_ident()
    computed_in: list[int] = []
    live = {"ns-a": 1.0}

    def provider() -> list[GaugeSample | Deferred]:
        copied = dict(live)

        def walk() -> list[GaugeSample]:
            computed_in.append(threading.get_ident())
            return [GaugeSample("guests", (("state", "licensed"), ("tenant", ns)), v) for ns, v in copied.items()]

        return [GaugeSample("leader", (), 1.0), Deferred(walk)]

    m.snapshots.add(provider)
    scrape = asyncio.create_task(render(m))
    await asyncio.sleep(0)
    live["ns-b"] = 2.0
    body = (await scrape).decode()
    assert 'licensectl_guests{state="licensed",tenant="ns-a"} 1.0' in body and "ns-b" not in body
    assert "licensectl_leader 1.0" in body
    assert computed_in and all(t != loop_thread for t in computed_in)
    # Outside a render (tests reading the registry) a deferred part is computed where it is read.
    assert m.registry.get_sample_value("licensectl_guests", {"state": "licensed", "tenant": "ns-b"}) == 2.0
