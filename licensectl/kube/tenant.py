"""A tenant Kubernetes cluster's API, reached with the kubeconfig Cluster API keeps for it.

Cluster API stores a workload cluster's admin kubeconfig in the management cluster as Secret
`<cluster>-kubeconfig`, key `value`, in the Cluster's namespace (cluster-api util/secret). licensectl
reads it only to drain a worker before its restart (docs/design.md#tenant-worker-drain): per use, never
logged, never kept past the drain step that needed it; the connection trusts the kubeconfig's own CA
only. The client session is closed when the step is done (`async with open_tenant(...)`).

Raises `TenantUnreachable` with a reason fit for an Event (never the kubeconfig or a response body).
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

from licensectl import logs
from licensectl.kube import kubeconfig
from licensectl.kube.api import AnyClient, ApiException, CoreV1Api, KubeClient, absent_on_404
from licensectl.kube.raw import RawApi, checked

log = logs.get(__name__)

KUBECONFIG_SUFFIX = "-kubeconfig"
KUBECONFIG_KEY = "value"
REQUEST_TIMEOUT = 10.0
MERGE_PATCH = "application/merge-patch+json"


class TenantUnreachable(Exception):
    """The tenant cluster's API cannot be used now: no kubeconfig Secret, an unusable one, or no answer."""


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
        except ApiException as e:
            if e.status in (401, 403):
                raise TenantUnreachable(f"tenant API refused licensectl's credentials (HTTP {e.status})") from None
            raise

    async def nodes(self) -> list[dict[str, Any]]:
        return _items(await self._get("/api/v1/nodes"))

    async def node(self, name: str) -> dict[str, Any] | None:
        return await absent_on_404(self._get(f"/api/v1/nodes/{quote(name, safe='')}"))

    async def pods_on(self, node: str) -> list[dict[str, Any]]:
        return _items(await self._get("/api/v1/pods", (("fieldSelector", f"spec.nodeName={node}"),)))

    async def daemonset_exists(self, namespace: str, name: str) -> bool:
        path = f"/apis/apps/v1/namespaces/{quote(namespace, safe='')}/daemonsets/{quote(name, safe='')}"
        return await absent_on_404(self._get(path)) is not None

    async def patch_node(self, name: str, body: Mapping[str, Any]) -> bool:
        """Merge-patch a Node (a resourceVersion in `body` guards it); False when it changed or is gone."""
        try:
            await checked(self._client.request("PATCH", f"/api/v1/nodes/{quote(name, safe='')}", body=body,
                                               content_type=MERGE_PATCH, request_timeout=REQUEST_TIMEOUT))
            return True
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise TenantUnreachable(f"tenant API did not answer: {type(e).__name__}") from None
        except ApiException as e:
            if e.status in (404, 409):
                return False
            raise

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


def _items(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = doc.get("items")
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


async def read_kubeconfig(mgmt: AnyClient, namespace: str, cluster: str) -> Any:
    """The parsed kubeconfig document of `cluster`; TenantUnreachable when there is none or it is unreadable."""
    name = kubeconfig_secret(cluster)
    try:
        secret = await absent_on_404(RawApi(CoreV1Api(mgmt)).read_namespaced_secret(name, namespace))
    except ApiException as e:
        raise TenantUnreachable(f"cannot read Secret {namespace}/{name} (HTTP {e.status})") from None
    if secret is None:
        raise TenantUnreachable(f"Secret {namespace}/{name} (Cluster API's kubeconfig of {cluster}) does not exist")
    raw = (secret.get("data") or {}).get(KUBECONFIG_KEY)
    try:
        return yaml.safe_load(base64.b64decode(str(raw or ""), validate=True))
    except (ValueError, yaml.YAMLError):
        raise TenantUnreachable(f"Secret {namespace}/{name} has no readable kubeconfig under key "
                                f"{KUBECONFIG_KEY!r}") from None


@contextlib.asynccontextmanager
async def open_tenant(mgmt: AnyClient, namespace: str, cluster: str) -> AsyncIterator[TenantApi]:
    """A tenant client for one drain step, closed after it (the kubeconfig is not kept)."""
    doc = await read_kubeconfig(mgmt, namespace, cluster)
    try:
        endpoint = kubeconfig.endpoint_from_document(doc, what=f"kubeconfig of tenant cluster {namespace}/{cluster}")
    except (kubeconfig.KubeconfigError, OSError, ValueError) as e:
        # KubeconfigError texts name fields and files, never values; ssl errors carry no key material.
        raise TenantUnreachable(str(e) if isinstance(e, kubeconfig.KubeconfigError)
                                else f"kubeconfig of {cluster} has unusable TLS material: {type(e).__name__}") from None
    if endpoint is None:
        raise TenantUnreachable(f"kubeconfig of {cluster} needs an exec or auth-provider plugin, which licensectl "
                                "does not run")
    del doc
    connector = aiohttp.TCPConnector(limit=8, ssl=endpoint.ssl_context)
    session = aiohttp.ClientSession(connector=connector, trust_env=False)
    tokens = kubeconfig.TokenSource(token=endpoint.token, token_file=endpoint.token_file)
    client = KubeClient(host=endpoint.host, session=session, auth=tokens.headers,
                        server_hostname=endpoint.server_hostname, proxy=endpoint.proxy)
    try:
        yield TenantApi(client)
    finally:
        await client.close()
