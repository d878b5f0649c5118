"""/metrics rendering: the snapshot is taken on the event loop, the text is formatted off it."""

from __future__ import annotations

import asyncio
import threading
import tracemalloc
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from licensectl.exposition import gauge_text
from licensectl.metrics import PREFIX, SNAPSHOT_GAUGES, Deferred, GaugeSample, Metrics, SnapshotCollector, render


class ThreadSpy(Collector):
    def __init__(self) -> None:
        self.threads: list[int] = []

    def collect(self) -> Iterator[Metric]:
        self.threads.append(threading.get_ident())
        yield GaugeMetricFamily("spy", "which thread collected", value=1.0)


@pytest.mark.asyncio
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


@pytest.mark.asyncio
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


@pytest.mark.asyncio
async def test_outside_a_render_the_registry_collects_live() -> None:
    m = Metrics()
    value = [1.0]
    m.snapshots.add(lambda: [GaugeSample("leader", (), value[0])])
    value[0] = 0.0
    got = {s.name: s.value for fam in m.registry.collect() for s in fam.samples}
    assert got["licensectl_leader"] == 0.0


@pytest.mark.asyncio
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


# -- the snapshot writer (licensectl/exposition.py) ----------------------------------------------

_NAMES = sorted(SNAPSHOT_GAUGES)[:6]
# Label names per metric name, in the order a provider would give them (not sorted).
_KEYS = {name: keys for name, keys in zip(_NAMES, [(), ("tenant", "state"), ("state",), ("source", "class", "wave"),
                                                   ("namespace",), ("reason", "kind")], strict=True)}
_values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**18, 10**18).map(float),
                    st.sampled_from([0.0, -0.0, 1.0, 1e21, 1234567.0, 0.1]))
_specials = st.sampled_from(['\\', '\n', '"', 'é', '{', ','])
_label_values = st.text(alphabet=st.one_of(st.characters(exclude_categories=("Cs",)), _specials),
                        max_size=12)


@st.composite
def _series(draw: st.DrawFn) -> GaugeSample:
    name = draw(st.sampled_from(_NAMES))
    labels = tuple((k, draw(_label_values)) for k in _KEYS[name])
    return GaugeSample(name, labels, draw(_values))


def _prometheus_client_text(samples: list[GaugeSample]) -> bytes:
    """What prometheus-client writes for the same samples (the collector's own path)."""
    registry = CollectorRegistry(auto_describe=False)
    collector = SnapshotCollector()
    collector.add(lambda: samples)
    registry.register(collector)
    return generate_latest(registry)


@settings(max_examples=300, deadline=None)
@given(st.lists(_series(), max_size=40))
def test_the_writer_writes_the_bytes_prometheus_client_writes(samples: list[GaugeSample]) -> None:
    """Interleaved families, escapes in label values, unsorted label names, any float."""
    assert bytes(gauge_text(samples, SNAPSHOT_GAUGES, PREFIX)) == _prometheus_client_text(samples)


@pytest.mark.parametrize("big", [0, 1, 2])
def test_families_keep_the_order_they_first_appeared_in_wherever_the_largest_is(big: int) -> None:
    names = ["leader", "ready", "replicas"]
    samples = [GaugeSample(n, (("state", f"s{i}"),) if n == "replicas" else (), float(i))
               for i in range(1) for n in names]
    samples += [GaugeSample(names[big], (("state", f"x{i}"),) if names[big] == "replicas" else (), float(i))
                for i in range(50)]
    text = bytes(gauge_text(samples, SNAPSHOT_GAUGES, PREFIX)).decode()
    heads = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert heads == [f"licensectl_{n}" for n in names]
    assert text.encode() == _prometheus_client_text(samples)


def test_a_large_snapshot_is_held_about_once_while_it_is_written() -> None:
    """The scrape of a large fleet set the controller's peak memory: prometheus-client held the text
    three to four times over, plus a Sample and a dict per series."""
    samples = [GaugeSample("guest_license_state", (("namespace", f"tenant-t{i:05d}"), ("vm", f"vm-{i}"),
                                                   ("state", "unknown")), 1.0) for i in range(20_000)]
    samples += [GaugeSample("guests", (("state", "unknown"), ("tenant", f"tenant-c{i:03d}")), 20.0)
                for i in range(1_000)]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        text = gauge_text(iter(samples), SNAPSHOT_GAUGES, PREFIX)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * len(text), (peak, len(text))


@pytest.mark.asyncio
async def test_a_render_is_the_registrys_whole_text() -> None:
    """`render` writes the snapshot families itself and the rest through prometheus-client: together
    the same bytes as prometheus-client alone, counters and histograms included."""
    m = Metrics()
    m.snapshots.add(lambda: [GaugeSample("leader", (), 1.0), Deferred(lambda: [
        GaugeSample("guests", (("tenant", "t-a"), ("state", "licensed")), 3.0)])])
    m.restarts_total.labels("issued").inc(2)
    m.webhook_duration.observe(0.002)
    body = await render(m)
    assert bytes(body) == generate_latest(m.registry)
    assert body.count(b"# TYPE licensectl_leader gauge") == 1
