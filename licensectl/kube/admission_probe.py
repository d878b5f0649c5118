"""The delivery probe's one call: a server-side dry-run create of a VMI (dryRun=All, nothing stored).

It goes through the apiserver's real admission chain, so what comes back shows whether licensectl's
webhook answered (controllers/delivery_probe.py, docs/design.md#delivery-readiness).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from licensectl.kube.api import AnyClient, CustomObjectsApi
from licensectl.kube.contract import KUBEVIRT_GROUP, KUBEVIRT_VERSION, VMI_PLURAL
from licensectl.kube.raw import RawApi


class VmiDryRunApi:
    """`core.ports.VmiDryRun` over the custom objects API."""

    def __init__(self, custom: Any) -> None:
        self._custom: Any = custom  # RawApi(CustomObjectsApi) or an object with its create call (tests)

    @classmethod
    def for_client(cls, api: AnyClient) -> VmiDryRunApi:
        return cls(RawApi(CustomObjectsApi(api)))

    async def create_vmi(self, namespace: str, body: Mapping[str, Any], *,
                         request_timeout: float) -> Mapping[str, Any]:
        obj: Mapping[str, Any] = await self._custom.create_namespaced_custom_object(
            KUBEVIRT_GROUP, KUBEVIRT_VERSION, namespace, VMI_PLURAL, body, dry_run="All",
            _request_timeout=request_timeout)
        return obj
