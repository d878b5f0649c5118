"""The allocation report behind /debug/memory: off unless tracing, grouped by line and file, paths short."""

from __future__ import annotations

import tracemalloc
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from licensectl.core.readiness import Readiness
from licensectl.metrics import Metrics
from licensectl.serve.http import make_internal_app
from licensectl.serve.memory_report import current_report, short_path, top_sites


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    ok = Readiness(True, "ok")
    c: TestClient[Any, Any] = TestClient(TestServer(make_internal_app(
        Metrics(), ready=lambda: ok, live=lambda: ok, status=dict)))
    await c.start_server()
    try:
        yield c
    finally:
        await c.close()


@pytest.mark.parametrize(("path", "short"), [
    ("/usr/lib/python3/dist-packages/yaml/reader.py", "yaml/reader.py"),
    ("/app/.venv/lib/python3.11/site-packages/aiohttp/streams.py", "aiohttp/streams.py"),
    ("/usr/local/lib/python3.11/json/decoder.py", "json/decoder.py"),
    ("/src/licensectl/kube/projections.py", "licensectl/kube/projections.py"),
    ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap>"),
])
def test_paths_name_the_code_not_the_machine(path: str, short: str) -> None:
    assert short_path(path) == short


def test_top_sites_are_the_biggest_first_and_at_most_the_limit() -> None:
    sites = top_sites([("a", 10, 1), ("b", 30, 2), ("c", 20, 3)], 2)
    assert [(s.where, s.size, s.count) for s in sites] == [("b", 30, 2), ("c", 20, 3)]


async def test_the_endpoint_says_how_to_turn_tracing_on_when_it_is_off(client: TestClient[Any, Any]) -> None:
    assert not tracemalloc.is_tracing()
    r = await client.get("/debug/memory")
    assert r.status == 404 and "PYTHONTRACEMALLOC=1" in await r.text()


async def test_the_endpoint_names_the_line_that_holds_the_memory(client: TestClient[Any, Any]) -> None:
    tracemalloc.start(1)
    try:
        held = [bytearray(1024) for _ in range(2048)]  # 2 MiB held by this line
        r = await client.get("/debug/memory")
        text = await r.text()
        rep = current_report(limit=5)
    finally:
        tracemalloc.stop()
    assert r.status == 200 and text.startswith("traced now ")
    assert rep is not None and rep.traced >= 2 * 1024 * 1024
    mine = [s for s in rep.by_line if "test_memory_report.py:" in s.where]
    assert mine and mine[0].size >= 2 * 1024 * 1024 and mine[0].count >= 2048
    assert "test_memory_report.py" in text
    del held
