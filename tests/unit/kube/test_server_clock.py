"""The server clock corrects a skewed local clock from apiserver Date headers, fed by the API
client's request tracing, which also counts every request by (verb, code)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import AsyncIterator
from email.utils import format_datetime
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from licensectl.config import Settings
from licensectl.kube import client as kclient
from licensectl.kube.api import ApiException, CoreV1Api
from licensectl.kube.raw import RawApi
from licensectl.kube.server_clock import ServerClock
from licensectl_dev.testkit.local_http import serve


def header(epoch: float) -> str:
    return format_datetime(dt.datetime.fromtimestamp(int(epoch), dt.UTC), usegmt=True)


def test_no_samples_means_local_time() -> None:
    c = ServerClock()
    assert c.offset == 0.0
    assert abs(c.now().timestamp() - time.time()) < 1.0


def test_offset_follows_the_server_and_ignores_outliers_and_garbage() -> None:
    c = ServerClock(min_interval=0.0)
    local = 1_800_000_000.25
    for i in range(9):
        c.observe(header(local + i + 120), local + i)  # server 120 s ahead
    c.observe(header(local - 5000), local + 10)  # one wild sample
    c.observe("not a date", local + 11)
    c.observe(None, local + 12)
    assert 119.0 <= c.offset <= 121.0
    assert abs(c.now().timestamp() - (time.time() + c.offset)) < 1.0


def test_server_behind_gives_negative_offset() -> None:
    c = ServerClock(min_interval=0.0)
    local = 1_800_000_000.0
    for i in range(5):
        c.observe(header(local + i - 30), local + i)
    assert -31.0 <= c.offset <= -29.0


def test_samples_are_rate_limited() -> None:
    c = ServerClock(min_interval=1.0)
    local = 1_800_000_000.0
    c.observe(header(local + 60), local)
    c.observe(header(local - 60), local + 0.5)  # ignored: within the interval
    assert 59.0 <= c.offset <= 61.0


# -- fed by the API client's request tracing ---------------------------------------------------------
SKEW = 3600.0  # the fake apiserver runs an hour ahead of this machine


@contextlib.asynccontextmanager
async def fake_apiserver() -> AsyncIterator[str]:
    """A tiny HTTP apiserver: namespaces list (Date an hour ahead), 404 for a Secret, a watch stream."""

    def dated(resp: web.StreamResponse) -> web.StreamResponse:
        resp.headers["Date"] = header(time.time() + SKEW)
        return resp

    async def namespaces(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch", "").lower() == "true":
            resp = dated(web.StreamResponse())
            await resp.prepare(request)
            await resp.write_eof()
            return resp
        return dated(web.json_response({"kind": "NamespaceList", "apiVersion": "v1", "metadata": {}, "items": []}))

    async def secret(_request: web.Request) -> web.StreamResponse:
        return dated(web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404))

    app = web.Application()
    app.router.add_get("/api/v1/namespaces", namespaces)
    app.router.add_get("/api/v1/namespaces/{ns}/secrets/{name}", secret)
    async with serve(app) as url:
        yield url


def kubeconfig_for(server: str, path: Path) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": server}}],
        "users": [{"name": "t", "user": {"token": "t"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
    }))
    return path


async def test_client_counts_every_request_and_feeds_the_clock(tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []
    clock = ServerClock(min_interval=0.0)
    tracing = kclient.request_tracing(on_request=lambda verb, code: seen.append((verb, code)), clock=clock)
    async with fake_apiserver() as server:
        api = await kclient.make_api_client(Settings(kubeconfig=str(kubeconfig_for(server, tmp_path / "kc"))),
                                            trace_configs=[tracing])
        try:
            session = api.session
            assert session.trust_env is False  # no ~/.netrc or proxy-environment lookups per request
            core = RawApi(CoreV1Api(api))
            await core.list_namespace()
            with pytest.raises(ApiException) as err:
                await core.read_namespaced_secret("s", "ns")
            assert err.value.status == 404
            resp = await CoreV1Api(api).list_namespace(watch=True)
            resp.release()
        finally:
            await api.close()
    # An unreachable apiserver: no response at all is code 0.
    closed = await kclient.make_api_client(Settings(kubeconfig=str(kubeconfig_for(server, tmp_path / "kc2"))),
                                           trace_configs=[tracing])
    try:
        with pytest.raises(aiohttp.ClientError):
            await RawApi(CoreV1Api(closed)).list_namespace()
    finally:
        await closed.close()
    assert seen == [("GET", 200), ("GET", 404), ("WATCH", 200), ("GET", 0)]
    assert SKEW - 2.0 <= clock.offset <= SKEW + 2.0
    assert abs(clock.now().timestamp() - (time.time() + SKEW)) < 2.0


async def test_a_failing_observer_never_fails_the_request(tmp_path: Path) -> None:
    def broken(_verb: str, _code: int) -> None:
        raise RuntimeError("metrics bug")

    async with fake_apiserver() as server:
        api = await kclient.make_api_client(Settings(kubeconfig=str(kubeconfig_for(server, tmp_path / "kc"))),
                                            trace_configs=[kclient.request_tracing(on_request=broken)])
        try:
            listed = await RawApi(CoreV1Api(api)).list_namespace()
        finally:
            await api.close()
    assert listed["items"] == []


def test_watch_is_told_from_the_query() -> None:
    assert kclient.request_verb("get", URL("http://h/api/v1/pods?watch=True&resourceVersion=5")) == "WATCH"
    assert kclient.request_verb("GET", URL("http://h/api/v1/pods?watch=true")) == "WATCH"
    assert kclient.request_verb("GET", URL("http://h/api/v1/pods?watch=false")) == "GET"
    assert kclient.request_verb("patch", URL("http://h/api/v1/namespaces/a")) == "PATCH"


# -- bounds: responses at different fractions of a second pin the offset down ------------------------
def _respond(c: ServerClock, true_offset: float, sent: float, rtt: float) -> None:
    """One request sent at local `sent`, stamped by the server halfway through, received after `rtt`."""
    c.observe(header(sent + rtt / 2 + true_offset), sent + rtt, sent)


@pytest.mark.parametrize("seed", range(20))
def test_the_upper_bound_is_never_early_and_the_bounds_narrow(seed: int) -> None:
    import random
    rng = random.Random(seed)
    true_offset = rng.uniform(-300.0, 300.0)
    c = ServerClock(min_interval=0.0)
    local = 1_800_000_000.0
    for i in range(30):
        local += rng.uniform(0.05, 1.7)
        _respond(c, true_offset, local, rng.uniform(0.0005, 0.02))
        assert c.upper >= true_offset, f"after {i + 1} responses the latest server time is early"
        assert c.upper - true_offset <= 1.02  # never worse than one response's bound
    assert abs(c.offset - true_offset) < 0.1
    assert c.upper - true_offset < 0.2


def test_a_wild_header_neither_moves_the_offset_nor_breaks_the_bounds() -> None:
    c = ServerClock(min_interval=0.0)
    local = 1_800_000_000.0
    for i in range(8):
        _respond(c, 42.25, local + i * 0.37, 0.001)
    _respond(c, -5000.0, local + 4, 0.001)
    assert abs(c.offset - 42.25) < 0.5 and c.upper >= 42.25


def test_latest_is_the_upper_bound_on_the_clock() -> None:
    c = ServerClock(min_interval=0.0)
    local = time.time()
    for i in range(10):
        _respond(c, 7.0, local - 10 + i * 0.31, 0.001)
    assert 0.0 <= (c.latest() - c.now()).total_seconds() <= c.upper - c.offset + 0.05
    assert c.latest().timestamp() >= time.time() + 7.0 - 0.05
