"""Build hoster fleets on a dev cluster: Cozystack-shaped tenants, GPU classes, claims, VMs.

Used by the integration tests and by the demo (`make demo`), so both exercise the same object shapes
(docs/design.md#upstream-facts). Tokens made here are *fake* JWTs with a real structure and a dummy signature.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, CustomObjectsApi

from licensectl.kube.raw import RawApi

TENANT_LABEL_PREFIX = "tenant.cozystack.io/"
VGPU_LABEL = "gpu.cozystack.io/vgpu"
GPU_GROUP, GPU_VERSION = "gpu.cozystack.io", "v1alpha1"


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def fake_token(exp: int, *, iat: int | None = None, extra: Mapping[str, Any] | None = None) -> bytes:
    """A JWT-shaped client configuration token (unsigned: the signature part is filler)."""
    header = {"alg": "RS256", "typ": "JWT"}
    payload: dict[str, Any] = {"iat": iat if iat is not None else exp - 86400 * 365, "exp": exp,
                               "nbf": iat if iat is not None else exp - 86400 * 365,
                               "service_instance_ref": "demo-instance"}
    payload.update(extra or {})
    parts = [_b64url(json.dumps(header).encode()), _b64url(json.dumps(payload).encode()), _b64url(b"\0" * 32)]
    return ".".join(parts).encode()


def tenant_child_name(parent: str, child: str, root: str = "tenant-root") -> str:
    """Cozystack naming: child x of the root is tenant-x, child y of tenant-x is tenant-x-y."""
    return f"tenant-{child}" if parent == root else f"{parent}-{child}"


async def create_tenant(api: ApiClient, name: str, *, parent: Mapping[str, Any] | None = None,
                        vgpu: bool | None = None, vgpu_label: str = VGPU_LABEL) -> dict[str, Any]:
    """A tenant Namespace with ancestor labels and the controller ownerReference to its parent."""
    core: Any = CoreV1Api(api)
    labels: dict[str, str] = {}
    if parent is not None:
        for k, v in (parent["metadata"].get("labels") or {}).items():
            if k.startswith(TENANT_LABEL_PREFIX):
                labels[k] = v
    labels[f"{TENANT_LABEL_PREFIX}{name}"] = ""
    if vgpu is not None:
        labels[vgpu_label] = "true" if vgpu else "false"
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if parent is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Namespace", "name": parent["metadata"]["name"],
                                    "uid": parent["metadata"]["uid"], "controller": True,
                                    "blockOwnerDeletion": True}]
    out: dict[str, Any] = await RawApi(core).create_namespace(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
    return out


async def set_vgpu(api: ApiClient, namespace: str, value: bool | None, *, vgpu_label: str = VGPU_LABEL) -> None:
    core: Any = CoreV1Api(api)
    v = None if value is None else ("true" if value else "false")
    await core.patch_namespace(namespace, {"metadata": {"labels": {vgpu_label: v}}})


async def create_gpu_class(api: ApiClient, name: str, *, mode: str = "vgpu", secret: tuple[str, str] | None = None,
                           feature_type: Any = 1) -> None:
    co: Any = CustomObjectsApi(api)
    spec: dict[str, Any] = {"mode": mode, "license": {"featureType": feature_type}}
    if secret is not None:
        spec["license"]["secretRef"] = {"namespace": secret[0], "name": secret[1]}
    await co.create_cluster_custom_object(GPU_GROUP, GPU_VERSION, "gpuclasses", {
        "apiVersion": f"{GPU_GROUP}/{GPU_VERSION}", "kind": "GPUClass", "metadata": {"name": name}, "spec": spec})


async def delete_gpu_class(api: ApiClient, name: str) -> None:
    co: Any = CustomObjectsApi(api)
    try:
        await co.delete_cluster_custom_object(GPU_GROUP, GPU_VERSION, "gpuclasses", name)
    except ApiException as e:
        if e.status != 404:
            raise


async def create_claim(api: ApiClient, namespace: str, name: str, *, class_name: str) -> None:
    co: Any = CustomObjectsApi(api)
    await co.create_namespaced_custom_object(GPU_GROUP, GPU_VERSION, namespace, "gpuclaims", {
        "apiVersion": f"{GPU_GROUP}/{GPU_VERSION}", "kind": "GPUClaim",
        "metadata": {"name": name, "namespace": namespace}, "spec": {"className": class_name}})


async def delete_claim(api: ApiClient, namespace: str, name: str) -> None:
    co: Any = CustomObjectsApi(api)
    await co.delete_namespaced_custom_object(GPU_GROUP, GPU_VERSION, namespace, "gpuclaims", name)


async def put_source_secret(api: ApiClient, namespace: str, name: str, *, token: bytes | None,
                            token_key: str = "client_configuration_token.tok", gridd_conf: str | None = None,
                            annotations: Mapping[str, str] | None = None) -> None:
    """Create or replace the hoster's license Secret."""
    data: dict[str, str] = {}
    if token is not None:
        data[token_key] = base64.b64encode(token).decode()
    if gridd_conf is not None:
        data["gridd.conf"] = base64.b64encode(gridd_conf.encode()).decode()
    body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})}, "data": data}
    await put_secret(api, body)


async def put_secret(api: ApiClient, body: Mapping[str, Any]) -> None:
    """Create the Secret `body` describes, or replace it when it exists."""
    core: Any = CoreV1Api(api)
    meta = body["metadata"]
    try:
        await core.create_namespaced_secret(meta["namespace"], body)
    except ApiException as e:
        if e.status != 409:
            raise
        await core.replace_namespaced_secret(meta["name"], meta["namespace"], body)


# The containerDisk every fleet VM boots. A setting that vouches for it (`--vgpu-driver-images`) stands
# for a hoster whose golden image carries the vGPU guest driver and is marked as such.
GOLDEN_IMAGE = "quay.io/containerdisks/ubuntu:24.04"


def vm_body(namespace: str, name: str, *, license_secret: str | None = None, run_strategy: str = "Always",
            annotations: Mapping[str, str] | None = None, firmware_uuid: str | None = None,
            gpu_claims: Sequence[str] = (), labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A VirtualMachine using `gpu_claims` in KubeVirt's DRA shape (the admission webhook then adds the
    license volume, docs/design.md#vmi-claims); `license_secret` mounts a replica by hand instead, as a
    disk with serial LICENSECTL (the way hosters wired it before the webhook).

    `labels` go on the VM and on its template (so onto every VMI), as CAPK labels a tenant cluster's
    machines (`cluster.x-k8s.io/cluster-name`, role); `kubevirt.io/vm` is always kept."""
    disks: list[dict[str, Any]] = [{"name": "root", "disk": {"bus": "virtio"}}]
    volumes: list[dict[str, Any]] = [{"name": "root", "containerDisk": {"image": GOLDEN_IMAGE}}]
    if license_secret:
        disks.append({"name": "license", "serial": "LICENSECTL", "disk": {"bus": "virtio"}})
        volumes.append({"name": "license", "secret": {"secretName": license_secret, "volumeLabel": "LICENSECTL"}})
    devices: dict[str, Any] = {"disks": disks}
    domain: dict[str, Any] = {"devices": devices, "resources": {"requests": {"memory": "1Gi"}}}
    if firmware_uuid:
        domain["firmware"] = {"uuid": firmware_uuid}
    template_spec: dict[str, Any] = {"domain": domain, "volumes": volumes}
    if gpu_claims:
        devices["gpus"] = [{"name": f"gpu{i}", "claimName": f"claim{i}", "requestName": "gpu"}
                           for i in range(len(gpu_claims))]
        template_spec["resourceClaims"] = [{"name": f"claim{i}", "resourceClaimName": c}
                                           for i, c in enumerate(gpu_claims)]
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": dict(annotations or {})}
    if labels:
        metadata["labels"] = dict(labels)
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": metadata,
            "spec": {"runStrategy": run_strategy,
                     "template": {"metadata": {"labels": {**(labels or {}), "kubevirt.io/vm": name}},
                                  "spec": template_spec}}}


async def create_vm(api: ApiClient, namespace: str, name: str, *, license_secret: str | None = None,
                    run_strategy: str = "Always", annotations: Mapping[str, str] | None = None,
                    firmware_uuid: str | None = None, gpu_claims: Sequence[str] = (),
                    labels: Mapping[str, str] | None = None) -> None:
    co: Any = CustomObjectsApi(api)
    await co.create_namespaced_custom_object("kubevirt.io", "v1", namespace, "virtualmachines", vm_body(
        namespace, name, license_secret=license_secret, run_strategy=run_strategy, annotations=annotations,
        firmware_uuid=firmware_uuid, gpu_claims=gpu_claims, labels=labels))
