"""An upgrade in the middle of a token rollout: the released version leads and starts restarting VMs,
is stopped the way a Deployment rollout stops it (SIGTERM), and the version in this tree takes the
Lease and finishes the rollout.

The old version is a pinned commit of this repository, extracted with `git archive` into a temporary
directory and run with the same interpreter and virtualenv, importing the old package through
PYTHONPATH and its working directory (checked, so the test cannot silently run the new code twice).
What must hold across the version change is the state both versions share through the apiserver:
the Lease, the replica Secrets and the rollout annotations on each VM.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, CustomObjectsApi

from licensectl.core import model, preflight
from licensectl.core.model import ANN_RESTART_REVISION, ObjectRef
from licensectl.kube.revision_store import store_name
from licensectl.kube.signing_key import SECRET_NAME as SIGNING_KEY_SECRET
from licensectl_dev.devcluster.controlplane import ControlPlane
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.process import REPO_ROOT, child_env, extract_package

from .support import REPORT_INTERVAL, Rig, assert_each_restarted_once, controllers, leader_pods, lease_holder

# The last released commit: what a cluster runs before it is upgraded to this tree. Move it forward
# when a new version is released (and keep the test passing: it is the upgrade contract).
OLD_VERSION_SHA = "7afdc8f18dfa66fe788821e6ae8574ae0f472604"

# A long lease: a handover by expiry would take 15 s, so a quick takeover proves the old version
# released the Lease on SIGTERM and the new one took it.
LEASE = {"lease_duration_seconds": 15, "renew_deadline_seconds": 10, "retry_period_seconds": 0.5}


def package_digest(root: Path) -> str:
    """sha256 over the package's .py files (relative path + bytes), to tell two trees apart."""
    h = hashlib.sha256()
    for p in sorted((root / "licensectl").rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The old version's `licensectl` package, extracted from git (a full clone is needed)."""
    return extract_package(OLD_VERSION_SHA, tmp_path_factory.mktemp("licensectl-old"))


def old_env(tree: Path) -> dict[str, str]:
    """The launcher's child environment with the old tree, and only it, on PYTHONPATH."""
    return child_env({"PYTHONPATH": str(tree)})


def imported_package_dir(tree: Path) -> Path:
    """Where `import licensectl` resolves for a child with the old version's environment and cwd."""
    res = subprocess.run([sys.executable, "-c", "import licensectl.app, sys; sys.stdout.write(licensectl.__file__)"],
                         env=old_env(tree), cwd=tree, capture_output=True, text=True, check=True, timeout=60)
    return Path(res.stdout).resolve().parent


def process_env_and_cwd(pid: int) -> tuple[dict[str, str], Path]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(e.decode(errors="replace").split("=", 1) for e in raw if b"=" in e)
    return env, Path(f"/proc/{pid}/cwd").resolve()


async def start_old(rig: Rig, started: list[ControllerProcess], pod: str, tree: Path) -> ControllerProcess:
    """The old version as `licensectl-<pod>`: the launcher of the tests, pointed at the old tree.

    Same flags as Rig.controller gives the new version, so only the code differs.
    """
    kubeconfig = rig.tmp / f"{pod}-old.kubeconfig"
    kubeconfig.write_text(rig.proxies[pod].kubeconfig(rig.cp.admin_token))
    kubeconfig.chmod(0o600)
    c = ControllerProcess(
        kubeconfig, rig.fleet.controller_ns, log_dir=rig.tmp, name=f"{pod}-old", tree=tree,
        settings={"log_level": "info", "settle_seconds": 0, "pod_name": pod, "leader_elect": True,
                  "root_tenant": rig.fleet.root_name, "report_url": rig.service.url, "max_unavailable": "1",
                  "max_per_namespace": 1, "restart_timeout_seconds": 60,
                  "report_interval_seconds": REPORT_INTERVAL, **LEASE},
        tls_and_webhook=False)  # the old version knows neither flag
    await c.start()
    started.append(c)
    rig.service.endpoints[pod] = c
    return c


def restarts_issued_by(rig: Rig, pod: str) -> int:
    """Accepted `virtualmachines/restart` calls that went through this pod's API proxy."""
    return len([r for r in rig.proxies[pod].requests
                if r.resource == "virtualmachines" and r.subresource == "restart" and r.status == 202])


async def replica_versions(api: ApiClient, rig: Rig) -> dict[str, str]:
    core = CoreV1Api(api)
    out: dict[str, str] = {}
    for ns in rig.fleet.tenants:
        s = await core.read_namespaced_secret(rig.fleet.replica, ns)
        out[ns] = s.metadata.resource_version
    return out


def test_old_version_is_really_different_code(old_tree: Path) -> None:
    assert imported_package_dir(old_tree) == old_tree / "licensectl"
    assert old_env(old_tree)["PYTHONPATH"] == str(old_tree)
    assert package_digest(old_tree) != package_digest(REPO_ROOT), (
        f"this tree's package equals {OLD_VERSION_SHA[:7]}: nothing to upgrade from; move OLD_VERSION_SHA")


@pytest.mark.asyncio(loop_scope="session")
async def test_upgrade_mid_rollout_old_leader_hands_over_to_new_version(
        api_client: ApiClient, rig: Rig, old_tree: Path) -> None:
    kv, fl = rig.kv, rig.fleet
    async with controllers() as started:
        old = await start_old(rig, started, "licensectl-a", old_tree)
        await old.wait_metric("licensectl_leader", 1, timeout=60)
        # The running process is the old code: its environment and cwd are exactly those under which
        # `import licensectl` resolves into the extracted tree (test_old_version_is_really_different_code).
        assert old.pid is not None
        env, cwd = process_env_and_cwd(old.pid)
        assert env["PYTHONPATH"] == str(old_tree) and cwd == old_tree

        new = await rig.controller(started, "licensectl-b", **LEASE)
        vms = await fl.boot(per_tenant=2)
        await new.wait_metric("licensectl_ready", 1)
        assert await leader_pods(api_client, fl.controller_ns) == ["licensectl-a"]

        old_rev = await fl.revision()
        await fl.rotate(1)
        await eventually(lambda: restarts_issued_by(rig, "licensectl-a") >= 1, timeout=60, interval=0.05,
                         what="the old leader issued a restart")
        new_rev = await fl.revision()
        assert new_rev is not None and new_rev != old_rev, "the old leader wrote every replica before restarting"
        replicas_before = await replica_versions(api_client, rig)

        # The Deployment's rolling update: SIGTERM to the old pod; it finishes its writes and releases.
        rc = await old.stop()
        exited = time.monotonic()
        assert rc == 0, old.log_tail()
        issued_by_old = restarts_issued_by(rig, "licensectl-a")
        assert issued_by_old < len(vms), "the old leader finished the rollout: nothing left to hand over"
        assert await lease_holder(api_client, fl.controller_ns) in ("", "licensectl-b")
        await new.wait_metric("licensectl_leader", 1, timeout=10)
        assert time.monotonic() - exited < 3.0, "the new version waited for the Lease to expire"
        assert await lease_holder(api_client, fl.controller_ns) == "licensectl-b"
        await eventually(lambda: _leaders_are(api_client, fl.controller_ns, ["licensectl-b"]), timeout=10,
                         what="leader label moved to the new version's pod")

        await eventually(lambda: fl.all_done(vms, new_rev), timeout=120, interval=0.25,
                         what="the new version finished the rollout the old one started")
        # Every VM restarted exactly once across both versions: the new one trusted the old one's
        # rollout annotations instead of restarting VMs it had already restarted.
        assert_each_restarted_once(kv, vms)
        assert restarts_issued_by(rig, "licensectl-b") == len(vms) - issued_by_old
        # Replicas were current: the new version did not rewrite a single one.
        assert await replica_versions(api_client, rig) == replicas_before
        # A create refused with 409 AlreadyExists changed nothing (a second try racing its own watch event).
        secret_writes = [r for r in rig.writes_by("licensectl-b") if r.resource == "secrets" and r.status != 409]
        # Its only Secret writes, in its own namespace: the serving TLS Secret it creates at its first
        # start (self-managed mode; the old version had no TLS) and the source's revision store, whose
        # stable revision is what the replicas already carry (docs/design.md#safe-rotation).
        assert [(r.verb, r.namespace) for r in secret_writes] in (
            [], [("create", fl.controller_ns)], [("create", fl.controller_ns)] * 2), secret_writes
        store = await CoreV1Api(api_client).read_namespaced_secret(
            store_name(ObjectRef(fl.source_ns, fl.source_name)), fl.controller_ns)
        assert (store.metadata.annotations or {}).get("licensectl.io/rotation-phase") == "stable"
        assert await secret_exists(api_client, fl.controller_ns, "licensectl-tls")
        scrape = await new.must_scrape()
        assert scrape.value("licensectl_replica_writes_total") == 0
        assert await fl.revision() == new_rev
        assert await new.stop() == 0

    # Uninstall, as documented: with the controller gone, the replica command removes every replica
    # and nothing else (the signing key Secret carries the same label; the source has none).
    # The commands span all namespaces: earlier tests' namespaces still being deleted would make them
    # report NotFound for objects listed a moment before (docs/operations.md#uninstall says to re-run),
    # so they run once only this test's VMs are left.
    await eventually(lambda: _only_these_vms_left(api_client, fl.tenants), timeout=120, interval=0.5,
                     what="the VMs of earlier tests' namespaces are gone")
    assert await secret_exists(api_client, fl.controller_ns, SIGNING_KEY_SECRET)
    delete, annotate = documented_uninstall_commands(fl.controller_ns)
    await run_kubectl(rig.cp, delete)
    for ns in fl.tenants:
        assert not await secret_exists(api_client, ns, fl.replica), ns
    assert await secret_exists(api_client, fl.controller_ns, SIGNING_KEY_SECRET)
    assert await secret_exists(api_client, fl.source_ns, fl.source_name)
    await run_as_documented(rig.cp, annotate, mine=fl.tenants)
    for ns, name in vms:
        assert not [k for k in await fl.vm_annotations(ns, name) if k.startswith("licensectl.io/restart-")]
    assert ANN_RESTART_REVISION.startswith("licensectl.io/restart-")


def documented_uninstall_commands(controller_ns: str) -> list[list[str]]:
    """The replica-removal and annotation-removal commands of docs/operations.md's "Uninstall",
    with licensectl's namespace replaced by the test's."""
    text = (REPO_ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("\n## Uninstall\n"):]
    section = section[:section.index("\n## ", 1)]
    found = re.findall(r"^`?(kubectl (?:delete secrets|annotate vm) [^`\n]+)`?$", section, re.M)
    assert len(found) == 2, found
    return [[a.replace("licensectl-system", controller_ns) for a in shlex.split(cmd)] for cmd in found]


def test_the_documented_annotation_removal_names_every_restart_annotation() -> None:
    """Each restart-intent and pre-flight annotation licensectl writes on a VM (not the hoster's opt-out) is removed."""
    _, annotate = documented_uninstall_commands("licensectl-system")
    removed = {a.removesuffix("-") for a in annotate if a.endswith("-")}
    written = {v for k, v in vars(model).items() if k.startswith("ANN_RESTART_") and k != "ANN_RESTART_POLICY"}
    written |= set(preflight.HOLD_ANNOTATIONS)
    assert written == removed


async def kubectl(cp: ControlPlane, argv: list[str]) -> tuple[int | None, str]:
    proc = await asyncio.create_subprocess_exec(
        str(cp.kubectl), "--kubeconfig", str(cp.kubeconfig_path), *argv[1:],
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode, out.decode(errors="replace")


async def run_kubectl(cp: ControlPlane, argv: list[str]) -> str:
    code, out = await kubectl(cp, argv)
    assert code == 0, out
    return out


NAMESPACE_GONE = re.compile(r'^Error from server \(NotFound\): namespaces "([^"]+)" not found$')


async def run_as_documented(cp: ControlPlane, argv: list[str], *, mine: Sequence[str], runs: int = 3) -> None:
    """An all-namespaces command, as docs/operations.md#uninstall says to run it: a NotFound for a
    namespace deleted between its list and its patches (an earlier test's) is harmless, run it again.
    Any other error, or one in a namespace of this test, fails at once."""
    out = ""
    for _ in range(runs):
        code, out = await kubectl(cp, argv)
        if code == 0:
            return
        errors = [line for line in out.splitlines() if line.startswith("error") or line.startswith("Error")]
        gone = [m.group(1) for m in map(NAMESPACE_GONE.match, errors) if m]
        assert errors and len(gone) == len(errors) and not set(gone) & set(mine), out
    raise AssertionError(f"still failing after {runs} runs:\n{out}")


async def _only_these_vms_left(api: ApiClient, mine: Sequence[str]) -> bool:
    """What the documented annotate command could trip over: VMs of earlier tests, whose namespaces
    the garbage collector deletes after the test's root tenant. A VM left behind in a namespace that
    no longer exists is deleted here (the apiserver admits deletes there); it is no test's."""
    namespaces = {n.metadata.name for n in (await CoreV1Api(api).list_namespace()).items}
    co = CustomObjectsApi(api)
    vms = await co.list_cluster_custom_object("kubevirt.io", "v1", "virtualmachines")
    others = [(vm["metadata"]["namespace"], vm["metadata"]["name"]) for vm in vms["items"]
              if vm["metadata"]["namespace"] not in mine]
    for ns, name in others:
        if ns not in namespaces:
            with contextlib.suppress(ApiException):
                await co.delete_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachines", name)
    return not others


async def secret_exists(api: ApiClient, ns: str, name: str) -> bool:
    try:
        await CoreV1Api(api).read_namespaced_secret(name, ns)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


async def _leaders_are(api: ApiClient, ns: str, want: list[str]) -> bool:
    return await leader_pods(api, ns) == want
