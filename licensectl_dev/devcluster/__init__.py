"""A real Kubernetes control plane (etcd + kube-apiserver + kube-controller-manager) on loopback,
the project's CRDs, and a KubeVirt simulator, for integration tests and the demo."""

from licensectl_dev.devcluster.controlplane import (
    ETCD_VERSION,
    K8S_VERSION,
    BuildError,
    ControlPlane,
    ControlPlaneError,
    binaries_dir,
    cache_root,
    ensure_binaries,
    free_port,
    render_kubeconfig,
)
from licensectl_dev.devcluster.kubeapi import CRD_DIR, api_client_from_kubeconfig, install_crds
from licensectl_dev.devcluster.ledger import SimulatorRecord
from licensectl_dev.devcluster.virt_api import RestartProxy
from licensectl_dev.devcluster.virt_controller import KubevirtSimulator

__all__ = [
    "CRD_DIR",
    "ETCD_VERSION",
    "K8S_VERSION",
    "BuildError",
    "ControlPlane",
    "ControlPlaneError",
    "KubevirtSimulator",
    "RestartProxy",
    "SimulatorRecord",
    "api_client_from_kubeconfig",
    "binaries_dir",
    "cache_root",
    "ensure_binaries",
    "free_port",
    "install_crds",
    "render_kubeconfig",
]
