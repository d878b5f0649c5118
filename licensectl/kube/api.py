"""The controller's Kubernetes HTTP client: the handful of verbs it uses, raw JSON, one aiohttp session.

Why not kubernetes-asyncio's generated client: importing any part of it loads every generated API and
model module (~860 of them, about 38 MiB of RSS, measured: see benchmarks/README.md#memory), and the
controller only ever asked it for raw responses (`_preload_content=False`). The classes here keep
the generated method names and argument order for exactly the calls licensectl makes, so a call site
reads the same and the informers' list functions stay plain callables; every method returns the
aiohttp response, which `raw.checked` or the informer reads and releases.

A kubernetes-asyncio `ApiClient` (what the test kit and the dev cluster hold) is accepted too:
`as_kube` borrows its session, host and credentials without importing the library.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import aiohttp

from licensectl.kube import jsoncodec
from licensectl.kube.errors import ApiException, NotFound

__all__ = ["ApiException"]  # re-exported: call sites import it from here or from kube.errors

T = TypeVar("T")

AuthHeaders = Callable[[], Awaitable[Mapping[str, str]]]
Timeout = float | tuple[float, float] | aiohttp.ClientTimeout | None

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# Python keyword arguments (the generated client's names) -> query parameter names.
QUERY_NAMES: Mapping[str, str] = {
    "label_selector": "labelSelector",
    "field_selector": "fieldSelector",
    "resource_version": "resourceVersion",
    "resource_version_match": "resourceVersionMatch",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "timeout_seconds": "timeoutSeconds",
    "send_initial_events": "sendInitialEvents",
    "_continue": "continue",
    "limit": "limit",
    "watch": "watch",
    "dry_run": "dryRun",
    "field_manager": "fieldManager",
    "grace_period_seconds": "gracePeriodSeconds",
    "propagation_policy": "propagationPolicy",
}
# Options of the request itself, not of the query.
REQUEST_OPTIONS = frozenset({"_preload_content", "_request_timeout", "_content_type"})


async def absent_on_404(call: Awaitable[T]) -> T | None:
    """Await `call`; None when the apiserver answers 404, meaning the object is not there.

    For reads, deletes and patches whose caller treats "not found" as a state, not a failure; any
    other error is raised. Only for calls that never return None themselves (a `RawApi` call returns
    a dict), so None means exactly "absent". Where 404 means something else (the namespace is gone,
    a subresource is missing, the object changed) the call site keeps its own `except`.
    """
    try:
        return await call
    except NotFound:
        return None


def query_of(kwargs: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Query parameters from generated-client keyword arguments; None values are left out."""
    out: list[tuple[str, str]] = []
    for key, value in kwargs.items():
        if key in REQUEST_OPTIONS or value is None or key == "body":
            continue
        name = QUERY_NAMES.get(key)
        if name is None:
            raise TypeError(f"unsupported query argument {key!r}")
        out.append((name, ("true" if value else "false") if isinstance(value, bool) else str(value)))
    return out


def client_timeout(value: Timeout) -> aiohttp.ClientTimeout:
    """The generated client's `_request_timeout` forms: total seconds, (connect, read), or a ClientTimeout."""
    if isinstance(value, aiohttp.ClientTimeout):
        return value
    if isinstance(value, tuple):
        return aiohttp.ClientTimeout(connect=value[0], sock_connect=value[0], sock_read=value[1])
    if value:
        return aiohttp.ClientTimeout(total=float(value))
    return aiohttp.ClientTimeout()


def patch_content_type(body: Any, *, strategic: bool) -> str:
    """What the generated client sends for a PATCH: JSON patch for a list, else strategic merge
    (built-in types) or merge patch (custom resources, which have no strategic merge)."""
    if isinstance(body, list):
        return JSON_PATCH
    return STRATEGIC_MERGE_PATCH if strategic else MERGE_PATCH


def _seg(value: str) -> str:
    return quote(str(value), safe="")


class OutcomeUnknown(aiohttp.ClientError):
    """The connection broke after a request that must not be replayed went out: it may or may not
    have taken effect, and only a fresh read of the cluster can tell."""


async def never_replay(req: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
    """Client middleware for a request whose replay would act on something else.

    aiohttp sends a PUT or DELETE again, once, when its connection breaks before the answer, even if
    the server already acted on it (RFC 9110 calls both methods idempotent). Go's net/http does not
    replay them, and neither may we for the VM restart subresource: it stops whatever VMI runs *now*,
    so a replay restarts the VMI the first call created. An error aiohttp does not retry stops that.
    A request that never reached the server (no connection) is not touched."""
    try:
        return await handler(req)
    except aiohttp.ClientConnectorError:
        raise
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        raise OutcomeUnknown(f"{req.method} {req.url.path}: connection lost before the answer "
                             f"({type(e).__name__})") from e


class KubeClient:
    """One apiserver endpoint: base URL, an aiohttp session (TLS context on its connector) and a
    source of auth headers (a bearer token that may rotate). Closes the session only if it owns it."""

    def __init__(self, *, host: str, session: aiohttp.ClientSession, auth: AuthHeaders | None = None,
                 server_hostname: str | None = None, proxy: str | None = None, owns_session: bool = True) -> None:
        self.host = host.rstrip("/")
        self.session = session
        self._auth = auth
        self._server_hostname = server_hostname
        self._proxy = proxy
        self._owns_session = owns_session

    async def request(self, method: str, path: str, *, query: Sequence[tuple[str, str]] = (), body: Any = None,
                      content_type: str = JSON, request_timeout: Timeout = None,
                      replayable: bool = True) -> aiohttp.ClientResponse:
        """Send one request; the caller reads and releases the response (non-2xx is not raised here).

        `replayable=False` for a request aiohttp must not send twice (`never_replay`): a broken
        connection then raises OutcomeUnknown."""
        headers = {"Accept": JSON, "Content-Type": content_type}
        if self._auth is not None:
            headers.update(await self._auth())
        url = self.host + path
        if query:
            url += "?" + urlencode(query)
        data = None if body is None else jsoncodec.dumps(body)
        kwargs: dict[str, Any] = {}
        if self._server_hostname:
            kwargs["server_hostname"] = self._server_hostname
        if self._proxy:
            kwargs["proxy"] = self._proxy
        if not replayable:
            kwargs["middlewares"] = (never_replay,)
        try:
            return await self.session.request(method, url, data=data, headers=headers,
                                              timeout=client_timeout(request_timeout), **kwargs)
        except aiohttp.InvalidURL as e:
            raise ApiException(0, f"invalid URL: {type(e).__name__}") from None

    async def close(self) -> None:
        if self._owns_session and not self.session.closed:
            await self.session.close()


def library_auth(cfg: Any) -> AuthHeaders:
    """Auth headers from a kubernetes-asyncio Configuration: its bearer token, refreshed by the
    library's own hooks (exec plugins, rotating token files)."""

    async def auth() -> Mapping[str, str]:
        setting = (await cfg.auth_settings()).get("BearerToken")
        return {setting["key"]: setting["value"]} if setting and setting.get("value") else {}

    return auth


def as_kube(api: Any) -> KubeClient:
    """A KubeClient, or one borrowing a kubernetes-asyncio ApiClient's session, host and credentials.

    Duck-typed on purpose: importing kubernetes-asyncio here would cost what this module saves."""
    if isinstance(api, KubeClient):
        return api
    cfg = getattr(api, "configuration", None)
    rest = getattr(api, "rest_client", None)
    if cfg is None or rest is None:
        raise TypeError(f"not a Kubernetes client: {type(api).__name__}")
    return KubeClient(host=cfg.host, session=rest.pool_manager, auth=library_auth(cfg),
                      server_hostname=getattr(cfg, "tls_server_name", None), proxy=getattr(cfg, "proxy", None),
                      owns_session=False)


class _Api:
    def __init__(self, api: Any) -> None:
        self.api_client = as_kube(api)

    def _send(self, method: str, path: str, kwargs: Mapping[str, Any], *, body: Any = None,
              content_type: str = JSON) -> Awaitable[aiohttp.ClientResponse]:
        return self.api_client.request(method, path, query=query_of(kwargs), body=body,
                                       content_type=str(kwargs.get("_content_type") or content_type),
                                       request_timeout=kwargs.get("_request_timeout"))


class CoreV1Api(_Api):
    """Core v1 calls the controller makes (namespaces, Secrets, Events, its own Pod)."""

    def list_namespace(self, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("GET", "/api/v1/namespaces", kw)

    def create_namespace(self, body: Any, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("POST", "/api/v1/namespaces", kw, body=body)

    def list_secret_for_all_namespaces(self, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("GET", "/api/v1/secrets", kw)

    def list_persistent_volume_claim_for_all_namespaces(self, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("GET", "/api/v1/persistentvolumeclaims", kw)

    def list_namespaced_secret(self, namespace: str, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("GET", f"/api/v1/namespaces/{_seg(namespace)}/secrets", kw)

    def read_namespaced_secret(self, name: str, namespace: str, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("GET", f"/api/v1/namespaces/{_seg(namespace)}/secrets/{_seg(name)}", kw)

    def create_namespaced_secret(self, namespace: str, body: Any, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("POST", f"/api/v1/namespaces/{_seg(namespace)}/secrets", kw, body=body)

    def replace_namespaced_secret(self, name: str, namespace: str, body: Any,
                                  **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("PUT", f"/api/v1/namespaces/{_seg(namespace)}/secrets/{_seg(name)}", kw, body=body)

    def patch_namespaced_secret(self, name: str, namespace: str, body: Any,
                                **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("PATCH", f"/api/v1/namespaces/{_seg(namespace)}/secrets/{_seg(name)}", kw, body=body,
                          content_type=patch_content_type(body, strategic=True))

    def delete_namespaced_secret(self, name: str, namespace: str, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("DELETE", f"/api/v1/namespaces/{_seg(namespace)}/secrets/{_seg(name)}", kw,
                          body=kw.get("body"))

    def create_namespaced_event(self, namespace: str, body: Any, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("POST", f"/api/v1/namespaces/{_seg(namespace)}/events", kw, body=body)

    def patch_namespaced_event(self, name: str, namespace: str, body: Any,
                               **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("PATCH", f"/api/v1/namespaces/{_seg(namespace)}/events/{_seg(name)}", kw, body=body,
                          content_type=patch_content_type(body, strategic=True))

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any,
                             **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("PATCH", f"/api/v1/namespaces/{_seg(namespace)}/pods/{_seg(name)}", kw, body=body,
                          content_type=patch_content_type(body, strategic=True))


class CustomObjectsApi(_Api):
    """Custom resources (GPU contract, KubeVirt): list, get, merge-patch, delete."""

    @staticmethod
    def _base(group: str, version: str) -> str:
        return f"/apis/{_seg(group)}/{_seg(version)}"

    def list_cluster_custom_object(self, group: str, version: str, plural: str,
                                   **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("GET", f"{self._base(group, version)}/{_seg(plural)}", kw)

    def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                      **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("GET", f"{self._base(group, version)}/namespaces/{_seg(namespace)}/{_seg(plural)}", kw)

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                     **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        path = f"{self._base(group, version)}/namespaces/{_seg(namespace)}/{_seg(plural)}/{_seg(name)}"
        return self._send("GET", path, kw)

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, body: Any,
                                        **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        """Only ever with dry_run="All" (the delivery probe, docs/design.md#delivery-readiness)."""
        return self._send("POST", f"{self._base(group, version)}/namespaces/{_seg(namespace)}/{_seg(plural)}", kw,
                          body=body)

    def patch_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                       body: Any, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        path = f"{self._base(group, version)}/namespaces/{_seg(namespace)}/{_seg(plural)}/{_seg(name)}"
        return self._send("PATCH", path, kw, body=body, content_type=patch_content_type(body, strategic=False))

    def delete_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                        **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        path = f"{self._base(group, version)}/namespaces/{_seg(namespace)}/{_seg(plural)}/{_seg(name)}"
        return self._send("DELETE", path, kw, body=kw.get("body"))


class CoordinationV1Api(_Api):
    """Leases, for leader election."""

    def read_namespaced_lease(self, name: str, namespace: str, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("GET", f"/apis/coordination.k8s.io/v1/namespaces/{_seg(namespace)}/leases/{_seg(name)}", kw)

    def create_namespaced_lease(self, namespace: str, body: Any, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("POST", f"/apis/coordination.k8s.io/v1/namespaces/{_seg(namespace)}/leases", kw, body=body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any,
                                 **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{_seg(namespace)}/leases/{_seg(name)}"
        return self._send("PUT", path, kw, body=body)


class AdmissionregistrationV1Api(_Api):
    """The shipped MutatingWebhookConfiguration (its caBundle, for the self-managed CA)."""

    PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"

    def read_mutating_webhook_configuration(self, name: str, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("GET", f"{self.PATH}/{_seg(name)}", kw)

    def patch_mutating_webhook_configuration(self, name: str, body: Any,
                                             **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("PATCH", f"{self.PATH}/{_seg(name)}", kw, body=body,
                          content_type=patch_content_type(body, strategic=True))

    # The enforce webhook's configuration (--vgpu-driver-check=enforce): its caBundle, JSON-patched.
    VALIDATING_PATH = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"

    def read_validating_webhook_configuration(self, name: str, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("GET", f"{self.VALIDATING_PATH}/{_seg(name)}", kw)

    def patch_validating_webhook_configuration(self, name: str, body: Any,
                                               **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("PATCH", f"{self.VALIDATING_PATH}/{_seg(name)}", kw, body=body, content_type=JSON_PATCH)


class VersionApi(_Api):
    def get_code(self, **kw: Any) -> Awaitable[aiohttp.ClientResponse]:
        return self._send("GET", "/version", kw)


# What components accept: a KubeClient, or a kubernetes-asyncio ApiClient (test kit, dev cluster),
# adapted by `as_kube`. Typed Any because naming the library's class would import it.
AnyClient = Any
