"""The one adapter for resource names the controller reads: the assumed GPU contract and KubeVirt.

GPUClass/GPUClaim are an *assumed* contract (docs/design.md#gpu-contract): their group, version and plurals come
from Settings so licensectl can follow upstream when the real API lands, by configuration or by
editing only this module. The field layout of their specs is read in `projections`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from licensectl import config
from licensectl.kube.api import CustomObjectsApi
from licensectl.kube.watch import ListFunc

# KubeVirt core API (kubevirt/kubevirt staging/src/kubevirt.io/api/core/v1).
KUBEVIRT_GROUP = "kubevirt.io"
KUBEVIRT_VERSION = "v1"
VM_PLURAL = "virtualmachines"
VMI_PLURAL = "virtualmachineinstances"
VM_KIND = "VirtualMachine"
VMI_KIND = "VirtualMachineInstance"

GPU_CLASS_KIND = "GPUClass"
GPU_CLAIM_KIND = "GPUClaim"


@dataclass(frozen=True, slots=True)
class GpuContract:
    """Resolved names of the GPU contract (cluster-scoped classes, namespaced claims)."""

    group: str
    version: str
    class_plural: str
    claim_plural: str

    @classmethod
    def from_settings(cls, settings: config.Settings) -> GpuContract:
        return cls(settings.gpu_group, settings.gpu_version, settings.gpu_class_plural,
                   settings.gpu_claim_plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


def gpu_class_lister(api: CustomObjectsApi, settings: config.Settings) -> ListFunc:
    """List/watch function for GPUClasses (cluster-scoped)."""
    c = GpuContract.from_settings(settings)
    return functools.partial(api.list_cluster_custom_object, c.group, c.version, c.class_plural)


def gpu_claim_lister(api: CustomObjectsApi, settings: config.Settings) -> ListFunc:
    """List/watch function for GPUClaims in all namespaces.

    The cluster-wide collection path (/apis/{group}/{version}/{plural}) of a namespaced resource
    lists across all namespaces, which is what list_cluster_custom_object requests.
    """
    c = GpuContract.from_settings(settings)
    return functools.partial(api.list_cluster_custom_object, c.group, c.version, c.claim_plural)


def vm_lister(api: CustomObjectsApi) -> ListFunc:
    """List/watch function for KubeVirt VirtualMachines in all namespaces."""
    return functools.partial(api.list_cluster_custom_object, KUBEVIRT_GROUP, KUBEVIRT_VERSION, VM_PLURAL)


def vmi_lister(api: CustomObjectsApi) -> ListFunc:
    """List/watch function for KubeVirt VirtualMachineInstances in all namespaces."""
    return functools.partial(api.list_cluster_custom_object, KUBEVIRT_GROUP, KUBEVIRT_VERSION, VMI_PLURAL)
