"""A tenant Kubernetes cluster for the dev cluster: a second real control plane, published the CAPI way.

In production a Cluster API workload cluster's admin kubeconfig lives in the management cluster as
Secret `<cluster>-kubeconfig` (data key `value`, type `cluster.x-k8s.io/secret`, labelled with the
cluster name) in the Cluster's namespace (cluster-api `util/secret` and `util/kubeconfig`). Tests start
a `ControlPlane(scheduler=True)` to play that cluster, publish its kubeconfig there, and run
`TenantNodeAgent` (tenant_nodes.py) to play its kubelets.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import structlog
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient

from licensectl_dev.devcluster.controlplane import (
    TENANT_KCM_CONTROLLERS,
    ControlPlane,
    Logger,
    render_kubeconfig,
)
from licensectl_dev.devcluster.fleet import put_secret
from licensectl_dev.devcluster.kubeapi import api_client_from_kubeconfig

log = structlog.get_logger(__name__)

CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
ROLE_LABEL = "cluster.x-k8s.io/role"
MACHINE_NAME_LABEL = "capk.cluster.x-k8s.io/kubevirt-machine-name"
KUBECONFIG_KEY = "value"
CAPI_SECRET_TYPE = "cluster.x-k8s.io/secret"


def kubeconfig_secret_name(cluster: str) -> str:
    """Cluster API's name for the admin kubeconfig Secret of `cluster`."""
    return f"{cluster}-kubeconfig"


def tenant_control_plane(name: str = "tenant", *, log_fn: Logger | None = None) -> ControlPlane:
    """An unstarted ControlPlane that can run Pods: kube-scheduler plus TENANT_KCM_CONTROLLERS."""
    kw: dict[str, Any] = {"log": log_fn} if log_fn is not None else {}
    return ControlPlane(scheduler=True, kcm_controllers=TENANT_KCM_CONTROLLERS,
                        name=f"tenant control plane {name}", **kw)


def tenant_kubeconfig(tenant_cp: ControlPlane, cluster: str) -> str:
    """The admin kubeconfig of the tenant control plane, named after the cluster as CAPI names it."""
    return render_kubeconfig(tenant_cp.server, tenant_cp.ca_pem, token=tenant_cp.admin_token,
                             name=cluster, user=f"{cluster}-admin")


async def publish_kubeconfig(mgmt_api: ApiClient, namespace: str, cluster: str, tenant_cp: ControlPlane) -> None:
    """Create or replace Secret `<cluster>-kubeconfig` (key `value`) in `namespace` of the management
    cluster, exactly what Cluster API stores for a workload cluster."""
    name = kubeconfig_secret_name(cluster)
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Secret", "type": CAPI_SECRET_TYPE,
        "metadata": {"name": name, "namespace": namespace, "labels": {CLUSTER_NAME_LABEL: cluster}},
        "data": {KUBECONFIG_KEY: base64.b64encode(tenant_kubeconfig(tenant_cp, cluster).encode()).decode()},
    }
    await put_secret(mgmt_api, body)
    log.info("tenant kubeconfig published", namespace=namespace, secret=name, server=tenant_cp.server)


async def tenant_api_client(tenant_cp: ControlPlane) -> ApiClient:
    """An admin kubernetes-asyncio ApiClient for the tenant control plane (close it when done)."""
    return await api_client_from_kubeconfig(tenant_cp.kubeconfig_path)


async def api_client_from_kubeconfig_secret(mgmt_api: ApiClient, namespace: str, cluster: str) -> ApiClient:
    """An ApiClient built from the published Secret, the way a management-cluster controller reaches a
    workload cluster (proves the Secret is usable, not just present)."""
    core = client.CoreV1Api(mgmt_api)
    secret = await core.read_namespaced_secret(kubeconfig_secret_name(cluster), namespace)
    data: Mapping[str, str] = secret.data or {}
    doc = yaml.safe_load(base64.b64decode(data[KUBECONFIG_KEY]))
    cfg = client.Configuration()
    await config.load_kube_config_from_dict(doc, client_configuration=cfg)
    return ApiClient(configuration=cfg)
