"""/readyz and /livez: what they answer and why (docs/design.md#readiness)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from licensectl.core.readiness import STALE_LIMIT_SECONDS, Readiness, liveness, readiness
from licensectl.metrics import Metrics
from licensectl.serve.http import make_internal_app

OK = dict(stopping=False, caches_synced=True, admission_decidable=True, tls_ready=True, stale_seconds=5.0)


@pytest.mark.parametrize(
    ("change", "ready", "reason"),
    [
        ({}, True, "ok"),
        ({"stale_seconds": None}, True, "ok"),  # no age known yet is not stale
        # A watch reconnecting during an apiserver blip keeps the endpoint: only long silence removes it.
        ({"stale_seconds": 60.0}, True, "ok"),
        ({"stale_seconds": STALE_LIMIT_SECONDS}, True, "ok"),
        ({"stale_seconds": STALE_LIMIT_SECONDS + 1}, False, "caches have not heard from the apiserver for 901 s"),
        ({"stopping": True}, False, "stopping"),
        ({"caches_synced": False}, False, "caches not synced"),
        ({"tls_ready": False}, False, "serving certificate not loaded"),
        ({"admission_decidable": False}, False, "no replication plan yet: admission cannot be decided"),
        ({"stopping": True, "caches_synced": False}, False, "stopping"),  # the first failing condition
    ],
)
def test_readiness(change: dict[str, Any], ready: bool, reason: str) -> None:
    assert readiness(**{**OK, **change}) == Readiness(ready, reason)


@pytest.mark.parametrize(
    ("stopping", "loops", "live"),
    [(False, True, True), (False, False, False), (True, False, True), (True, True, True)],
)
def test_liveness_never_depends_on_the_apiserver(stopping: bool, loops: bool, live: bool) -> None:
    assert liveness(stopping=stopping, loops_healthy=loops).ready is live


@pytest.fixture
async def client() -> AsyncIterator[tuple[TestClient[Any, Any], dict[str, Readiness]]]:
    state = {"ready": Readiness(True, "ok"), "live": Readiness(True, "ok")}
    app = make_internal_app(Metrics(), ready=lambda: state["ready"], live=lambda: state["live"], status=dict)
    c: TestClient[Any, Any] = TestClient(TestServer(app))
    await c.start_server()
    try:
        yield c, state
    finally:
        await c.close()


async def test_endpoints_answer_with_the_reason(client: tuple[TestClient[Any, Any], dict[str, Readiness]]) -> None:
    c, state = client
    for path in ("/readyz", "/livez", "/healthz"):
        r = await c.get(path)
        assert (r.status, await r.text()) == (200, "ok\n")
    state["ready"] = Readiness(False, "caches not synced")
    r = await c.get("/readyz")
    assert (r.status, await r.text()) == (503, "caches not synced\n")
    assert (await c.get("/livez")).status == 200  # unready is not dead
    state["live"] = Readiness(False, "a reconcile loop or listener stopped")
    for path in ("/livez", "/healthz"):
        r = await c.get(path)
        assert (r.status, await r.text()) == (503, "a reconcile loop or listener stopped\n")
