"""manifests/components/vgpu-driver-enforce: the opt-in enforce webhook of the boot image check.

Rendered on top of manifests/base with kustomize (as an overlay would use it), checked for what
docs/operations.md#vgpu-driver-marks promises (a validating webhook on the same Service, failurePolicy
Ignore, the mutating webhook's filter, the setting, RBAC limited to the one configuration), and
applied with server-side dry run to the real apiserver.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from licensectl import config
from licensectl.serve.webhook import VALIDATE_PATH

from .test_manifests import (  # noqa: F401 - fixtures
    MANIFESTS,
    NAMESPACE,
    cluster,
    container,
    dry_run,
    env_of,
    kustomize,
    one,
    operator_crds,
    static_kubectl,
)

COMPONENT = MANIFESTS / "components" / "vgpu-driver-enforce"


def overlay(tmp: Path) -> Path:
    """base + the component, as a hoster's overlay lists them (paths relative to the overlay)."""
    base = os.path.relpath(MANIFESTS / "base", tmp)
    component = os.path.relpath(COMPONENT, tmp)
    (tmp / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"namespace: {NAMESPACE}\nresources:\n  - {base}\ncomponents:\n  - {component}\n")
    return tmp


def render(kubectl: str, tmp: Path) -> list[dict[str, Any]]:
    res = subprocess.run([kubectl, "kustomize", "--load-restrictor=LoadRestrictionsNone", str(overlay(tmp))],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@pytest.fixture(scope="module")
def enforced(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(static_kubectl(), tmp_path_factory.mktemp("enforce"))


def test_the_component_adds_the_validating_webhook_rbac_and_setting(enforced: list[dict[str, Any]]) -> None:
    base = kustomize(static_kubectl(), MANIFESTS / "base")
    added = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in enforced
                   if (o["kind"], o["metadata"]["name"]) not in {(b["kind"], b["metadata"]["name"]) for b in base})
    assert added == ["ClusterRole/licensectl-vgpu-driver-enforce", "ClusterRoleBinding/licensectl-vgpu-driver-enforce",
                     "ValidatingWebhookConfiguration/licensectl"]
    env = {k: v for k, v in env_of(container(enforced)).items() if isinstance(v, str)}
    assert config.settings_from(None, env).vgpu_driver_check == "enforce"
    assert config.settings_from(None, {k: v for k, v in env_of(container(base)).items() if isinstance(v, str)}
                                ).vgpu_driver_check == "warn"


def test_the_validating_webhook_mirrors_the_mutating_one_and_never_blocks_on_an_outage(
        enforced: list[dict[str, Any]]) -> None:
    mutating, _vm_warning = one(enforced, "MutatingWebhookConfiguration", "licensectl")["webhooks"]
    vwc = one(enforced, "ValidatingWebhookConfiguration", "licensectl")
    assert "namespace" not in vwc["metadata"]
    assert vwc["metadata"]["labels"] == {"app.kubernetes.io/name": "licensectl",
                                         "app.kubernetes.io/part-of": "licensectl"}
    (hook,) = vwc["webhooks"]
    assert hook["name"] == "vmi-boot-image.licensectl.io"
    assert hook["clientConfig"]["service"] == {**mutating["clientConfig"]["service"], "path": VALIDATE_PATH}
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None" and hook["timeoutSeconds"] <= 5
    for same in ("rules", "matchPolicy", "namespaceSelector", "matchConditions", "admissionReviewVersions"):
        assert hook[same] == mutating[same], same
    assert "reinvocationPolicy" not in hook  # validating webhooks run once, after every mutation


def test_its_rbac_is_the_one_configuration(enforced: list[dict[str, Any]]) -> None:
    role = one(enforced, "ClusterRole", "licensectl-vgpu-driver-enforce")
    assert role["rules"] == [{"apiGroups": ["admissionregistration.k8s.io"],
                              "resources": ["validatingwebhookconfigurations"],
                              "resourceNames": [config.Settings().webhook_configuration], "verbs": ["get", "patch"]}]
    binding = one(enforced, "ClusterRoleBinding", "licensectl-vgpu-driver-enforce")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "licensectl", "namespace": NAMESPACE}]
    base_rules = one(enforced, "ClusterRole", "licensectl")["rules"]
    assert {"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes", "datasources"],
            "verbs": ["list", "watch"]} in base_rules
    assert {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["list", "watch"]} in base_rules
    assert not any("validatingwebhookconfigurations" in r["resources"] for r in base_rules)


@pytest.mark.cluster
def test_base_with_the_component_passes_server_dry_run(cluster: list[str],  # noqa: F811
                                                       tmp_path: Path) -> None:
    objs = render(cluster[0], tmp_path)
    res = dry_run(cluster, objs)
    assert res.returncode == 0, res.stderr
    applied = [line for line in res.stdout.splitlines() if line.endswith("serverside-applied (server dry run)")]
    assert len(applied) == len(objs), res.stdout
