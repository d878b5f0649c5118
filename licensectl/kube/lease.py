"""Leader election on a coordination.k8s.io/v1 Lease, after client-go's leaderelection package.

Expiry is judged by the *local* time at which we last saw the lease record change (as client-go
does), so clock skew between replicas cannot make two leaders. Updates carry resourceVersion, so two
candidates racing for an expired lease cannot both win. On shutdown the leader releases the lease
(empty holder) so a standby takes over at once instead of waiting for expiry.

The elector talks to a `LeaseBackend` (licensectl.core.ports): `ApiLeaseBackend` here for the cluster,
an in-memory one in the test kit.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from licensectl import logs
from licensectl.core.ports import LeaseBackend, MonotonicClock, WallClock
from licensectl.core.timecodec import format_micro_time
from licensectl.kube.api import AnyClient, ApiException, CoordinationV1Api, absent_on_404
from licensectl.kube.errors import Conflict
from licensectl.kube.raw import RawApi

log = logs.get(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class ApiLeaseBackend:
    """The Lease API through kubernetes-asyncio: 404 reads as absent, 409 as a lost race."""

    def __init__(self, api_client: AnyClient) -> None:
        self._api: Any = RawApi(CoordinationV1Api(api_client))

    async def read(self, namespace: str, name: str) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = await absent_on_404(self._api.read_namespaced_lease(name, namespace))
        return obj

    async def create(self, namespace: str, body: dict[str, Any]) -> bool:
        try:
            await self._api.create_namespaced_lease(namespace, body)
            return True
        except Conflict:
            return False

    async def replace(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        try:
            await self._api.replace_namespaced_lease(name, namespace, body)
            return True
        except Conflict:
            return False


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LeaderElector:
    def __init__(self, backend: LeaseBackend, cfg: LeaseConfig, *,
                 on_change: Callable[[bool], None] | None = None, wall: WallClock = _utc_now,
                 monotonic: MonotonicClock = time.monotonic) -> None:
        """`wall` stamps acquire/renew times (informational); `monotonic` judges expiry and deadlines."""
        self._backend = backend
        self._wall = wall
        self._monotonic = monotonic
        self.cfg = cfg
        self._on_change = on_change
        self.is_leader = False
        self._observed_record: tuple[Any, ...] | None = None
        self._observed_at = 0.0  # monotonic time we last saw the record change
        self._last_renew = 0.0
        self.elected = asyncio.Event()

    def _set_leader(self, value: bool) -> None:
        if value != self.is_leader:
            self.is_leader = value
            log.info("leadership changed", leader=value, identity=self.cfg.identity, lease=self.cfg.name)
            if value:
                self.elected.set()
            else:
                self.elected.clear()
            if self._on_change:
                self._on_change(value)

    async def _read(self) -> dict[str, Any] | None:
        return await self._backend.read(self.cfg.namespace, self.cfg.name)

    def _spec(self, transitions: int, acquire: str | None) -> dict[str, Any]:
        now = format_micro_time(self._wall())
        return {"holderIdentity": self.cfg.identity, "leaseDurationSeconds": max(1, int(self.cfg.lease_duration)),
                "acquireTime": acquire or now, "renewTime": now, "leaseTransitions": transitions}

    async def try_acquire_or_renew(self) -> bool:
        """One round of client-go's tryAcquireOrRenew."""
        obj = await self._read()
        if obj is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace},
                    "spec": self._spec(0, None)}
            if not await self._backend.create(self.cfg.namespace, body):
                return False
            self._observed_at = self._monotonic()
            return True
        spec = obj.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"))
        if record != self._observed_record:
            self._observed_record = record
            self._observed_at = self._monotonic()
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.cfg.lease_duration)
        mine = holder == self.cfg.identity
        expired = self._monotonic() > self._observed_at + duration
        if holder and not mine and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if mine else 1)
        obj["spec"] = self._spec(transitions, spec.get("acquireTime") if mine else None)
        if not await self._backend.replace(self.cfg.namespace, self.cfg.name, obj):
            return False
        self._observed_record = None
        self._observed_at = self._monotonic()
        return True

    async def run(self) -> None:
        """Acquire, then renew until cancelled or the renew deadline passes (then start over)."""
        tracebacks = logs.TracebackLimit()
        try:
            while True:
                ok = False
                try:
                    ok = await asyncio.wait_for(self.try_acquire_or_renew(), timeout=self.cfg.renew_deadline)
                except (ApiException, OSError, TimeoutError) as e:
                    log.warning("lease round failed", error=type(e).__name__)
                except Exception as e:  # a bug, not the apiserver: say where, now and then
                    log.warning("lease round failed", **logs.failure_fields(e, traceback=tracebacks.due("lease", e)))
                now = self._monotonic()
                if ok:
                    self._last_renew = now
                    self._set_leader(True)
                elif self.is_leader and now - self._last_renew > self.cfg.renew_deadline:
                    self._set_leader(False)
                elif self.is_leader and not ok:
                    # Someone else holds it (we lost a race or were replaced): stop writing now.
                    obj_holder = await self._holder()
                    if obj_holder is not None and obj_holder != self.cfg.identity:
                        self._set_leader(False)
                await asyncio.sleep(self.cfg.retry_period)
        finally:
            if self.is_leader:
                self._set_leader(False)

    async def _holder(self) -> str | None:
        try:
            obj = await self._read()
        except Exception:
            return None
        return ((obj or {}).get("spec") or {}).get("holderIdentity")

    async def release(self) -> None:
        """Give the lease up so a standby does not wait for expiry (client-go ReleaseOnCancel).

        A renew cancelled on its way out can still land after our read, so a conflict is re-read and
        retried a few times while the lease is still ours; once someone else holds it, it is theirs.
        """
        try:
            for _ in range(3):
                obj = await self._read()
                if obj is None or (obj.get("spec") or {}).get("holderIdentity") != self.cfg.identity:
                    return
                obj["spec"]["holderIdentity"] = ""
                obj["spec"]["leaseDurationSeconds"] = 1
                obj["spec"]["renewTime"] = format_micro_time(self._wall())
                if await self._backend.replace(self.cfg.namespace, self.cfg.name, obj):
                    log.info("lease released", lease=self.cfg.name, identity=self.cfg.identity)
                    return
            log.warning("lease release failed", error="conflict")
        except Exception as e:
            log.warning("lease release failed", error=type(e).__name__)
