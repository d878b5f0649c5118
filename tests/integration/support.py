"""Helpers for integration tests that run licensectl in-process against the real apiserver."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api

from licensectl import config
from licensectl.app import App
from licensectl_dev.devcluster import webhook as webhook_registration
from licensectl_dev.devcluster.guest_sim import GuestProfile, SimulatedGuest
from licensectl_dev.devcluster.kubeapi import api_client_from_kubeconfig
from licensectl_dev.testkit.poll import eventually as eventually
from licensectl_dev.testkit.world import World, build_world
from licensectl_dev.testkit.world import unique as unique


def settings_for(kubeconfig: Path, namespace: str, **overrides: Any) -> config.Settings:
    """Loopback listeners, no settle time, and the one-step rotation (no canary, one 100% step): the
    rollout engine's own tests; the safe-rotation tests opt in to a canary and steps."""
    base = config.Settings(canary="0", rollout_steps="100%",
                           kubeconfig=str(kubeconfig), namespace=namespace, metrics_address="127.0.0.1:0",
                           reports_address="127.0.0.1:0", resync_seconds=30.0, settle_seconds=0.0,
                           log_level="warning", report_url="http://127.0.0.1:1/v1/reports",
                           webhook_address="127.0.0.1:0", tls_hosts="127.0.0.1",
                           webhook_configuration=f"licensectl-{namespace}")
    return dataclasses.replace(base, **overrides)


def world_settings(world: World, kubeconfig: Path, **overrides: Any) -> config.Settings:
    """`settings_for` a controller of `world`: its namespace and its tenant root."""
    return settings_for(kubeconfig, world.controller_ns, root_tenant=world.root_name, **overrides)


@contextlib.asynccontextmanager
async def running_app(settings: config.Settings, *, register_webhook: bool = True, **kw: Any) -> AsyncIterator[App]:
    """An App that the apiserver calls for VMI admission, as in a cluster: its webhook is
    registered (the shipped configuration, loopback URL, the App's own CA) while it runs."""
    app = App(settings, **kw)
    await app.start()
    registered = register_webhook and app.webhook_port > 0
    admin = await api_client_from_kubeconfig(Path(settings.kubeconfig)) if registered else None
    try:
        if admin is not None:
            await webhook_registration.register(admin, name=settings.webhook_configuration,
                                                port=app.webhook_port, ca_bundle=app.tls.ca_bundle)
        yield app
    finally:
        if admin is not None:
            await webhook_registration.unregister(admin, settings.webhook_configuration)
            await admin.close()
        await app.stop()


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


async def make_world(api: ApiClient, namespace_factory: Any, cleanup: Any, *, gridd_conf: str | None = None,
                     token_days: int = 90) -> World:
    """A world whose namespaces, tenant tree and class the test's fixtures delete."""
    return await build_world(api, world_type=World, make_namespace=namespace_factory, cleanup=cleanup,
                             gridd_conf=gridd_conf, token_days=token_days)


async def boot_guests(app: App, api: ApiClient, namespace: str, profiles: dict[str, GuestProfile], *,
                      report_url: str, into: list[SimulatedGuest]) -> None:
    """Wait until each named VMI is Ready with a firmware UUID in the app's cache, then boot its simulated
    guest (the real install unit) and run one probe; `into` collects the guests for cleanup."""

    async def vmi_ready(name: str) -> bool:
        return any(v.namespace == namespace and v.name == name and v.ready and v.firmware_uuid
                   for v in (app.caches.vmis.cache.values() if app.caches.vmis else []))

    for name, profile in profiles.items():
        await eventually(lambda name=name: vmi_ready(name), what=f"{name} ready")
        g = SimulatedGuest(namespace, name, profile)
        into.append(g)
        assert await g.boot(api, report_url=report_url) == 0, g.last_stderr
        assert await g.probe() == 0, g.last_stderr
