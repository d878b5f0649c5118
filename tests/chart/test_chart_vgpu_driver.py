"""The chart's switch for the enforce webhook of the boot image check (config.vgpuDriverCheck).

Off by default; `enforce` renders the ValidatingWebhookConfiguration and the RBAC of
manifests/components/vgpu-driver-enforce (the same objects kustomize renders from the component) and
sets the setting; with cert-manager the cainjector gets the configuration too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..manifests.test_manifests import static_kubectl
from ..manifests.test_vgpu_driver_enforce import render
from .helm import NAMESPACE, Helm, objects_by_key
from .test_chart import normalized

pytestmark = pytest.mark.cluster

ADDED = [("ValidatingWebhookConfiguration", "", "licensectl"), ("ClusterRole", "", "licensectl-vgpu-driver-enforce"),
         ("ClusterRoleBinding", "", "licensectl-vgpu-driver-enforce")]


def env(objs: dict[tuple[str, str, str], dict[str, Any]]) -> dict[str, Any]:
    c = objs[("Deployment", NAMESPACE, "licensectl")]["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in c["env"]}


def test_off_by_default(helm: Helm) -> None:
    for values in (None, {"config": {"vgpuDriverCheck": "warn"}}, {"config": {"vgpuDriverCheck": "off"}}):
        objs = objects_by_key(helm.render(values))
        assert not [k for k in ADDED if k in objs], values
    assert "LICENSECTL_VGPU_DRIVER_CHECK" not in env(objects_by_key(helm.render()))


def test_enforce_renders_the_component(helm: Helm, tmp_path: Path) -> None:
    chart = objects_by_key(helm.render({"config": {"vgpuDriverCheck": "enforce",
                                                   "vgpuDriverImages": "registry.example.com/vgpu/"}}))
    kustomized = objects_by_key(render(static_kubectl(), tmp_path))
    for key in ADDED:
        assert normalized(chart[key]) == normalized(kustomized[key]), key
    assert env(chart)["LICENSECTL_VGPU_DRIVER_CHECK"] == "enforce"
    assert env(chart)["LICENSECTL_VGPU_DRIVER_IMAGES"] == "registry.example.com/vgpu/"
    assert "annotations" not in chart[ADDED[0]]["metadata"]


def test_enforce_with_cert_manager_and_a_custom_configuration_name(helm: Helm) -> None:
    objs = objects_by_key(helm.render({"certManager": {"enabled": True},
                                       "config": {"vgpuDriverCheck": "enforce", "webhookConfiguration": "lc"}}))
    # One name everywhere: both configurations, the RBAC resourceNames, the controller's setting.
    assert ("MutatingWebhookConfiguration", "", "lc") in objs
    vwc = objs[("ValidatingWebhookConfiguration", "", "lc")]
    assert vwc["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/licensectl-serving"}
    (rule,) = objs[("ClusterRole", "", "licensectl-vgpu-driver-enforce")]["rules"]
    assert rule["resourceNames"] == ["lc"]
