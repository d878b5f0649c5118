"""Shared fixtures: one real control plane per test session, plus per-test namespaces and KubeVirt.

The control plane is started lazily by the first test that needs it. If it cannot be built or
started, those tests ERROR (never skip): a green run must mean the integration tests really ran.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.rest import ApiException

from licensectl_dev.devcluster.controlplane import ControlPlane
from licensectl_dev.devcluster.kubeapi import api_client_from_kubeconfig, install_crds
from licensectl_dev.devcluster.ledger import SimulatorRecord
from licensectl_dev.devcluster.tenant_cluster import publish_kubeconfig, tenant_api_client, tenant_control_plane
from licensectl_dev.devcluster.tenant_nodes import TenantNodeAgent
from licensectl_dev.devcluster.virt_api import RestartProxy
from licensectl_dev.devcluster.virt_controller import KubevirtSimulator
from licensectl_dev.testkit.process import end_leaked_processes

# Session fixtures that hand a test an external toolchain binary; each run costs seconds, not milliseconds.
TOOL_FIXTURES = frozenset({"promtool", "vmalert_tool", "helm", "validator"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the slow tier, so `-m "not cluster"` is the fast loop (under a minute, nothing started).

    `cluster`: the test needs what `make setup` provides beyond Python: the control plane (every cluster
    fixture depends on `control_plane`, so its presence in the fixture closure is the rule; a module that
    starts a control plane, controllers or Prometheus some other way says so with
    `pytestmark = pytest.mark.cluster`; `integration`, the marker's former name, still counts) or an
    external tool. `tools` names the second kind too: the test runs promtool, vmalert-tool, helm or the
    Grafana schema validator (node) through one of TOOL_FIXTURES, so `-m tools` runs just those.
    """
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if "control_plane" in names or item.get_closest_marker("integration"):
            item.add_marker(pytest.mark.cluster)
        if names & TOOL_FIXTURES:
            if not item.get_closest_marker("cluster"):
                item.add_marker(pytest.mark.cluster)
            item.add_marker(pytest.mark.tools)


# Processes that outlived an xdist worker's session, reported by the controller process at its end.
_LEAKED_IN_WORKERS: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """Collect what a worker found still alive (pytest-xdist hook; a worker's exit status is not relayed)."""
    _LEAKED_IN_WORKERS.extend(getattr(node, "workeroutput", {}).get("leaked_processes", []))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if a test was skipped, or if a process the suite started (licensectl_dev.testkit.process)
    outlived it.

    Runs after every fixture's teardown; the survivors are killed so they do not linger either. Under
    pytest-xdist each worker kills its own survivors and hands their names to the controller process,
    which holds the terminal and the exit status.
    """
    leaked = end_leaked_processes()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["leaked_processes"] = leaked
        return
    leaked += _LEAKED_IN_WORKERS
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped and reporter is not None:
        # A skipped test is not a passed one (tests/conftest.py policy: missing tools ERROR instead).
        reporter.ensure_newline()
        reporter.write_sep("=", f"{len(skipped)} test(s) skipped: a skip never counts as passing", red=True)
        for rep in skipped[:20]:
            reporter.write_line(f"  {rep.nodeid}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if leaked:
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_sep("=", "processes started by the tests were still alive at the end (now killed)", red=True)
            for line in leaked:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-controller-manager on 127.0.0.1 for the whole session."""
    cp = ControlPlane()
    cp.start()  # raises BuildError/ControlPlaneError -> the dependent tests ERROR
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kubeconfig_path(control_plane: ControlPlane) -> Path:
    """Admin (system:masters) kubeconfig of the session control plane."""
    return control_plane.kubeconfig_path


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def api_client(kubeconfig_path: Path) -> AsyncIterator[ApiClient]:
    """A kubernetes-asyncio ApiClient (admin) with the project's CRDs installed and Established."""
    api = await api_client_from_kubeconfig(kubeconfig_path)
    await install_crds(api)
    try:
        yield api
    finally:
        await api.close()


NamespaceFactory = Callable[..., Awaitable[str]]


@pytest_asyncio.fixture(loop_scope="session")
async def namespace_factory(api_client: ApiClient) -> AsyncIterator[NamespaceFactory]:
    """`await make(prefix="t", labels=None, owner=None) -> name`: unique namespaces, deleted after the test.

    `owner` is a V1Namespace (or its dict) to set as the controller ownerReference, the way
    Cozystack links a child tenant namespace to its parent.
    """
    core = client.CoreV1Api(api_client)
    made: list[str] = []

    async def make(prefix: str = "t", labels: dict[str, str] | None = None, owner: Any = None,
                   name: str | None = None) -> str:
        ns_name = name or f"{prefix}-{uuid.uuid4().hex[:8]}"
        meta: dict[str, Any] = {"name": ns_name, "labels": labels or {}}
        if owner is not None:
            o = owner if isinstance(owner, dict) else api_client.sanitize_for_serialization(owner)
            meta["ownerReferences"] = [{
                "apiVersion": "v1", "kind": "Namespace", "name": o["metadata"]["name"],
                "uid": o["metadata"]["uid"], "controller": True, "blockOwnerDeletion": False,
            }]
        await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": meta})
        made.append(ns_name)
        return ns_name

    yield make
    for ns_name in reversed(made):
        try:
            await core.delete_namespace(ns_name)
        except ApiException as e:
            if e.status != 404:
                raise


@pytest_asyncio.fixture(loop_scope="session")
async def namespace(namespace_factory: NamespaceFactory) -> str:
    """One fresh namespace for the test."""
    return await namespace_factory()


@pytest_asyncio.fixture(loop_scope="session")
async def cleanup() -> AsyncIterator[Callable[[Callable[[], Awaitable[Any]]], None]]:
    """`cleanup(async_fn)`: run at teardown, newest first (for cluster-scoped objects a test makes)."""
    fns: list[Callable[[], Awaitable[Any]]] = []
    yield fns.append
    for fn in reversed(fns):
        try:
            await fn()
        except ApiException as e:
            if e.status != 404:
                raise


@dataclass
class KubevirtEnv:
    """The simulator, its restart proxy and their shared record."""

    simulator: KubevirtSimulator
    proxy: RestartProxy
    record: SimulatorRecord

    @property
    def kubeconfig_path(self) -> Path:
        """Admin kubeconfig through the proxy (restart subresource available)."""
        return self.proxy.kubeconfig_path


KubevirtFactory = Callable[..., Awaitable[KubevirtEnv]]


@pytest_asyncio.fixture(loop_scope="session")
async def kubevirt_factory(
    api_client: ApiClient, control_plane: ControlPlane
) -> AsyncIterator[KubevirtFactory]:
    """`await make(ready_delay=0.2, stop_delay=0.0, restart_enabled=True) -> KubevirtEnv`; stopped after the test."""
    envs: list[KubevirtEnv] = []

    async def make(ready_delay: float = 0.2, stop_delay: float = 0.0, restart_enabled: bool = True) -> KubevirtEnv:
        sim = KubevirtSimulator(api_client, ready_delay=ready_delay, stop_delay=stop_delay)
        await sim.start()
        proxy = RestartProxy(sim, upstream=control_plane.server, ca_path=control_plane.ca_path,
                             token=control_plane.admin_token, restart_enabled=restart_enabled,
                             tls=control_plane.issue_serving_cert("kubevirt-proxy"))
        await proxy.start()
        env = KubevirtEnv(sim, proxy, sim.record)
        envs.append(env)
        return env

    yield make
    for env in reversed(envs):
        await env.proxy.stop()
        await env.simulator.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def kubevirt(kubevirt_factory: KubevirtFactory) -> KubevirtEnv:
    """A running KubeVirt simulator (ready_delay 0.2 s) and restart proxy for one test."""
    return await kubevirt_factory()


@pytest_asyncio.fixture(loop_scope="session")
async def proxied(kubevirt: KubevirtEnv) -> AsyncIterator[ApiClient]:
    """An admin ApiClient that talks to the cluster through the test's restart proxy (a module that needs
    other simulator delays overrides `kubevirt`)."""
    api = await api_client_from_kubeconfig(kubevirt.kubeconfig_path)
    try:
        yield api
    finally:
        await api.close()


@pytest.fixture(scope="session")
def tenant_control_planes(control_plane: ControlPlane) -> Iterator[dict[str, ControlPlane]]:
    """Tenant control planes (kube-scheduler + tenant controllers) by cluster name, started lazily by
    `tenant_cluster_factory` and kept for the session (each takes ~10 s to start); stopped at its end."""
    planes: dict[str, ControlPlane] = {}
    try:
        yield planes
    finally:
        for cp in planes.values():
            cp.stop()


@dataclass
class TenantEnv:
    """A tenant (workload) cluster of the management cluster: its control plane, an admin client for
    it, the node agent playing its kubelets, and the KubeVirt simulator its machines run on."""

    namespace: str  # management namespace holding the VMs and the `<cluster>-kubeconfig` Secret
    cluster: str
    control_plane: ControlPlane
    api: ApiClient  # admin client of the tenant cluster
    agent: TenantNodeAgent
    kubevirt: KubevirtEnv


TenantClusterFactory = Callable[..., Awaitable[TenantEnv]]


@pytest_asyncio.fixture(loop_scope="session")
async def tenant_cluster_factory(
    api_client: ApiClient, kubevirt_factory: KubevirtFactory, tenant_control_planes: dict[str, ControlPlane]
) -> AsyncIterator[TenantClusterFactory]:
    """`await make(namespace, cluster, *, kubevirt=None, termination_delay=0.3, ready_delay=1.0, fresh=False)
    -> TenantEnv`.

    Starts (or reuses, per cluster name, for the session) a tenant control plane, publishes Secret
    `<cluster>-kubeconfig` in the management `namespace`, and starts a TenantNodeAgent there. Pass the
    test's KubevirtEnv as `kubevirt` if it already has one (two simulators must not run); otherwise one
    is started. `fresh=True` starts a dedicated tenant control plane, stopped after the test (for tests
    that must not see Nodes or Pods an earlier test left in a reused one). Everything else is stopped
    after the test.
    """
    made: list[TenantEnv] = []
    dedicated: list[ControlPlane] = []

    async def make(namespace: str, cluster: str, *, kubevirt: KubevirtEnv | None = None,
                   termination_delay: float = 0.3, ready_delay: float = 1.0, fresh: bool = False) -> TenantEnv:
        cp = None if fresh else tenant_control_planes.get(cluster)
        if cp is None:
            cp = tenant_control_plane(cluster)
            cp.start()  # on the test thread, so the processes die with it (PDEATHSIG)
            if fresh:
                dedicated.append(cp)
            else:
                tenant_control_planes[cluster] = cp
        kv = kubevirt or await kubevirt_factory()
        await publish_kubeconfig(api_client, namespace, cluster, cp)
        tenant_api = await tenant_api_client(cp)
        agent = TenantNodeAgent(api_client, tenant_api, namespace=namespace, cluster=cluster,
                                termination_delay=termination_delay, ready_delay=ready_delay)
        try:
            await agent.start()
        except BaseException:
            await tenant_api.close()
            raise
        env = TenantEnv(namespace, cluster, cp, tenant_api, agent, kv)
        made.append(env)
        return env

    yield make
    for env in reversed(made):
        await env.agent.stop()
        await env.api.close()
    for cp in dedicated:
        cp.stop()
