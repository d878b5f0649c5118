"""Async client plumbing for the dev cluster: ApiClients from kubeconfigs and CRD installation."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import structlog
import yaml
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.rest import ApiException

log = structlog.get_logger(__name__)

# The GPUClass/GPUClaim CRDs of the assumed GPU contract. They ship (manifests/components/gpu-crds and
# the chart carry copies), so their one source lives with the manifests.
GPU_CRD_DIR = Path(__file__).resolve().parents[2] / "manifests" / "crds"
# Minimal stand-ins for the KubeVirt, CDI and Cluster API CRDs, whose controllers the dev cluster does not run.
CRD_DIR = Path(__file__).resolve().parent / "crds"
# Every CRD the dev cluster installs.
CRD_DIRS = (GPU_CRD_DIR, CRD_DIR)


async def api_client_from_kubeconfig(path: str | os.PathLike[str], context: str | None = None) -> ApiClient:
    """A kubernetes-asyncio ApiClient bound to one kubeconfig file (not the global default)."""
    cfg = client.Configuration()
    await config.load_kube_config(config_file=os.fspath(path), context=context, client_configuration=cfg)
    return ApiClient(configuration=cfg)


def crd_files(crd_dirs: Sequence[Path] = CRD_DIRS) -> list[Path]:
    """Every CRD file under `crd_dirs`, in file-name order."""
    return sorted((p for d in crd_dirs for p in d.glob("*.yaml")), key=lambda p: p.name)


def load_crd_manifests(crd_dirs: Sequence[Path] = CRD_DIRS) -> list[dict[str, Any]]:
    """Every CustomResourceDefinition document under `crd_dirs`, in file-name order."""
    docs: list[dict[str, Any]] = []
    for path in crd_files(crd_dirs):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                docs.append(doc)
    return docs


def _established(crd: Any) -> bool:
    conds = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conds)


async def _apply(ext: client.ApiextensionsV1Api, doc: dict[str, Any]) -> None:
    name = doc["metadata"]["name"]
    try:
        await ext.create_custom_resource_definition(body=cast(Any, doc))
    except ApiException as e:
        if e.status != 409:
            raise
        current = await ext.read_custom_resource_definition(name)
        body = dict(doc)
        body["metadata"] = {**doc["metadata"], "resourceVersion": current.metadata.resource_version}
        await ext.replace_custom_resource_definition(name, body=cast(Any, body))


async def install_crds(
    target: ApiClient | str | os.PathLike[str],
    crd_dirs: Sequence[Path] = CRD_DIRS,
    wait_seconds: float = 30.0,
) -> list[str]:
    """Create or replace the CRDs in `crd_dirs` and wait until each is Established.

    `target` is an ApiClient or a kubeconfig path. Returns the CRD names.
    """
    own = not isinstance(target, ApiClient)
    api = await api_client_from_kubeconfig(target) if not isinstance(target, ApiClient) else target
    try:
        ext = client.ApiextensionsV1Api(api)
        docs = load_crd_manifests(crd_dirs)
        for doc in docs:
            await _apply(ext, doc)
        names = [d["metadata"]["name"] for d in docs]
        await _wait_established(ext, names, wait_seconds)
        log.info("crds established", crds=names)
        return names
    finally:
        if own:
            await api.close()


async def _wait_established(ext: client.ApiextensionsV1Api, names: Iterable[str], wait_seconds: float) -> None:
    pending = set(names)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    while pending:
        for name in sorted(pending):
            if _established(await ext.read_custom_resource_definition(name)):
                pending.discard(name)
        if not pending:
            return
        if loop.time() > deadline:
            raise TimeoutError(f"CRDs not Established after {wait_seconds:.0f}s: {', '.join(sorted(pending))}")
        await asyncio.sleep(0.1)


async def watch_until(
    list_fn: Callable[..., Any],
    *args: Any,
    predicate: Callable[[str, dict[str, Any]], bool],
    wait_seconds: float = 30.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """Watch `list_fn(*args, **kwargs)` until `predicate(event_type, raw_object)` holds; return the object.

    Starts without a resourceVersion, so the apiserver first replays the current state as ADDED
    events: a condition that already holds is seen at once, and none is missed in between.
    """
    async with asyncio.timeout(wait_seconds), watch.Watch() as w:
        async for ev in w.stream(list_fn, *args, **kwargs):
            obj: dict[str, Any] = ev["raw_object"]
            if predicate(str(ev["type"]), obj):
                return obj
    raise TimeoutError("watch ended before the condition held")


async def wait_deleted(
    list_fn: Callable[..., Any], *args: Any, name: str, wait_seconds: float = 30.0, **kwargs: Any
) -> None:
    """Return once no object named `name` is listed by `list_fn`: list, then watch from that list.

    Listing first makes an object that is already gone count as deleted; watching from the list's
    resourceVersion makes a deletion in between impossible to miss.
    """
    selector = f"metadata.name={name}"
    listed = await list_fn(*args, field_selector=selector, **kwargs)
    items = listed["items"] if isinstance(listed, dict) else listed.items
    if not items:
        return
    rv = listed["metadata"]["resourceVersion"] if isinstance(listed, dict) else listed.metadata.resource_version
    await watch_until(list_fn, *args, predicate=lambda t, _o: t == "DELETED", wait_seconds=wait_seconds,
                      field_selector=selector, resource_version=rv, **kwargs)
