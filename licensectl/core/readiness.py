"""What /readyz and /livez answer (docs/design.md#readiness), decided from plain facts.

A replica serves admission (the webhook Service selects every ready pod) and, as leader, reports.
Ready means "can answer admission correctly now": started, not stopping, serving TLS, its core caches
listed once and a replication plan to decide delivery from. A watch that is merely reconnecting does
not make it unready: during an apiserver blip every replica's watches reconnect at once, and dropping
every endpoint would turn the blip into VMIs admitted without their license volume. Only a cache the
apiserver has been silent about for longer than STALE_LIMIT_SECONDS (far beyond any healthy quiet
watch) takes a replica out. Live means "the process works": its loops and listeners run; the
apiserver's health never enters, or an outage would restart every replica at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# A healthy quiet watch ends at its server-side timeout (at most 2 x 300 s) and reopens, so a cache
# hears from the apiserver at least every 10 minutes; 15 minutes of silence is an apiserver (or a
# network path) that is gone for this replica, not a blip.
STALE_LIMIT_SECONDS: Final = 900.0


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reason: str  # "ok", or why not: the /readyz body and a log line


def readiness(*, stopping: bool, caches_synced: bool, admission_decidable: bool, tls_ready: bool,
              stale_seconds: float | None, stale_limit: float = STALE_LIMIT_SECONDS) -> Readiness:
    """Ready to be an admission (and reports) endpoint; the first failing condition is the reason."""
    if stopping:
        return Readiness(False, "stopping")
    if not caches_synced:
        return Readiness(False, "caches not synced")
    if not tls_ready:
        return Readiness(False, "serving certificate not loaded")
    if not admission_decidable:
        return Readiness(False, "no replication plan yet: admission cannot be decided")
    if stale_seconds is not None and stale_seconds > stale_limit:
        return Readiness(False, f"caches have not heard from the apiserver for {stale_seconds:.0f} s")
    return Readiness(True, "ok")


def liveness(*, stopping: bool, loops_healthy: bool) -> Readiness:
    """Alive: the reconcile loops and listeners run (a crashed loop is restarted by the kubelet)."""
    if not loops_healthy and not stopping:
        return Readiness(False, "a reconcile loop or listener stopped")
    return Readiness(True, "ok")
