"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from kubernetes_asyncio.client import ApiClient

from licensectl_dev.devcluster.controlplane import ControlPlane

from ..conftest import KubevirtFactory
from .support import Rig, make_fleet


@pytest_asyncio.fixture(loop_scope="session")
async def rig(api_client: ApiClient, control_plane: ControlPlane, kubevirt_factory: KubevirtFactory,
              namespace_factory: Any, cleanup: Any, tmp_path: Path) -> AsyncIterator[Rig]:
    """A fresh fleet, the simulator (VMIs Ready 1 s after start) and the per-pod plumbing, started."""
    kv = await kubevirt_factory(ready_delay=1.0)
    fl = await make_fleet(api_client, namespace_factory, cleanup)
    r = Rig(api_client, control_plane, kv, fl, tmp_path)
    await r.start()
    try:
        yield r
    finally:
        await r.stop()
