"""manifests/: rendered with kustomize and applied with `--dry-run=server` to the real apiserver.

Static checks (no cluster) pin the properties the install promises: security context, probes,
downward API, settings that exist in licensectl/config.py, Services and NetworkPolicy that match the
ports, RBAC that is commented and minimal. The cluster tests apply every rendered object to the
session control plane (tests/conftest.py) with server-side dry run and strict field validation,
after installing the GPU CRDs (manifests/crds), the KubeVirt stand-ins (licensectl_dev/devcluster/crds)
and prometheus-operator's ServiceMonitor/PrometheusRule CRDs. Those come from the pinned Go module
of prometheus-operator (its example/prometheus-operator-crd/ directory, the CRDs it publishes),
fetched with `go mod download` and checked against the pinned module sum, so no copy of them lives here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from licensectl import __version__, config
from licensectl.app import LEADER_LABEL
from licensectl.serve.webhook import VM_PATH
from licensectl_dev.devcluster.controlplane import ControlPlane, binaries_dir
from licensectl_dev.devcluster.kubeapi import GPU_CRD_DIR, crd_files

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
BUILDS = {"default": MANIFESTS, "base": MANIFESTS / "base", "example": MANIFESTS / "overlays" / "example"}
NAMESPACE = "licensectl-system"
SA = f"system:serviceaccount:{NAMESPACE}:licensectl"

PROMETHEUS_OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_VERSION = "v0.85.0"
PROMETHEUS_OPERATOR_SUM = "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s="
OPERATOR_CRDS = ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml")
CLUSTER_SCOPED_KINDS = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                                  "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                                  "ValidatingAdmissionPolicyBinding"})
GPUCLASS_POLICY = MANIFESTS / "components" / "gpuclass-immutable" / "policy.yaml"


# --------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------
def static_kubectl() -> str:
    """kubectl for kustomize builds: the one the dev control plane builds, else PATH."""
    built = binaries_dir() / "kubectl"
    if built.is_file():
        return str(built)
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: build the dev control plane or install kubectl")
    return found


def kustomize(kubectl: str, path: Path) -> list[dict[str, Any]]:
    res = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    kubectl = static_kubectl()
    return {name: kustomize(kubectl, path) for name, path in BUILDS.items()}


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    c: dict[str, Any] = one(objs, "Deployment", "licensectl")["spec"]["template"]["spec"]["containers"][0]
    return c


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


# --------------------------------------------------------------------------------------------------
# Static checks
# --------------------------------------------------------------------------------------------------
def test_builds_contain_the_expected_objects(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = {name: sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objs) for name, objs in rendered.items()}
    core = ["ClusterRole/licensectl", "ClusterRoleBinding/licensectl", "Deployment/licensectl",
            "Namespace/licensectl-system", "NetworkPolicy/licensectl", "PodDisruptionBudget/licensectl",
            "Role/licensectl", "RoleBinding/licensectl", "Service/licensectl-metrics",
            "Service/licensectl-reports", "Service/licensectl-webhook", "ServiceAccount/licensectl",
            "MutatingWebhookConfiguration/licensectl"]
    monitoring = ["PrometheusRule/licensectl", "ServiceMonitor/licensectl"]
    crds = ["CustomResourceDefinition/gpuclaims.gpu.cozystack.io",
            "CustomResourceDefinition/gpuclasses.gpu.cozystack.io"]
    gpuclass_policy = ["ValidatingAdmissionPolicy/licensectl-gpuclass-immutable",
                       "ValidatingAdmissionPolicyBinding/licensectl-gpuclass-immutable"]
    assert kinds["base"] == sorted(core)
    assert kinds["default"] == sorted(core + monitoring)
    assert kinds["example"] == sorted(core + monitoring + crds + gpuclass_policy)
    for objs in rendered.values():
        for o in objs:
            if o["kind"] in CLUSTER_SCOPED_KINDS:
                # The example overlay's transformer strips what kustomize sets on the admission policy.
                assert "namespace" not in o["metadata"], f"{o['kind']} is cluster-scoped"
            else:
                assert o["metadata"]["namespace"] == NAMESPACE, o["kind"]


def test_gpu_crd_component_is_a_copy_of_the_gpu_crds() -> None:
    component = MANIFESTS / "components" / "gpu-crds"
    copies = sorted(p.name for p in component.glob("*.yaml") if p.name != "kustomization.yaml")
    assert copies == sorted(p.name for p in GPU_CRD_DIR.glob("gpu*.yaml"))
    for name in copies:
        assert (component / name).read_bytes() == (GPU_CRD_DIR / name).read_bytes(), name


def gpuclass_policy() -> tuple[dict[str, Any], dict[str, Any]]:
    """The shipped ValidatingAdmissionPolicy and its binding, as the file holds them."""
    policy, binding = (d for d in yaml.safe_load_all(GPUCLASS_POLICY.read_text()) if d)
    assert (policy["kind"], binding["kind"]) == ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    return policy, binding


def test_gpuclass_policy_guards_the_licensing_fields_of_licensectls_contract() -> None:
    """The policy matches UPDATEs of the class resource licensectl reads by default, denies, and
    checks exactly the three fields that decide licensing (the cluster test proves what they do)."""
    policy, binding = gpuclass_policy()
    defaults = config.Settings()
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule == {"apiGroups": [defaults.gpu_group], "apiVersions": ["*"], "operations": ["UPDATE"],
                    "resources": [defaults.gpu_class_plural]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    validations = policy["spec"]["validations"]
    guarded = [re.fullmatch(r"object\.\?spec\.\?(\S+) == oldObject\.\?spec\.\?\1", v["expression"])
               for v in validations]
    assert [m.group(1) if m else v["expression"] for m, v in zip(guarded, validations, strict=True)] == [
        "mode", "license.?secretRef.?namespace", "license.?secretRef.?name", "license.?featureType"]
    for v in validations:
        assert v["reason"] == "Invalid"  # 422, like the apiserver's own "field is immutable"
        assert "create a new class" in v["messageExpression"], v["messageExpression"]
    # Each CEL string folds to one line: YAML libraries disagree on folding more-indented lines, so a
    # line break would let the chart (Helm's parser) and kustomize (kyaml) read different strings.
    spec = policy["spec"]
    for entry in spec["matchConditions"] + spec["variables"] + validations:
        for key in ("expression", "messageExpression"):
            assert "\n" not in entry.get(key, ""), entry
    # Absent fields are read through `?.` only: a plain `.` on an optional field would be an error.
    for expr in [c["expression"] for c in policy["spec"]["matchConditions"]] + [v["expression"] for v in validations]:
        assert not re.search(r"(object|oldObject)\.spec\b", expr), expr


def test_deployment_is_hardened(rendered: dict[str, list[dict[str, Any]]]) -> None:
    dep = one(rendered["default"], "Deployment", "licensectl")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "licensectl"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = container(rendered["default"])
    assert c["command"] == ["licensectl", "run"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert set(c["resources"]["requests"]) == {"cpu", "memory"}
    assert set(c["resources"]["limits"]) == {"cpu", "memory"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_deployment_settings_are_real_licensectl_settings(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Every LICENSECTL_* variable exists in config.py and its value parses (a typo would be ignored)."""
    known = {o.env for o in config.OPTIONS}
    for name, objs in rendered.items():
        env = env_of(container(objs))
        assert set(env) <= known, f"{name}: unknown settings {set(env) - known}"
        assert env["LICENSECTL_POD_NAME"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}
        assert env["LICENSECTL_NAMESPACE"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
        plain = {k: v for k, v in env.items() if isinstance(v, str)}
        settings = config.settings_from(None, plain)
        assert settings.leader_elect is True
        assert settings.log_format == "json"
        ports = {p["name"]: p["containerPort"] for p in container(objs)["ports"]}
        assert settings.metrics_address == f"0.0.0.0:{ports['metrics']}"
        assert settings.reports_address == f"0.0.0.0:{ports['reports']}"


def test_example_overlay_patches_apply(rendered: dict[str, list[dict[str, Any]]]) -> None:
    c = container(rendered["example"])
    assert c["image"] == f"registry.example.com/platform/licensectl:{__version__}"
    env = env_of(c)
    assert env["LICENSECTL_MAX_UNAVAILABLE"] == "5"
    assert env["LICENSECTL_LEADER_ELECT"] == "true"  # the base env survives the patch
    netpol = one(rendered["example"], "NetworkPolicy", "licensectl")
    assert netpol["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "cozy-monitoring"}
    # Runbook links: the overlay's base replaces the placeholder before `#` in every alert, and its
    # local ConfigMap (the replacement's input) is not rendered.
    rules = [r for g in one(rendered["example"], "PrometheusRule", "licensectl")["spec"]["groups"] for r in g["rules"]]
    assert {r["annotations"]["runbook_url"] for r in rules} == {
        f"https://docs.example.com/platform/licensectl/operations.md#{r['alert'].lower()}" for r in rules}
    assert not [o for o in rendered["example"] if o["metadata"]["name"] == "licensectl-runbooks"]


def test_webhook_reaches_every_replica_and_never_blocks_vms(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["default"]
    pod_labels = one(objs, "Deployment", "licensectl")["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in container(objs)["ports"]}
    svc = one(objs, "Service", "licensectl-webhook")
    assert svc["spec"]["selector"].items() <= pod_labels.items() and LEADER_LABEL not in svc["spec"]["selector"]
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == {"webhook"} <= port_names
    hook, vm_hook = one(objs, "MutatingWebhookConfiguration", "licensectl")["webhooks"]
    # The VirtualMachine boot image warning: the same server, never blocking, never patching.
    assert vm_hook["clientConfig"]["service"] == {**hook["clientConfig"]["service"], "path": VM_PATH}
    assert vm_hook["failurePolicy"] == "Ignore" and vm_hook["sideEffects"] == "None"
    assert vm_hook["reinvocationPolicy"] == "Never" and vm_hook["timeoutSeconds"] <= 5
    assert vm_hook["rules"] == [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["kubevirt.io"],
                                 "apiVersions": ["v1"], "resources": ["virtualmachines"], "scope": "Namespaced"}]
    assert [c["name"] for c in vm_hook["matchConditions"]] == ["uses-gpu-claims", "template-changed"]
    assert vm_hook["namespaceSelector"] == hook["namespaceSelector"]
    ref = hook["clientConfig"]["service"]
    assert (ref["name"], ref["namespace"]) == ("licensectl-webhook", NAMESPACE)
    assert ref["port"] == svc["spec"]["ports"][0]["port"]
    assert ref["path"] == "/mutate-virtualmachineinstances"
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["reinvocationPolicy"] == "IfNeeded" and hook["timeoutSeconds"] <= 5
    assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": ["kubevirt.io"], "apiVersions": ["v1"],
                              "resources": ["virtualmachineinstances"], "scope": "Namespaced"}]
    assert [c["name"] for c in hook["matchConditions"]] == ["uses-gpu-claims"]
    (expr,) = hook["namespaceSelector"]["matchExpressions"]
    assert expr["operator"] == "NotIn" and expr["values"] == ["kube-system"]


def test_services_select_the_pods_and_the_leader(rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["default"]
    pod_labels = one(objs, "Deployment", "licensectl")["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in container(objs)["ports"]}
    metrics = one(objs, "Service", "licensectl-metrics")
    reports = one(objs, "Service", "licensectl-reports")
    assert metrics["spec"]["selector"].items() <= pod_labels.items()
    assert reports["spec"]["selector"] == {**metrics["spec"]["selector"], LEADER_LABEL: "true"}
    assert {p["targetPort"] for p in metrics["spec"]["ports"]} == {"metrics"} <= port_names
    assert {p["targetPort"] for p in reports["spec"]["ports"]} == {"reports"} <= port_names
    smon = one(objs, "ServiceMonitor", "licensectl")
    assert smon["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
    assert not smon["spec"]["selector"]["matchLabels"].items() <= reports["metadata"]["labels"].items()
    assert smon["spec"]["endpoints"][0]["port"] == "metrics"
    assert smon["spec"]["endpoints"][0]["honorLabels"] is True
    pdb = one(objs, "PodDisruptionBudget", "licensectl")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_network_policy_opens_reports_to_tenants_and_metrics_to_monitoring(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    np = one(rendered["default"], "NetworkPolicy", "licensectl")
    assert np["spec"]["policyTypes"] == ["Ingress"]
    by_port = {r["ports"][0]["port"]: (r["from"][0]["namespaceSelector"] if "from" in r else None)
               for r in np["spec"]["ingress"]}
    assert by_port["reports"] == {"matchExpressions": [
        {"key": "tenant.cozystack.io/tenant-root", "operator": "Exists"}]}
    assert by_port["metrics"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert by_port["webhook"] is None  # the apiserver's source address cannot be named


def rbac_rules(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in objs:
        if o["kind"] in {"ClusterRole", "Role"}:
            for r in o["rules"]:
                yield f"{o['kind']}/{o['metadata']['name']}", r


def test_rbac_is_minimal(rendered: dict[str, list[dict[str, Any]]]) -> None:
    granted: set[tuple[str, str, str, str]] = set()
    for where, r in rbac_rules(rendered["default"]):
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in r[field], f"{where}: wildcard {field}"
        assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(r["verbs"]), where
        for g in r["apiGroups"]:
            for res in r["resources"]:
                for v in r["verbs"]:
                    granted.add((where.split("/")[0], g, res, v))
    # No VMI deletion unless the fallback component is used; no pod/lease writes cluster-wide.
    assert not any(g == "kubevirt.io" and res == "virtualmachineinstances" and v == "delete"
                   for _, g, res, v in granted)
    assert not any(kind == "ClusterRole" and res in {"pods", "leases"} for kind, _, res, _ in granted)
    assert ("ClusterRole", "subresources.kubevirt.io", "virtualmachines/restart", "update") in granted
    # Cluster API's objects (tenant cluster workers) are read one at a time, never listed or written.
    capi = {(res, v) for _, g, res, v in granted if g in {"cluster.x-k8s.io", "infrastructure.cluster.x-k8s.io"}}
    assert capi == {("clusters", "get"), ("machines", "get"), ("kubevirtmachines", "get")}


def test_every_rbac_rule_says_why() -> None:
    """Each rule in the RBAC sources is directly preceded by a comment."""
    for path in MANIFESTS.rglob("*.yaml"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(r"\s+- apiGroups:", line):
                assert lines[i - 1].strip().startswith("#"), f"{path.relative_to(ROOT)}:{i + 1}"


# --------------------------------------------------------------------------------------------------
# Against the real apiserver
# --------------------------------------------------------------------------------------------------
def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, **kw)


@pytest.fixture(scope="module")
def operator_crds(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """prometheus-operator's ServiceMonitor/PrometheusRule CRDs from its pinned Go module."""
    go = shutil.which("go")
    if go is None:
        pytest.fail("go not found: needed to fetch the prometheus-operator module")
    res = run([go, "mod", "download", "-json", f"{PROMETHEUS_OPERATOR_MODULE}@{PROMETHEUS_OPERATOR_VERSION}"],
              cwd=tmp_path_factory.mktemp("gomod"))
    assert res.returncode == 0, res.stdout + res.stderr
    info = json.loads(res.stdout)
    assert info["Sum"] == PROMETHEUS_OPERATOR_SUM, "prometheus-operator module does not match its pinned sum"
    crd_dir = Path(info["Dir"]) / "example" / "prometheus-operator-crd"
    return [crd_dir / name for name in OPERATOR_CRDS]


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, kubeconfig_path: Path, operator_crds: list[Path]) -> list[str]:
    """kubectl argv bound to the session cluster, with every CRD the manifests need Established."""
    kubectl = [str(control_plane.kubectl), "--kubeconfig", str(kubeconfig_path)]
    crds = [*operator_crds, *crd_files()]
    res = run([*kubectl, "apply", "--server-side", "--force-conflicts", "--field-manager=licensectl-tests",
               *[a for p in crds for a in ("-f", str(p))]])
    assert res.returncode == 0, res.stderr
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in crds]
    res = run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s",
               *[f"crd/{n}" for n in names]])
    assert res.returncode == 0, res.stderr
    # Namespaced objects can only be dry-run into a namespace that exists.
    ns = yaml.safe_load((MANIFESTS / "base" / "namespace.yaml").read_text())
    res = run([*kubectl, "apply", "--server-side", "--field-manager=licensectl-tests", "-f", "-"],
              input=yaml.safe_dump(ns))
    assert res.returncode == 0, res.stderr
    return kubectl


def dry_run(kubectl: list[str], objs: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    return run([*kubectl, "apply", "--server-side", "--dry-run=server", "--validate=strict",
                "--field-manager=licensectl-tests", "-f", "-"], input=yaml.safe_dump_all(objs))


@pytest.mark.cluster
@pytest.mark.parametrize("build", sorted(BUILDS))
def test_every_object_passes_server_dry_run(cluster: list[str], build: str) -> None:
    objs = kustomize(cluster[0], BUILDS[build])  # the control plane's own kubectl renders it too
    res = dry_run(cluster, objs)
    assert res.returncode == 0, res.stderr
    applied = [line for line in res.stdout.splitlines() if line.endswith("serverside-applied (server dry run)")]
    assert len(applied) == len(objs), res.stdout
    # The namespace enforces Pod Security "restricted"; the apiserver warns if the pod template breaks it.
    assert "PodSecurity" not in res.stderr, res.stderr


@pytest.mark.cluster
def test_server_dry_run_rejects_broken_objects(cluster: list[str]) -> None:
    """The dry run really validates: an unknown field and a bad PrometheusRule duration are refused."""
    objs = kustomize(cluster[0], BUILDS["default"])
    dep = one(objs, "Deployment", "licensectl")
    dep["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFilesytem"] = True
    res = dry_run(cluster, [dep])
    assert res.returncode != 0
    assert "readOnlyRootFilesytem" in res.stderr
    rule = one(objs, "PrometheusRule", "licensectl")
    rule["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
    res = dry_run(cluster, [rule])
    assert res.returncode != 0
    assert "for" in res.stderr


@pytest.mark.cluster
def test_rbac_grants_what_licensectl_does_and_no_more(cluster: list[str]) -> None:
    """Apply the RBAC for real and ask the apiserver's authorizer what the ServiceAccount may do."""
    objs = [o for o in kustomize(cluster[0], BUILDS["default"])
            if o["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}]
    res = run([*cluster, "apply", "--server-side", "--field-manager=licensectl-tests", "-f", "-"],
              input=yaml.safe_dump_all(objs))
    assert res.returncode == 0, res.stderr
    try:
        def can(verb: str, resource: str, ns: str = "tenant-a", subresource: str = "", name: str = "") -> bool:
            """A SubjectAccessReview: the apiserver's own authorizer, no discovery involved."""
            res_name, _, group = resource.partition(".")
            attrs = {"verb": verb, "group": group, "resource": res_name, "subresource": subresource,
                     "namespace": ns, "name": name}
            review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                      "spec": {"user": SA, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
                               "resourceAttributes": attrs}}
            out = run([*cluster, "create", "-o", "json", "-f", "-"], input=json.dumps(review))
            assert out.returncode == 0, out.stderr
            return bool(json.loads(out.stdout)["status"].get("allowed"))

        allowed = [
            ("create", "secrets"), ("update", "secrets"), ("delete", "secrets"), ("watch", "secrets"),
            ("list", "namespaces"), ("create", "events"), ("patch", "events"),
            ("list", "gpuclasses.gpu.cozystack.io"), ("watch", "gpuclaims.gpu.cozystack.io"),
            ("patch", "virtualmachines.kubevirt.io"), ("watch", "virtualmachineinstances.kubevirt.io"),
            ("get", "clusters.cluster.x-k8s.io"), ("get", "machines.cluster.x-k8s.io"),
            ("get", "kubevirtmachines.infrastructure.cluster.x-k8s.io"),
        ]
        denied = [
            ("patch", "secrets"), ("deletecollection", "secrets"), ("delete", "virtualmachineinstances.kubevirt.io"),
            ("update", "virtualmachines.kubevirt.io"), ("delete", "virtualmachines.kubevirt.io"),
            ("patch", "pods"), ("create", "leases.coordination.k8s.io"), ("patch", "namespaces"),
            ("update", "gpuclasses.gpu.cozystack.io"), ("create", "pods"),
            ("list", "clusters.cluster.x-k8s.io"), ("patch", "clusters.cluster.x-k8s.io"),
            ("update", "machines.cluster.x-k8s.io"), ("list", "kubevirtmachines.infrastructure.cluster.x-k8s.io"),
        ]
        for verb, resource in allowed:
            assert can(verb, resource), f"may not {verb} {resource}"
        for verb, resource in denied:
            assert not can(verb, resource), f"may {verb} {resource}"
        assert can("update", "virtualmachines.subresources.kubevirt.io", subresource="restart")
        assert not can("update", "virtualmachines.subresources.kubevirt.io", subresource="migrate")
        # Own namespace only: the leader label on its pod, the Lease by name.
        assert can("patch", "pods", ns=NAMESPACE)
        assert can("create", "leases.coordination.k8s.io", ns=NAMESPACE)
        assert can("update", "leases.coordination.k8s.io", ns=NAMESPACE, name="licensectl")
        assert not can("update", "leases.coordination.k8s.io", ns=NAMESPACE, name="other")
    finally:
        run([*cluster, "delete", "--ignore-not-found", "--wait=false", "-f", "-"], input=yaml.safe_dump_all(objs))


def test_dockerfile_matches_the_deployment(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The image runs as the uid the pod enforces, and its build context holds what it copies."""
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines()]
    assert lines[-2:] == ['ENTRYPOINT ["licensectl"]', 'CMD ["run"]']
    # The base image and the dependency lock are tests/unit/project/test_image_recipe.py's business.
    pod = one(rendered["default"], "Deployment", "licensectl")["spec"]["template"]["spec"]
    assert f"USER {pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}" in lines
    included = {ln[1:].rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.startswith("!")}
    for ln in lines:
        if ln.startswith("COPY") and "--from=" not in ln:
            for src in ln.split()[1:-1]:
                assert src.rstrip("/") in included, f"{src} is excluded by .dockerignore"
                assert (ROOT / src).exists(), f"{src} does not exist"
