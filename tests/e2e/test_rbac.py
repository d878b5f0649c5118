"""licensectl runs as its ServiceAccount, with exactly the RBAC of manifests/base.

The base's Namespace, ServiceAccount and RBAC are rendered with kustomize and applied to the real
apiserver (renamed to a fresh namespace and fresh ClusterRole names, so the test never collides
with another test or a previous run). A TokenRequest mints the ServiceAccount's token; the
controller process talks through a recording proxy to the KubeVirt restart proxy, which forwards
the caller's own credential (and authorizes the restart subresource with a SelfSubjectAccessReview
as virt-api does). A full replication, rotation, rollout and deletion then has to work with zero
403s, and every granted permission has to have been used, or be allow-listed below with a reason.
"""

from __future__ import annotations

import asyncio
import pprint
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi, RbacAuthorizationV1Api

from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.controlplane import ControlPlane
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.world import unique

from ..conftest import KubevirtFactory
from .support import (
    ApiRequest,
    RecordingProxy,
    controllers,
    create_pod,
    leader_pods,
    make_fleet,
    start_controller,
)

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "manifests" / "base"
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

# Granted permissions this run does not exercise, each with the reason it is still granted.
# Keys are (verb, api group, resource[/subresource]). The scenario below reaches every other rule
# of manifests/base (the Lease `create` too, as the namespace is fresh; VM `get` through a cluster
# without the restart subresource). The optional restart-fallback-delete component is not part of
# the base and is not applied here.
ALLOWED_UNUSED: dict[tuple[str, str, str], str] = {
    ("get", "kubevirt.io", "virtualmachineinstances"): (
        "the live VMI read before a restart is made only where the plan cannot rule out a lagging VMI "
        "watch (a re-issue, an earlier intent for the same revision: docs/design.md#decision-restart-intent); "
        "a clean first rollout never needs it"),
    # Tenant cluster workers (docs/operations.md#tenant-cluster-workers): read only for VMs that carry
    # CAPK's cluster label, which this fleet has none of; tests/e2e/test_worker_drain.py drives them.
    ("get", "cluster.x-k8s.io", "clusters"): (
        "a tenant cluster's policy annotations (max-disrupted-workers, restart-without-drain), read only when "
        "one of its workers is drained"),
    ("get", "cluster.x-k8s.io", "machines"): (
        "a worker's Machine (nodeDrainTimeout, exclude-node-draining), read only when the worker is drained"),
    ("get", "infrastructure.cluster.x-k8s.io", "kubevirtmachines"): (
        "the KubevirtMachine that leads to a worker's Machine, read only when the worker is drained"),
}

# Cluster-wide grants that this run used only in licensectl's own namespace, with the reason.
ALLOWED_OWN_NAMESPACE_ONLY: dict[tuple[str, str, str], str] = {}


@dataclass(frozen=True)
class Grant:
    """One (verb, group, resource) a ServiceAccount holds through one binding."""

    role: str
    verb: str
    group: str
    resource: str  # "resource" or "resource/subresource"
    names: frozenset[str]  # resourceNames; empty = any
    namespace: str | None  # None: cluster-wide (ClusterRoleBinding); else the RoleBinding's namespace

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.verb, self.group, self.resource)

    def allows(self, r: ApiRequest) -> bool:
        """RBAC's rule matching (kubernetes plugin/pkg/auth/authorizer/rbac/rbac.go RuleAllows)."""
        resource = f"{r.resource}/{r.subresource}" if r.subresource else r.resource
        return (self.verb in (r.verb, "*") and self.group in (r.group, "*") and self.resource in (resource, "*")
                and (not self.names or r.name in self.names)
                and (self.namespace is None or self.namespace == r.namespace))


def grants_for(objs: Iterable[dict[str, Any]], sa_namespace: str, sa_name: str) -> list[Grant]:
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o.get("rules") or []
             for o in objs if o["kind"] in ("ClusterRole", "Role")}
    out: list[Grant] = []
    for b in objs:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa_name
                   and s.get("namespace") == sa_namespace for s in b.get("subjects") or []):
            continue
        scope = None if b["kind"] == "ClusterRoleBinding" else b["metadata"]["namespace"]
        ref = b["roleRef"]
        rules = roles[(ref["kind"], None if ref["kind"] == "ClusterRole" else scope, ref["name"])]
        for rule in rules:
            for verb in rule["verbs"]:
                for group in rule.get("apiGroups") or []:
                    for res in rule.get("resources") or []:
                        out.append(Grant(f"{ref['kind']}/{ref['name']}", verb, group, res,
                                         frozenset(rule.get("resourceNames") or ()), scope))
    return out


def unused_grants(grants: list[Grant], used: list[ApiRequest]) -> list[Grant]:
    return [g for g in grants if not any(g.allows(r) for r in used)]


def too_broad(grants: list[Grant], used: list[ApiRequest], own_namespace: str) -> list[Grant]:
    """Cluster-wide grants only ever used in licensectl's own namespace: a Role would do."""
    out = []
    for g in grants:
        hits = [r for r in used if g.allows(r)]
        if g.namespace is None and hits and all(r.namespace == own_namespace for r in hits):
            out.append(g)
    return out


def render_base(kubectl: str, namespace: str, suffix: str) -> list[dict[str, Any]]:
    """manifests/base's RBAC objects, moved to `namespace`, cluster-scoped names suffixed."""
    res = subprocess.run([kubectl, "kustomize", str(BASE)], capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stderr
    objs = [d for d in yaml.safe_load_all(res.stdout) if d and d["kind"] in RBAC_KINDS]
    assert {o["kind"] for o in objs} == RBAC_KINDS
    original = next(o["metadata"]["name"] for o in objs if o["kind"] == "Namespace")
    for o in objs:
        meta = o["metadata"]
        if o["kind"] == "Namespace":
            meta["name"] = namespace
        elif o["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            meta["name"] = f"{meta['name']}-{suffix}"
        else:
            assert meta.get("namespace") == original
            meta["namespace"] = namespace
        for s in o.get("subjects") or []:
            assert s.get("namespace") == original
            s["namespace"] = namespace
        ref = o.get("roleRef")
        if ref and ref["kind"] == "ClusterRole":
            ref["name"] = f"{ref['name']}-{suffix}"
    return objs


async def kubectl_apply(cp: ControlPlane, objs: list[dict[str, Any]], *extra: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        str(cp.kubectl), f"--kubeconfig={cp.kubeconfig_path}", "apply", "--server-side",
        "--field-manager=licensectl-e2e", *extra, "-f", "-", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate(yaml.safe_dump_all(objs).encode())
    assert proc.returncode == 0, err.decode()


def test_grant_comparison_flags_unused_and_too_broad_rules() -> None:
    """The comparison itself can fail: an extra rule, and a cluster-wide one used only at home."""
    objs: list[dict[str, Any]] = [
        {"kind": "ClusterRole", "metadata": {"name": "c"}, "rules": [
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "delete"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}]},
        {"kind": "ClusterRoleBinding", "metadata": {"name": "c"}, "roleRef": {"kind": "ClusterRole", "name": "c"},
         "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "home"}]},
        {"kind": "Role", "metadata": {"name": "r", "namespace": "home"}, "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"], "resourceNames": ["p"]}]},
        {"kind": "RoleBinding", "metadata": {"name": "r", "namespace": "home"},
         "roleRef": {"kind": "Role", "name": "r"},
         "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "home"}]},
    ]
    used = [ApiRequest("list", "", "secrets", "", "", "", 200),
            ApiRequest("get", "coordination.k8s.io", "leases", "", "home", "x", 200),
            ApiRequest("patch", "", "pods", "", "home", "p", 200),
            ApiRequest("patch", "", "pods", "", "elsewhere", "p", 403)]
    g = grants_for(objs, "home", "sa")
    assert [x.key for x in unused_grants(g, used)] == [("delete", "", "secrets")]
    assert [x.key for x in too_broad(g, used, "home")] == [("get", "coordination.k8s.io", "leases")]
    assert not any(x.allows(used[3]) for x in g)


@pytest.mark.asyncio(loop_scope="session")
async def test_full_lifecycle_as_the_service_account_with_exactly_the_shipped_rbac(
        api_client: ApiClient, control_plane: ControlPlane, kubevirt_factory: KubevirtFactory,
        namespace_factory: Any, cleanup: Any, tmp_path: Path) -> None:
    suffix = unique("e2e")
    home = f"lsys-{suffix}"
    objs = render_base(str(control_plane.kubectl), home, suffix)
    sa = next(o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount")
    rbac = RbacAuthorizationV1Api(api_client)
    core = CoreV1Api(api_client)

    async def drop() -> None:
        for o in objs:
            if o["kind"] == "ClusterRoleBinding":
                await rbac.delete_cluster_role_binding(o["metadata"]["name"])
            elif o["kind"] == "ClusterRole":
                await rbac.delete_cluster_role(o["metadata"]["name"])
        await core.delete_namespace(home)

    cleanup(drop)
    await kubectl_apply(control_plane, [o for o in objs if o["kind"] == "Namespace"])
    await kubectl_apply(control_plane, [o for o in objs if o["kind"] != "Namespace"])
    # The pod whose name the controller gets (downward API in the Deployment): it labels it as leader.
    await create_pod(api_client, "licensectl-0", home, service_account=sa)
    token = (await core.create_namespaced_service_account_token(
        sa, home, {"spec": {"expirationSeconds": 3600}})).status.token

    kv = await kubevirt_factory(ready_delay=0.3)
    fl = await make_fleet(api_client, namespace_factory, cleanup, controller_ns=home)
    # A claimed class whose source is missing (an invalid source: Events on the class and on the
    # Secret reference, re-emitted by every process) and a standalone VMI (never restarted, only
    # reported: RestartBlocked Event).
    broken = unique("broken")
    await fleet.create_gpu_class(api_client, broken, mode="vgpu", secret=(fl.source_ns, "missing"))
    cleanup(lambda: fleet.delete_gpu_class(api_client, broken))
    await fleet.create_claim(api_client, fl.tenants[1], "gpu-broken", class_name=broken)

    proxy = RecordingProxy(kv.proxy.url, control_plane.ca_path)
    await proxy.start()
    kubeconfig = tmp_path / "sa.kubeconfig"
    kubeconfig.write_text(proxy.kubeconfig(token))
    kubeconfig.chmod(0o600)
    settings = {"pod_name": "licensectl-0", "leader_elect": True, "lease_duration_seconds": 4,
                "renew_deadline_seconds": 3, "retry_period_seconds": 0.5, "root_tenant": fl.root_name,
                "report_url": "http://127.0.0.1:1/v1/reports", "max_unavailable": "2",
                "restart_timeout_seconds": 60,
                # The standalone VMI mounts its replica by hand: no webhook call, no delivery stamp, so
                # the time rule judges it, after this leader's evidence window (three report intervals,
                # docs/design.md#evidence-after-takeover). A short interval keeps that wait short.
                "report_interval_seconds": 2,
                # The shipped name: RBAC lets licensectl read and patch only that configuration, whose
                # caBundle the controller fills in itself (self-managed TLS; registered without one).
                "webhook_configuration": "licensectl"}
    try:
        async with controllers() as started:
            c = await start_controller("sa-1", kubeconfig, home, tmp_path, webhook_api=api_client, webhook_ca=False,
                                       **settings)
            started.append(c)
            await c.wait_metric("licensectl_leader", 1)
            vms = await fl.boot(per_tenant=2)
            lonely = fleet.vm_body(fl.tenants[0], "lonely", license_secret=fl.replica)["spec"]["template"]
            await CustomObjectsApi(api_client).create_namespaced_custom_object(
                "kubevirt.io", "v1", fl.tenants[0], "virtualmachineinstances",
                {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                 "metadata": {"name": "lonely", "namespace": fl.tenants[0]}, "spec": lonely["spec"]})
            assert await leader_pods(api_client, home) == ["licensectl-0"]
            # The standalone VMI must run before the rotation's replicas are written (one-second
            # timestamps), or it starts on the new revision and has nothing to be blocked on.
            await eventually(lambda: fl.ready(fl.tenants[0], "lonely"), timeout=30, what="lonely VMI ready")
            await asyncio.sleep(1.1)

            # Rotation -> replicas updated -> rolling restart through the restart subresource.
            old = await fl.revision()
            await fl.rotate(1)
            await eventually(lambda: _new_revision(fl, old), timeout=30, what="replicas rotated")
            new = await fl.revision()
            assert new is not None
            await eventually(lambda: fl.all_done(vms, new), timeout=90, interval=0.25, what="rollout done")
            assert all(len(kv.record.restarts_for(ns, n)) == 1 for ns, n in vms)

            # A tenant loses its claim: its replica is deleted.
            gone = fl.tenants[-1]
            await fleet.delete_claim(api_client, gone, "gpu")
            await eventually(lambda: _missing(fl, gone), timeout=30, what="replica deleted")
            s = await c.must_scrape()
            assert s.value("licensectl_replica_writes_total", action="delete") >= 1
            # The invalid source was reported (an Event); it stays invalid across the restart below.
            recorded = await _within(lambda: _events_with(api_client, "LicenseSourceInvalid", 1), 15)
            assert await _within(lambda: _events_with(api_client, "RestartBlocked", 1), 15)
            assert await c.stop() == 0

            # The pod restarts: same Lease (get/update by name), Events of persisting problems bumped.
            c2 = await start_controller("sa-2", kubeconfig, home, tmp_path, webhook_api=api_client, webhook_ca=False,
                                        **settings)
            started.append(c2)
            await c2.wait_metric("licensectl_leader", 1, timeout=20)
            # Checked with the RBAC findings below, so one run reports every problem at once.
            bumped = recorded and await _within(lambda: _events_with(api_client, "LicenseSourceInvalid", 2), 20)
            # A cluster without virt-api's restart subresource: the 404 makes licensectl read the VM
            # to tell a missing VM from a missing subresource (and, without the fallback, give up).
            kv.proxy.restart_enabled = False
            await fl.rotate(2)
            await eventually(lambda: _vm_read(proxy.requests), timeout=30, what="a VM read after a 404 restart")
            s2 = await c2.must_scrape()
            assert await c2.stop() == 0
    finally:
        await proxy.stop()

    used = proxy.requests
    grants = grants_for(objs, home, sa)
    # A create in a namespace being deleted (a previous test's tenants) is refused with 403 and the
    # cause NamespaceTerminating by the NamespaceLifecycle admission, whatever RBAC allows (client-go
    # controllers skip it: kubernetes pkg/controller/replicaset/replica_set.go). Every other 403 is
    # an RBAC denial, and the controller's own 403 counter must match what the proxy saw.
    terminating = [r for r in used if r.status == 403 and r.cause == "NamespaceTerminating"]
    counted = sum(x.value("licensectl_api_requests_total", code="403") for x in (s, s2))
    problems: dict[str, Any] = {
        "403 Forbidden": sorted({(r.verb, r.group, r.resource, r.subresource, r.namespace)
                                 for r in used if r.status == 403 and r not in terminating}),
        "licensectl_api_requests_total{code=403} beyond terminating namespaces":
            [counted - len(terminating)] if counted != len(terminating) else [],
        "requests outside the shipped RBAC": sorted({(r.verb, r.group, r.resource, r.subresource) for r in used
                                                     if not any(g.allows(r) for g in grants)}),
        "granted but never used (remove, or allow-list with a reason)": sorted(
            {g.key for g in unused_grants(grants, used)} - set(ALLOWED_UNUSED)),
        "cluster-wide grants used only in licensectl's namespace (a Role would do)": sorted(
            {g.key for g in too_broad(grants, used, home)} - set(ALLOWED_OWN_NAMESPACE_ONLY)),
        "no repeated Event was bumped": [] if bumped else ["events are not written or not bumped"],
    }
    bad = {k: v for k, v in problems.items() if v}
    assert not bad, pprint.pformat(bad, width=110)
    assert s.value("licensectl_api_requests_total") > 0 and s2.value("licensectl_api_requests_total") > 0


async def _within(check: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.25)
    return False


async def _new_revision(fl: Any, old: str | None) -> bool:
    rev = await fl.revision()
    return rev is not None and rev != old


def _vm_read(requests: list[ApiRequest]) -> bool:
    return any(r.verb == "get" and r.resource == "virtualmachines" and r.group == "kubevirt.io" for r in requests)


async def _missing(fl: Any, ns: str) -> bool:
    return await fl.replica_revision(ns) is None


async def _events_with(api: ApiClient, reason: str, count: int) -> bool:
    """An Event licensectl recorded with this reason, bumped to at least `count`."""
    evs = await CoreV1Api(api).list_event_for_all_namespaces(field_selector=f"reason={reason}")
    return any((e.count or 0) >= count for e in evs.items if e.source and e.source.component == "licensectl")
