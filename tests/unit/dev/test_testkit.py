"""The shared test kit: process groups and the leak check, the proxy base, `eventually`, the metrics parser."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from licensectl.kube.caches import CacheHealth
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.memory import MemoryCaches
from licensectl_dev.testkit.metrics_text import Scrape, delta, delta_by_label, parse_metrics
from licensectl_dev.testkit.poll import EventuallyTimeout, eventually
from licensectl_dev.testkit.process import (
    REPO_ROOT,
    ManagedProcess,
    child_env,
    extract_package,
    group_members,
    leaked_processes,
)
from licensectl_dev.testkit.proxy import HOP_BY_HOP, LOOPBACK, ReverseProxy


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may wait for a reaper that never comes)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


async def _read_pid(path: Path) -> int:
    text = await eventually(lambda: path.exists() and path.read_text().strip(), timeout=10, what="grandchild pid")
    return int(text)


# -- processes -------------------------------------------------------------------------------------
# A wrapper that forks the real program and waits for it, as faketime does.
WRAPPER = "sleep 300 & echo $! > {pidfile}; wait"


async def test_stop_ends_the_whole_group_including_a_grandchild(tmp_path: Path) -> None:
    p = ManagedProcess(["sh", "-c", WRAPPER.format(pidfile=tmp_path / "pid")], log_path=tmp_path / "log",
                       name="wrapper")
    p.start()
    grandchild = await _read_pid(tmp_path / "pid")
    assert p.pid is not None and grandchild in group_members(p.pid)
    await p.stop(grace=5)
    assert not _running(grandchild)
    assert not p.group_alive()


async def test_kill_ends_the_whole_group_including_a_grandchild(tmp_path: Path) -> None:
    p = ManagedProcess(["sh", "-c", WRAPPER.format(pidfile=tmp_path / "pid")], log_path=tmp_path / "log",
                       name="wrapper")
    p.start()
    grandchild = await _read_pid(tmp_path / "pid")
    assert await p.kill() == -9
    assert not _running(grandchild)


async def test_leak_check_reports_a_group_whose_leader_died_but_child_lives(tmp_path: Path) -> None:
    """The clock-skew orphan: the wrapper is gone, the program under it is not."""
    p = ManagedProcess(["sh", "-c", WRAPPER.format(pidfile=tmp_path / "pid")], log_path=tmp_path / "log",
                       name="leaky-wrapper")
    p.start()
    grandchild = await _read_pid(tmp_path / "pid")
    assert p.pid is not None
    os.kill(p.pid, 9)  # only the wrapper, by PID
    await p.wait(5)
    try:
        assert _running(grandchild)
        assert [line for line in leaked_processes() if line.startswith("leaky-wrapper ")]
    finally:
        await p.stop(grace=5)
    assert not _running(grandchild)
    assert not [line for line in leaked_processes() if line.startswith("leaky-wrapper ")]


async def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path: Path) -> None:
    p = ManagedProcess(["sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.1; done"],
                       log_path=tmp_path / "log", name="stubborn")
    p.start()
    await eventually(lambda: "up" in p.log_lines(), timeout=10, what="trap installed")
    await p.stop(grace=0.5)
    assert not p.group_alive()


def test_child_env_drops_implicit_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LICENSECTL_NAMESPACE", "elsewhere")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    env = child_env({"EXTRA": "1"})
    assert not [k for k in env if k.startswith(("LICENSECTL_", "KUBERNETES_SERVICE_")) or k == "KUBECONFIG"]
    assert env["EXTRA"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(Path(__file__).resolve().parents[3])


async def test_log_records_keep_non_json_lines(tmp_path: Path) -> None:
    p = ManagedProcess([sys.executable, "-c", "print('{\"event\": \"hello\"}'); print('Traceback')"],
                       log_path=tmp_path / "log", name="logger")
    p.start()
    assert await p.wait(10) == 0
    assert p.log_records() == [{"event": "hello"}, {"raw": "Traceback"}]


# -- proxy -----------------------------------------------------------------------------------------
@pytest_asyncio.fixture(loop_scope="session")
async def upstream() -> AsyncIterator[str]:
    """Echoes the request headers it received, and answers with hop-by-hop headers of its own."""

    async def echo(request: web.Request) -> web.Response:
        return web.json_response(dict(request.headers), headers={"Proxy-Authenticate": "Basic", "X-Up": "1"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    yield f"http://{LOOPBACK}:{runner.addresses[0][1]}"
    await runner.cleanup()


class FaultyProxy(ReverseProxy):
    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.seen: list[str] = []

    async def intercept(self, request: web.Request) -> web.StreamResponse | None:
        self.seen.append(request.path)
        if request.path.startswith("/fault"):
            return web.json_response({"code": 503}, status=503)
        return None


async def test_proxy_strips_hop_by_hop_headers_both_ways(upstream: str) -> None:
    async with ReverseProxy(upstream) as proxy, aiohttp.ClientSession() as http:
        headers = {"Keep-Alive": "timeout=5", "TE": "trailers", "Proxy-Authorization": "Basic x", "Trailer": "X",
                   "X-End-To-End": "kept", "Authorization": "Bearer caller"}
        async with http.get(proxy.url + "/api/v1/namespaces?watch=false", headers=headers) as r:
            assert r.status == 200
            got = {k.lower(): v for k, v in (await r.json()).items()}
            assert r.headers.get("X-Up") == "1"
            assert "Proxy-Authenticate" not in r.headers
    assert got["x-end-to-end"] == "kept" and got["authorization"] == "Bearer caller"
    for name in ("keep-alive", "te", "proxy-authorization", "trailer"):
        assert name in HOP_BY_HOP and name not in got, name


async def test_proxy_fault_hook_answers_without_the_upstream(upstream: str) -> None:
    async with FaultyProxy(upstream) as proxy, aiohttp.ClientSession() as http:
        async with http.get(proxy.url + "/fault/x") as r:
            assert r.status == 503 and await r.json() == {"code": 503}
        async with http.get(proxy.url + "/ok") as r:
            assert r.status == 200
    assert proxy.seen == ["/fault/x", "/ok"]


async def test_proxy_answers_502_when_the_upstream_is_down() -> None:
    async with aiohttp.ClientSession() as http, ReverseProxy(f"http://{LOOPBACK}:1") as proxy, \
            http.get(proxy.url + "/x") as r:
        assert r.status == 502


async def test_proxy_sever_cuts_an_open_stream() -> None:
    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"first\n")
        await asyncio.sleep(30)
        return resp

    app = web.Application()
    app.router.add_get("/watch", slow)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, 0).start()
    try:
        async with ReverseProxy(f"http://{LOOPBACK}:{runner.addresses[0][1]}") as proxy, \
                aiohttp.ClientSession() as http, http.get(proxy.url + "/watch") as r:
            assert await r.content.readline() == b"first\n"
            assert proxy.sever() == 1
            with pytest.raises(aiohttp.ClientError):
                await asyncio.wait_for(r.content.read(), 5)
    finally:
        await runner.cleanup()


# -- eventually ------------------------------------------------------------------------------------
async def test_eventually_returns_the_first_truthy_value_of_an_async_check() -> None:
    calls: list[int] = []

    async def check() -> list[int] | None:
        calls.append(1)
        return calls if len(calls) >= 3 else None

    assert await eventually(check, timeout=5, interval=0.01) == [1, 1, 1]


async def test_eventually_times_out_naming_what_and_the_last_value() -> None:
    with pytest.raises(EventuallyTimeout) as e:
        await eventually(lambda: {"ready": 0}.get("ready"), timeout=0.1, interval=0.02, what="the widget")
    assert str(e.value) == "timed out after 0.1s waiting for the widget; last value: 0"
    assert isinstance(e.value, AssertionError) and isinstance(e.value, TimeoutError)


# -- metrics text ----------------------------------------------------------------------------------
EXPOSITION = """\
# HELP licensectl_api_requests_total Requests to the apiserver by verb and code.
# TYPE licensectl_api_requests_total counter
licensectl_api_requests_total{code="200",verb="GET"} 12.0
licensectl_api_requests_total{code="404",verb="GET"} 3.0
licensectl_api_requests_total{code="201",verb="POST"} 5.0
# HELP licensectl_replicas Replica Secrets by state (in_sync, drifted, missing, conflict).
# TYPE licensectl_replicas gauge
licensectl_replicas{state="in_sync"} 4999.0
licensectl_replicas{state="missing"} 1.0
# HELP licensectl_source_revision_info Current license revision per source and class.
# TYPE licensectl_source_revision_info gauge
licensectl_source_revision_info{class="vws",revision="ab\\"c,d}e",source_name="n",source_namespace="s"} 1.0
# HELP licensectl_ready 1 once every cache completed its initial sync.
# TYPE licensectl_ready gauge
licensectl_ready 1.0
"""


def test_parse_metrics_sums_matching_label_subsets() -> None:
    s = parse_metrics(EXPOSITION, at=7.0)
    assert s.at == 7.0
    assert s.value("licensectl_api_requests_total") == 20.0
    assert s.value("licensectl_api_requests_total", verb="GET") == 15.0
    assert s.value("licensectl_api_requests_total", verb="GET", code="404") == 3.0
    assert s.value("licensectl_replicas", state="in_sync") == 4999.0
    assert s.value("licensectl_ready") == 1.0
    assert s.value("licensectl_replicas", state="drifted") == 0.0
    assert not s.has("licensectl_replicas", state="drifted")
    assert s.has("licensectl_replicas", state="missing")
    assert s.labels_of("licensectl_replicas", 1.0) == [{"state": "missing"}]


def test_parse_metrics_keeps_escaped_label_values() -> None:
    s = parse_metrics(EXPOSITION)
    labels = [dict(ls) for (n, ls) in s.samples if n == "licensectl_source_revision_info"]
    assert labels == [{"class": "vws", "revision": 'ab"c,d}e', "source_name": "n", "source_namespace": "s"}]


def test_by_label_and_deltas() -> None:
    before = parse_metrics(EXPOSITION)
    after = parse_metrics(EXPOSITION.replace('verb="POST"} 5.0', 'verb="POST"} 9.0')
                          + 'licensectl_api_requests_total{code="200",verb="PUT"} 2.0\n')
    assert after.by_label("licensectl_api_requests_total", "verb") == {"GET": 15.0, "POST": 9.0, "PUT": 2.0}
    assert delta(after, before, "licensectl_api_requests_total") == 6.0
    assert delta(after, before, "licensectl_api_requests_total", verb="GET") == 0.0
    # Unchanged verbs are left out; a series that appeared counts from zero.
    assert delta_by_label(after, before, "licensectl_api_requests_total", label="verb") == {"POST": 4.0, "PUT": 2.0}
    assert delta_by_label(after, Scrape({}), "licensectl_replicas", label="state") == {
        "in_sync": 4999.0, "missing": 1.0}


# -- another version's package ------------------------------------------------------------------
def test_extract_package_gives_a_runnable_tree_of_that_revision(tmp_path: Path) -> None:
    tree = extract_package("HEAD", tmp_path)
    assert (tree / "licensectl" / "__main__.py").is_file()
    assert not (tree / "tests").exists()  # the package only, not the checkout


def test_extract_package_names_a_revision_it_cannot_find(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="git archive no-such-revision"):
        extract_package("no-such-revision", tmp_path)


def test_a_controller_from_another_tree_imports_only_that_tree(tmp_path: Path) -> None:
    """PYTHONPATH and the working directory both point at the tree (`python -m` puts the cwd first)."""
    c = ControllerProcess("kubeconfig", "ns", log_dir=tmp_path, tree=tmp_path / "old", tls_and_webhook=False)
    assert c.process.env["PYTHONPATH"] == str(tmp_path / "old") and c.process.cwd == tmp_path / "old"
    here = ControllerProcess("kubeconfig", "ns", log_dir=tmp_path, tls_and_webhook=False)
    assert here.process.env.get("PYTHONPATH") != str(tmp_path / "old") and here.process.cwd == REPO_ROOT


def test_the_in_memory_caches_judge_health_by_the_real_caches_rule() -> None:
    assert isinstance(MemoryCaches(), CacheHealth)
    caches = MemoryCaches()
    assert caches.core_synced() and caches.core_healthy() and caches.kubevirt_healthy()
    caches.claims.healthy = False  # a watch broke: still synced, no longer trusted for deletions
    assert caches.core_synced() and not caches.core_healthy()
    caches.replicas.synced = False
    assert not caches.core_synced()
    assert caches.vmis is not None
    caches.vmis.healthy = False
    assert not caches.kubevirt_healthy()
    assert not MemoryCaches(with_kubevirt=False).kubevirt_healthy()
