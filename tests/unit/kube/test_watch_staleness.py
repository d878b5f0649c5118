"""`Informer.stale_seconds`: how long a cache has not heard from the apiserver (docs/design.md#readiness).

A watch that is open but silent (an apiserver stopped with SIGSTOP) stays "healthy"; its staleness grows,
and any line or a reopened watch resets it.
"""

from __future__ import annotations

import time

from licensectl.kube import watch as w
from licensectl.kube.caches import CacheHealth
from tests.unit.kube.test_watch_unit import FakeApi, name_projection, obj, page, running, until


async def test_staleness_grows_on_a_silent_watch_and_resets_when_it_reopens() -> None:
    api = FakeApi()
    api.list_round([page([obj("a", "1")], "10")])
    inf = w.Informer("test", api, name_projection, options=w.InformerOptions(backoff_base=0.01, backoff_cap=0.01))
    assert inf.stale_seconds is None  # never listed: no age
    async with running(inf):
        assert await inf.wait_synced(2)
        assert inf.stale_seconds is not None and inf.stale_seconds < 1.0
        silent_from = time.monotonic()
        await until(lambda: (inf.stale_seconds or 0.0) >= 0.2)  # the open watch says nothing
        assert inf.healthy  # still "up": only the age tells that nothing arrives
        assert inf.stale_seconds is not None and inf.stale_seconds >= time.monotonic() - silent_from - 0.05
        api.release.set()  # the server ends the stream; the informer reopens the watch
        await until(lambda: (inf.stale_seconds or 1.0) < 0.1)


def test_core_stale_seconds_is_the_oldest_and_needs_every_cache() -> None:
    class Stub:
        def __init__(self, age: float | None) -> None:
            self.stale_seconds = age

    class Health(CacheHealth):
        def __init__(self, ages: list[float | None]) -> None:
            self._core = [Stub(a) for a in ages]

        @property
        def core(self) -> list[Stub]:  # type: ignore[override]
            return self._core

    assert Health([1.0, 7.5, 3.0]).core_stale_seconds() == 7.5
    assert Health([1.0, None]).core_stale_seconds() is None  # one never listed: not judged stale
