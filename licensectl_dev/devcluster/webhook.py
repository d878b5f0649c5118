"""Register licensectl's VMI admission webhooks on the dev cluster's apiserver.

The configurations are the ones licensectl ships (manifests/base/webhook.yaml, and the enforce
webhook of manifests/components/vgpu-driver-enforce/webhook.yaml), with the in-cluster Service
replaced by a loopback URL, so the apiserver's own admission chain calls the controller exactly as
in a cluster. Each registration gets its own webhook name, so the apiserver's metrics
(`apiserver_admission_webhook_*{name=...}`) tell registrations apart.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes_asyncio.client import AdmissionregistrationV1Api, ApiClient, ApiException, CustomObjectsApi

from licensectl.core.model import ANN_GPU_CLAIMS
from licensectl_dev.testkit.metrics_text import Scrape, parse_metrics
from licensectl_dev.testkit.poll import eventually

REPO = Path(__file__).resolve().parents[2]
WEBHOOK_MANIFEST = REPO / "manifests" / "base" / "webhook.yaml"
ENFORCE_MANIFEST = REPO / "manifests" / "components" / "vgpu-driver-enforce" / "webhook.yaml"
PROBE_NAMESPACE = "default"


def _shipped(manifest: Path, kind: str) -> dict[str, Any]:
    for doc in yaml.safe_load_all(manifest.read_text()):
        if doc and doc.get("kind") == kind:
            return dict(doc)
    raise LookupError(f"no {kind} in {manifest}")


def shipped_configuration() -> dict[str, Any]:
    """The MutatingWebhookConfiguration from manifests/base/webhook.yaml."""
    return _shipped(WEBHOOK_MANIFEST, "MutatingWebhookConfiguration")


def webhook_name(configuration: str) -> str:
    return f"{configuration}.vmi-license.licensectl.io"


def vm_webhook_name(configuration: str) -> str:
    """The VirtualMachine boot image warning's webhook of a registration (its second webhook)."""
    return f"{configuration}.vm-boot-image.licensectl.io"


def _loopback(doc: dict[str, Any], *, name: str, webhook: str, origin: str, ca_bundle: bytes) -> dict[str, Any]:
    """A shipped configuration renamed `name`, each webhook calling its path at `origin` (trusting
    `ca_bundle` if given); the first webhook is named `webhook`, any other `<name>.<its shipped name>`."""
    doc = copy.deepcopy(doc)
    doc["metadata"] = {"name": name, "labels": dict(doc["metadata"].get("labels") or {})}
    for i, wh in enumerate(doc["webhooks"]):
        path = wh["clientConfig"]["service"]["path"]
        wh["name"] = webhook if i == 0 else f"{name}.{wh['name']}"
        wh["clientConfig"] = {"url": f"{origin}{path}"}
        if ca_bundle:
            wh["clientConfig"]["caBundle"] = base64.b64encode(ca_bundle).decode()
    return doc


def loopback_configuration(*, name: str, port: int, ca_bundle: bytes = b"") -> dict[str, Any]:
    """The shipped configuration, named `name`, calling https://127.0.0.1:<port>."""
    return _loopback(shipped_configuration(), name=name, webhook=webhook_name(name),
                     origin=f"https://127.0.0.1:{port}", ca_bundle=ca_bundle)


async def _create_or_replace(api: ApiClient, kind: str, body: dict[str, Any]) -> None:
    """Create the `kind` ("mutating" or "validating") webhook configuration, or replace the one there."""
    adm = AdmissionregistrationV1Api(api)
    name = body["metadata"]["name"]
    try:
        await getattr(adm, f"create_{kind}_webhook_configuration")(cast(Any, body))
    except ApiException as e:
        if e.status != 409:
            raise
        current = await getattr(adm, f"read_{kind}_webhook_configuration")(name)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        await getattr(adm, f"replace_{kind}_webhook_configuration")(name, cast(Any, body))


async def register(api: ApiClient, *, name: str, port: int, ca_bundle: bytes = b"", wait: bool = True) -> None:
    """Create or replace the configuration; with `wait`, return once the apiserver calls it."""
    await _create_or_replace(api, "mutating", loopback_configuration(name=name, port=port, ca_bundle=ca_bundle))
    if wait:
        await wait_called(api, name=name)


async def unregister(api: ApiClient, name: str) -> None:
    try:
        await AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(name)
    except ApiException as e:
        if e.status != 404:
            raise


async def apiserver_metrics(api: ApiClient) -> Scrape:
    """The apiserver's own /metrics (needs a client allowed to GET /metrics), parsed by the test kit."""
    resp = await api.call_api("/metrics", "GET", auth_settings=["BearerToken"], response_types_map={},
                              _preload_content=False)
    raw = await (resp[0] if isinstance(resp, tuple) else resp).read()
    return parse_metrics(raw.decode())


async def webhook_requests(api: ApiClient, name: str) -> float:
    """apiserver_admission_webhook_request_total for one registration (all codes)."""
    return (await apiserver_metrics(api)).value("apiserver_admission_webhook_request_total",
                                                name=webhook_name(name))


def _probe_vmi(prefix: str, *, claim: str | None = None, annotation: str | None = None) -> dict[str, Any]:
    """A VMI for server-side dry-run creates: they run mutating admission and store nothing."""
    spec: dict[str, Any] = {"domain": {"devices": {}}}
    meta: dict[str, Any] = {"generateName": prefix}
    if claim is not None:
        spec["domain"]["devices"]["gpus"] = [{"name": "gpu0", "claimName": "c0", "requestName": "gpu"}]
        spec["resourceClaims"] = [{"name": "c0", "resourceClaimName": claim}]
    if annotation is not None:
        meta["annotations"] = {ANN_GPU_CLAIMS: annotation}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta, "spec": spec}


async def _dry_run_create(api: ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """The admitted object, or None when the apiserver refused it."""
    try:
        obj: dict[str, Any] = await CustomObjectsApi(api).create_namespaced_custom_object(
            "kubevirt.io", "v1", namespace, "virtualmachineinstances", body, dry_run="All")
    except ApiException:
        return None
    return obj


async def wait_called(api: ApiClient, *, name: str, timeout: float = 30.0) -> None:  # noqa: ASYNC109
    """The apiserver picks configurations up through its own watch: until then a VMI would pass
    without the webhook. Dry-run creates prove the apiserver calls it."""
    probe = _probe_vmi("licensectl-webhook-probe-", annotation="probe")

    async def called() -> bool:
        await _dry_run_create(api, PROBE_NAMESPACE, probe)
        return await webhook_requests(api, name) > 0

    await eventually(called, timeout=timeout, interval=0.2, what=f"apiserver calling webhook {name}")


async def wait_delivery(api: ApiClient, *, namespace: str, claim: str, timeout: float = 60.0) -> None:  # noqa: ASYNC109
    """Until a VMI using `claim` in `namespace` would get its license volume: a webhook is registered,
    called, and its caches hold the replica. Proven with a dry-run create, the same admission path a
    real VMI takes, so VMs created afterwards never race the registration."""
    probe = _probe_vmi("licensectl-delivery-probe-", claim=claim)

    async def delivered() -> bool:
        obj = await _dry_run_create(api, namespace, probe)
        return obj is not None and any("secret" in v for v in (obj.get("spec") or {}).get("volumes") or [])

    await eventually(delivered, timeout=timeout, interval=0.2,
                     what=f"license delivery for claim {claim} in {namespace}")


# -- the enforce webhook (--vgpu-driver-check=enforce) ----------------------------------------------
def shipped_validating_configuration() -> dict[str, Any]:
    """The ValidatingWebhookConfiguration of manifests/components/vgpu-driver-enforce."""
    return _shipped(ENFORCE_MANIFEST, "ValidatingWebhookConfiguration")


def validating_webhook_name(configuration: str) -> str:
    return f"{configuration}.vmi-boot-image.licensectl.io"


def loopback_validating_configuration(*, name: str, port: int, ca_bundle: bytes = b"") -> dict[str, Any]:
    """The shipped enforce configuration, named `name`, calling https://127.0.0.1:<port>."""
    return _loopback(shipped_validating_configuration(), name=name, webhook=validating_webhook_name(name),
                     origin=f"https://127.0.0.1:{port}", ca_bundle=ca_bundle)


async def register_validating(api: ApiClient, *, name: str, port: int, ca_bundle: bytes = b"") -> None:
    """Create or replace the enforce configuration (the apiserver picks it up through its own watch:
    wait for it with a request the webhook refuses)."""
    await _create_or_replace(api, "validating",
                             loopback_validating_configuration(name=name, port=port, ca_bundle=ca_bundle))


async def unregister_validating(api: ApiClient, name: str) -> None:
    try:
        await AdmissionregistrationV1Api(api).delete_validating_webhook_configuration(name)
    except ApiException as e:
        if e.status != 404:
            raise
