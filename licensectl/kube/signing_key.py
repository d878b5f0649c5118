"""The report signing keys, kept in a Secret in licensectl's own namespace.

Per-namespace report credentials are HMACs of the current key (credentials.py), so the ring is the one
thing that must survive restarts and be shared by every replica: it lives in the cluster, is created
once by the leader when absent, and is never regenerated over an existing (even unreadable) Secret.
Older keys leave it only when no running VMI may hold them (`prune`, docs/design.md#key-ring).
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from typing import Any

from licensectl import logs
from licensectl.core.credentials import (
    Holders,
    KeyRing,
    keyring_from_secret_data,
    keyring_to_secret_data,
    new_signing_key,
)
from licensectl.core.model import MANAGED_BY_LABEL, MANAGED_BY_VALUE
from licensectl.kube.api import AnyClient, CoreV1Api, absent_on_404
from licensectl.kube.errors import Conflict
from licensectl.kube.raw import RawApi

log = logs.get(__name__)

SECRET_NAME = "licensectl-report-signing-key"


class SigningKeyStore:
    def __init__(self, api_client: AnyClient, namespace: str, *, grace: dt.timedelta,
                 clock: Callable[[], dt.datetime] | None = None, dry_run: bool = False) -> None:
        self._api: Any = RawApi(CoreV1Api(api_client))
        self.namespace = namespace
        self.grace = grace
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self.dry_run = dry_run
        self.keyring: KeyRing | None = None
        self.error: str | None = None

    async def _read(self) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = await absent_on_404(
            self._api.read_namespaced_secret(SECRET_NAME, self.namespace))
        return obj

    async def refresh(self, *, create: bool) -> KeyRing | None:
        """Load the key; create it when absent and `create` (the leader). Keeps the last good key on errors."""
        obj = await self._read()
        if obj is None:
            if not create or self.dry_run:
                return self.keyring
            ring = KeyRing(current=new_signing_key())
            body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": SECRET_NAME, "namespace": self.namespace,
                                 "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
                    "data": {k: base64.b64encode(v).decode() for k, v in keyring_to_secret_data(ring).items()}}
            try:
                await self._api.create_namespaced_secret(self.namespace, body)
                log.info("report signing key created", secret=f"{self.namespace}/{SECRET_NAME}")
            except Conflict:
                pass  # another replica created it first: read theirs
            obj = await self._read()
            if obj is None:
                return self.keyring
        try:
            data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
            self.keyring = keyring_from_secret_data(data)
            self.error = None
        except (ValueError, TypeError) as e:
            self.error = str(e)  # messages name keys, never bytes
            log.error("report signing key unusable", secret=f"{self.namespace}/{SECRET_NAME}", error=self.error)
        return self.keyring

    async def _write(self, change: Callable[[KeyRing], KeyRing]) -> tuple[KeyRing, KeyRing]:
        """Read, change and replace the Secret (its resourceVersion guards against a concurrent writer)."""
        obj = await self._read()
        if obj is None:
            raise RuntimeError(f"{self.namespace}/{SECRET_NAME} does not exist yet")
        data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        before = keyring_from_secret_data(data)
        ring = change(before)
        if ring != before:
            obj["data"] = {k: base64.b64encode(v).decode() for k, v in keyring_to_secret_data(ring).items()}
            await self._api.replace_namespaced_secret(SECRET_NAME, self.namespace, obj)
        self.keyring = ring
        return before, ring

    async def rotate(self, holders: Holders) -> tuple[KeyRing, KeyRing]:
        """New current key; older keys stay while `holders` (running VMIs) may hold them (no VM restart).

        Returns the ring before and after. Raises `credentials.RingFull` when the ring is at its bound and
        every older key is held."""
        return await self._write(lambda r: r.rotate(new_signing_key(), self.clock(), holders, retention=self.grace))

    async def revoke_older(self) -> tuple[KeyRing, KeyRing]:
        """New current key and no older one: every guest still on an older credential stops reporting."""
        return await self._write(lambda r: r.revoke_older(new_signing_key(), self.clock()))

    def next_prune_at(self, holders: Holders) -> dt.datetime | None:
        """When a pass should come back to retire an unheld older key (the loop's wakeup)."""
        ring = self.keyring
        return None if ring is None or self.dry_run else ring.next_prune_at(holders, min_retention=self.grace)

    async def prune(self, holders: Holders) -> KeyRing | None:
        """Drop older keys no running VMI may hold (the leader, each pass; a no-op write is skipped)."""
        ring = self.keyring
        if ring is None or self.dry_run or ring.prune(holders, self.clock(), min_retention=self.grace) == ring:
            return ring
        before, after = await self._write(lambda r: r.prune(holders, self.clock(), min_retention=self.grace))
        dropped = [k for k in before.ids if k not in after.ids]
        if dropped:
            log.info("signing keys retired: no running VMI holds them", keys=dropped)
        return after
