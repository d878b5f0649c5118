"""Helpers for integration tests that run licensectl in-process against the real apiserver."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api

from licensectl import config
from licensectl.app import App
from licensectl.devcluster import fleet

T = TypeVar("T")


def unique(prefix: str) -> str:
    """A DNS- and Cozystack-safe name part (no dashes: tenant names cannot contain them)."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def settings_for(kubeconfig: Path, namespace: str, **overrides: Any) -> config.Settings:
    base = config.Settings(kubeconfig=str(kubeconfig), namespace=namespace, metrics_address="127.0.0.1:0",
                           reports_address="127.0.0.1:0", resync_seconds=30.0, settle_seconds=0.0,
                           log_level="warning", report_url="http://127.0.0.1:1/v1/reports")
    return dataclasses.replace(base, **overrides)


@contextlib.asynccontextmanager
async def running_app(settings: config.Settings, **kw: Any) -> AsyncIterator[App]:
    app = App(settings, **kw)
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


async def eventually(check: Callable[[], Awaitable[T]] | Callable[[], T], timeout: float = 20.0,
                     interval: float = 0.1, what: str = "condition") -> T:
    """Poll a check (sync or async) until it returns a truthy value; fail with the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        res = check()
        last = await res if asyncio.iscoroutine(res) else res
        if last:
            return last  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value: {last!r}")
        await asyncio.sleep(interval)


async def read_secret(api: ApiClient, namespace: str, name: str) -> Any | None:
    try:
        return await CoreV1Api(api).read_namespaced_secret(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def secret_bytes(secret: Any, key: str) -> bytes:
    return base64.b64decode((secret.data or {})[key])


def metric(app: App, name: str, labels: dict[str, str] | None = None) -> float | None:
    """Current value of one series from the app's registry (None when absent)."""
    want = labels or {}
    for fam in app.metrics.registry.collect():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in want.items()):
                return float(s.value)
    return None


async def events_for(api: ApiClient, namespace: str, name: str) -> list[Any]:
    ev = await CoreV1Api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return list(ev.items)


async def wait_event(api: ApiClient, namespace: str, name: str, *reasons: str, timeout: float = 20.0) -> list[Any]:
    """Events are written after the action they describe: wait until all `reasons` are there."""
    async def check() -> list[Any] | None:
        evs = await events_for(api, namespace, name)
        return evs if set(reasons) <= {e.reason for e in evs} else None

    return await eventually(check, timeout=timeout, what=f"events {reasons} on {namespace}/{name}")


@dataclasses.dataclass
class World:
    """One test's hoster: a controller namespace, a license source Secret, a unique tenant root
    (so concurrent or leftover trees of other tests never count as ours) and a vGPU class."""

    api: ApiClient
    controller_ns: str
    source_ns: str
    root: dict[str, Any]
    root_name: str
    cls: str
    token: bytes

    async def tenant(self, parent: dict[str, Any] | None = None, vgpu: bool | None = True) -> dict[str, Any]:
        parent = parent or self.root
        name = fleet.tenant_child_name(parent["metadata"]["name"], unique("t"), self.root_name)
        return await fleet.create_tenant(self.api, name, parent=parent, vgpu=vgpu)


async def make_world(api: ApiClient, namespace_factory: Any, cleanup: Any, *, gridd_conf: str | None = None,
                     token_days: int = 90) -> World:
    controller_ns = await namespace_factory("ctl")
    source_ns = await namespace_factory("src")
    root_name = f"tenant-{unique('root')}"
    root = await fleet.create_tenant(api, root_name, vgpu=True)

    async def drop_tree() -> None:
        await CoreV1Api(api).delete_namespace(root_name, propagation_policy="Background")

    cleanup(drop_tree)
    cls = unique("vws")
    token = fleet.fake_token(int(time.time()) + 86400 * token_days)
    await fleet.put_source_secret(api, source_ns, "nls-token", token, gridd_conf=gridd_conf)
    await fleet.create_gpu_class(api, cls, mode="vgpu", secret=(source_ns, "nls-token"), feature_type=1)
    cleanup(lambda: fleet.delete_gpu_class(api, cls))
    return World(api, controller_ns, source_ns, root, root_name, cls, token)
