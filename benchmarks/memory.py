"""Where the controller's memory goes: tracemalloc over its informer caches at the goal's size.

`python -m benchmarks memory [--namespaces 5000 --vmis 20000 --plain-vmis 50000]` (no control plane needed).

Builds the objects a LIST returns (metadata with managedFields, labels, ownerReferences; VMs and
VMIs shaped like KubeVirt's), decodes them from JSON one 500-object page at a time like the
informers do, projects them with the real projections (licensectl/kube/projections.py) and keeps
them in dicts keyed by the informers' own key functions (licensectl/kube/caches.py). Reported: bytes
held per cached object by resource, the transient peak of one page (raw JSON + decoded dicts), and
the top allocation sites. Unrelated Secrets never reach the controller (its Secret LISTs are
label- or name-selected), so they cost it nothing here by construction; the replication
benchmark's RSS row covers the whole process.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tracemalloc
import uuid as uuidlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from benchmarks.common import fmt_mib, format_table
from licensectl.core.render import replica_name
from licensectl.kube import projections
from licensectl.kube.watch import Key, object_key, shared_name_key
from licensectl_dev.devcluster import fleet

PAGE = 500  # the informers' page size


def _uid(*parts: str) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, "/".join(parts)))


def _meta(ns: str | None, name: str, *, manager: str, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": _uid(ns or "", name), "resourceVersion": "123456",
                            "creationTimestamp": "2026-01-01T00:00:00Z",
                            "managedFields": [{"manager": manager, "operation": "Update", "apiVersion": "v1",
                                               "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                                               "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}}}]}
    if ns is not None:
        meta["namespace"] = ns
    meta.update(extra)
    return meta


def namespace_obj(i: int) -> dict[str, Any]:
    name = f"tenant-a{i}"
    labels = {"tenant.cozystack.io/tenant-root": "", f"tenant.cozystack.io/{name}": "",
              "gpu.cozystack.io/vgpu": "true", "kubernetes.io/metadata.name": name}
    owner = [{"apiVersion": "v1", "kind": "Namespace", "name": "tenant-root", "uid": _uid("", "tenant-root"),
              "controller": True, "blockOwnerDeletion": True}]
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": _meta(None, name, manager="cozystack", labels=labels, ownerReferences=owner),
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}


def claim_obj(i: int) -> dict[str, Any]:
    ns = f"tenant-a{i}"
    return {"apiVersion": "gpu.cozystack.io/v1alpha1", "kind": "GPUClaim",
            "metadata": _meta(ns, "gpu", manager="kubectl"), "spec": {"className": "vws"}}


def replica_obj(i: int) -> dict[str, Any]:
    ns = f"tenant-a{i}"
    ann = {"licensectl.io/source-namespace": "hoster-licenses", "licensectl.io/source-name": "nls-token",
           "licensectl.io/class": "vws", "licensectl.io/revision": "a" * 64,
           "licensectl.io/revision-time": "2026-01-01T00:00:00.000000Z"}
    data = {"client_configuration_token.tok": "eHh4" * 700, "gridd.conf": "eHh4" * 80, "report-url": "eHh4" * 20,
            "namespace": "eHh4" * 5, "credential": "eHh4" * 15}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": data,
            "metadata": _meta(ns, replica_name("vws"), manager="licensectl",
                              labels={"app.kubernetes.io/managed-by": "licensectl"}, annotations=ann)}


def vm_obj(i: int, namespaces: int) -> dict[str, Any]:
    ns = f"tenant-a{i % namespaces}"
    body = fleet.vm_body(ns, f"vm-{i}", license_secret=replica_name("vws"), firmware_uuid=_uid(ns, f"vm-{i}"))
    body["metadata"] = _meta(ns, f"vm-{i}", manager="virt-controller", annotations={}, generation=2)
    body["status"] = {"ready": True, "printableStatus": "Running", "created": True}
    return body


def vmi_obj(i: int, namespaces: int) -> dict[str, Any]:
    vm = vm_obj(i, namespaces)
    ns, name = vm["metadata"]["namespace"], vm["metadata"]["name"]
    owner = [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": name, "uid": _uid(ns, name),
              "controller": True, "blockOwnerDeletion": True}]
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": _meta(ns, name, manager="virt-handler", ownerReferences=owner,
                              labels={"kubevirt.io/vm": name, "kubevirt.io/nodeName": "node-1"}),
            "spec": vm["spec"]["template"]["spec"],
            "status": {"phase": "Running", "nodeName": "node-1",
                       "conditions": [{"type": "Ready", "status": "True",
                                       "lastTransitionTime": "2026-01-01T00:01:00Z"}],
                       "phaseTransitionTimestamps": [{"phase": "Running",
                                                      "phaseTransitionTimestamp": "2026-01-01T00:01:00Z"}]}}


def plain_vm_obj(i: int, namespaces: int) -> dict[str, Any]:
    """An ordinary VM beside the vGPU ones: no GPU claim, no replica, no licensectl annotation."""
    ns = f"tenant-a{i % namespaces}"
    body = fleet.vm_body(ns, f"plain-{i}", firmware_uuid=_uid(ns, f"plain-{i}"))
    body["metadata"] = _meta(ns, f"plain-{i}", manager="virt-controller", annotations={}, generation=2)
    body["status"] = {"ready": True, "printableStatus": "Running", "created": True}
    return body


def plain_vmi_obj(i: int, namespaces: int) -> dict[str, Any]:
    vmi = vmi_obj(i, namespaces)
    vm = plain_vm_obj(i, namespaces)
    ns, name = vm["metadata"]["namespace"], vm["metadata"]["name"]
    vmi["metadata"] = {**vmi["metadata"], "name": name,
                       "ownerReferences": [{**vmi["metadata"]["ownerReferences"][0], "name": name,
                                            "uid": _uid(ns, name)}]}
    vmi["spec"] = vm["spec"]["template"]["spec"]
    return vmi


def kept(relevant: Callable[[Any], bool], project: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The informer's order (licensectl/kube/watch/informer.py): an object `relevant` refuses is never projected."""
    return lambda o: project(o) if relevant(o) else None


def pages(make: Callable[[int], dict[str, Any]], count: int) -> Iterator[bytes]:
    """The raw bodies of a paged LIST, one page at a time (as the apiserver sends them)."""
    for start in range(0, count, PAGE):
        items = [make(i) for i in range(start, min(count, start + PAGE))]
        yield json.dumps({"kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}).encode()


def measure(make: Callable[[int], dict[str, Any]], project: Callable[[Any], Any], count: int,
            cache: dict[tuple[str, str], Any], key: Callable[[Any], Key] = object_key) -> tuple[int, int]:
    """(bytes the cache holds afterwards, transient peak of one page above what was held before it).

    `key` is the informer's key function for the resource (licensectl/kube/caches.py)."""
    gc.collect()
    before, _ = tracemalloc.get_traced_memory()
    page_peak = 0
    for raw in pages(make, count):
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        body = json.loads(raw)
        del raw
        for item in body["items"]:
            p = project(item)
            if p is not None:
                cache[key(item)] = p
        del body
        _, peak = tracemalloc.get_traced_memory()
        page_peak = max(page_peak, peak - start)
    gc.collect()
    after, _ = tracemalloc.get_traced_memory()
    return after - before, page_peak


_IMPORT_STAGES = (
    ("bare interpreter", ""),
    ("+ aiohttp, structlog, prometheus_client", "import aiohttp, structlog, prometheus_client"),
    ("+ every licensectl module the controller loads", "import licensectl.cli.main, licensectl.app"),
    # Not loaded by the controller (docs/design.md#a-thin-kubernetes-client-not-the-generated-one):
    # shown for scale, on top of the controller's own floor.
    ("(+ kubernetes_asyncio.client, which the controller no longer imports)", "import kubernetes_asyncio.client"),
)


def import_rss() -> list[tuple[str, int]]:
    """VmRSS of a fresh interpreter after each import stage: the floor under any cache."""
    code = "\n".join([
        "import re",
        "def rss():",
        "    return int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) * 1024",
        *(f"{stmt}\nprint(rss())" for _, stmt in _IMPORT_STAGES),
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return [(label, int(v)) for (label, _), v in zip(_IMPORT_STAGES, out.stdout.split(), strict=True)]


def run(namespaces: int, vmis: int, plain: int) -> str:
    tracemalloc.start(1)
    caches: dict[str, dict[tuple[str, str], Any]] = {}
    rows: list[list[str]] = []
    total = 0
    plan: Sequence[tuple[str, Callable[[int], dict[str, Any]], Callable[[Any], Any], int, Callable[[Any], Key]]] = (
        ("namespaces", namespace_obj, projections.namespace_from, namespaces, object_key),
        ("gpuclaims", claim_obj, projections.gpu_claim_from, namespaces, shared_name_key),
        ("replica secrets", replica_obj, projections.replica_secret_from, namespaces, shared_name_key),
        ("virtualmachines", lambda i: vm_obj(i, namespaces), kept(projections.vm_relevant, projections.vm_from),
         vmis, object_key),
        ("virtualmachineinstances", lambda i: vmi_obj(i, namespaces),
         kept(projections.vmi_relevant, projections.vmi_from), vmis, object_key),
        # Ordinary VMs and VMIs beside them (docs/design.md#decision-cache-relevance): as the caches
        # hold them, and (for scale) what they cost when every one is projected and held.
        ("virtualmachines, no vGPU", lambda i: plain_vm_obj(i, namespaces),
         kept(projections.vm_relevant, projections.vm_from), plain, object_key),
        ("virtualmachineinstances, no vGPU", lambda i: plain_vmi_obj(i, namespaces),
         kept(projections.vmi_relevant, projections.vmi_from), plain, object_key),
        ("(no vGPU VMs, if every one were held)", lambda i: plain_vm_obj(i, namespaces), projections.vm_from,
         plain, object_key),
        ("(no vGPU VMIs, if every one were held)", lambda i: plain_vmi_obj(i, namespaces), projections.vmi_from,
         plain, object_key),
    )
    for name, make, project, count, key in plan:
        cache = caches.setdefault(name, {})
        held, page_peak = measure(make, project, count, cache, key)
        if not name.startswith("("):
            total += held
        rows.append([name, f"{count:,}", fmt_mib(held), f"{held / max(count, 1):,.0f} B", fmt_mib(page_peak)])
    rows.append(["all caches", "", fmt_mib(total), "", "one page at a time"])
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    top = snap.statistics("lineno")[:10]
    sites = [[f"{'/'.join(s.traceback[0].filename.split('/')[-2:])}:{s.traceback[0].lineno}", fmt_mib(s.size),
              f"{s.count:,}"] for s in top]
    tracemalloc.stop()
    stages = import_rss()
    import_rows = [[label, fmt_mib(v), fmt_mib(v - (stages[k - 1][1] if k else 0))]
                   for k, (label, v) in enumerate(stages)]
    return "\n\n".join([
        format_table("Process floor: RSS of a fresh interpreter after each import (before any object)",
                     ["stage", "VmRSS", "added"], import_rows),
        format_table(f"Informer cache memory (tracemalloc): {namespaces:,} tenant ns, {vmis:,} vGPU VMs + VMIs, "
                     f"{plain:,} VMs + VMIs without a vGPU",
                     ["resource", "objects", "held by the cache", "per object", "peak of one 500-object page"],
                     rows),
        format_table("Top allocation sites still held", ["site", "size", "blocks"], sites),
    ])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks memory", description=__doc__.splitlines()[0])
    p.add_argument("--namespaces", type=int, default=5_000)
    p.add_argument("--vmis", type=int, default=20_000)
    p.add_argument("--plain-vmis", type=int, default=50_000, help="VMs + VMIs without a vGPU beside them")
    a = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    print(run(a.namespaces, a.vmis, a.plain_vmis), flush=True)
    return 0
