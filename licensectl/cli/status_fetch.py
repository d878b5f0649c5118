"""Reaching the running controller's own `GET /v1/status`, and turning its answer into `licensectl status` JSON.

Through the Kubernetes API service proxy (`services/proxy` on the metrics Service in licensectl's
namespace) or a direct `--url`. The apiserver picks a random ready endpoint per proxied request, so
with two replicas this asks again until the leader answers (only it holds guest states).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

import aiohttp

from licensectl import config
from licensectl.core.tokeninfo import Readability
from licensectl.kube.api import AnyClient, ApiException, as_kube
from licensectl.kube.errors import Forbidden, NotFound, ServiceUnavailable
from licensectl.kube.raw import checked

# The Service (manifests/base/services.yaml, the chart's templates/services.yaml) in front of every
# replica's internal listener, and its port name.
STATUS_SERVICE = "licensectl-metrics"
STATUS_SERVICE_PORT = "metrics"
STATUS_PATH = "/v1/status"
# Proxied requests land on a random ready endpoint: ask this often before settling for a standby.
LEADER_ATTEMPTS = 8
HTTP_TIMEOUT = 10.0


# Where a status answer came from (`view` in every `-o json|yaml` document). Only the leader with synced
# caches is authoritative; a standby (no guest reports; its rollout view waits on a webhook it does not
# probe) or a starting leader (`{"synced": false}`) says nothing final, so every reader keeps waiting.
# The offline recomputation is partial but complete as far as it goes (every object LISTed), and says
# so (docs/operations.md#status-from-the-controller).
VIEW_LEADER: Final = "leader"
VIEW_STANDBY: Final = "standby"
VIEW_UNSYNCED: Final = "unsynced"
VIEW_OFFLINE: Final = "offline"
DECISIVE_VIEWS: Final = frozenset({VIEW_LEADER, VIEW_OFFLINE})


def controller_view(doc: Mapping[str, Any]) -> str:
    """Which kind of answer a controller's /v1/status is: leader, standby or unsynced (pure). A part
    without `synced` (a controller of an older release) counts as synced."""
    if not doc.get("leader"):
        return VIEW_STANDBY
    if any((doc.get(part) or {}).get("synced") is False for part in ("replication", "rollout")):
        return VIEW_UNSYNCED
    return VIEW_LEADER


def view_marker(view: str, identity: str | None = None) -> str | None:
    """The line a reader prints above a non-authoritative answer; None for the leader's or offline."""
    who = identity or "?"
    if view == VIEW_STANDBY:
        return (f"STANDBY: {who} answered, not the leader; it holds no guest reports and its rollout view is "
                f"not the leader's: unknown")
    if view == VIEW_UNSYNCED:
        return f"UNSYNCED: {who} is starting and has not read the cluster yet: unknown"
    return None


class ControllerUnreachable(Exception):
    """The controller's /v1/status could not be read; the message says why (never a credential).
    `http_status`: what a direct --url answered instead (something listens there: a Service or a
    proxy in front of a replica that is being replaced)."""

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(message)
        self.http_status = http_status


@dataclass(frozen=True, slots=True)
class ControllerTarget:
    """Where the controller's internal listener is: a direct URL, or a Service behind the API proxy."""

    url: str | None = None
    namespace: str = "licensectl-system"
    service: str = STATUS_SERVICE
    port: str = STATUS_SERVICE_PORT

    def proxy_path(self, path: str = STATUS_PATH) -> str:
        """The apiserver path that proxies `path` to the Service (`services/proxy` subresource)."""
        return (f"/api/v1/namespaces/{quote(self.namespace, safe='')}/services/"
                f"{quote(self.service, safe='')}:{quote(self.port, safe='')}/proxy{path}")

    def describe(self) -> str:
        return self.url or f"service {self.namespace}/{self.service}:{self.port} via the API server proxy"


def _proxy_error(e: ApiException, target: ControllerTarget) -> str:
    if isinstance(e, Forbidden):
        return (f"HTTP 403 from the API server: this user may not get services/proxy in {target.namespace} "
                f"(see docs/operations.md#status-from-the-controller)")
    if isinstance(e, NotFound):
        return f"HTTP 404: no Service {target.namespace}/{target.service} with port {target.port}"
    if isinstance(e, ServiceUnavailable):
        return (f"HTTP 503: no ready endpoint of Service {target.namespace}/{target.service} answered (where "
                f"NetworkPolicies are enforced, the shipped policy blocks the API server's proxy route)")
    return f"HTTP {e.status} {e.reason} from {target.describe()}"


def url_failure(e: BaseException, url: str) -> str:
    """Why a direct --url gave no status, as a sentence (never an exception's class name alone)."""
    if isinstance(e, aiohttp.ClientConnectorError):
        errno = e.os_error.errno or 0
        why = os.strerror(errno) if errno > 0 else "its host name does not resolve" if errno < 0 else "no connection"
        return f"nothing answers at {url} ({why}); is the port-forward running and the URL right?"
    if isinstance(e, TimeoutError):
        return f"{url} did not answer within {HTTP_TIMEOUT:g} s"
    if isinstance(e, ValueError):
        return f"{url} did not answer with JSON: is it licensectl's internal listener (the metrics port)?"
    return f"{url} could not be read ({e or type(e).__name__})"


async def _get_once(api: AnyClient | None, target: ControllerTarget) -> dict[str, Any]:
    """One GET of /v1/status. An API server that cannot be reached at all is raised as is (no offline
    view can be computed either); a proxy that cannot reach the controller is ControllerUnreachable."""
    if target.url:
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http, \
                    http.get(target.url.rstrip("/") + STATUS_PATH) as resp:
                if resp.status != 200:
                    raise ControllerUnreachable(f"HTTP {resp.status} from {target.url}", http_status=resp.status)
                doc = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise ControllerUnreachable(url_failure(e, target.url)) from None
    else:
        if api is None:
            raise ControllerUnreachable("no API client for the service proxy")
        try:
            doc = await checked(as_kube(api).request("GET", target.proxy_path(), request_timeout=HTTP_TIMEOUT))
        except ApiException as e:
            raise ControllerUnreachable(_proxy_error(e, target)) from None
        except TimeoutError:
            raise ControllerUnreachable("the API server's proxy to the controller timed out (where "
                                        "NetworkPolicies are enforced, the shipped policy blocks this route)") from None
    if not isinstance(doc, dict) or "replication" not in doc:
        raise ControllerUnreachable(f"{target.describe()} did not answer with a licensectl status document")
    return doc


async def fetch_controller_status(api: AnyClient | None, target: ControllerTarget, *,
                                  attempts: int = LEADER_ATTEMPTS) -> dict[str, Any]:
    """The controller's own /v1/status, from the leader when one answers within `attempts` tries.

    A direct URL names one process: its answer is taken as is. Through the Service, a standby's
    answer (it has no guest reports) is only kept if no leader answers at all.
    """
    doc = await _get_once(api, target)
    tries = 1
    while not target.url and not doc.get("leader") and tries < attempts:
        again = await _get_once(api, target)
        tries += 1
        if again.get("leader"):
            return again
    return doc


def status_from_controller(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`licensectl status` JSON from the controller's /v1/status (pure): the same keys as the offline
    view, plus where it came from."""
    repl = doc.get("replication") or {}
    entitled = repl.get("entitled") or []
    per_class: dict[str, str] = {}
    counts: dict[str, int] = {}
    for e in entitled:
        per_class.setdefault(e["class"], e["source"])
        counts[e["class"]] = counts.get(e["class"], 0) + 1
    srcs = repl.get("sources") or {}
    classes = repl.get("classes") or {}  # absent from a controller of an older release
    guests = doc.get("guests")
    view = controller_view(doc)
    return {
        "from": "controller",
        "view": view,
        "authoritative": view == VIEW_LEADER,
        "controller": {"identity": doc.get("identity"), "leader": bool(doc.get("leader")),
                       "version": doc.get("version"), "ready": bool(doc.get("ready"))},
        "sources": [{
            "class": cls, "source": src, "valid": bool((srcs.get(cls) or {}).get("valid")),
            # An older controller sent the replica revision as "revision": not shown as a source revision.
            "source_revision": (srcs.get(cls) or {}).get("source_revision"),
            "token": (srcs.get(cls) or {}).get("token"),
            "problem": (srcs.get(cls) or {}).get("message") or token_problem((srcs.get(cls) or {}).get("token")),
            "entitled_namespaces": counts[cls],
            **class_fields(classes.get(cls)),
        } for cls, src in sorted(per_class.items())],
        "replicas": dict(repl.get("replica_counts") or {}),
        "tenant_problems": list(repl.get("tenant_problems") or []),
        "rollouts": dict((doc.get("rollout") or {}).get("sources") or {}),
        "rotations": {src: snake_rotation(r) for src, r in (doc.get("rotation") or {}).items()},
        "guests": guests if doc.get("leader") else None,
        # Delivery readiness (docs/operations.md#delivery-readiness); None from a release without it.
        "delivery": doc.get("delivery"),
    }


# A token that is not a JWT is delivered (`valid`, licensectl_source_valid 1: the source is usable) but
# most likely the wrong file: every view says so as a problem (docs/operations.md#opaque-tokens).
UNREADABLE_TOKEN_PROBLEM: Final = ("the token is not a JWT (probably the wrong file): delivered, but its expiry is "
                                   "unknown; if it is right, annotate the source licensectl.io/token-opaque=true")


def token_problem(token: object) -> str | None:
    """The problem a source's token readability is (None for a readable or a knowingly opaque token)."""
    return UNREADABLE_TOKEN_PROBLEM if token == Readability.UNREADABLE.value else None


def snake_rotation(rot: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A rotation as the CLI prints it: `waveStartedAt` from a controller of an earlier release is
    `wave_started_at` (one snake_case schema in every output)."""
    if rot is None:
        return None
    out = dict(rot)
    if "waveStartedAt" in out:
        out.setdefault("wave_started_at", out.pop("waveStartedAt"))
    return out


def class_fields(cls: Mapping[str, Any] | None) -> dict[str, Any]:
    """A source line's class fields: the FeatureType check and a held license change, if any."""
    c = cls or {}
    return {"feature_type_check": c.get("feature_type_check"), "feature_type_message": c.get("feature_type_message"),
            "license_change": c.get("license_change")}


def target_from(args: Any, settings: config.Settings) -> ControllerTarget:
    return ControllerTarget(url=getattr(args, "url", None) or None,
                            namespace=getattr(args, "namespace", None) or settings.namespace,
                            service=getattr(args, "service", None) or STATUS_SERVICE,
                            port=getattr(args, "service_port", None) or STATUS_SERVICE_PORT)


