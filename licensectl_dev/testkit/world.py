"""A hoster's world in a real cluster: controller and source namespaces, the license source Secret,
one vGPU class and a Cozystack tenant root, plus tenants under it.

One builder for integration tests (unique names, cleaned up by fixtures), fault scenarios (unique
names, `teardown()`), e2e fleets and benchmarks (fixed names at scale). Callers that need more
(VMs, decoy Secrets, per-suite checks) subclass `World` and pass `world_type`.
"""

from __future__ import annotations

import base64
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api

from licensectl.core.model import ANN_REVISION
from licensectl.core.render import replica_name
from licensectl_dev.devcluster import fleet

SOURCE_NAME = "nls-token"
TOKEN_KEY = "client_configuration_token.tok"

Key = tuple[str, str]
MakeNamespace = Callable[[str], Awaitable[str]]
Cleanup = Callable[[Callable[[], Awaitable[Any]]], None]


def unique(prefix: str) -> str:
    """A DNS- and Cozystack-safe name part (no dashes: tenant names cannot contain them)."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def token_for(days: float, **extra: Any) -> bytes:
    """A fake NLS token valid for `days`; a nonce makes every token distinct (secrecy scans need it)."""
    return fleet.fake_token(int(time.time() + 86400 * days), extra={**extra, "nonce": uuid.uuid4().hex})


@dataclass
class World:
    """One hoster: where the controller runs, the source Secret, the vGPU class, the tenant root.

    `root_name` is unique per test unless given, so concurrent or leftover trees of other tests
    never count as ours. `tokens[0]` is the token the source started with; `rotate()` appends.
    """

    api: ApiClient
    controller_ns: str
    source_ns: str
    root: dict[str, Any]
    root_name: str
    cls: str
    tokens: list[bytes] = field(default_factory=list)
    tenants: list[str] = field(default_factory=list)
    source_name: str = SOURCE_NAME

    @property
    def token(self) -> bytes:
        return self.tokens[0]

    @property
    def source(self) -> Key:
        return (self.source_ns, self.source_name)

    @property
    def replica(self) -> str:
        return replica_name(self.cls)

    async def tenant(self, parent: dict[str, Any] | None = None, vgpu: bool | None = True, *,
                     claim: bool = False) -> dict[str, Any]:
        """A child tenant (of the root unless `parent`), recorded in `tenants`; `claim` adds a GPUClaim."""
        parent = parent or self.root
        name = fleet.tenant_child_name(parent["metadata"]["name"], unique("t"), self.root_name)
        t = await fleet.create_tenant(self.api, name, parent=parent, vgpu=vgpu)
        self.tenants.append(name)
        if claim:
            await fleet.create_claim(self.api, name, "gpu", class_name=self.cls)
        return t

    async def rotate(self, n: int, *, days: float = 200) -> bytes:
        """The hoster replaces the token in the source Secret (a new revision)."""
        token = token_for(days, rotation=n)
        await self.put_token(token)
        return token

    async def put_token(self, token: bytes) -> None:
        """The hoster writes `token` (chosen by the caller, e.g. one its license server refuses) into
        the source Secret."""
        await CoreV1Api(self.api).patch_namespaced_secret(self.source_name, self.source_ns, {"data": {
            TOKEN_KEY: base64.b64encode(token).decode()}})
        self.tokens.append(token)

    @property
    def cli_env(self) -> dict[str, str]:
        """What the `licensectl` command needs to find this world's controller and tenant tree."""
        return {"LICENSECTL_NAMESPACE": self.controller_ns, "LICENSECTL_ROOT_TENANT": self.root_name}

    async def replica_annotations(self, ns: str) -> dict[str, str] | None:
        """The annotations of the replica in `ns` (None when there is no replica)."""
        try:
            s = await CoreV1Api(self.api).read_namespaced_secret(self.replica, ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(s.metadata.annotations or {})

    async def replica_revision(self, ns: str) -> str | None:
        """The revision annotation of the replica in `ns` (None when there is none)."""
        annotations = await self.replica_annotations(ns)
        return annotations.get(ANN_REVISION) if annotations is not None else None

    async def teardown(self, *extra_namespaces: str) -> None:
        """Delete everything the builder made (for callers without fixtures doing it)."""
        core = CoreV1Api(self.api)
        for ns in (self.root_name, self.controller_ns, self.source_ns, *extra_namespaces):
            with contextlib.suppress(ApiException):
                await core.delete_namespace(ns, propagation_policy="Background")
        with contextlib.suppress(ApiException):
            await fleet.delete_gpu_class(self.api, self.cls)


W = TypeVar("W", bound=World)


async def build_world(
    api: ApiClient, *, world_type: type[W], make_namespace: MakeNamespace | None = None,
    cleanup: Cleanup | None = None, controller_ns: str | None = None, source_ns: str | None = None,
    root_name: str | None = None, cls: str | None = None, token: bytes | None = None, token_days: float = 90,
    gridd_conf: str | None = None,
) -> W:
    """Create the hoster's objects and return the world (no tenants yet: `world.tenant()` adds them).

    Namespaces come from `make_namespace(prefix)` (a fixture that deletes them) or are created here
    with the given or unique names. With `cleanup`, the tenant tree and the class are registered for
    deletion; without it, call `world.teardown()`.
    """
    core: Any = CoreV1Api(api)  # the client accepts plain dict bodies; its stubs say model objects

    async def namespace(name: str | None, prefix: str) -> str:
        if name is None and make_namespace is not None:
            return await make_namespace(prefix)
        name = name or unique(prefix)
        await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        return name

    ctl = await namespace(controller_ns, "ctl")
    src = await namespace(source_ns, "src")
    root_name = root_name or f"tenant-{unique('root')}"
    root = await fleet.create_tenant(api, root_name, vgpu=True)
    if cleanup is not None:
        async def drop_tree() -> None:
            await core.delete_namespace(root_name, propagation_policy="Background")

        cleanup(drop_tree)
    cls = cls or unique("vws")
    token = token if token is not None else token_for(token_days)
    await fleet.put_source_secret(api, src, SOURCE_NAME, token=token, gridd_conf=gridd_conf)
    await fleet.create_gpu_class(api, cls, mode="vgpu", secret=(src, SOURCE_NAME), feature_type=1)
    if cleanup is not None:
        cleanup(lambda: fleet.delete_gpu_class(api, cls))
    return world_type(api, ctl, src, root, root_name, cls, tokens=[token])
