"""License delivery through the VMI admission webhook, called by the real apiserver's admission chain.

The webhook is registered with the shipped MutatingWebhookConfiguration (manifests/base/webhook.yaml)
pointing at the App's loopback HTTPS listener; VMIs are created through the apiserver, by the test
or by the KubeVirt simulator, so every decision here went through matchConditions, TLS and JSONPatch
as in a cluster.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, CustomObjectsApi

from licensectl.core.delivery import SERIAL, parse_stamp, volume_name
from licensectl.core.model import (
    ANN_CREDENTIAL_KEY,
    ANN_DELIVERED_KEY,
    ANN_DELIVERED_REVISION,
    ANN_GPU_CLAIMS,
    ANN_RESTART_RESULT,
    ANN_REVISION,
)
from licensectl.core.render import replica_name
from licensectl.kube import serving_tls
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster import webhook as registration
from licensectl_dev.devcluster.controlplane import free_port
from licensectl_dev.testkit.world import World, unique

from ..conftest import KubevirtEnv
from .support import eventually, make_world, metric, running_app, settings_for, wait_event

pytestmark = pytest.mark.asyncio(loop_scope="session")


@dataclass
class Rig:
    api: ApiClient
    world: World
    entitled: str  # tenant namespace with a claim "gpu" of the world's vGPU class
    other: str  # tenant whose vgpu flag is off, also with a claim "gpu"

    def settings(self, kubeconfig: Any, **kw: Any) -> Any:
        return settings_for(kubeconfig, self.world.controller_ns, root_tenant=self.world.root_name,
                            restart_timeout_seconds=30.0, **kw)


@pytest_asyncio.fixture(loop_scope="session")
async def rig(api_client: ApiClient, namespace_factory: Any, cleanup: Any) -> AsyncIterator[Rig]:
    w = await make_world(api_client, namespace_factory, cleanup)
    entitled = (await w.tenant(claim=True))["metadata"]["name"]
    other = (await w.tenant(vgpu=False, claim=True))["metadata"]["name"]
    yield Rig(api_client, w, entitled, other)


def vmi_body(name: str, *, claims: tuple[str, ...] = (), annotation: str | None = None,
             volumes: list[dict[str, Any]] | None = None, disks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A VMI in KubeVirt's DRA shape (claims) and/or with the claims annotation."""
    devices: dict[str, Any] = {"disks": [{"name": "root", "disk": {"bus": "virtio"}}, *(disks or [])]}
    spec: dict[str, Any] = {"domain": {"devices": devices, "resources": {"requests": {"memory": "1Gi"}}},
                            "volumes": [{"name": "root", "containerDisk": {"image": "example/os:1"}}, *(volumes or [])]}
    if claims:
        devices["gpus"] = [{"name": f"gpu{i}", "claimName": f"c{i}", "requestName": "gpu"} for i in range(len(claims))]
        spec["resourceClaims"] = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    meta: dict[str, Any] = {"name": name}
    if annotation is not None:
        meta["annotations"] = {ANN_GPU_CLAIMS: annotation}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta, "spec": spec}


async def create_vmi(api: ApiClient, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = await CustomObjectsApi(api).create_namespaced_custom_object(
        "kubevirt.io", "v1", ns, "virtualmachineinstances", copy.deepcopy(body))
    return obj


def license_volumes(vmi: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in vmi["spec"].get("volumes", []) if "secret" in v}


async def replica_seen(app: Any, ns: str, name: str) -> bool:
    return (ns, name) in app.caches.replicas.cache


async def test_entitled_claim_gets_the_volume_and_disk(rig: Rig, kubeconfig_path: Any) -> None:
    async with running_app(rig.settings(kubeconfig_path)) as app:
        await eventually(lambda: replica_seen(app, rig.entitled, rig.world.replica), what="replica cached")
        dra = await create_vmi(rig.api, rig.entitled, vmi_body("dra", claims=("gpu",)))
        ann = await create_vmi(rig.api, rig.entitled, vmi_body("ann", annotation="gpu"))
    for vmi in (dra, ann):
        vols = license_volumes(vmi)
        assert list(vols) == [f"licensectl-{rig.world.cls}"], vmi["spec"]["volumes"]
        secret = next(iter(vols.values()))["secret"]
        assert secret == {"secretName": rig.world.replica, "volumeLabel": SERIAL, "optional": True}
        disk = [d for d in vmi["spec"]["domain"]["devices"]["disks"] if d["name"] in vols]
        assert disk == [{"name": f"licensectl-{rig.world.cls}", "serial": SERIAL, "disk": {"bus": "virtio"}}]
        # Nothing the user wrote is removed or reordered.
        assert vmi["spec"]["volumes"][0]["name"] == "root"
        assert vmi["spec"]["domain"]["devices"]["disks"][0]["name"] == "root"
    assert metric(app, "licensectl_webhook_admissions_total", {"result": "mutated"}) == 2


async def test_not_entitled_is_admitted_unchanged_with_an_event(rig: Rig, kubeconfig_path: Any) -> None:
    body = vmi_body("denied", claims=("gpu",))
    async with running_app(rig.settings(kubeconfig_path)) as app:
        await eventually(lambda: replica_seen(app, rig.entitled, rig.world.replica), what="replica cached")
        vmi = await create_vmi(rig.api, rig.other, body)
        assert vmi["spec"] == body["spec"]
        evs = await wait_event(rig.api, rig.other, "denied", "LicenseNotDelivered")
        assert any("not_entitled" in e.message for e in evs)
        assert metric(app, "licensectl_webhook_skipped_total", {"reason": "not_entitled"}) == 1


async def test_two_vgpu_classes_give_two_volumes(rig: Rig, kubeconfig_path: Any) -> None:
    second = unique("vcs")
    await fleet.create_gpu_class(rig.api, second, mode="vgpu", secret=rig.world.source, feature_type=4)
    try:
        await fleet.create_claim(rig.api, rig.entitled, "compute", class_name=second)
        async with running_app(rig.settings(kubeconfig_path)) as app:
            for name in (rig.world.replica, replica_name(second)):
                await eventually(lambda name=name: replica_seen(app, rig.entitled, name), what=f"{name} cached")
            vmi = await create_vmi(rig.api, rig.entitled, vmi_body("both", claims=("gpu", "compute")))
    finally:
        await fleet.delete_gpu_class(rig.api, second)
    vols = license_volumes(vmi)
    assert {v["secret"]["secretName"] for v in vols.values()} == {rig.world.replica, replica_name(second)}
    assert sorted(v["secret"]["volumeLabel"] for v in vols.values()) == [SERIAL, f"{SERIAL}-2"]
    serials = sorted(d.get("serial") for d in vmi["spec"]["domain"]["devices"]["disks"] if d["name"] in vols)
    assert serials == [SERIAL, f"{SERIAL}-2"]


async def replica_stamp(api: ApiClient, ns: str, name: str) -> tuple[str, str | None]:
    """What the webhook must stamp for this replica: its revision and credential key, read live."""
    ann = (await CoreV1Api(api).read_namespaced_secret(name, ns)).metadata.annotations or {}
    return ann[ANN_REVISION], ann.get(ANN_CREDENTIAL_KEY)


async def test_a_delivered_vmi_carries_the_delivery_stamp(rig: Rig, kubeconfig_path: Any) -> None:
    """docs/design.md#delivery-stamp: the revision (and signing key) it got, as the apiserver stored it."""
    async with running_app(rig.settings(kubeconfig_path)) as app:
        await eventually(lambda: replica_seen(app, rig.entitled, rig.world.replica), what="replica cached")
        vmi = await create_vmi(rig.api, rig.entitled, vmi_body("stamped", claims=("gpu",)))
        stored = await CustomObjectsApi(rig.api).get_namespaced_custom_object(
            "kubevirt.io", "v1", rig.entitled, "virtualmachineinstances", "stamped")
        revision, key = await replica_stamp(rig.api, rig.entitled, rig.world.replica)
        # The projection the rollout reads holds the same.
        cached = await eventually(lambda: app.caches.vmis.cache.get((rig.entitled, "stamped")) if app.caches.vmis
                                  else None, what="VMI cached")
    ann = stored["metadata"].get("annotations") or {}
    assert parse_stamp(ann.get(ANN_DELIVERED_REVISION)) == ((rig.world.replica, revision),)
    assert ann.get(ANN_DELIVERED_KEY) == key
    assert license_volumes(vmi)
    assert cached.delivered_revisions == ((rig.world.replica, revision),)
    assert cached.delivered_key == key


async def test_a_vmi_that_already_has_the_volume_keeps_its_spec_and_gets_the_stamp(
        rig: Rig, kubeconfig_path: Any) -> None:
    own = {"name": "my-license", "secret": {"secretName": rig.world.replica, "volumeLabel": "MINE"}}
    body = vmi_body("handmade", claims=("gpu",), volumes=[own],
                    disks=[{"name": "my-license", "serial": "MINE", "disk": {"bus": "virtio"}}])
    async with running_app(rig.settings(kubeconfig_path)) as app:
        await eventually(lambda: replica_seen(app, rig.entitled, rig.world.replica), what="replica cached")
        # Counted from here: registering the webhook probes it with dry-run creates of its own.
        before = metric(app, "licensectl_webhook_admissions_total", {"result": "stamped"}) or 0.0
        vmi = await create_vmi(rig.api, rig.entitled, body)
        assert metric(app, "licensectl_webhook_admissions_total", {"result": "stamped"}) == before + 1
        revision, _ = await replica_stamp(rig.api, rig.entitled, rig.world.replica)
    assert vmi["spec"] == body["spec"]
    assert parse_stamp(vmi["metadata"]["annotations"][ANN_DELIVERED_REVISION]) == ((rig.world.replica, revision),)


async def test_a_taken_serial_is_refused_and_named(rig: Rig, kubeconfig_path: Any) -> None:
    """The guest installs the disk with serial LICENSECTL: a VMI whose own disk holds it gets no volume."""
    body = vmi_body("squatter", claims=("gpu",), volumes=[{"name": "data", "emptyDisk": {"capacity": "1Gi"}}],
                    disks=[{"name": "data", "serial": SERIAL, "disk": {"bus": "virtio"}}])
    async with running_app(rig.settings(kubeconfig_path)) as app:
        await eventually(lambda: replica_seen(app, rig.entitled, rig.world.replica), what="replica cached")
        vmi = await create_vmi(rig.api, rig.entitled, body)
        assert vmi["spec"] == body["spec"]
        evs = await wait_event(rig.api, rig.entitled, "squatter", "LicenseNotDelivered")
        assert any("serial_taken" in e.message for e in evs)
        assert metric(app, "licensectl_webhook_skipped_total", {"reason": "serial_taken"}) == 1


async def test_a_taken_volume_name_is_named_by_both_events_and_counted_in_one_family(
        rig: Rig, kubevirt: KubevirtEnv, kubeconfig_path: Any) -> None:
    """One cause, one object named, one alert: the VM's own volume holds the license volume's name."""
    taken = volume_name(rig.world.cls)
    body = fleet.vm_body(rig.entitled, "taken", gpu_claims=["gpu"])
    spec = body["spec"]["template"]["spec"]
    spec["volumes"].append({"name": taken, "emptyDisk": {"capacity": "1Gi"}})
    spec["domain"]["devices"]["disks"].append({"name": taken, "disk": {"bus": "virtio"}})
    settings = rig.settings(kubevirt.kubeconfig_path, done_gate="ready")
    async with running_app(settings) as app:
        await eventually(lambda: replica_seen(app, rig.entitled, rig.world.replica), what="replica cached")
        await CustomObjectsApi(rig.api).create_namespaced_custom_object(
            "kubevirt.io", "v1", rig.entitled, "virtualmachines", body)
        evs = await wait_event(rig.api, rig.entitled, "taken", "LicenseNotDelivered", "LicenseDeliveryBlocked",
                               timeout=40)
        by_reason = {e.reason: e.message for e in evs}
        # The admission names the claim and its class (not the class as "claim"), and the taken volume.
        assert by_reason["LicenseNotDelivered"].startswith(
            f"GPU claim gpu of GPUClass {rig.world.cls}: no license volume added (volume_name_taken: "), by_reason
        assert f"volume or disk named {taken})" in by_reason["LicenseNotDelivered"], by_reason
        assert f"volume or disk named {taken})" in by_reason["LicenseDeliveryBlocked"], by_reason
        await eventually(lambda: metric(app, "licensectl_vmis_delivery_blocked",
                                        {"namespace": rig.entitled, "reason": "volume_name_taken"}) == 1,
                         what="counted as blocked")
        # Not counted as missing as well: LicensectlVMIMissingLicenseVolume stays quiet for it.
        assert metric(app, "licensectl_vmis_missing_license_volume", {"namespace": rig.entitled}) == 0
        assert "LicenseVolumeMissing" not in {e.reason for e in evs}
    assert kubevirt.record.restarts_for(rig.entitled, "taken") == []


async def test_a_vmi_without_gpus_never_reaches_the_webhook(rig: Rig, kubeconfig_path: Any) -> None:
    settings = rig.settings(kubeconfig_path)
    def probes(app: Any) -> float:
        """The delivery probe's own dry runs reach the webhook too (docs/design.md#delivery-readiness)."""
        return metric(app, "licensectl_webhook_admissions_total", {"result": "probe"}) or 0.0

    async with running_app(settings) as app:
        # Take the baseline just after a probe came back mutated: the apiserver counted that call before
        # answering the probe, and the next one is a full probe interval away, so no probe is in flight
        # between the two reads (a failed probe retries within a second and would straddle them).
        assert app.delivery_probe is not None, "the leader runs the delivery probe"
        await eventually(app.delivery_probe.ready, timeout=30, what="a delivery probe answered by the webhook")
        before = await registration.webhook_requests(rig.api, settings.webhook_configuration)
        calls = metric(app, "licensectl_webhook_admissions_total", {"result": "unchanged"}) or 0.0
        probed = probes(app)
        for i in range(5):
            await create_vmi(rig.api, rig.entitled, vmi_body(f"plain{i}"))
        # A control: one VMI with a claim in the same namespace does reach it.
        await create_vmi(rig.api, rig.entitled, vmi_body("control", annotation="nosuchclaim"))

        async def only_the_control_and_probes() -> bool:
            # A probe may be in flight between the two reads: compare once both counters have settled.
            after = await registration.webhook_requests(rig.api, settings.webhook_configuration)
            return bool(after - before == 1 + probes(app) - probed)
        await eventually(only_the_control_and_probes, timeout=10, interval=0.2,
                         what="webhook calls = the control VMI plus the delivery probes")
        assert (metric(app, "licensectl_webhook_admissions_total", {"result": "unchanged"}) or 0.0) - calls == 1


async def test_webhook_down_then_backstop_restarts_once_with_the_volume(
        rig: Rig, kubevirt: KubevirtEnv, kubeconfig_path: Any) -> None:
    # No guests here: a restart is done when its VMI is Ready (a guest that never reports is no evidence).
    settings = rig.settings(kubevirt.kubeconfig_path, max_unavailable="5", done_gate="ready")
    # Down: the configuration points at a port nobody listens on (failurePolicy Ignore admits).
    await registration.register(rig.api, name=settings.webhook_configuration, port=free_port(), wait=False)
    try:
        # The replica exists (a previous licensectl run wrote it) before the VMs start.
        async with running_app(settings, register_webhook=False):
            await eventually(lambda: rig.world.replica_revision(rig.entitled), what="replica written")
        await asyncio.sleep(1.1)  # one-second timestamps: start the VMs after the revision
        for i in range(2):
            await fleet.create_vm(rig.api, rig.entitled, f"vm{i}", gpu_claims=["gpu"])
        first = {}
        for i in range(2):
            vmi = await eventually(lambda i=i: running(rig.api, rig.entitled, f"vm{i}"), what=f"vm{i} running")
            assert license_volumes(vmi) == {}, "admitted without the webhook"
            first[i] = vmi["metadata"]["uid"]
        # Back: licensectl starts; its webhook is registered; the backstop finds both VMIs.
        async with running_app(settings) as app:
            for i in range(2):
                await wait_event(rig.api, rig.entitled, f"vm{i}", "LicenseVolumeMissing")

            async def restarted(i: int) -> dict[str, Any] | None:
                vmi = await running(rig.api, rig.entitled, f"vm{i}")
                return vmi if vmi is not None and vmi["metadata"]["uid"] != first[i] else None

            for i in range(2):
                vmi = await eventually(lambda i=i: restarted(i), timeout=60, what=f"vm{i} restarted")
                vols = license_volumes(vmi)
                assert [v["secret"]["secretName"] for v in vols.values()] == [rig.world.replica]

            async def done(i: int) -> bool:
                vm = await CustomObjectsApi(rig.api).get_namespaced_custom_object(
                    "kubevirt.io", "v1", rig.entitled, "virtualmachines", f"vm{i}")
                return (vm["metadata"].get("annotations") or {}).get(ANN_RESTART_RESULT) == "done"

            for i in range(2):
                await eventually(lambda i=i: done(i), timeout=30, what=f"vm{i} restart recorded done")
            await eventually(lambda: metric(app, "licensectl_vmis_missing_license_volume",
                                            {"namespace": rig.entitled}) is None, what="missing gauge cleared")
            await asyncio.sleep(3)  # a few more passes: nothing restarts again
        for i in range(2):
            assert len(kubevirt.record.restarts_for(rig.entitled, f"vm{i}")) == 1
    finally:
        await registration.unregister(rig.api, settings.webhook_configuration)


async def running(api: ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        vmi: dict[str, Any] = await CustomObjectsApi(api).get_namespaced_custom_object(
            "kubevirt.io", "v1", ns, "virtualmachineinstances", name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (vmi.get("status") or {}).get("conditions") or [])
    return vmi if ready and not vmi["metadata"].get("deletionTimestamp") else None


async def test_serving_certificate_rotated_under_a_stream_of_creations(rig: Rig, kubeconfig_path: Any) -> None:
    """Zero failed admissions: every VMI created while the certificate changes carries the volume."""
    from licensectl.core import certs

    settings = rig.settings(kubeconfig_path)
    core = CoreV1Api(rig.api)
    async with running_app(settings) as app:
        await eventually(lambda: replica_seen(app, rig.entitled, rig.world.replica), what="replica cached")
        secret = await core.read_namespaced_secret(settings.tls_secret, settings.namespace)
        data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
        ca = certs.KeyPair(cert_pem=data["ca.crt"], key_pem=data["ca.key"])
        old_serial = certs.serial_of(data["tls.crt"])
        created: list[dict[str, Any]] = []

        async def stream() -> None:
            for i in range(60):
                created.append(await create_vmi(rig.api, rig.entitled, vmi_body(f"s{i}", claims=("gpu",))))
                await asyncio.sleep(0.05)

        async def rotate() -> None:
            await asyncio.sleep(0.5)
            leaf = certs.new_leaf(ca, app.tls.hosts, now=app.clock())
            await core.patch_namespaced_secret(settings.tls_secret, settings.namespace, {"data": {
                "tls.crt": base64.b64encode(leaf.cert_pem).decode(),
                "tls.key": base64.b64encode(leaf.key_pem).decode()}})

        await asyncio.gather(stream(), rotate())
        await eventually(lambda: app.tls.serial != old_serial, what="new leaf loaded")
        late = await create_vmi(rig.api, rig.entitled, vmi_body("late", claims=("gpu",)))
    missing = [v["metadata"]["name"] for v in [*created, late] if not license_volumes(v)]
    assert missing == []
    assert len(created) == 60


async def test_a_standby_answers_admission_too(rig: Rig, kubeconfig_path: Any) -> None:
    """Admission never depends on who leads: only the standby's webhook is registered here."""
    base = rig.settings(kubeconfig_path, leader_elect=True, lease_duration_seconds=15.0)
    async with running_app(base, register_webhook=False, identity="a") as leader:
        await eventually(lambda: leader.is_leader, what="a leads")
        standby_settings = dataclasses.replace(base, webhook_configuration=f"{base.webhook_configuration}-b")
        async with running_app(standby_settings, identity="b") as standby:
            assert not standby.is_leader
            await eventually(lambda: replica_seen(standby, rig.entitled, rig.world.replica), what="replica cached")
            # Every cache the decision reads synced (a busy machine lists the claims after the replicas).
            await registration.wait_delivery(rig.api, namespace=rig.entitled, claim="gpu")
            before = metric(standby, "licensectl_webhook_admissions_total", {"result": "mutated"}) or 0.0
            vmi = await create_vmi(rig.api, rig.entitled, vmi_body("via-standby", claims=("gpu",)))
            assert [v["secret"]["secretName"] for v in license_volumes(vmi).values()] == [rig.world.replica]
            assert metric(standby, "licensectl_webhook_admissions_total", {"result": "mutated"}) == before + 1
            assert not standby.is_leader


# -- delivery readiness and the webhook configuration (docs/design.md#delivery-readiness) -----------
async def test_delivery_ready_only_once_the_apiserver_calls_a_webhook_that_mutates(
        rig: Rig, kubeconfig_path: Any) -> None:
    """No configuration: the dry-run probe comes back unchanged, the configuration is reported missing
    (Warning Event, gauge). Registered: the probe comes back answered and delivery is ready."""
    settings = rig.settings(kubeconfig_path)
    name = settings.webhook_configuration
    async with running_app(settings, register_webhook=False) as app:
        probe = app.delivery_probe
        assert probe is not None
        await eventually(lambda: probe.last_result == "unchanged", what="probe admitted unchanged")
        assert not app.delivery_ready() and metric(app, "licensectl_delivery_ready") == 0
        await eventually(lambda: metric(app, "licensectl_webhook_configuration_problem",
                                        {"name": name, "problem": "missing"}) == 1, what="missing configuration gauge")
        evs = await wait_event(rig.api, "default", name, "WebhookConfigurationProblem")
        assert all(e.type == "Warning" and "does not exist" in e.message for e in evs)
        assert app.status()["delivery"]["ready"] is False
        try:
            await registration.register(rig.api, name=name, port=app.webhook_port, ca_bundle=app.tls.ca_bundle,
                                        wait=False)
            await eventually(app.delivery_ready, timeout=30, what="delivery ready")
            assert metric(app, "licensectl_delivery_ready") == 1
            assert (metric(app, "licensectl_webhook_admissions_total", {"result": "probe"}) or 0) >= 1
            # Nothing wakes the leader: while a problem stands it re-checks every RETRY_SECONDS, not
            # only at the periodic pass (a Helm install applies the configuration after the Deployment).
            await eventually(lambda: metric(app, "licensectl_webhook_configuration_problem",
                                            {"name": name, "problem": "missing"}) == 0,
                             timeout=3 * serving_tls.RETRY_SECONDS, what="problem cleared on its own")
            # The probe is no VMI: nothing was stored in licensectl's namespace.
            left = await CustomObjectsApi(rig.api).list_namespaced_custom_object(
                "kubevirt.io", "v1", settings.namespace, "virtualmachineinstances")
            assert left["items"] == []
        finally:
            await registration.unregister(rig.api, name)


async def test_a_configuration_without_ca_bundle_is_fixed_by_the_leader_then_delivery_is_ready(
        rig: Rig, kubeconfig_path: Any) -> None:
    """Self-managed TLS: the shipped configuration arrives without a caBundle; the leader sets it, the
    probe proves the apiserver now reaches the webhook, and no problem remains."""
    settings = rig.settings(kubeconfig_path)
    name = settings.webhook_configuration
    async with running_app(settings, register_webhook=False) as app:
        await eventually(lambda: metric(app, "licensectl_webhook_configuration_problem",
                                        {"name": name, "problem": "missing"}) == 1, what="missing configuration gauge")
        try:
            # Not woken: the leader's next check comes RETRY_SECONDS after it saw the problem.
            await registration.register(rig.api, name=name, port=app.webhook_port, wait=False)
            await eventually(lambda: metric(app, "licensectl_webhook_configuration_problem",
                                            {"name": name, "problem": "no_ca_bundle"}) == 0
                             and metric(app, "licensectl_webhook_configuration_problem",
                                        {"name": name, "problem": "missing"}) == 0,
                             timeout=3 * serving_tls.RETRY_SECONDS, what="the leader set the caBundle on its own")
            await eventually(app.delivery_ready, timeout=30, what="delivery ready after the caBundle was set")
            assert metric(app, "licensectl_webhook_configuration_problem",
                          {"name": name, "problem": "no_ca_bundle"}) == 0
        finally:
            await registration.unregister(rig.api, name)

