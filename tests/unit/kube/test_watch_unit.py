"""Watch helpers (backoff, line parsing) and the Informer state machine against a scripted fake API."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from licensectl.kube import errors
from licensectl.kube import watch as w

# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rnd", [0.0, 0.3, 0.999999])
def test_backoff_bounds_and_cap(rnd: float) -> None:
    delays = [w.backoff_delay(a, rnd, base=0.5, cap=30.0) for a in range(40)]
    assert all(0.25 <= d <= 30.0 for d in delays)
    assert delays == sorted(delays)  # non-decreasing for a fixed draw
    assert delays[-1] >= 15.0  # reaches the cap range
    assert w.backoff_delay(0, rnd) <= 0.5


def test_backoff_jitter_spreads_and_is_total() -> None:
    assert w.backoff_delay(10, 0.0) == 15.0 and w.backoff_delay(10, 1.0) == 30.0
    assert w.backoff_delay(10**6, 0.5) <= 30.0  # no overflow on huge attempts
    assert w.backoff_delay(-3, 0.5) == w.backoff_delay(0, 0.5)


def test_watch_timeout_spread() -> None:
    assert w.watch_timeout_seconds(300, 0.0) == 300
    assert 300 <= w.watch_timeout_seconds(300, 0.999999) < 600
    assert w.watch_timeout_seconds(0.1, 0.0) == 1


def ev(typ: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": typ, "object": obj}).encode() + b"\n"


def obj(name: str, rv: str, ns: str = "n", **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv}, **extra}


def test_parse_event_line() -> None:
    e = w.parse_event_line(ev("ADDED", obj("a", "1")))
    assert e is not None and e.type == "ADDED" and e.object["metadata"]["name"] == "a"
    b = w.parse_event_line(ev("BOOKMARK", {"metadata": {"resourceVersion": "9"}}))
    assert b is not None and w.resource_version_of(b.object) == "9"
    err = w.parse_event_line(ev("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"}))
    assert err is not None and w.is_gone(err.object)
    for bad in (b"", b"not json", b"[1]", b'{"type":"ADDED"}', b'{"type":"WHAT","object":{}}',
                b'{"type":"ADDED","object":[]}', b"\xff\xfe"):
        assert w.parse_event_line(bad) is None


def test_status_helpers() -> None:
    assert w.is_gone({"code": 410})
    assert w.is_gone({"reason": "Expired", "code": 500})
    assert not w.is_gone({"code": 500, "reason": "InternalError"})
    assert w.status_code({"code": True}) == 0
    assert w.status_reason({"reason": "too old: 12 (34)"}) == "Unknown"  # free text is not logged
    assert w.status_reason({"reason": "Forbidden"}) == "Forbidden"


def test_line_splitter_chunks_and_bound() -> None:
    s = w.LineSplitter(max_line=20)
    assert s.feed(b'{"a"') == []
    assert s.feed(b':1}\n\n{"b":2}\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert s.finish() == b'{"c"'
    assert s.finish() is None
    with pytest.raises(w.LineTooLong):
        s.feed(b"x" * 21)
    s2 = w.LineSplitter(max_line=10)
    with pytest.raises(w.LineTooLong):
        s2.feed(b"y" * 30 + b"\n")


def test_a_failed_answer_means_gone_or_an_api_error() -> None:
    """One rule for a LIST page, a WATCH answer and an ERROR event: 410 or an Expired/Gone Status is Gone."""
    assert isinstance(w.failure(410, {}), w.Gone)
    assert isinstance(w.failure(500, {"kind": "Status", "code": 410, "reason": "Expired"}), w.Gone)
    assert isinstance(w.failure(0, {"kind": "Status", "reason": "Gone"}), w.Gone)
    err = w.failure(429, {"kind": "Status", "code": 429, "reason": "TooManyRequests"}, 1.5)
    assert isinstance(err, w.ApiError) and (err.code, err.reason, err.retry_after) == (429, "TooManyRequests", 1.5)
    assert errors.is_status(err, errors.TooManyRequests) and not errors.is_status(err, errors.Gone)
    free_text = w.failure(403, {"reason": "secret abc is forbidden", "message": "token=xyz"})
    assert isinstance(free_text, w.ApiError) and str(free_text) == "403 Unknown"  # never a body


def test_list_page_parts() -> None:
    page = w.list_page({"items": [{"a": 1}], "metadata": {"resourceVersion": "7", "continue": "tok"}})
    assert page == w.ListPage([{"a": 1}], "7", "tok")
    assert w.list_page({"items": {}, "metadata": {"resourceVersion": "", "continue": 3}}) == w.ListPage([], None, None)
    assert w.list_page({"metadata": []}) == w.ListPage([], None, None)


def test_object_key() -> None:
    assert w.object_key(obj("a", "1", ns="x")) == ("x", "a")
    assert w.object_key({"metadata": {"name": "cluster-scoped"}}) == ("", "cluster-scoped")
    assert w.object_key({"metadata": 3}) == ("", "")


# ---------------------------------------------------------------------------------------------
# Informer against a scripted fake
# ---------------------------------------------------------------------------------------------
class FakeContent:
    def __init__(self, chunks: list[bytes], hang: asyncio.Event | None) -> None:
        self._chunks = chunks
        self._hang = hang

    async def readany(self) -> bytes:
        if self._chunks:
            return self._chunks.pop(0)
        if self._hang is not None:
            await self._hang.wait()
        return b""

    async def read(self, n: int = -1) -> bytes:
        data = b"".join(self._chunks)
        self._chunks = []
        return data


class FakeResp:
    def __init__(self, status: int, chunks: list[bytes], hang: asyncio.Event | None = None) -> None:
        self.status = status
        self.content = FakeContent(chunks, hang)
        self.closed = False

    async def read(self) -> bytes:
        return await self.content.read()

    def close(self) -> None:
        self.closed = True


class FakeApi:
    """Serves scripted LIST pages and watch streams; records every call's kwargs."""

    def __init__(self) -> None:
        self.lists: list[Any] = []   # each: a list of pages (dict bodies) or an Exception at that page
        self.watches: list[FakeResp | Exception] = []
        self.calls: list[dict[str, Any]] = []
        # The watch-cache probe (`Informer._await_watch_cache`) is answered from its own script (a
        # status code, or an Exception), then 200; its calls are kept apart from the LISTs'.
        self.probe_answers: list[int | Exception] = []
        self.probes: list[dict[str, Any]] = []
        self.release = asyncio.Event()
        self._list_round = -1

    def list_round(self, pages: list[Any]) -> None:
        self.lists.append(pages)

    async def __call__(self, **kw: Any) -> Any:
        assert kw["_preload_content"] is False
        if kw.get("label_selector") == w.CACHE_PROBE_SELECTOR:
            self.probes.append(kw)
            answer = self.probe_answers.pop(0) if self.probe_answers else 200
            if isinstance(answer, Exception):
                raise answer
            if answer == 429:
                return FakeResp(429, [b'{"kind":"Status","code":429,"reason":"TooManyRequests"}'])
            return FakeResp(answer, [b'{"kind":"List","metadata":{"resourceVersion":"1"},"items":[]}'])
        self.calls.append(kw)
        if kw.get("watch"):
            if not self.watches:
                return FakeResp(200, [], hang=self.release)  # idle stream until released
            nxt = self.watches.pop(0)
            if isinstance(nxt, Exception):
                raise nxt
            return nxt
        if not kw.get("_continue"):
            self._list_round += 1
        pages = self.lists[min(self._list_round, len(self.lists) - 1)]
        idx = int(kw.get("_continue") or 0)
        page = pages[idx]
        if isinstance(page, Exception):
            raise page
        if isinstance(page, FakeResp):
            return page
        return FakeResp(200, [json.dumps(page).encode()])


def page(items: list[dict[str, Any]], rv: str, cont: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return {"kind": "List", "metadata": meta, "items": items}


def name_projection(o: Mapping[str, Any]) -> str | None:
    spec = o.get("spec")
    if isinstance(spec, dict) and spec.get("explode"):
        raise RuntimeError("bad projection")
    md = o.get("metadata", {})
    return f"{md.get('name')}@{(spec or {}).get('v', 0)}" if isinstance(md, dict) else None


@contextlib.asynccontextmanager
async def running(inf: w.Informer[Any]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(inf.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(cond: Any, within: float = 3.0) -> None:
    """Poll a condition over cache state (the informer exposes no per-change future to await)."""
    async with asyncio.timeout(within):
        while True:
            if cond():
                return
            await asyncio.sleep(0.005)


def fast(api: FakeApi, **kw: Any) -> w.Informer[str]:
    changes: list[tuple[Any, Any, Any]] = kw.pop("changes", [])
    return w.Informer("test", api, name_projection,
                      options=w.InformerOptions(page_size=2, backoff_base=0.01, backoff_cap=0.02),
                      on_change=lambda k, o, n: changes.append((k, o, n)), **kw)


async def test_paged_initial_list_then_watch_events() -> None:
    api = FakeApi()
    api.list_round([page([obj("a", "1"), obj("b", "2")], "10", "1"), page([obj("c", "3")], "10")])
    api.watches.append(FakeResp(200, [
        ev("ADDED", obj("d", "11")),
        ev("MODIFIED", obj("a", "12", spec={"v": 2}))[:20],  # an event split across chunks
        ev("MODIFIED", obj("a", "12", spec={"v": 2}))[20:],
        ev("DELETED", obj("b", "13")),
        ev("BOOKMARK", {"metadata": {"resourceVersion": "20"}}),
    ], hang=api.release))
    changes: list[Any] = []
    inf = fast(api, changes=changes, label_selector="x=y")
    assert not inf.synced and not inf.healthy
    async with running(inf):
        assert await inf.wait_synced(2)
        await until(lambda: inf.resource_version == "20")
        assert dict(inf.cache) == {("n", "a"): "a@2", ("n", "c"): "c@0", ("n", "d"): "d@0"}
        assert inf.healthy and inf.last_sync_at is not None
    list_calls = [c for c in api.calls if not c.get("watch")]
    assert [c.get("_continue") for c in list_calls] == [None, "1"]
    assert all(c["limit"] == 2 and c["label_selector"] == "x=y" for c in list_calls)
    watch_call = next(c for c in api.calls if c.get("watch"))
    assert watch_call["resource_version"] == "10" and watch_call["allow_watch_bookmarks"] is True
    assert (("n", "a"), "a@0", "a@2") in changes and (("n", "b"), "b@0", None) in changes
    assert not inf.running


async def test_an_empty_first_list_is_news_once() -> None:
    """A confirmed-absent object changes no key, so only `on_synced` tells a waiting loop to look again
    (a missing source Secret reported 20 s late, at the next resync, without it)."""
    api = FakeApi()
    api.list_round([page([], "10")])
    api.watches.append(FakeResp(200, [ev("BOOKMARK", {"metadata": {"resourceVersion": "11"}})], hang=api.release))
    changes: list[Any] = []
    synced: list[bool] = []
    inf = fast(api, changes=changes, on_synced=lambda: synced.append(inf.synced))
    async with running(inf):
        assert await inf.wait_synced(2)
        await until(lambda: inf.resource_version == "11")
    assert synced == [True] and changes == []


async def test_initial_list_failing_on_page_two_never_syncs() -> None:
    api = FakeApi()
    api.list_round([page([obj("a", "1"), obj("b", "2")], "10", "1"), ConnectionResetError("cut")])
    inf = fast(api)
    async with running(inf):
        await until(lambda: inf.counters["list_failures"] >= 2)
        assert not inf.synced and not inf.healthy and dict(inf.cache) == {}
        assert not await inf.wait_synced(0.05)


async def test_relist_failing_halfway_keeps_cache_and_turns_unhealthy() -> None:
    api = FakeApi()
    api.list_round([page([obj("a", "1"), obj("b", "2")], "10")])
    # Relist after Gone: page 1 fine, page 2 fails with an HTTP 500 Status, forever.
    api.list_round([page([obj("z", "30")], "30", "1"),
                    FakeResp(500, [json.dumps({"kind": "Status", "code": 500, "reason": "InternalError"}).encode()])])
    api.watches.append(FakeResp(200, [ev("ERROR", {"kind": "Status", "code": 410, "reason": "Expired",
                                                   "message": "too old resource version: 10 (25)"})]))
    restarts: list[str] = []
    lists: list[str] = []
    hooks = w.InformerHooks(on_watch_restart=lambda n, r: restarts.append(r),
                            on_list=lambda n, r, c, s: lists.append(r))
    inf = fast(api, hooks=hooks)
    async with running(inf):
        await until(lambda: inf.counters["list_failures"] >= 2)
        assert inf.synced  # it was synced once ...
        assert not inf.healthy  # ... but the failed relist makes it untrustworthy
        assert dict(inf.cache) == {("n", "a"): "a@0", ("n", "b"): "b@0"}
    assert restarts[0] == w.REASON_GONE
    assert lists[0] == "ok" and "error" in lists


async def test_gone_relists_and_diff_is_notified() -> None:
    api = FakeApi()
    api.list_round([page([obj("a", "1"), obj("b", "2")], "10")])
    api.list_round([page([obj("a", "1"), obj("c", "40")], "40")])
    api.watches.append(FakeResp(410, [json.dumps({"kind": "Status", "code": 410, "reason": "Gone"}).encode()]))
    changes: list[Any] = []
    inf = fast(api, changes=changes)
    async with running(inf):
        await until(lambda: inf.resource_version == "40")
        assert dict(inf.cache) == {("n", "a"): "a@0", ("n", "c"): "c@0"}
        assert inf.healthy and inf.counters["relists"] == 1
    after = changes[2:]  # the first two are the initial adds
    assert sorted(after, key=str) == sorted([(("n", "b"), "b@0", None), (("n", "c"), None, "c@0")], key=str)


async def test_reconnect_resumes_from_last_rv_and_bad_objects_do_not_stop() -> None:
    api = FakeApi()
    api.list_round([page([obj("a", "1")], "10")])
    api.watches.append(FakeResp(200, [ev("ADDED", obj("b", "11")),
                                      ev("ADDED", obj("bad", "12", spec={"explode": True})),
                                      b"garbage line\n"]))  # then the server closes the stream
    api.watches.append(OSError("connection refused"))
    api.watches.append(FakeResp(200, [ev("MODIFIED", obj("b", "13", spec={"v": 1}))], hang=api.release))
    inf = fast(api)
    async with running(inf):
        await until(lambda: inf.resource_version == "13")
        assert dict(inf.cache) == {("n", "a"): "a@0", ("n", "b"): "b@1"}
        assert inf.counters["invalid_objects"] == 1
    rvs = [c["resource_version"] for c in api.calls if c.get("watch")]
    assert rvs[:3] == ["10", "12", "12"]  # resumed where it left off, not from the list RV
    assert sum(1 for c in api.calls if not c.get("watch")) == 1  # no relist for a plain disconnect


async def test_run_is_cancellable_and_restartable() -> None:
    api = FakeApi()
    api.list_round([page([obj("a", "1")], "10")])
    api.list_round([page([obj("a", "1"), obj("b", "2")], "20")])
    inf = fast(api)
    async with running(inf):
        assert await inf.wait_synced(2)
    # Stopped: the last cache stays readable but is no longer trusted.
    assert not inf.running and not inf.synced and not inf.healthy
    assert dict(inf.cache) == {("n", "a"): "a@0"}
    async with running(inf) as task:
        assert await inf.wait_synced(2)
        with pytest.raises(RuntimeError):
            await inf.run()  # a second concurrent run is refused
        assert dict(inf.cache) == {("n", "a"): "a@0", ("n", "b"): "b@0"}
    assert task.cancelled()


async def test_watch_down_beyond_grace_is_unhealthy() -> None:
    api = FakeApi()
    api.list_round([page([obj("a", "1")], "10")])
    api.watches.extend([OSError("down")] * 1000)
    inf = w.Informer("test", api, name_projection,
                     options=w.InformerOptions(backoff_base=0.01, backoff_cap=0.01, unhealthy_after=0.1))
    async with running(inf):
        assert await inf.wait_synced(2)
        await asyncio.sleep(0.3)
        assert inf.synced and not inf.healthy


async def test_repeated_internal_errors_relist_instead_of_resuming_forever() -> None:
    api = FakeApi()
    api.list_round([page([obj("a", "1")], "10")])
    api.list_round([page([obj("a", "1"), obj("b", "20")], "20")])
    err = ev("ERROR", {"kind": "Status", "code": 500, "reason": "InternalError"})
    api.watches.extend([FakeResp(200, [err]) for _ in range(3)])
    restarts: list[str] = []
    inf = fast(api, hooks=w.InformerHooks(on_watch_restart=lambda n, r: restarts.append(r)))
    async with running(inf):
        await until(lambda: inf.resource_version == "20")
        assert set(inf.cache) == {("n", "a"), ("n", "b")} and inf.healthy
    assert restarts[:3] == [w.REASON_ERROR] * 3
    # The first two 500s were retried from the same RV; the third gave up on resuming.
    assert [c["resource_version"] for c in api.calls if c.get("watch")][:4] == ["10", "10", "10", "20"]


async def test_too_many_requests_keeps_resuming() -> None:
    api = FakeApi()
    api.list_round([page([obj("a", "1")], "10")])
    busy = json.dumps({"kind": "Status", "code": 429, "reason": "TooManyRequests"}).encode()
    api.watches.extend([FakeResp(429, [busy]) for _ in range(4)])
    api.watches.append(FakeResp(200, [ev("ADDED", obj("b", "11"))], hang=api.release))
    inf = fast(api)
    async with running(inf):
        await until(lambda: ("n", "b") in inf.cache)
    assert sum(1 for c in api.calls if not c.get("watch")) == 1


async def test_a_selectorless_list_waits_until_the_apiservers_watch_cache_is_filled() -> None:
    """A restarted apiserver reads an unselected paged LIST from etcd while it fills the watch cache, and
    answers a selected one 429: the informer asks the selected probe until it is answered, then LISTs."""
    api = FakeApi()
    api.probe_answers = [429, 429, 429]
    api.list_round([page([obj("a", "1"), obj("b", "2")], "10")])
    inf = fast(api)
    async with running(inf):
        await until(lambda: len(api.probes) >= 2)
        assert not inf.synced and not inf.healthy
        assert [c for c in api.calls if not c.get("watch")] == []  # no page asked of an unfilled cache
        await until(lambda: inf.synced)
    assert len(api.probes) == 4 and all(p["limit"] == 1 for p in api.probes)
    assert sum(1 for c in api.calls if not c.get("watch")) == 1
    assert inf.counters["list_failures"] == 0 and set(inf.cache) == {("n", "a"), ("n", "b")}


async def test_every_relist_asks_the_probe_first() -> None:
    api = FakeApi()
    api.list_round([page([obj("a", "1")], "10")])
    api.list_round([page([obj("b", "20")], "20")])
    api.watches.append(FakeResp(200, [ev("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"})]))
    inf = fast(api)
    async with running(inf):
        await until(lambda: ("n", "b") in inf.cache)
    assert len(api.probes) == 2


@pytest.mark.parametrize("answer", [500, 403, ConnectionResetError("reset")])
async def test_a_probe_answer_other_than_429_is_left_to_the_list(answer: int | Exception) -> None:
    """The probe only decides when to LIST: whatever else it meets, the LIST meets and reports."""
    api = FakeApi()
    api.probe_answers = [answer]
    api.list_round([page([obj("a", "1")], "10")])
    inf = fast(api)
    async with running(inf):
        await until(lambda: inf.synced)
    assert len(api.probes) == 1 and set(inf.cache) == {("n", "a")}


async def test_a_selected_informer_sends_no_probe() -> None:
    """Its own LIST is never read from etcd for an unfilled cache: it gets the 429 itself."""
    for selectors in ({"label_selector": "app=x"}, {"field_selector": "metadata.name=x"}):
        api = FakeApi()
        api.list_round([page([obj("a", "1")], "10")])
        inf = fast(api, **selectors)
        async with running(inf):
            await until(lambda inf=inf: inf.synced)
        assert api.probes == []


# ---------------------------------------------------------------------------------------------
# Recovery: the backoff schedule after an outage (docs/design.md#recovery-backoff)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rnd", [0.0, 0.5, 0.999999])
def test_outage_backoff_never_waits_longer_than_the_short_ceiling(rnd: float) -> None:
    delays = [w.retry_delay(a, rnd, throttled=False) for a in range(200)]
    assert max(delays) <= w.RECOVERY_CAP <= 2.0
    assert delays == sorted(delays) and delays[-1] >= w.RECOVERY_CAP / 2  # grows to the ceiling, jitter kept
    # A healed server is tried again within the ceiling, however long the outage lasted: a LIST of
    # a few seconds at most then leaves the controller ready within 5 s.
    assert w.retry_delay(10**6, rnd, throttled=False) <= w.RECOVERY_CAP


def test_only_throttling_backs_off_to_the_long_ceiling() -> None:
    assert w.retry_delay(20, 0.999999, throttled=True) > 15.0
    assert w.retry_delay(20, 0.999999, throttled=True) <= w.THROTTLED_CAP
    assert w.retry_delay(0, 0.0, throttled=True) == w.retry_delay(0, 0.0, throttled=False)  # same start


def test_jitter_spreads_retries_of_many_informers() -> None:
    draws = [i / 100 for i in range(100)]
    at_cap = {round(w.retry_delay(30, r, throttled=False), 3) for r in draws}
    assert min(at_cap) == w.RECOVERY_CAP / 2 and max(at_cap) < w.RECOVERY_CAP and len(at_cap) > 50


def test_what_counts_as_throttled() -> None:
    class Raised(Exception):
        status = 429

    assert w.is_throttled(w.ApiError(429, "TooManyRequests")) and w.is_throttled(Raised())
    assert not w.is_throttled(w.ApiError(503, "ServiceUnavailable"))
    assert not w.is_throttled(ConnectionRefusedError()) and not w.is_throttled(None)
    assert w.is_throttled(errors.ApiException(429)) and not w.is_throttled(errors.ApiException(503))


def test_options_default_to_the_production_values() -> None:
    o = w.InformerOptions()
    assert (o.page_size, o.watch_timeout, o.unhealthy_after, o.backoff_cap, o.throttled_cap) == (
        500, 300.0, 30.0, w.RECOVERY_CAP, w.THROTTLED_CAP)
    capped = w.Informer("t", FakeApi(), name_projection, options=w.InformerOptions(backoff_cap=60.0))
    assert capped._throttled_cap == 60.0  # the throttled ceiling is never below the failing one


async def _sleeps_during(api: FakeApi, inf: w.Informer[Any], monkeypatch: pytest.MonkeyPatch,
                         cond: Any) -> list[float]:
    """The backoff sleeps an informer takes until `cond`, recorded instead of waited."""
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(seconds: float, *args: Any) -> None:
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr("asyncio.sleep", fake_sleep)  # what the informer module calls
    try:
        async with running(inf):
            async with asyncio.timeout(5):
                while not cond():
                    await real_sleep(0.001)
    finally:
        monkeypatch.setattr("asyncio.sleep", real_sleep)
    return slept


async def _sleeps_until_synced(failed_lists: list[Any], monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoff sleeps of an informer (production defaults) whose LIST answers each of
    `failed_lists` in turn (an exception or a response) before one that succeeds."""
    api = FakeApi()
    for failure in failed_lists:
        api.list_round([failure])
    api.list_round([page([obj("a", "1")], "10")])
    api.watches.append(FakeResp(200, [], hang=api.release))
    inf = w.Informer("test", api, name_projection)
    return await _sleeps_during(api, inf, monkeypatch, lambda: inf.synced)


async def test_a_long_outage_is_retried_at_the_short_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    # 1 + 40 refused LISTs: a minute-long outage at the old schedule
    slept = await _sleeps_until_synced([ConnectionRefusedError("apiserver down") for _ in range(41)], monkeypatch)
    assert len(slept) >= 40 and max(slept) <= w.RECOVERY_CAP
    assert all(s >= 0.25 for s in slept)  # still backing off, not spinning


async def test_a_throttling_server_gets_the_long_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    throttled = FakeResp(429, [json.dumps({"kind": "Status", "code": 429, "reason": "TooManyRequests"}).encode()])
    slept = await _sleeps_until_synced([throttled] * 8, monkeypatch)
    assert max(slept) > w.RECOVERY_CAP  # 0.5 * 2**7 = 64, jittered into [15, 30]


def test_the_servers_retry_after_wins_over_the_schedule() -> None:
    # A restarted apiserver answers 429 "storage is (re)initializing" with Retry-After: 1 while its
    # watch cache fills: retry after about a second, not after the throttled ceiling.
    assert all(1.0 <= w.retry_delay(a, r, throttled=True, retry_after=1.0) <= 1.25
               for a in (0, 5, 50) for r in (0.0, 0.5, 0.999999))
    assert w.retry_delay(3, 0.5, throttled=True, retry_after=10**6) == w.THROTTLED_CAP  # bounded
    assert w.parse_retry_after("1") == 1.0 and w.parse_retry_after(" 2 ") == 2.0
    assert w.parse_retry_after(None) is None and w.parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    assert w.parse_retry_after("-1") is None
    assert w.retry_delay(0, 0.0, throttled=True, retry_after=0.0) == w.MIN_RETRY_AFTER  # never a busy loop


async def test_a_restarting_apiserver_is_retried_when_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    initializing = FakeResp(429, [json.dumps({"kind": "Status", "code": 429, "reason": "TooManyRequests"}).encode()])
    initializing.headers = {"Retry-After": "1"}  # type: ignore[attr-defined]
    slept = await _sleeps_until_synced([initializing] * 10, monkeypatch)
    assert len(slept) >= 10 and all(1.0 <= s <= 1.25 for s in slept)


def keep_wanted(o: Mapping[str, Any]) -> bool:
    spec = o.get("spec")
    if isinstance(spec, dict) and spec.get("keep") == "explode":
        raise RuntimeError("bad predicate")
    return isinstance(spec, dict) and bool(spec.get("keep"))


async def test_objects_keep_refuses_are_never_held_and_leave_when_they_stop_being_wanted() -> None:
    api = FakeApi()
    api.list_round([page([obj("a", "1", spec={"keep": True}), obj("b", "2")], "10", "1"),
                    page([obj("c", "3", spec={"keep": "explode"})], "10")])
    api.watches.append(FakeResp(200, [
        ev("ADDED", obj("d", "11")),                               # not wanted: never held
        ev("MODIFIED", obj("b", "12", spec={"keep": True, "v": 1})),  # becomes wanted: an add
        ev("MODIFIED", obj("a", "13")),                            # stops being wanted: a delete
        ev("BOOKMARK", {"metadata": {"resourceVersion": "20"}}),
    ], hang=api.release))
    changes: list[Any] = []
    inf = fast(api, changes=changes, keep=keep_wanted)
    async with running(inf):
        assert await inf.wait_synced(2)
        await until(lambda: inf.resource_version == "20")
        assert dict(inf.cache) == {("n", "b"): "b@1", ("n", "c"): "c@0"}
    # The LIST held a and c (a predicate that raises holds the object: memory over a missed one); the
    # watch added b when it became wanted and removed a when it stopped being wanted; d was never held.
    assert changes == [(("n", "a"), None, "a@0"), (("n", "c"), None, "c@0"),
                       (("n", "b"), None, "b@1"), (("n", "a"), "a@0", None)]
    # The generation counts exactly the effective changes: what was derived at one generation still holds.
    assert inf.generation == len(changes)
    counters = inf.counters
    assert counters["ignored_objects"] == 3 and counters["invalid_objects"] == 0
