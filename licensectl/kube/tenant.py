"""A tenant Kubernetes cluster's API, reached with the kubeconfig Cluster API keeps for it.

Cluster API stores a workload cluster's admin kubeconfig in the management cluster as Secret
`<cluster>-kubeconfig`, key `value`, in the Cluster's namespace (cluster-api util/secret). licensectl
reads it only to drain a worker before its restart (docs/design.md#tenant-worker-drain): per use, never
logged, never kept past the drain step that needed it; the connection trusts the kubeconfig's own CA
only. The client session is closed when the step is done (`async with open_tenant(...)`).

Raises `TenantUnreachable` with a reason fit for an Event (never the kubeconfig or a response body).
What leaves this module is core/drain.py's `TenantNode` and `TenantPod` (`tenant_node`, `tenant_pod`
read the JSON); `TenantClusters` is the `core.ports.TenantClusters` the worker drain opens clusters with.
"""

from __future__ import annotations

import base64
import contextlib
import re
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml
from yarl import URL

from licensectl import logs
from licensectl.core import drain
from licensectl.core.ports import TenantUnreachable
from licensectl.core.timecodec import parse_time
from licensectl.kube import kubeconfig
from licensectl.kube.api import AnyClient, ApiException, CoreV1Api, KubeClient, absent_on_404
from licensectl.kube.errors import Conflict, Forbidden, NotFound, Unauthorized
from licensectl.kube.raw import RawApi, checked

log = logs.get(__name__)

KUBECONFIG_SUFFIX = "-kubeconfig"
KUBECONFIG_KEY = "value"
REQUEST_TIMEOUT = 10.0
MERGE_PATCH = "application/merge-patch+json"
LABEL_CONTROL_PLANE = "node-role.kubernetes.io/control-plane"  # kubeadm's mark on control-plane Nodes


__all__ = ["TenantApi", "TenantClusters", "TenantUnreachable", "open_tenant", "tenant_node", "tenant_pod"]


def kubeconfig_secret(cluster: str) -> str:
    return cluster + KUBECONFIG_SUFFIX


class TenantApi:
    """The handful of tenant-cluster calls a drain makes (kubectl drain / cluster-api's drain use the same)."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def _get(self, path: str, query: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
        try:
            return await checked(self._client.request("GET", path, query=query, request_timeout=REQUEST_TIMEOUT))
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise TenantUnreachable(f"tenant API did not answer: {type(e).__name__}") from None
        except (Unauthorized, Forbidden) as e:
            raise TenantUnreachable(f"tenant API refused licensectl's credentials (HTTP {e.status})") from None
        except NotFound:
            raise
        except ApiException as e:  # any other answer is no answer: held, named, never a log line only
            raise TenantUnreachable(f"tenant API answered HTTP {e.status}") from None

    async def nodes(self) -> list[drain.TenantNode]:
        return [tenant_node(n) for n in _items(await self._get("/api/v1/nodes"))]

    async def node(self, name: str) -> tuple[drain.TenantNode, str] | None:
        """The Node and its resourceVersion (what guards `set_cordon`), read afresh; None when gone."""
        obj = await absent_on_404(self._get(f"/api/v1/nodes/{quote(name, safe='')}"))
        if obj is None:
            return None
        return tenant_node(obj), str((obj.get("metadata") or {}).get("resourceVersion") or "")

    async def pods_on(self, node: str) -> tuple[drain.TenantPod, ...]:
        """The Node's Pods; a DaemonSet Pod whose DaemonSet is gone is an orphan (looked up once each)."""
        raw = _items(await self._get("/api/v1/pods", (("fieldSelector", f"spec.nodeName={node}"),)))
        missing: set[tuple[str, str]] = set()
        for p in raw:
            meta = p.get("metadata") or {}
            for o in meta.get("ownerReferences") or ():
                if isinstance(o, dict) and o.get("controller") and o.get("kind") == "DaemonSet":
                    ns, name = str(meta.get("namespace") or ""), str(o.get("name") or "")
                    if (ns, name) not in missing and not await self.daemonset_exists(ns, name):
                        missing.add((ns, name))
        return tuple(tenant_pod(p, frozenset(missing)) for p in raw)

    async def daemonset_exists(self, namespace: str, name: str) -> bool:
        path = f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/daemonsets/{quote(name, safe='')}"
        return await absent_on_404(self._get(path)) is not None

    async def set_cordon(self, name: str, *, unschedulable: bool, marker: str | None,
                         resource_version: str) -> bool:
        """Cordon with the marker in the same patch, or uncordon and drop it, guarded by `resource_version`."""
        body = {"metadata": {"resourceVersion": resource_version, "annotations": {drain.ANN_CORDONED_BY: marker}},
                "spec": {"unschedulable": unschedulable}}
        return await self.patch_node(name, body)

    async def patch_node(self, name: str, body: Mapping[str, Any]) -> bool:
        """Merge-patch a Node (a resourceVersion in `body` guards it); False when it changed or is gone."""
        try:
            await checked(self._client.request("PATCH", f"/api/v1/nodes/{quote(name, safe='')}", body=body,
                                               content_type=MERGE_PATCH, request_timeout=REQUEST_TIMEOUT))
            return True
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise TenantUnreachable(f"tenant API did not answer: {type(e).__name__}") from None
        except (NotFound, Conflict):
            return False
        except ApiException as e:
            raise TenantUnreachable(f"tenant API answered HTTP {e.status}") from None

    async def evict(self, namespace: str, name: str) -> int:
        """POST an Eviction (policy/v1): the HTTP status (201 evicted, 429 a PodDisruptionBudget refused,
        404 already gone), as cluster-api's drain reads it; transport errors raise TenantUnreachable."""
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/eviction"
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        try:
            await checked(self._client.request("POST", path, body=body, request_timeout=REQUEST_TIMEOUT))
            return 201
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise TenantUnreachable(f"tenant API did not answer: {type(e).__name__}") from None
        except ApiException as e:
            return e.status


def tenant_node(obj: Mapping[str, Any]) -> drain.TenantNode:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    ready: bool | None = None
    for c in status.get("conditions") or ():
        if isinstance(c, dict) and c.get("type") == "Ready":
            ready = {"True": True, "False": False}.get(str(c.get("status")))
    return drain.TenantNode(name=str(meta.get("name") or ""), provider_id=str(spec.get("providerID") or ""),
                            unschedulable=bool(spec.get("unschedulable")), ready=ready,
                            boot_id=str((status.get("nodeInfo") or {}).get("bootID") or ""),
                            cordoned_by=(meta.get("annotations") or {}).get(drain.ANN_CORDONED_BY),
                            control_plane=LABEL_CONTROL_PLANE in (meta.get("labels") or {}))


def tenant_pod(obj: Mapping[str, Any], missing_daemonsets: frozenset[tuple[str, str]] = frozenset()) -> drain.TenantPod:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    ns = str(meta.get("namespace") or "")
    owner = next((o for o in meta.get("ownerReferences") or () if isinstance(o, dict) and o.get("controller")), None)
    kind = str(owner.get("kind")) if owner else None
    deleted = parse_time(meta["deletionTimestamp"]) if isinstance(meta.get("deletionTimestamp"), str) else None
    return drain.TenantPod(
        namespace=ns, name=str(meta.get("name") or ""), node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"), controller_kind=kind,
        controller_missing=(kind == "DaemonSet" and owner is not None
                            and (ns, str(owner.get("name"))) in missing_daemonsets),
        is_mirror=drain.ANN_MIRROR_POD in (meta.get("annotations") or {}), deletion_timestamp=deleted,
        has_empty_dir=any(isinstance(v, dict) and "emptyDir" in v for v in spec.get("volumes") or ()),
        drain_label=(meta.get("labels") or {}).get(drain.LABEL_POD_DRAIN))


def _items(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = doc.get("items")
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


async def read_kubeconfig(mgmt: AnyClient, namespace: str, cluster: str) -> kubeconfig.Endpoint:
    """The client configuration of `cluster`, from its kubeconfig Secret; TenantUnreachable naming the
    Secret (and the field) when there is none or it cannot be used."""
    name = kubeconfig_secret(cluster)
    try:
        secret = await absent_on_404(RawApi(CoreV1Api(mgmt)).read_namespaced_secret(name, namespace))
    except ApiException as e:
        raise TenantUnreachable(f"cannot read Secret {namespace}/{name} (HTTP {e.status})") from None
    if secret is None:
        raise TenantUnreachable(f"Secret {namespace}/{name} (Cluster API's kubeconfig of {cluster}) does not exist")
    return tenant_endpoint(secret.get("data"), f"Secret {namespace}/{name}")


def tenant_endpoint(data: object, what: str) -> kubeconfig.Endpoint:
    """A Secret's `data` -> a client configuration every field of which was checked; else TenantUnreachable
    whose text names `what` (the Secret) and the field. Total: nothing else ever leaves it. The texts name
    fields, never values (a kubeconfig holds credentials)."""
    try:
        return _endpoint(data, what)
    except TenantUnreachable:
        raise
    except Exception as e:  # a shape no check above foresaw: still a named hold, never a log line
        raise TenantUnreachable(f"{what}: kubeconfig under key {KUBECONFIG_KEY!r} cannot be used "
                                f"({type(e).__name__})") from None


def _endpoint(data: object, what: str) -> kubeconfig.Endpoint:
    def bad(field: str, why: str) -> TenantUnreachable:
        return TenantUnreachable(f"{what}: {field} {why}")

    if not isinstance(data, Mapping) or KUBECONFIG_KEY not in data:
        raise bad(f"key {KUBECONFIG_KEY!r}", "is missing")
    try:
        doc = yaml.safe_load(base64.b64decode(str(data[KUBECONFIG_KEY]), validate=True))
    except ValueError:
        raise bad(f"key {KUBECONFIG_KEY!r}", "is not base64") from None
    except yaml.YAMLError:
        raise bad(f"key {KUBECONFIG_KEY!r}", "is not YAML") from None
    try:
        endpoint = kubeconfig.endpoint_from_document(doc, what="the kubeconfig")
    except kubeconfig.KubeconfigError as e:
        raise TenantUnreachable(f"{what}: {e}") from None
    except (OSError, ValueError):  # the TLS material: which field, said below
        _check_ca(doc, bad)
        raise bad("client-certificate-data / client-key-data", "cannot be loaded") from None
    if endpoint is None:
        raise bad("user", "needs an exec or auth-provider plugin, which licensectl does not run")
    _check_url(endpoint.host, "server", bad, schemes=("https", "http"))
    if endpoint.proxy is not None:
        _check_url(endpoint.proxy, "proxy-url", bad, schemes=("http", "https"))
    if endpoint.server_hostname is not None and not (
            isinstance(endpoint.server_hostname, str) and _HOSTNAME.fullmatch(endpoint.server_hostname)):
        raise bad("tls-server-name", "is not a host name")
    if endpoint.token is not None and not _TOKEN.fullmatch(endpoint.token):
        raise bad("token", "is not a bearer token (printable ASCII, no spaces)")
    return endpoint


_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.\-]{0,252})|\[[0-9A-Fa-f:.]+\]")
_TOKEN = re.compile(r"[\x21-\x7e]+")


def _check_url(value: object, field: str, bad: Callable[[str, str], TenantUnreachable], *,
               schemes: tuple[str, ...]) -> None:
    """A URL aiohttp can connect to: a scheme of `schemes`, a host, a port from 1 to 65535."""
    if not isinstance(value, str) or not value or any(c.isspace() or not c.isprintable() for c in value):
        raise bad(field, "is not a URL")
    try:
        url = URL(value)
        port = url.port
    except ValueError:
        raise bad(field, "is not a URL (or its port is not from 1 to 65535)") from None
    if url.scheme not in schemes:
        raise bad(field, f"is not an {' or '.join(schemes)} URL")
    if not url.host:
        raise bad(field, "has no host")
    if port is None or not 1 <= port <= 65535:
        raise bad(field, "has a port not from 1 to 65535")


def _check_ca(doc: Any, bad: Callable[[str, str], TenantUnreachable]) -> None:
    """Raise naming certificate-authority-data when it alone cannot be loaded (the document passed
    endpoint_from_document's reads: its current context and cluster exist)."""
    ctx = kubeconfig.named_entry(doc.get("contexts"), str(doc.get("current-context")), "context")
    cluster = kubeconfig.named_entry(doc.get("clusters"), str(ctx.get("cluster")), "cluster")
    try:
        ca = base64.b64decode("".join(str(cluster.get("certificate-authority-data") or "").split()), validate=True)
        if ca:
            ssl.create_default_context(cadata=ca.decode())
    except (OSError, ValueError):
        raise bad("certificate-authority-data", "is not a PEM certificate") from None


@contextlib.asynccontextmanager
async def open_tenant(mgmt: AnyClient, namespace: str, cluster: str) -> AsyncIterator[TenantApi]:
    """A tenant client for one drain step, closed after it (the kubeconfig is not kept)."""
    endpoint = await read_kubeconfig(mgmt, namespace, cluster)
    connector = aiohttp.TCPConnector(limit=8, ssl=endpoint.ssl_context)
    session = aiohttp.ClientSession(connector=connector, trust_env=False)
    tokens = kubeconfig.TokenSource(token=endpoint.token, token_file=endpoint.token_file)
    client = KubeClient(host=endpoint.host, session=session, auth=tokens.headers,
                        server_hostname=endpoint.server_hostname, proxy=endpoint.proxy)
    try:
        yield TenantApi(client)
    finally:
        await client.close()


class TenantClusters:
    """`core.ports.TenantClusters` over the management cluster's kubeconfig Secrets."""

    def __init__(self, mgmt: AnyClient) -> None:
        self._mgmt = mgmt

    def open(self, namespace: str, cluster: str) -> contextlib.AbstractAsyncContextManager[TenantApi]:
        return open_tenant(self._mgmt, namespace, cluster)
