"""charts/licensectl with the real helm and helm-unittest (no cluster needed).

`helm lint --strict`, the helm-unittest suites in the chart's tests/ (Cozystack's convention) run
through the real plugin, the generated `config:` block and schema against licensectl/config.py,
schema rejections, a dead-value finder, and the proof that the chart and manifests/ are one
source: rendered with the same settings they produce the same objects.
"""

from __future__ import annotations

import copy
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
from licensectl.cli import main as cli

from ..manifests.test_manifests import gpuclass_policy, kustomize, static_kubectl
from .helm import CHART, NAMESPACE, REQUIRED, ROOT, VALUES, Helm, documents, objects_by_key

# They need the Go-built helm, helm-unittest and kubectl (the control plane's build): the slow tier.
pytestmark = pytest.mark.cluster

# Every on/off switch of the chart; the dead-value test renders with all of them on.
TOGGLES = {
    "podDisruptionBudget.enabled": True,
    "networkPolicy.enabled": True,
    "gpuCRDs": False,
    "gpuClassPolicy.enabled": True,
    "monitoring.prometheusOperator.enabled": False,
    "monitoring.victoriaMetrics.enabled": False,
    "monitoring.dashboard.enabled": False,
    "monitoring.grafanaOperator.enabled": False,
    "config.restartFallbackDelete": None,
    "spreadAcrossNodes": True,
    "certManager.enabled": False,
}


def set_path(values: dict[str, Any], path: str | tuple[str, ...], value: Any) -> None:
    *parents, leaf = path.split(".") if isinstance(path, str) else path
    node = values
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


def default_values() -> dict[str, Any]:
    v: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return v


def all_on() -> dict[str, Any]:
    v = default_values()
    v["image"]["repository"] = "licensectl"
    for path in TOGGLES:
        set_path(v, path, True)
    v["replicaCount"] = 1  # so config.leaderElect can be switched off too
    return v


def with_standby(values: dict[str, Any]) -> dict[str, Any]:
    """The same values with three replicas (and leader election): the PodDisruptionBudget renders."""
    v = copy.deepcopy(values)
    v["replicaCount"] = 3
    v["config"]["leaderElect"] = True
    return v


# --------------------------------------------------------------------------------------------------
# helm lint, helm-unittest
# --------------------------------------------------------------------------------------------------
def test_helm_is_the_pinned_v4(helm: Helm) -> None:
    res = helm.run("version", "--short")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("v4.3.2"), res.stdout


@pytest.mark.parametrize("values", [{}, all_on(), "kustomize-example.yaml"], ids=["defaults", "all-on", "example"])
def test_helm_lint_strict(helm: Helm, values: dict[str, Any] | str) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE, "--values", str(REQUIRED)]
    if isinstance(values, str):
        res = helm.run(*args, "--values", str(VALUES / values))
    else:
        res = helm.run(*args, "--values", "-", input=yaml.safe_dump(values))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in res.stdout, res.stdout


def suite_cases(chart: Path) -> int:
    return sum(len(yaml.safe_load(p.read_text())["tests"]) for p in (chart / "tests").glob("*_test.yaml"))


def test_helm_unittest_suites_pass(helm: Helm) -> None:
    res = helm.run("unittest", "--strict", str(CHART))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    cases = suite_cases(CHART)
    assert cases >= 20
    # Every case ran (and passed): the plugin's own summary line.
    assert re.search(rf"Tests:\s+{cases} passed, {cases} total", out), out


def test_helm_unittest_fails_a_wrong_expectation(helm: Helm, tmp_path: Path) -> None:
    """The suites can fail: the same chart with one expectation changed is reported."""
    chart = tmp_path / "licensectl"
    shutil.copytree(CHART, chart, symlinks=False)
    suite = chart / "tests" / "deployment_test.yaml"
    suite.write_text(suite.read_text().replace(f"value: licensectl:{__version__}", "value: licensectl:6.6.6", 1))
    res = helm.run("unittest", str(chart))
    assert res.returncode != 0
    assert "licensectl:6.6.6" in res.stdout + res.stderr


# --------------------------------------------------------------------------------------------------
# Values: generated from config.py, documented, schema-checked, none dead
# --------------------------------------------------------------------------------------------------
def cli_output(capsys: pytest.CaptureFixture[str], fmt: str) -> str:
    assert cli.main(["config-reference", "--format", fmt]) == 0
    return capsys.readouterr().out


def test_config_block_and_schema_are_generated_from_config_py(capsys: pytest.CaptureFixture[str]) -> None:
    text = (CHART / "values.yaml").read_text()
    start = text.index(config.HELM_VALUES_START)
    end = text.index(config.HELM_VALUES_END) + len(config.HELM_VALUES_END) + 1
    assert text[start:end] == config.reference_helm_values(), (
        "run `licensectl config-reference --format helm-values` and paste it into charts/licensectl/values.yaml")
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["config"] == config.helm_values_schema(), (
        "run `licensectl config-reference --format helm-schema` and put it under properties.config")
    assert cli_output(capsys, "helm-values") == config.reference_helm_values()
    assert json.loads(cli_output(capsys, "helm-schema")) == config.helm_values_schema()
    # One value per `licensectl run` flag.
    assert list(default_values()["config"]) == [config.helm_key(o.field) for o in config.OPTIONS]


def test_chart_versions_follow_the_package() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__


def leaves(values: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(key path, value) of every leaf; empty maps and lists are leaves too."""
    if isinstance(values, dict) and values:
        for k, v in values.items():
            yield from leaves(v, (*prefix, k))
    else:
        yield prefix, values


def documented_paths() -> set[str]:
    """Paths whose key line in values.yaml has a `# --` comment directly above it."""
    out: set[str] = set()
    stack: list[tuple[int, str]] = []
    comment = False
    for line in (CHART / "values.yaml").read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment = True
            continue
        if stripped.startswith("#"):
            continue
        m = re.match(r"^(\s*)([A-Za-z0-9_.]+):", line)
        if not m:
            comment = False
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(k for _, k in stack), m.group(2)])
        stack.append((indent, m.group(2)))
        if comment:
            out.add(path)
        comment = False
    return out


def test_every_value_is_documented_and_in_the_schema() -> None:
    documented = documented_paths()
    schema = json.loads((CHART / "values.schema.json").read_text())
    for parts, _ in leaves(default_values()):
        path = ".".join(parts)
        assert any(".".join(parts[:i]) in documented for i in range(1, len(parts) + 1)), f"{path} undocumented"
        node = schema
        for p in parts:
            props = node.get("properties", {})
            if p in props:
                node = props[p]
            else:
                assert isinstance(node.get("additionalProperties"), dict), f"{path} not in the schema"
                node = node["additionalProperties"]
        assert node.get("type") or node.get("enum") or node.get("properties"), f"{path} untyped in the schema"
    assert schema["additionalProperties"] is False


# A valid different value for each leaf whose change cannot be derived from its type.
SAMPLES: dict[str, Any] = {
    "image.repository": "registry.example.com/licensectl",
    "image.tag": "9.9.9",
    "image.pullPolicy": "Always",
    "imagePullSecrets": [{"name": "regcred"}],
    "resources.requests.cpu": "77m",
    "resources.requests.memory": "99Mi",
    "resources.limits.cpu": "2",
    "resources.limits.memory": "1Gi",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Exists"}],
    "priorityClassName": "system-cluster-critical",
    "podAnnotations": {"example.com/a": "b"},
    "networkPolicy.reportsFrom.matchExpressions": [{"key": "tenant", "operator": "Exists"}],
    "networkPolicy.metricsFrom.matchLabels.kubernetes.io/metadata.name": "monitoring",
    "monitoring.interval": "1m",
    "monitoring.scrapeTimeout": "20s",
    "monitoring.labels": {"release": "monitoring"},
    "monitoring.runbookBaseUrl": "https://docs.example.net/licensectl/operations.md",
    "monitoring.dashboard.namespace": "cozy-grafana",
    "monitoring.grafanaOperator.namespace": "tenant-root",
    "monitoring.grafanaOperator.instanceSelector.dashboards": "main",
    "monitoring.grafanaOperator.folder": "Platform",
    "monitoring.dashboard.sidecarLabel.grafana_dashboard": "yes",
    "podDisruptionBudget.minAvailable": 2,
    "config.leaseDurationSeconds": 30,
    "config.reportUrl": "https://licensectl.example.net/v1/reports",
    "config.gpuVersion": "v1beta1",
    "config.tenantLabelPrefix": "tenant.example.net/",
    "config.renewDeadlineSeconds": 12,
    "config.retryPeriodSeconds": 3,
    "replicaCount": 3,
    "config.metricsAddress": "0.0.0.0:9000",
    "config.reportsAddress": "0.0.0.0:9443",
    "config.webhookAddress": "0.0.0.0:10443",
    "config.tlsMode": "secret",
    "config.maxUnavailable": "5",
    "config.doneGate": "ready",
    "config.maxRestartsPerMinute": 30,
    "config.canary": "5%",
    "config.rolloutSteps": "25%,100%",
    "config.analysisMaxUnlicensed": 2,
    "config.guestMetrics": "per-tenant",
    "config.vgpuDriverCheck": "enforce",
    "config.logFormat": "console",
    "config.logLevel": "debug",
}


def changed(path: str, value: Any) -> Any:
    if path in SAMPLES:
        return SAMPLES[path]
    if isinstance(value, bool):
        return not value
    if value is None and path.startswith("config."):
        field = re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), path.removeprefix("config."))
        parse = next(o.parse for o in config.OPTIONS if o.field == field)
        if parse is int:
            return 7
        if parse is float:
            return 7.5
        return True if getattr(parse, "__name__", "") == "_bool" else "x"
    raise AssertionError(f"no sample value for {path}={value!r}: add one to SAMPLES")


def test_no_dead_values(helm: Helm) -> None:
    """Every value changes at least one rendered object when changed (with every toggle on; the
    PodDisruptionBudget's values with the replicas it needs)."""
    bases = {"single": all_on(), "standby": with_standby(all_on())}
    references = {name: objects_by_key(helm.render(base)) for name, base in bases.items()}
    paths, variants, against = [], [], []
    for parts, value in leaves(bases["single"]):
        path = ".".join(parts)
        base = "standby" if path.startswith("podDisruptionBudget.") else "single"
        values = copy.deepcopy(bases[base])
        set_path(values, parts, changed(path, value))
        paths.append(path)
        variants.append(values)
        against.append(base)
    assert len(paths) > 60
    dead = []
    for path, base, res in zip(paths, against, helm.template_many(variants), strict=True):
        assert res.returncode == 0, f"{path}: {res.stderr}"
        if objects_by_key(documents(res.stdout)) == references[base]:
            dead.append(path)
    assert not dead, f"values that change nothing: {dead}"


@pytest.mark.parametrize(("values", "message"), [
    ({"config": {"maxUnavailable": "0%"}}, "maxUnavailable"),
    ({"config": {"doneGate": "soon"}}, "doneGate"),
    ({"config": {"maxUnavailble": "5"}}, "maxUnavailble"),
    ({"config": {"settleSeconds": "sixty"}}, "settleSeconds"),
    ({"replicaCount": 0}, "replicaCount"),
    ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ({"monitoring": {"interval": "often"}}, "interval"),
    ({"podDisruptionBudget": {"minAvailable": "most"}}, "minAvailable"),
    ({"gpuCRDs": "yes"}, "gpuCRDs"),
    ({"gpuClassPolicy": {"enabled": "yes"}}, "gpuClassPolicy"),
    ({"gpuClassPolicy": {"enable": True}}, "enable"),
    ({"monitoring": {"runbookBaseUrl": "docs/operations.md"}}, "runbookBaseUrl"),
    ({"monitoring": {"runbookBaseUrl": "https://x.example/ops.md#anchor"}}, "runbookBaseUrl"),
    # issue 26: every string setting licensectl parses has the parser's pattern.
    ({"config": {"canary": "5 VMs"}}, "/config/canary"),
    ({"config": {"canary": "0%"}}, "/config/canary"),
    ({"config": {"canary": "namespaces:"}}, "/config/canary"),
    ({"config": {"rolloutSteps": "10,50,100"}}, "/config/rolloutSteps"),
    ({"config": {"rolloutSteps": "10%;100%"}}, "/config/rolloutSteps"),
    ({"config": {"rolloutSteps": "150%"}}, "/config/rolloutSteps"),
    ({"config": {"metricsAddress": "8080"}}, "/config/metricsAddress"),
    ({"config": {"webhookAddress": "0.0.0.0:https"}}, "/config/webhookAddress"),
    ({"config": {"reportUrl": "licensectl-reports:8443"}}, "/config/reportUrl"),
    ({"config": {"vgpuDriverImages": "registry.example.com/a b"}}, "/config/vgpuDriverImages"),
    ({"config": {"leaseName": "Licensectl_Lease"}}, "/config/leaseName"),
    ({"config": {"gpuVersion": "1alpha1"}}, "/config/gpuVersion"),
    ({"image": {"repository": "registry.example.com/licensectl@sha256:0"}}, "/image/repository"),
    ({"monitoring": {"grafanaOperator": {"instanceSelector": {"dashboards": 1}}}},
     "/monitoring/grafanaOperator/instanceSelector/dashboards"),
    ({"monitoring": {"grafanaOperator": {"enable": True}}}, "enable"),
], ids=lambda v: json.dumps(v) if isinstance(v, dict) else v)
def test_schema_rejects_bad_values_naming_them(helm: Helm, values: dict[str, Any], message: str) -> None:
    res = helm.template(values)
    assert res.returncode != 0
    assert "schema" in res.stderr and message in res.stderr, res.stderr


def test_schema_requires_an_image_repository(helm: Helm) -> None:
    """The chart has no default repository: leaving it out is an install error, not ImagePullBackOff."""
    res = helm.template(bare=True)
    assert res.returncode != 0
    assert "schema" in res.stderr and "/image/repository" in res.stderr, res.stderr
    res = helm.template({"image": {"repository": "registry.example.com/platform/licensectl"}}, bare=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(("values", "message"), [
    ({"config": {"renewDeadlineSeconds": 20}},
     "config.renewDeadlineSeconds (20) must be less than config.leaseDurationSeconds (15)"),
    ({"config": {"leaseDurationSeconds": 8}},
     "config.renewDeadlineSeconds (10) must be less than config.leaseDurationSeconds (8)"),
    ({"config": {"renewDeadlineSeconds": 2}},
     "config.retryPeriodSeconds (2) x 1.2 must be less than config.renewDeadlineSeconds (2)"),
    ({"config": {"rolloutSteps": "50%,10%"}}, 'config.rolloutSteps "50%,10%" must increase'),
    ({"replicaCount": 3, "podDisruptionBudget": {"minAvailable": 3}},
     "podDisruptionBudget.minAvailable (3) must be less than replicaCount (3)"),
], ids=lambda v: json.dumps(v) if isinstance(v, dict) else v)
def test_templates_refuse_inconsistent_values(helm: Helm, values: dict[str, Any], message: str) -> None:
    """What a per-value schema cannot see: lease timings (licensectl's defaults fill the unset ones),
    step order, a PodDisruptionBudget that leaves nothing to evict."""
    res = helm.template(values)
    assert res.returncode != 0
    assert message in res.stderr, res.stderr


def test_one_replica_renders_no_pod_disruption_budget(helm: Helm) -> None:
    single = {"replicaCount": 1, "config": {"leaderElect": False}}
    assert not [o for o in helm.render(single) if o["kind"] == "PodDisruptionBudget"]
    pdbs = [o for o in helm.render() if o["kind"] == "PodDisruptionBudget"]
    assert [p["spec"]["minAvailable"] for p in pdbs] == [1]


# --------------------------------------------------------------------------------------------------
# One source with manifests/
# --------------------------------------------------------------------------------------------------
HELM_ONLY_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
                    "app.kubernetes.io/version"}


def normalized(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop what only Helm adds (its bookkeeping labels, the keep policy on CRDs); order env by name."""
    o = copy.deepcopy(obj)
    meta = o["metadata"]
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in HELM_ONLY_LABELS}
    meta["labels"] = labels
    ann = {k: v for k, v in (meta.get("annotations") or {}).items() if k != "helm.sh/resource-policy"}
    meta.pop("annotations", None)
    if ann:
        meta["annotations"] = ann
    if o["kind"] == "Deployment":
        for c in o["spec"]["template"]["spec"]["containers"]:
            c["env"] = sorted(c["env"], key=lambda e: e["name"])
    return o


@pytest.mark.parametrize(("build", "values"), [
    (ROOT / "manifests", "kustomize-default.yaml"),
    (ROOT / "manifests" / "overlays" / "example", "kustomize-example.yaml"),
], ids=["default", "example"])
def test_chart_and_manifests_render_the_same_objects(helm: Helm, build: Path, values: str) -> None:
    from_kustomize = {k: normalized(o) for k, o in objects_by_key(kustomize(static_kubectl(), build)).items()
                      if k[0] != "Namespace"}  # helm installs into an existing namespace
    from_chart = {k: normalized(o) for k, o in objects_by_key(helm.render(files=[VALUES / values])).items()}
    assert sorted(from_chart) == sorted(from_kustomize)
    for key, obj in from_kustomize.items():
        assert from_chart[key] == obj, key


def policy_objects(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objs if o["kind"].startswith("ValidatingAdmissionPolicy")}


def test_chart_renders_the_shipped_gpuclass_policy(helm: Helm) -> None:
    """templates/gpuclass-policy.yaml is manifests/components/gpuclass-immutable/policy.yaml: the same
    rules and the same CEL, with the chart's labels; config.gpuGroup/gpuClassPlural change the
    matched resource and nothing else; switched off, neither object is rendered."""
    policy, binding = gpuclass_policy()
    shipped = {"ValidatingAdmissionPolicy": policy, "ValidatingAdmissionPolicyBinding": binding}
    rendered = policy_objects(helm.render())
    assert sorted(rendered) == sorted(shipped)
    for kind, obj in rendered.items():
        assert obj["spec"] == shipped[kind]["spec"], kind
        assert obj["metadata"]["name"] == shipped[kind]["metadata"]["name"]
        assert "namespace" not in obj["metadata"]
        assert normalized(obj)["metadata"]["labels"] == {**shipped[kind]["metadata"]["labels"],
                                                         "app.kubernetes.io/part-of": "licensectl"}

    other = policy_objects(helm.render({"config": {"gpuGroup": "gpu.example.net",
                                                   "gpuClassPlural": "acceleratorclasses"}}))
    assert other["ValidatingAdmissionPolicyBinding"] == rendered["ValidatingAdmissionPolicyBinding"]
    expected = copy.deepcopy(policy["spec"])
    for rule in expected["matchConstraints"]["resourceRules"]:
        rule.update(apiGroups=["gpu.example.net"], resources=["acceleratorclasses"])
    assert other["ValidatingAdmissionPolicy"]["spec"] == expected

    assert policy_objects(helm.render({"gpuClassPolicy": {"enabled": False}})) == {}


def test_cozystack_example(helm: Helm) -> None:
    """examples/cozystack.yaml: scraped from cozy-monitoring, VictoriaMetrics objects, the dashboard as a
    GrafanaDashboard for grafana-operator (no sidecar ConfigMap, which Cozystack's Grafana ignores)."""
    example = CHART / "examples" / "cozystack.yaml"
    res = helm.run("lint", "--strict", str(CHART), "--namespace", NAMESPACE, "--values", str(example))
    assert res.returncode == 0, res.stdout + res.stderr
    objs = objects_by_key(helm.render(files=[example]))
    policy = objs[("NetworkPolicy", NAMESPACE, "licensectl")]
    metrics = next(r for r in policy["spec"]["ingress"] if r.get("ports") == [{"port": "metrics", "protocol": "TCP"}])
    cozy = {"matchLabels": {"kubernetes.io/metadata.name": "cozy-monitoring"}}
    assert metrics["from"] == [{"namespaceSelector": cozy}]
    dashboard = objs[("GrafanaDashboard", NAMESPACE, "licensectl")]
    assert dashboard["apiVersion"] == "grafana.integreatly.org/v1beta1"
    assert dashboard["spec"]["instanceSelector"] == {"matchLabels": {"dashboards": "grafana"}}
    assert dashboard["spec"]["allowCrossNamespaceImport"] is True
    assert {k[0] for k in objs} >= {"VMServiceScrape", "VMRule", "GrafanaDashboard", "PodDisruptionBudget"}
    assert not {k[0] for k in objs} & {"ServiceMonitor", "PrometheusRule"}
    assert ("ConfigMap", NAMESPACE, "licensectl-dashboard") not in objs
    image = objs[("Deployment", NAMESPACE, "licensectl")]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"registry.example.com/platform/licensectl:{__version__}"


EVERYTHING = {"gpuCRDs": True, "config": {"restartFallbackDelete": True},
              "monitoring": {"prometheusOperator": {"enabled": True}, "victoriaMetrics": {"enabled": True},
                             "dashboard": {"enabled": True}, "grafanaOperator": {"enabled": True}}}


def test_copied_chart_renders_like_the_packaged_chart(helm: Helm, tmp_path: Path) -> None:
    """`cp -r charts/licensectl` (vendoring into a platform tree) and `helm package` give the same chart."""
    res = helm.run("package", str(CHART), "--destination", str(tmp_path))
    assert res.returncode == 0, res.stderr
    archive = tmp_path / f"licensectl-{yaml.safe_load((CHART / 'Chart.yaml').read_text())['version']}.tgz"
    vendored = tmp_path / "platform" / "packages" / "system"
    vendored.mkdir(parents=True)
    cp = subprocess.run(["cp", "-r", str(CHART), str(vendored)], capture_output=True, text=True, timeout=60,
                        check=False)
    assert cp.returncode == 0, cp.stderr
    from_copy = helm.template(EVERYTHING, chart=vendored / "licensectl")
    from_archive = helm.template(EVERYTHING, chart=archive)
    assert from_copy.returncode == 0, from_copy.stderr
    assert from_archive.returncode == 0, from_archive.stderr
    assert from_copy.stdout == from_archive.stdout
    assert from_copy.stdout == helm.template(EVERYTHING).stdout
    kinds = {d["kind"] for d in documents(from_copy.stdout)}
    assert {"GrafanaDashboard", "PrometheusRule", "VMRule", "CustomResourceDefinition", "ConfigMap"} <= kinds


def test_rendered_alerts_and_dashboard_are_the_files(helm: Helm) -> None:
    objs = objects_by_key(helm.render({"monitoring": {"prometheusOperator": {"enabled": True},
                                                      "victoriaMetrics": {"enabled": True},
                                                      "dashboard": {"enabled": True},
                                                      "grafanaOperator": {"enabled": True}}}))
    source = yaml.safe_load((ROOT / "manifests" / "components" / "monitoring" / "prometheusrule.yaml").read_text())
    assert objs[("PrometheusRule", NAMESPACE, "licensectl")]["spec"] == source["spec"]
    assert objs[("VMRule", NAMESPACE, "licensectl")]["spec"] == source["spec"]
    source_dashboard = json.loads((ROOT / "dashboards" / "licensectl.json").read_text())
    dashboard = objs[("ConfigMap", NAMESPACE, "licensectl-dashboard")]
    assert json.loads(dashboard["data"]["licensectl.json"]) == source_dashboard
    grafana = objs[("GrafanaDashboard", NAMESPACE, "licensectl")]
    assert json.loads(grafana["spec"]["json"]) == source_dashboard


def test_runbook_base_url_is_set_at_install_time(helm: Helm) -> None:
    """Every runbook_url becomes <monitoring.runbookBaseUrl>#<alert>, absolute, in both rule objects."""
    base = "https://docs.example.net/licensectl/operations.md"
    objs = objects_by_key(helm.render({"monitoring": {"prometheusOperator": {"enabled": True},
                                                      "victoriaMetrics": {"enabled": True},
                                                      "runbookBaseUrl": base + "/"}}))
    for kind in ("PrometheusRule", "VMRule"):
        rules = [r for g in objs[(kind, NAMESPACE, "licensectl")]["spec"]["groups"] for r in g["rules"]]
        assert len(rules) > 10
        assert {r["annotations"]["runbook_url"] for r in rules} == {
            f"{base}#{r['alert'].lower()}" for r in rules}, kind


def test_deployment_env_names_are_licensectl_settings(helm: Helm) -> None:
    """Every config value becomes a LICENSECTL_* variable licensectl reads, and parses there."""
    values = all_on()
    for parts, value in leaves(values["config"], ("config",)):
        set_path(values, parts, changed(".".join(parts), value) if value is None else value)
    values["config"]["kubeconfig"] = "/etc/kubeconfig"
    dep = objects_by_key(helm.render(values))[("Deployment", NAMESPACE, "licensectl")]
    env = {e["name"]: e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert set(env) == {o.env for o in config.OPTIONS}
    settings = config.settings_from(None, env)
    assert settings.deletions_per_minute == 7
    assert settings.settle_seconds == 7.5
    assert settings.restart_fallback_delete is True


def test_image_exposes_every_port_the_chart_serves(helm: Helm) -> None:
    """The Dockerfile's EXPOSE lists the Deployment's containerPorts (metrics, reports, webhook)."""
    dep = objects_by_key(helm.render())[("Deployment", NAMESPACE, "licensectl")]
    ports = {p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    exposed = {int(p) for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("EXPOSE ")
               for p in line.split()[1:]}
    assert exposed == ports == {8080, 8443, 9443}


def test_template_defaults_are_licensectls() -> None:
    """_helpers.tpl repeats two sets of licensectl's defaults: the in-cluster settings a release from
    before a key existed gets, and the Lease timings the cross-check assumes when they are null."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    m = re.search(r'\$inCluster := dict (.*?) -\}\}', helpers)
    assert m is not None
    words = re.findall(r'"([^"]*)"|(\btrue\b|\bfalse\b)', m.group(1))
    items = [w[0] or w[1] for w in words]
    in_cluster = {items[i]: items[i + 1] for i in range(0, len(items), 2)}
    assert in_cluster == {config.helm_key(k): str(v).lower() if isinstance(v, bool) else v
                          for k, v in config.IN_CLUSTER.items()}
    timings = dict(re.findall(r'list \$config "(\w+)" ([0-9.]+)\)', helpers))
    defaults = config.Settings()
    assert timings == {config.helm_key(f): str(getattr(defaults, f))
                       for f in ("lease_duration_seconds", "renew_deadline_seconds", "retry_period_seconds")}
