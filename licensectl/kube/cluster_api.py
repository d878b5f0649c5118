"""Cluster API's objects in the management cluster, as the worker drain reads them (read only).

A tenant worker's KubevirtMachine names its controller Machine, whose `spec.nodeDrainTimeout` and
exclude annotation say how (and whether) to drain it; the CAPI Cluster carries the hoster's drain
policy annotations (docs/design.md#tenant-worker-drain). The objects are read only where Cluster API
is installed: a 404 means Cluster API's defaults. A failed read raises `ReadFailed`, never an answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import aiohttp

from licensectl.core import drain
from licensectl.core.ports import MachineSays, ReadFailed
from licensectl.kube.api import AnyClient, ApiException, CustomObjectsApi, absent_on_404
from licensectl.kube.raw import RawApi

CAPI_GROUP, CAPI_VERSION = "cluster.x-k8s.io", "v1beta1"
CAPK_GROUP, CAPK_VERSION = "infrastructure.cluster.x-k8s.io", "v1alpha1"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

# A read that failed says nothing about the object; 404 (absent) is handled where it is read.
READ_ERRORS = (ApiException, TimeoutError, aiohttp.ClientError)


def go_duration_seconds(text: object) -> float | None:
    """A metav1.Duration ("10m0s", "1h", "90s"); None when absent or unreadable (then licensectl's default)."""
    if not isinstance(text, str) or not text.strip():
        return None
    raw = text.strip()
    parts = _DURATION.findall(raw)
    if not parts or "".join(n + u for n, u in parts) != raw:
        return None
    return sum(float(n) * _UNIT[u] for n, u in parts)


def machine_says(machine: Mapping[str, Any] | None) -> MachineSays:
    """A Machine's drain settings; no Machine: Cluster API's defaults."""
    if machine is None:
        return MachineSays()
    ann = (machine.get("metadata") or {}).get("annotations") or {}
    return MachineSays(go_duration_seconds((machine.get("spec") or {}).get("nodeDrainTimeout")),
                       drain.ANN_EXCLUDE_NODE_DRAINING in ann)


class ClusterApiReader:
    """`core.ports.ClusterApi` over the management cluster's custom objects API."""

    def __init__(self, custom: Any) -> None:
        self._custom: Any = custom  # RawApi(CustomObjectsApi) or an object with its get call (tests)

    @classmethod
    def for_client(cls, mgmt: AnyClient) -> ClusterApiReader:
        return cls(RawApi(CustomObjectsApi(mgmt)))

    async def cluster_annotations(self, namespace: str, cluster: str) -> Mapping[str, str]:
        try:
            obj = await absent_on_404(self._custom.get_namespaced_custom_object(
                CAPI_GROUP, CAPI_VERSION, namespace, "clusters", cluster))
        except READ_ERRORS as e:
            raise ReadFailed(type(e).__name__, getattr(e, "status", None)) from e
        ann: Mapping[str, str] = ((obj or {}).get("metadata") or {}).get("annotations") or {}
        return ann

    async def machine(self, namespace: str, kubevirt_machine: str) -> MachineSays:
        """KubevirtMachine -> its controller Machine: nodeDrainTimeout and the exclude annotation."""
        try:
            kvm = await absent_on_404(self._custom.get_namespaced_custom_object(
                CAPK_GROUP, CAPK_VERSION, namespace, "kubevirtmachines", kubevirt_machine))
            owner = next((o for o in ((kvm or {}).get("metadata") or {}).get("ownerReferences") or ()
                          if isinstance(o, dict) and o.get("kind") == "Machine"), None)
            if owner is None:
                return MachineSays()
            machine = await absent_on_404(self._custom.get_namespaced_custom_object(
                CAPI_GROUP, CAPI_VERSION, namespace, "machines", str(owner.get("name"))))
        except READ_ERRORS as e:
            raise ReadFailed(type(e).__name__, getattr(e, "status", None)) from e
        return machine_says(machine)
