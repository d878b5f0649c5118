"""charts/licensectl against the real apiserver: dry runs, install, upgrade, uninstall.

Every object of every valid toggle combination goes through `kubectl apply --dry-run=server
--validate=strict`. There is no earlier chart release, so the "previous version" is licensectl
0.1.0 as manifests/ installs it: that install is applied, handed to Helm and adopted by a release
with the same settings (tests/chart/values/kustomize-default.yaml); the controller then runs as a
process with a token of the ServiceAccount the chart created (no kubelet runs pods here), the
release is upgraded to the Cozystack setup (VictoriaMetrics, dashboard, tuned rollout), and
uninstalled.

prometheus-operator's CRDs come from its pinned Go module (tests/manifests); the VictoriaMetrics
operator's Go modules are not reachable from here, so VMServiceScrape/VMRule are checked against
minimal CRDs written from its documented API (tests/chart/crds/).
"""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import AdmissionregistrationV1Api, ApiClient, CoordinationV1Api, CoreV1Api
from kubernetes_asyncio.client.rest import ApiException

from licensectl_dev.devcluster.controlplane import ControlPlane, render_kubeconfig
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.world import unique

from ..e2e.support import controllers, create_pod, make_fleet, start_controller
from ..integration.test_gpuclass_policy import wait_gpuclass_policy_lifted
from ..manifests.test_manifests import cluster, dry_run, kustomize, operator_crds  # noqa: F401 - fixtures
from .helm import CHART, NAMESPACE, REQUIRED, ROOT, VALUES, Helm, documents, objects_by_key
from .test_chart_history import chart_commits

VM_CRDS = sorted((Path(__file__).resolve().parent / "crds").glob("*.yaml"))

# The switches whose combinations are dry-run (each valid combination; replicas>1 without leader
# election is the invalid one, so `single` means one replica without it).
COMBINATION_SWITCHES = {
    "prometheusOperator": ("monitoring", "prometheusOperator", "enabled"),
    "victoriaMetrics": ("monitoring", "victoriaMetrics", "enabled"),
    "dashboard": ("monitoring", "dashboard", "enabled"),
    "gpuCRDs": ("gpuCRDs",),
    "pdb": ("podDisruptionBudget", "enabled"),
    "networkPolicy": ("networkPolicy", "enabled"),
    "restartFallbackDelete": ("config", "restartFallbackDelete"),
}


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False, **kw)


@pytest.fixture(scope="module")
def kube(cluster: list[str]) -> list[str]:  # noqa: F811 - the imported fixture
    """kubectl argv for the session cluster, with every CRD the chart can render Established."""
    res = run([*cluster, "apply", "--server-side", "--field-manager=licensectl-tests",
               *[a for p in VM_CRDS for a in ("-f", str(p))]])
    assert res.returncode == 0, res.stderr
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in VM_CRDS]
    res = run([*cluster, "wait", "--for=condition=Established", "--timeout=60s", *[f"crd/{n}" for n in names]])
    assert res.returncode == 0, res.stderr
    return cluster


def combination(flags: dict[str, bool], single: bool) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, path in COMBINATION_SWITCHES.items():
        node = values
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = flags[name]
    # The GrafanaDashboard is independent of every other switch: it rides with the sidecar ConfigMap.
    values["monitoring"]["grafanaOperator"] = {"enabled": flags["dashboard"]}
    if single:
        values["replicaCount"] = 1
        values.setdefault("config", {})["leaderElect"] = False
    return values


def test_every_valid_toggle_combination_passes_server_dry_run(helm: Helm, kube: list[str]) -> None:
    combos = [combination(dict(zip(COMBINATION_SWITCHES, bits, strict=False)), single=bits[-1])
              for bits in itertools.product((False, True), repeat=len(COMBINATION_SWITCHES) + 1)]
    assert len(combos) == 2 ** (len(COMBINATION_SWITCHES) + 1)
    unique_objs: dict[str, dict[str, Any]] = {}
    for values, res in zip(combos, helm.template_many(combos), strict=True):
        assert res.returncode == 0, f"{values}: {res.stderr}"
        for o in documents(res.stdout):
            if o:
                unique_objs[json.dumps(o, sort_keys=True)] = o
    objs = list(unique_objs.values())
    kinds = {o["kind"] for o in objs}
    assert {"VMRule", "VMServiceScrape", "PrometheusRule", "ServiceMonitor", "ConfigMap", "GrafanaDashboard",
            "CustomResourceDefinition", "PodDisruptionBudget", "NetworkPolicy",
            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds
    res = dry_run(kube, objs)
    assert res.returncode == 0, res.stderr
    applied = [ln for ln in res.stdout.splitlines() if ln.endswith("(server dry run)")]
    assert len(applied) == len(objs), res.stdout
    assert "PodSecurity" not in res.stderr, res.stderr


def test_server_dry_run_catches_a_broken_vm_rule(helm: Helm, kube: list[str]) -> None:
    """The minimal VictoriaMetrics CRDs really validate what the chart renders."""
    objs = objects_by_key(helm.render({"monitoring": {"victoriaMetrics": {"enabled": True}}}))
    rule = objs[("VMRule", NAMESPACE, "licensectl")]
    rule["spec"]["groups"][0]["rules"][0]["fro"] = "10m"
    res = dry_run(kube, [rule])
    assert res.returncode != 0
    assert "fro" in res.stderr


def kubectl_json(kube: list[str], *args: str) -> Any:
    res = run([*kube, *args, "-o", "json"])
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def names(kube: list[str], ns: str, kinds: str) -> set[str]:
    items = kubectl_json(kube, "get", kinds, "-n", ns)["items"]
    return {f"{o['kind']}/{o['metadata']['name']}" for o in items}


def kustomized_into(kube: list[str], ns: str) -> list[dict[str, Any]]:
    """manifests/ (base + monitoring) rendered, its namespaced objects moved to `ns`."""
    out = []
    for o in kustomize(kube[0], ROOT / "manifests"):
        if o["kind"] == "Namespace":
            continue
        if o["metadata"].get("namespace"):
            o["metadata"]["namespace"] = ns
        for s in o.get("subjects") or []:
            s["namespace"] = ns
        for hook in o.get("webhooks") or []:  # what kustomize's namespace transformer rewrites too
            hook["clientConfig"]["service"]["namespace"] = ns
        out.append(o)
    return out


def adoption_commands(ns: str) -> list[list[str]]:
    """kubectl argv that mark a kustomize install's objects as the release's (docs/operations.md)."""
    release = ["meta.helm.sh/release-name=licensectl", f"meta.helm.sh/release-namespace={ns}"]
    owned = ["app.kubernetes.io/managed-by=Helm"]
    selector = ["-l", "app.kubernetes.io/part-of=licensectl"]
    namespaced = ["-n", ns, NAMESPACED_KINDS, *selector]
    cluster_wide = ["clusterrole,clusterrolebinding,mutatingwebhookconfigurations", *selector]
    return [["label", "--overwrite", *namespaced, *owned], ["annotate", "--overwrite", *namespaced, *release],
            ["label", "--overwrite", *cluster_wide, *owned], ["annotate", "--overwrite", *cluster_wide, *release]]


GPUCLASS_POLICY = {"ValidatingAdmissionPolicy/licensectl-gpuclass-immutable",
                   "ValidatingAdmissionPolicyBinding/licensectl-gpuclass-immutable"}


def policy_names(kube: list[str]) -> set[str]:
    """The GPUClass policy objects in the cluster (cluster-scoped, so no namespace)."""
    items = kubectl_json(kube, "get", "validatingadmissionpolicies,validatingadmissionpolicybindings")["items"]
    return {f"{o['kind']}/{o['metadata']['name']}" for o in items} & GPUCLASS_POLICY


NAMESPACED_KINDS = ("deployments,services,serviceaccounts,roles,rolebindings,poddisruptionbudgets,"
                    "networkpolicies,servicemonitors,prometheusrules,vmservicescrapes,vmrules,configmaps")
CORE = {"Deployment/licensectl", "Service/licensectl-metrics", "Service/licensectl-reports",
        "Service/licensectl-webhook",
        "ServiceAccount/licensectl", "Role/licensectl", "RoleBinding/licensectl",
        "NetworkPolicy/licensectl"}


def test_install_refuses_bad_values_before_creating_anything(helm: Helm, kube: list[str],
                                                             kubeconfig_path: Path) -> None:
    ns = unique("lc-bad")
    res = helm.run("install", "licensectl", str(CHART), "--namespace", ns, "--create-namespace",
                   "--set", "config.doneGate=soon", kubeconfig=kubeconfig_path)
    assert res.returncode != 0
    assert "doneGate" in res.stderr and "schema" in res.stderr, res.stderr
    res = run([*kube, "get", "namespace", ns])
    assert res.returncode != 0  # not even the namespace was created


@pytest.mark.asyncio(loop_scope="session")
async def test_install_run_as_its_service_account_upgrade_and_uninstall(
        helm: Helm, kube: list[str], control_plane: ControlPlane, kubeconfig_path: Path,
        api_client: ApiClient, namespace_factory: Any, cleanup: Any, tmp_path: Path) -> None:
    ns = unique("lc-helm")
    core = CoreV1Api(api_client)

    async def drop() -> None:
        helm.run("uninstall", "licensectl", "--namespace", ns, "--ignore-not-found", kubeconfig=kubeconfig_path)
        # Cluster-scoped leftovers of a run that failed before Helm adopted the kustomize objects.
        run([*kube, "delete", "clusterrole/licensectl", "clusterrolebinding/licensectl", "--ignore-not-found"])
        await core.delete_namespace(ns)

    cleanup(drop)

    # 0. The previous version: licensectl 0.1.0 installed with kustomize (manifests/), moved to `ns`.
    res = run([*kube, "create", "namespace", ns])
    assert res.returncode == 0, res.stderr
    previous = kustomized_into(kube, ns)
    res = run([*kube, "apply", "--server-side", "--field-manager=kubectl", "-f", "-"],
              input=yaml.safe_dump_all(previous))
    assert res.returncode == 0, res.stderr
    before = kubectl_json(kube, "get", "deployment", "licensectl", "-n", ns)["metadata"]["uid"]

    # 1. Hand the objects to Helm as docs/operations.md says, then install with the same settings:
    # Helm adopts them in place (same Deployment, no pod restart for an unchanged template).
    for argv in adoption_commands(ns):
        res = run([*kube, *argv])
        assert res.returncode == 0, f"{argv}: {res.stderr}"
    res = helm.run("install", "licensectl", str(CHART), "--namespace", ns,
                   "--values", str(VALUES / "kustomize-default.yaml"), kubeconfig=kubeconfig_path)
    assert res.returncode == 0, res.stderr
    assert kubectl_json(kube, "get", "deployment", "licensectl", "-n", ns)["metadata"]["uid"] == before
    monitoring = {"ServiceMonitor/licensectl", "PrometheusRule/licensectl"}
    assert names(kube, ns, NAMESPACED_KINDS) >= CORE | monitoring | {"PodDisruptionBudget/licensectl"}
    binding = kubectl_json(kube, "get", "clusterrolebinding", "licensectl")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "licensectl", "namespace": ns}]
    assert binding["metadata"]["annotations"]["meta.helm.sh/release-namespace"] == ns
    deployment = kubectl_json(kube, "get", "deployment", "licensectl", "-n", ns)
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LICENSECTL_LEADER_ELECT"] == "true"
    assert not policy_names(kube)  # manifests/ does not include components/gpuclass-immutable

    # A second release (another namespace) is refused: licensectl is a cluster singleton.
    other = unique("lc-helm2")
    res = helm.run("install", "licensectl", str(CHART), "--namespace", other, "--create-namespace",
                   "--values", str(REQUIRED), kubeconfig=kubeconfig_path)
    assert res.returncode != 0
    assert "ClusterRole" in res.stderr and "release-namespace" in res.stderr, res.stderr
    assert run([*kube, "get", "namespace", other]).returncode != 0  # refused before creating anything

    # 2. The controller as that ServiceAccount: it leads, replicates, and is never refused.
    await create_pod(api_client, "licensectl-0", ns, service_account="licensectl")
    token = (await core.create_namespaced_service_account_token(
        "licensectl", ns, {"spec": {"expirationSeconds": 3600}})).status.token
    kubeconfig = tmp_path / "sa.kubeconfig"
    kubeconfig.write_text(render_kubeconfig(control_plane.server, control_plane.ca_pem, token=token))
    kubeconfig.chmod(0o600)
    fl = await make_fleet(api_client, namespace_factory, cleanup, controller_ns=ns)
    async with controllers() as started:
        c = await start_controller("helm-sa", kubeconfig, ns, tmp_path, pod_name="licensectl-0",
                                   leader_elect=True, lease_duration_seconds=4, renew_deadline_seconds=3,
                                   retry_period_seconds=0.5, root_tenant=fl.root_name,
                                   report_url="http://127.0.0.1:1/v1/reports",
                                   # The release's own configuration: the chart's RBAC names only it.
                                   webhook_configuration="licensectl")
        started.append(c)
        await c.wait_metric("licensectl_leader", 1)
        await eventually(fl.revision, timeout=30, what="replicas in every tenant")
        scrape = await c.must_scrape()
        assert scrape.value("licensectl_api_requests_total") > 0
        assert scrape.value("licensectl_api_requests_total", code="403") == 0
        lease = await CoordinationV1Api(api_client).read_namespaced_lease("licensectl", ns)
        assert lease.spec.holder_identity == "licensectl-0"

        # Self-managed TLS: the leader filled the release's webhook caBundle with its own CA.
        async def ca_bundle_is_the_controllers() -> bool:
            hook = await AdmissionregistrationV1Api(api_client).read_mutating_webhook_configuration("licensectl")
            tls = await core.read_namespaced_secret("licensectl-tls", ns)
            return base64.b64decode(hook.webhooks[0].client_config.ca_bundle or "") == base64.b64decode(
                tls.data["ca.crt"])

        await eventually(ca_bundle_is_the_controllers, timeout=30, what="caBundle of the release's webhook")
        assert await c.stop() == 0

    # 3. Upgrade to the Cozystack setup: objects are updated in place, switched-off ones removed.
    uid = deployment["metadata"]["uid"]
    # metricsFrom as the kustomize install applied it: a field kubectl applied (server-side) and the chart's
    # default changes (cozy-monitoring) would be an apply conflict (docs/operations.md, "From kustomize").
    res = helm.run("upgrade", "licensectl", str(CHART), "--namespace", ns, "--values", str(REQUIRED),
                   "--set", r"networkPolicy.metricsFrom.matchLabels.kubernetes\.io/metadata\.name=monitoring",
                   "--set", "monitoring.victoriaMetrics.enabled=true", "--set", "monitoring.dashboard.enabled=true",
                   "--set", "podDisruptionBudget.enabled=false", "--set", "config.maxUnavailable=5",
                   kubeconfig=kubeconfig_path)
    assert res.returncode == 0, res.stderr
    after = names(kube, ns, NAMESPACED_KINDS)
    assert after >= CORE | {"VMServiceScrape/licensectl", "VMRule/licensectl", "ConfigMap/licensectl-dashboard"}
    assert not after & (monitoring | {"PodDisruptionBudget/licensectl"})
    deployment = kubectl_json(kube, "get", "deployment", "licensectl", "-n", ns)
    assert deployment["metadata"]["uid"] == uid
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LICENSECTL_MAX_UNAVAILABLE"] == "5"
    # The chart's default adds the GPUClass policy (cluster-scoped, the release's).
    assert policy_names(kube) == GPUCLASS_POLICY
    policy = kubectl_json(kube, "get", "validatingadmissionpolicy", "licensectl-gpuclass-immutable")
    assert policy["metadata"]["annotations"]["meta.helm.sh/release-namespace"] == ns
    history = json.loads(helm.run("history", "licensectl", "--namespace", ns, "-o", "json",
                                  kubeconfig=kubeconfig_path).stdout)
    assert [h["status"] for h in history] == ["superseded", "deployed"]

    # 4. Uninstall: the chart's objects go; what licensectl wrote itself stays (by design).
    res = helm.run("uninstall", "licensectl", "--namespace", ns, "--wait", kubeconfig=kubeconfig_path)
    assert res.returncode == 0, res.stderr
    left = names(kube, ns, NAMESPACED_KINDS)
    assert not left & (CORE | {"VMServiceScrape/licensectl", "VMRule/licensectl", "ConfigMap/licensectl-dashboard"})
    for kind in ("clusterrole", "clusterrolebinding"):
        assert run([*kube, "get", kind, "licensectl"]).returncode != 0, f"{kind} left behind"
    assert not policy_names(kube)
    await wait_gpuclass_policy_lifted(api_client)  # the tests after this one edit classes freely
    assert await fl.revision() is not None  # replicas in tenant namespaces are not the chart's
    try:
        await CoordinationV1Api(api_client).read_namespaced_lease("licensectl", ns)
    except ApiException as e:  # pragma: no cover - reported below
        pytest.fail(f"the Lease should outlive the release: {e.status}")
    # Everything left in the namespace is in the Uninstall section's table (docs/operations.md#uninstall).
    left = {n.split("/", 1)[1] for n in names(kube, ns, "secrets,leases,configmaps")} - {"kube-root-ca.crt"}
    assert {"licensectl-tls", "licensectl-report-signing-key", "licensectl"} <= left, left
    assert undocumented_leftovers(left) == set()


def uninstall_section() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index("\n## Uninstall\n")
    return text[start:text.index("\n## ", start + 1)]


def undocumented_leftovers(left: set[str]) -> set[str]:
    """Names (revision stores by their prefix) the Uninstall section does not mention in backquotes."""
    section = uninstall_section()
    return {n for n in left
            if f"`{n}`" not in section and not (n.startswith("licensectl-revisions-")
                                                 and "`licensectl-revisions-<hash>`" in section)}


def test_uninstall_docs_check_catches_an_unlisted_object() -> None:
    assert undocumented_leftovers({"licensectl-tls", "licensectl-revisions-0123456789abcdef"}) == set()
    assert undocumented_leftovers({"licensectl-mystery"}) == {"licensectl-mystery"}


@pytest.mark.asyncio(loop_scope="session")
async def test_reuse_values_upgrade_from_the_oldest_chart_version(
        helm: Helm, kube: list[str], kubeconfig_path: Path, api_client: ApiClient, cleanup: Any,
        tmp_path: Path) -> None:
    """The documented upgrade, for real: the first chart version in git history (from before
    certManager, gpuClassPolicy and the webhook existed) is installed, then upgraded with
    `--reuse-values --set image.tag=...` to this chart. test_chart_history.py renders the same from
    every earlier version; this proves the model against Helm's own upgrade and the apiserver."""
    tree = chart_at(chart_commits()[-1], tmp_path / "oldest")
    ns = unique("lc-reuse")
    core = CoreV1Api(api_client)

    async def drop() -> None:
        helm.run("uninstall", "licensectl", "--namespace", ns, "--ignore-not-found", "--wait",
                 kubeconfig=kubeconfig_path)
        await core.delete_namespace(ns)

    cleanup(drop)
    res = helm.run("install", "licensectl", str(tree), "--namespace", ns,
                   "--create-namespace", kubeconfig=kubeconfig_path)
    assert res.returncode == 0, res.stderr
    before = kubectl_json(kube, "get", "deployment", "licensectl", "-n", ns)["metadata"]["uid"]
    assert run([*kube, "get", "mutatingwebhookconfiguration", "licensectl"]).returncode != 0  # not in that chart

    res = helm.run("upgrade", "licensectl", str(CHART), "--namespace", ns, "--reuse-values",
                   "--set", "image.tag=9.9.9", kubeconfig=kubeconfig_path)
    assert res.returncode == 0, res.stderr
    deployment = kubectl_json(kube, "get", "deployment", "licensectl", "-n", ns)
    assert deployment["metadata"]["uid"] == before
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "licensectl:9.9.9"  # the old release's repository, the new tag
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LICENSECTL_WEBHOOK_ADDRESS"] == "0.0.0.0:9443"  # absent from the old values: the pod's default
    assert {p["name"] for p in container["ports"]} == {"metrics", "reports", "webhook"}
    # Objects of values the old release never had, as a fresh install renders them.
    assert names(kube, ns, "services") >= {"Service/licensectl-webhook"}
    hook = kubectl_json(kube, "get", "mutatingwebhookconfiguration", "licensectl")
    assert hook["metadata"]["annotations"]["meta.helm.sh/release-namespace"] == ns
    assert "cert-manager.io/inject-ca-from" not in hook["metadata"].get("annotations", {})
    assert policy_names(kube) == GPUCLASS_POLICY
    history = json.loads(helm.run("history", "licensectl", "--namespace", ns, "-o", "json",
                                  kubeconfig=kubeconfig_path).stdout)
    assert [(h["chart"], h["status"]) for h in history] == [
        ("licensectl-0.1.0", "superseded"), (f"licensectl-{chart_version()}", "deployed")]

    res = helm.run("uninstall", "licensectl", "--namespace", ns, "--wait", kubeconfig=kubeconfig_path)
    assert res.returncode == 0, res.stderr
    assert not policy_names(kube)
    await wait_gpuclass_policy_lifted(api_client)  # the tests after this one edit classes freely


def chart_at(commit: str, into: Path) -> Path:
    """The repository as of `commit` unpacked under `into` (the chart's files/ were links into the rest
    of the tree then); returns that commit's chart directory."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit],
                             capture_output=True, timeout=120, check=False)
    assert archive.returncode == 0, archive.stderr
    unpack = subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, capture_output=True, timeout=120,
                            check=False)
    assert unpack.returncode == 0, unpack.stderr
    return into / "charts" / "licensectl"


def chart_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["version"])
