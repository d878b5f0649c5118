"""The vGPU guest driver mark of boot images, through the real apiserver's admission chain.

The mutating webhook is registered as in tests/integration/test_webhook.py, the enforce webhook from
manifests/components/vgpu-driver-enforce, both pointing at the App's loopback listener. PVCs,
DataVolumes and DataSources are real objects (the CDI test CRDs of licensectl_dev/devcluster/crds),
seen by the App's own watches; the client reads the warnings from the `Warning` response headers, as
kubectl does.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
import pytest_asyncio
from kubernetes_asyncio.client import AdmissionregistrationV1Api, ApiClient, ApiException, CoreV1Api, CustomObjectsApi

from licensectl.app import App
from licensectl.core.boot_image import MARK_LABEL
from licensectl_dev.devcluster import webhook as registration
from licensectl_dev.testkit.world import World

from .support import eventually, make_world, metric, running_app, settings_for, wait_event

pytestmark = pytest.mark.asyncio(loop_scope="session")

CDI = ("cdi.kubevirt.io", "v1beta1")
ALLOWED_IMAGES = "registry.example.com/vgpu/"
MARK = {MARK_LABEL: "true"}
CAPK_LABELS = {"cluster.x-k8s.io/cluster-name": "tenant-k8s", "cluster.x-k8s.io/role": "worker"}


@dataclass
class Rig:
    api: ApiClient
    world: World
    tenant: str  # entitled, with the claim "gpu" of the world's vGPU class
    images: str  # where the golden DataSources live

    def settings(self, kubeconfig: Any, **kw: Any) -> Any:
        return settings_for(kubeconfig, self.world.controller_ns, root_tenant=self.world.root_name,
                            vgpu_driver_images=ALLOWED_IMAGES, **kw)


async def create_pvc(api: ApiClient, ns: str, name: str, labels: dict[str, str] | None = None) -> None:
    await CoreV1Api(api).create_namespaced_persistent_volume_claim(ns, cast(Any, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "labels": labels or {}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))


async def create_cdi(api: ApiClient, ns: str, plural: str, kind: str, name: str, spec: dict[str, Any],
                     labels: dict[str, str] | None = None) -> None:
    await CustomObjectsApi(api).create_namespaced_custom_object(*CDI, ns, plural, {
        "apiVersion": "/".join(CDI), "kind": kind, "metadata": {"name": name, "labels": labels or {}}, "spec": spec})


@pytest_asyncio.fixture(loop_scope="session")
async def rig(api_client: ApiClient, namespace_factory: Any, cleanup: Any) -> AsyncIterator[Rig]:
    w = await make_world(api_client, namespace_factory, cleanup)
    tenant = (await w.tenant(claim=True))["metadata"]["name"]
    images = await namespace_factory(prefix="os-images")
    await create_pvc(api_client, tenant, "golden", MARK)
    await create_pvc(api_client, tenant, "plain")
    await create_pvc(api_client, images, "rhel9", MARK)
    await create_cdi(api_client, images, "datasources", "DataSource", "ubuntu",
                     {"source": {"pvc": {"namespace": images, "name": "ubuntu-2404"}}}, MARK)
    await create_cdi(api_client, images, "datasources", "DataSource", "nodriver",
                     {"source": {"pvc": {"namespace": images, "name": "debian-12"}}})
    storage = {"storage": {"resources": {"requests": {"storage": "10Gi"}}}}
    await create_cdi(api_client, tenant, "datavolumes", "DataVolume", "dv-marked",
                     {"source": {"http": {"url": "https://images.example.com/vgpu.qcow2"}}, **storage}, MARK)
    await create_cdi(api_client, tenant, "datavolumes", "DataVolume", "dv-ubuntu",
                     {"sourceRef": {"kind": "DataSource", "namespace": images, "name": "ubuntu"}, **storage})
    await create_cdi(api_client, tenant, "datavolumes", "DataVolume", "dv-nodriver",
                     {"sourceRef": {"kind": "DataSource", "namespace": images, "name": "nodriver"}, **storage})
    await create_cdi(api_client, tenant, "datavolumes", "DataVolume", "dv-rhel9",
                     {"source": {"pvc": {"namespace": images, "name": "rhel9"}}, **storage})
    yield Rig(api_client, w, tenant, images)


def vmi_body(name: str, volume: dict[str, Any], *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A vGPU VMI (claim "gpu") booting from `volume`, with a cloud-init disk after it."""
    devices = {"disks": [{"name": "root", "disk": {"bus": "virtio"}}, {"name": "cloudinit", "disk": {"bus": "virtio"}}],
               "gpus": [{"name": "gpu0", "claimName": "c0", "requestName": "gpu"}]}
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"domain": {"devices": devices, "resources": {"requests": {"memory": "1Gi"}}},
                     "resourceClaims": [{"name": "c0", "resourceClaimName": "gpu"}],
                     "volumes": [{"name": "root", **volume},
                                 {"name": "cloudinit", "cloudInitNoCloud": {"userData": "#cloud-config"}}]}}


def pvc(claim: str) -> dict[str, Any]:
    return {"persistentVolumeClaim": {"claimName": claim}}


def data_volume(name: str) -> dict[str, Any]:
    return {"dataVolume": {"name": name}}


def container_disk(image: str) -> dict[str, Any]:
    return {"containerDisk": {"image": image}}


_WARNING = re.compile(r'^\d{3} \S+ "((?:[^"\\]|\\.)*)"')


def warnings_of(headers: Any) -> list[str]:
    """RFC 7234 Warning headers (`299 - "text"`) -> the texts, unescaped, as kubectl prints them."""
    out = []
    for value in headers.getall("Warning", []):
        m = _WARNING.match(value)
        assert m is not None, value
        out.append(re.sub(r"\\(.)", r"\1", m.group(1)))
    return out


async def create(api: ApiClient, ns: str, body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Create a VMI; the stored object and the warnings the client was given."""
    obj, _, headers = await CustomObjectsApi(api).create_namespaced_custom_object_with_http_info(
        "kubevirt.io", "v1", ns, "virtualmachineinstances", copy.deepcopy(body))
    return obj, warnings_of(headers)


async def marks_seen(app: App, rig: Rig) -> None:
    """The App's watches hold every mark the rig made (and CDI is served: the test CRDs are installed)."""
    marks = app.caches.boot_marks
    assert marks is not None

    def seen() -> bool:
        m = marks.marks(())
        return (m.pvcs is not None and (rig.tenant, "golden") in m.pvcs and (rig.images, "rhel9") in m.pvcs
                and m.datasources is not None and (rig.images, "ubuntu") in m.datasources
                and m.datavolumes is not None and (rig.tenant, "dv-nodriver") in m.datavolumes)

    await eventually(seen, what="boot image marks cached")
    await eventually(lambda: (rig.tenant, rig.world.replica) in app.caches.replicas.cache, what="replica cached")


def license_volumes(vmi: dict[str, Any]) -> list[str]:
    return [v["secret"]["secretName"] for v in vmi["spec"]["volumes"] if "secret" in v]


async def test_an_unmarked_pvc_is_admitted_with_a_warning_and_an_event(rig: Rig, kubeconfig_path: Any) -> None:
    async with running_app(rig.settings(kubeconfig_path)) as app:
        await marks_seen(app, rig)
        body = vmi_body("plain-pvc", pvc("plain"))
        vmi, warnings = await create(rig.api, rig.tenant, body)
        assert warnings == ['boot PVC "plain" lacks label licensectl.io/vgpu-guest-driver=true: '
                            "a vGPU needs its guest driver"]
        # Warn mode changes nothing else: the license volume is added as always, the boot volume kept.
        assert license_volumes(vmi) == [rig.world.replica]
        assert vmi["spec"]["volumes"][:2] == body["spec"]["volumes"]
        evs = await wait_event(rig.api, rig.tenant, "plain-pvc", "VGPUDriverUnmarked")
        (ev,) = [e for e in evs if e.reason == "VGPUDriverUnmarked"]
        assert ev.type == "Warning" and 'no mark on PVC "plain"' in ev.message
        assert "the VMI was admitted" in ev.message
        assert metric(app, "licensectl_webhook_boot_image_total", {"result": "unmarked"}) == 1
        assert metric(app, "licensectl_webhook_boot_image_total", {"result": "marked"}) == 0


async def test_marked_images_pass_without_a_warning(rig: Rig, kubeconfig_path: Any) -> None:
    cases = {
        "marked-pvc": pvc("golden"),
        "marked-dv": data_volume("dv-marked"),
        "dv-of-marked-datasource": data_volume("dv-ubuntu"),
        "dv-cloning-marked-pvc": data_volume("dv-rhel9"),
        "allowlisted-image": container_disk("registry.example.com/vgpu/ubuntu:24.04"),
        "ephemeral-marked-pvc": {"ephemeral": {"persistentVolumeClaim": {"claimName": "golden"}}},
    }
    async with running_app(rig.settings(kubeconfig_path)) as app:
        await marks_seen(app, rig)
        for name, volume in cases.items():
            vmi, warnings = await create(rig.api, rig.tenant, vmi_body(name, volume))
            assert warnings == [], name
            assert license_volumes(vmi) == [rig.world.replica], name
        assert metric(app, "licensectl_webhook_boot_image_total", {"result": "marked"}) == len(cases)
        assert metric(app, "licensectl_webhook_boot_image_total", {"result": "unmarked"}) == 0
        # An image outside the allowlist, and a DataVolume of an unmarked DataSource: warned.
        _, warnings = await create(rig.api, rig.tenant, vmi_body("quay", container_disk("quay.io/x/ubuntu:24.04")))
        assert warnings == ['boot image "quay.io/x/ubuntu:24.04" is not in --vgpu-driver-images: '
                            "a vGPU needs its guest driver"]
        _, warnings = await create(rig.api, rig.tenant, vmi_body("nodriver", data_volume("dv-nodriver")))
        assert warnings == ['boot DataVolume "dv-nodriver" lacks label licensectl.io/vgpu-guest-driver=true: '
                            "a vGPU needs its guest driver"]
        evs = await wait_event(rig.api, rig.tenant, "nodriver", "VGPUDriverUnmarked")
        assert any(f'DataSource "{rig.images}/nodriver"' in e.message for e in evs)
    for name in cases:
        listed = await CoreV1Api(rig.api).list_namespaced_event(rig.tenant,
                                                                field_selector=f"involvedObject.name={name}")
        assert not [e for e in listed.items if e.reason == "VGPUDriverUnmarked"], name


def vm_manifest(name: str, volume: dict[str, Any], *, data_volume_templates: list[dict[str, Any]] | None = None,
                memory: str = "1Gi") -> str:
    """A halted VirtualMachine whose template is `vmi_body`'s (claim "gpu", booting from `volume`), as YAML."""
    template = vmi_body(name, volume)
    template["spec"]["domain"]["resources"]["requests"]["memory"] = memory
    spec: dict[str, Any] = {"runStrategy": "Halted", "template": {"metadata": {}, "spec": template["spec"]}}
    if data_volume_templates:
        spec["dataVolumeTemplates"] = data_volume_templates
    return json.dumps({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name},
                       "spec": spec})


async def test_kubectl_creating_a_vm_prints_the_boot_image_warning(
        rig: Rig, kubeconfig_path: Any, control_plane: Any) -> None:
    """Real kubectl against the real apiserver: the VirtualMachine's create and template update are warned
    before any VMI exists; a marked image, or an update that leaves the template alone, is not."""

    async def apply(manifest: str) -> tuple[str, str]:
        proc = await asyncio.create_subprocess_exec(
            str(control_plane.kubectl), "--kubeconfig", str(kubeconfig_path), "apply", "-n", rig.tenant, "-f", "-",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate(manifest.encode())
        assert proc.returncode == 0, err.decode()
        return out.decode(), err.decode()

    unmarked = ('Warning: boot PVC "plain" lacks label licensectl.io/vgpu-guest-driver=true: '
                "a vGPU needs its guest driver")
    storage = {"storage": {"resources": {"requests": {"storage": "10Gi"}}}}
    async with running_app(rig.settings(kubeconfig_path)) as app:
        await marks_seen(app, rig)
        out, err = await apply(vm_manifest("vm-plain", pvc("plain")))
        assert "virtualmachine.kubevirt.io/vm-plain created" in out and unmarked in err, (out, err)
        # The same manifest again: the template did not change, so the webhook is not even called.
        _, err = await apply(vm_manifest("vm-plain", pvc("plain")))
        assert "Warning:" not in err, err
        _, err = await apply(vm_manifest("vm-plain", pvc("plain"), memory="2Gi"))  # a template update
        assert unmarked in err, err
        _, err = await apply(vm_manifest("vm-golden", pvc("golden")))
        assert "Warning:" not in err, err
        # dataVolumeTemplates: the DataVolume does not exist yet; its template names the golden image.
        for name, source, warned in (("vm-ubuntu", "ubuntu", False), ("vm-nodriver", "nodriver", True)):
            dvt = [{"metadata": {"name": f"{name}-root"},
                    "spec": {"sourceRef": {"kind": "DataSource", "namespace": rig.images, "name": source}, **storage}}]
            _, err = await apply(vm_manifest(name, data_volume(f"{name}-root"), data_volume_templates=dvt))
            assert (f'Warning: boot DataVolume "{name}-root" lacks label' in err) is warned, (name, err)
            assert ("Warning:" in err) is warned, (name, err)


async def test_a_capk_worker_gets_the_same_check(rig: Rig, kubeconfig_path: Any) -> None:
    async with running_app(rig.settings(kubeconfig_path)) as app:
        await marks_seen(app, rig)
        _, warnings = await create(rig.api, rig.tenant, vmi_body("md-0-abcde", data_volume("dv-nodriver"),
                                                                 labels=CAPK_LABELS))
        assert warnings == ['boot DataVolume "dv-nodriver" lacks label licensectl.io/vgpu-guest-driver=true: '
                            "a vGPU needs its guest driver"]
        await wait_event(rig.api, rig.tenant, "md-0-abcde", "VGPUDriverUnmarked")
        _, warnings = await create(rig.api, rig.tenant, vmi_body("md-0-fghij", data_volume("dv-ubuntu"),
                                                                 labels=CAPK_LABELS))
        assert warnings == []


async def test_a_dry_run_warns_and_writes_no_event(rig: Rig, kubeconfig_path: Any) -> None:
    async with running_app(rig.settings(kubeconfig_path)) as app:
        await marks_seen(app, rig)
        _, _, headers = await CustomObjectsApi(rig.api).create_namespaced_custom_object_with_http_info(
            "kubevirt.io", "v1", rig.tenant, "virtualmachineinstances", vmi_body("dry", pvc("plain")), dry_run="All")
        assert len(warnings_of(headers)) == 1
        await asyncio.sleep(1.0)
    evs = await CoreV1Api(rig.api).list_namespaced_event(rig.tenant, field_selector="involvedObject.name=dry")
    assert evs.items == []


def status_message(e: ApiException) -> str:
    message: str = json.loads(e.body or b"{}")["message"]
    return message


async def validating_ca_bundle(api: ApiClient, name: str) -> str | None:
    cfg = await AdmissionregistrationV1Api(api).read_validating_webhook_configuration(name)
    return str(cfg.webhooks[0].client_config.ca_bundle or "") or None


async def test_enforce_denies_unmarked_with_the_message(rig: Rig, kubeconfig_path: Any) -> None:
    settings = rig.settings(kubeconfig_path, vgpu_driver_check="enforce")
    name = settings.webhook_configuration
    async with running_app(settings) as app:
        # Registered without a caBundle: the leader keeps it equal to its CA (self-managed TLS), as it
        # does for the MutatingWebhookConfiguration. Until then the apiserver cannot call it (Ignore).
        await registration.register_validating(rig.api, name=name, port=app.webhook_port)
        try:
            app.tls.wake()
            await eventually(lambda: validating_ca_bundle(rig.api, name), what="validating caBundle set")
            await marks_seen(app, rig)

            async def refused() -> ApiException | None:
                try:
                    await create(rig.api, rig.tenant, vmi_body("enforced", pvc("plain")))
                except ApiException as e:
                    return e
                await CustomObjectsApi(rig.api).delete_namespaced_custom_object(
                    "kubevirt.io", "v1", rig.tenant, "virtualmachineinstances", "enforced")
                return None  # the apiserver has not picked the configuration up yet

            e = await eventually(refused, what="enforce webhook called")
            assert e is not None and e.status == 403
            assert status_message(e).startswith(
                f'admission webhook "{registration.validating_webhook_name(name)}" denied the request: '
                "licensectl: the boot image is not marked as carrying the NVIDIA vGPU guest driver "
                '(no mark on PVC "plain"); label the PVC, DataVolume or DataSource of the image '
                'licensectl.io/vgpu-guest-driver: "true"'), status_message(e)
            assert (metric(app, "licensectl_webhook_boot_image_denied_total") or 0) >= 1
            # The client of a denied creation sees the warning too; the Event says it was denied.
            assert warnings_of(e.headers) == ['boot PVC "plain" lacks label licensectl.io/vgpu-guest-driver=true: '
                                              "a vGPU needs its guest driver"]
            evs = await wait_event(rig.api, rig.tenant, "enforced", "VGPUDriverUnmarked")
            assert any("creation denied (--vgpu-driver-check=enforce)" in ev.message for ev in evs)
            # A CAPK worker from an unmarked DataSource: denied the same way.
            with pytest.raises(ApiException) as worker:
                await create(rig.api, rig.tenant, vmi_body("md-0-klmno", data_volume("dv-nodriver"),
                                                           labels=CAPK_LABELS))
            assert worker.value.status == 403
            assert f'DataSource "{rig.images}/nodriver"' in status_message(worker.value)
            # Marked and unknown are admitted: the license volume still comes from the mutating webhook.
            vmi, warnings = await create(rig.api, rig.tenant, vmi_body("enforced-ok", data_volume("dv-ubuntu")))
            assert warnings == [] and license_volumes(vmi) == [rig.world.replica]
            vmi, warnings = await create(rig.api, rig.tenant, vmi_body("enforced-unknown", data_volume("dv-later")))
            assert warnings == ['licensectl could not check boot DataVolume "dv-later" for the vGPU guest driver mark']
            assert license_volumes(vmi) == [rig.world.replica]
        finally:
            await registration.unregister_validating(rig.api, name)


async def test_warn_mode_never_refuses_even_with_the_enforce_configuration(rig: Rig, kubeconfig_path: Any) -> None:
    """A ValidatingWebhookConfiguration left behind after switching back to warn refuses nothing."""
    settings = rig.settings(kubeconfig_path)
    name = settings.webhook_configuration
    async with running_app(settings) as app:
        await registration.register_validating(rig.api, name=name, port=app.webhook_port,
                                               ca_bundle=app.tls.ca_bundle)
        try:
            await marks_seen(app, rig)
            before = await registration.webhook_requests(rig.api, name)  # the mutating one, for comparison

            async def validating_called() -> bool:
                await create(rig.api, rig.tenant, vmi_body(f"warn-{len(made)}", pvc("plain")))
                made.append(1)
                scrape = await registration.apiserver_metrics(rig.api)
                return scrape.value("apiserver_admission_webhook_request_total",
                                    name=registration.validating_webhook_name(name)) > 0

            made: list[int] = []
            await eventually(validating_called, what="validating webhook called")
            assert await registration.webhook_requests(rig.api, name) > before
            assert metric(app, "licensectl_webhook_boot_image_denied_total") == 0
        finally:
            await registration.unregister_validating(rig.api, name)
