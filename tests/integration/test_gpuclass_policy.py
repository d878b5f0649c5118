"""The GPUClass immutability policy (manifests/components/gpuclass-immutable) in the real apiserver.

The shipped ValidatingAdmissionPolicy and its binding are created from their file, unchanged. The
apiserver compiles a policy in the background, so the tests start only once the policy is seen
refusing a dry-run edit of a probe class, and end only once it is seen lifted again: the policy is
cluster-wide, and other tests of the session may edit classes freely.

What is proved: every edit of a vGPU class's mode, license Secret (name, namespace) or FeatureType,
including adding or removing one of them, is refused with 422 and a message naming the field and
the way out; labels, annotations and other spec fields stay editable; a passthrough class stays
editable, except that it cannot become a vGPU class. The chart renders the same file with its
configured group and plural (tests/chart/test_chart.py); the last test runs that rendering against a
class resource of another group whose schema has one more spec field.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio.client import AdmissionregistrationV1Api, ApiClient, ApiextensionsV1Api, CustomObjectsApi
from kubernetes_asyncio.client.rest import ApiException

from licensectl_dev.devcluster.kubeapi import GPU_CRD_DIR
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.world import unique

from ..manifests.test_manifests import gpuclass_policy

pytestmark = pytest.mark.asyncio(loop_scope="session")

# Compilation is asynchronous (about a second in practice); generous, so a slow machine is no failure.
POLICY_TIMEOUT = 60.0


@dataclass(frozen=True)
class ClassResource:
    """Where GPUClasses live: licensectl's defaults, or what --gpu-group / --gpu-class-plural name."""

    group: str = "gpu.cozystack.io"
    plural: str = "gpuclasses"
    version: str = "v1alpha1"


DEFAULT = ClassResource()


def gpu_class(name: str, *, mode: str = "vgpu", feature_type: int | None = 1,
              secret: tuple[str, str] | None = ("licensing", "nls-token"),
              resource: ClassResource = DEFAULT, **spec: Any) -> dict[str, Any]:
    """A GPUClass body; `None` leaves a license field out."""
    license_: dict[str, Any] = {}
    if secret is not None:
        license_["secretRef"] = {"namespace": secret[0], "name": secret[1]}
    if feature_type is not None:
        license_["featureType"] = feature_type
    body_spec: dict[str, Any] = {"mode": mode, **spec}
    if license_:
        body_spec["license"] = license_
    return {"apiVersion": f"{resource.group}/{resource.version}", "kind": "GPUClass",
            "metadata": {"name": name}, "spec": body_spec}


@dataclass(frozen=True)
class Classes:
    """The GPUClasses of one class resource, through the admin client; `created` names what it made."""

    api: ApiClient
    resource: ClassResource = DEFAULT
    created: list[str] = field(default_factory=list)

    @property
    def _objects(self) -> CustomObjectsApi:
        return CustomObjectsApi(self.api)

    def _where(self) -> tuple[str, str, str]:
        return self.resource.group, self.resource.version, self.resource.plural

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        obj: dict[str, Any] = await self._objects.create_cluster_custom_object(*self._where(), copy.deepcopy(body))
        self.created.append(obj["metadata"]["name"])
        return obj

    async def get(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = await self._objects.get_cluster_custom_object(*self._where(), name)
        return obj

    async def update(self, obj: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """PUT: an UPDATE in admission, as `kubectl edit` and `kubectl replace` send it."""
        kw = {"dry_run": "All"} if dry_run else {}
        out: dict[str, Any] = await self._objects.replace_cluster_custom_object(
            *self._where(), obj["metadata"]["name"], copy.deepcopy(obj), **kw)
        return out

    async def merge_patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """PATCH: also an UPDATE in admission, as `kubectl patch` and `kubectl apply` send it."""
        out: dict[str, Any] = await self._objects.patch_cluster_custom_object(
            *self._where(), name, patch, _content_type="application/merge-patch+json")
        return out

    async def delete(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            await self._objects.delete_cluster_custom_object(*self._where(), name)


def refusal(e: ApiException) -> tuple[int, str, str]:
    """(HTTP status, Status reason, message) of a refused request."""
    status = json.loads(e.body)
    return e.status, status.get("reason", ""), status.get("message", "")


def immutable(name: str, path: str, suggestion: str | None = None) -> str:
    return (f"GPUClass {name}: {path} of a vGPU class is immutable: create a new class "
            f"(for example {suggestion or name + '-v2'}) and move the claims to it")


async def enforced(classes: Classes, probe: str) -> bool:
    """Whether the policy refuses a dry-run FeatureType change of the vGPU class `probe` right now."""
    obj = await classes.get(probe)
    obj["spec"]["license"]["featureType"] += 1
    try:
        await classes.update(obj, dry_run=True)
    except ApiException as e:
        if e.status == 422:
            return True
        raise
    return False


@contextlib.asynccontextmanager
async def policy_in_force(api: ApiClient, policy: dict[str, Any], binding: dict[str, Any],
                          resource: ClassResource = DEFAULT) -> AsyncIterator[None]:
    """Create `policy` and `binding`, wait until the apiserver enforces them; on exit delete both and
    wait until it no longer does."""
    admission = AdmissionregistrationV1Api(api)
    classes = Classes(api, resource)
    probe = unique("policyprobe")
    await classes.create(gpu_class(probe, resource=resource))
    try:
        try:
            await admission.create_validating_admission_policy(copy.deepcopy(policy))
            await admission.create_validating_admission_policy_binding(copy.deepcopy(binding))
            await eventually(lambda: enforced(classes, probe), timeout=POLICY_TIMEOUT,
                             what=f"policy {policy['metadata']['name']} enforced")
            yield
        finally:
            with contextlib.suppress(ApiException):
                await admission.delete_validating_admission_policy_binding(binding["metadata"]["name"])
            with contextlib.suppress(ApiException):
                await admission.delete_validating_admission_policy(policy["metadata"]["name"])

            async def lifted() -> bool:
                return not await enforced(classes, probe)

            await eventually(lifted, timeout=POLICY_TIMEOUT, what=f"policy {policy['metadata']['name']} lifted")
    finally:
        await classes.delete(probe)


async def wait_gpuclass_policy_lifted(api: ApiClient) -> None:
    """Return once no policy refuses a FeatureType change of a vGPU class (for tests that install the
    chart's policy for real and must not leave it in force for the tests after them)."""
    classes = Classes(api)
    probe = unique("policyprobe")
    await classes.create(gpu_class(probe))
    try:
        async def lifted() -> bool:
            return not await enforced(classes, probe)

        await eventually(lifted, timeout=POLICY_TIMEOUT, what="GPUClass policy lifted")
    finally:
        await classes.delete(probe)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def shipped_policy(api_client: ApiClient) -> AsyncIterator[None]:
    """The policy and binding of manifests/components/gpuclass-immutable/policy.yaml, in force."""
    policy, binding = gpuclass_policy()
    async with policy_in_force(api_client, policy, binding):
        yield


@pytest_asyncio.fixture(loop_scope="session")
async def classes(api_client: ApiClient, shipped_policy: None) -> AsyncIterator[Classes]:
    """The default class resource under the shipped policy; every class the test creates is deleted."""
    made = Classes(api_client)
    yield made
    for name in made.created:
        await made.delete(name)


Edit = Callable[[dict[str, Any]], None]


def set_mode(mode: str) -> Edit:
    return lambda spec: spec.update(mode=mode)


def set_secret(key: str, value: str) -> Edit:
    return lambda spec: spec["license"]["secretRef"].update({key: value})


def set_feature_type(value: int) -> Edit:
    return lambda spec: spec["license"].update(featureType=value)


def drop_license(key: str) -> Edit:
    return lambda spec: spec["license"].pop(key)


IMMUTABLE_EDITS: dict[str, tuple[Edit, str]] = {
    "mode vgpu->passthrough": (set_mode("passthrough"), "spec.mode"),
    "mode removed": (lambda spec: spec.pop("mode"), "spec.mode"),
    "secretRef name": (set_secret("name", "nls-token-2"), "spec.license.secretRef.name"),
    "secretRef namespace": (set_secret("namespace", "licensing-2"), "spec.license.secretRef.namespace"),
    "secretRef removed": (drop_license("secretRef"), "spec.license.secretRef.namespace"),
    "featureType 1->4": (set_feature_type(4), "spec.license.featureType"),
    "featureType removed": (drop_license("featureType"), "spec.license.featureType"),
}


@pytest.mark.parametrize("edit", list(IMMUTABLE_EDITS))
async def test_an_edit_of_a_licensing_field_of_a_vgpu_class_is_refused(classes: Classes, edit: str) -> None:
    change, path = IMMUTABLE_EDITS[edit]
    name = unique("vgpu")
    before = await classes.create(gpu_class(name))
    obj = copy.deepcopy(before)
    change(obj["spec"])
    with pytest.raises(ApiException) as refused:
        await classes.update(obj)
    code, reason, message = refusal(refused.value)
    assert (code, reason) == (422, "Invalid"), message
    assert message.endswith(immutable(name, path)), message
    assert "licensectl-gpuclass-immutable" in message  # names the policy, so a hoster can find it
    after = await classes.get(name)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


async def test_adding_a_licensing_field_to_a_vgpu_class_is_refused(classes: Classes) -> None:
    """Absent fields are compared safely: an absent FeatureType or Secret is a value too."""
    name = unique("vgpu")
    bare = await classes.create(gpu_class(name, feature_type=None, secret=None))
    assert "license" not in bare["spec"]
    for patch, path in [({"spec": {"license": {"featureType": 1}}}, "spec.license.featureType"),
                         ({"spec": {"license": {"secretRef": {"name": "nls-token"}}}}, "spec.license.secretRef.name")]:
        with pytest.raises(ApiException) as refused:
            await classes.merge_patch(name, patch)
        code, _, message = refusal(refused.value)
        assert code == 422 and message.endswith(immutable(name, path)), message


async def test_a_patch_is_refused_like_a_replace(classes: Classes) -> None:
    """`kubectl patch` / `kubectl apply` send PATCH, which admission sees as an UPDATE too."""
    name = unique("vgpu")
    await classes.create(gpu_class(name))
    with pytest.raises(ApiException) as refused:
        await classes.merge_patch(name, {"spec": {"license": {"featureType": 4}}})
    code, _, message = refusal(refused.value)
    assert code == 422 and message.endswith(immutable(name, "spec.license.featureType")), message


async def test_the_message_suggests_the_next_version_name(classes: Classes) -> None:
    name = f"{unique('l40s')}-v9"
    await classes.create(gpu_class(name))
    with pytest.raises(ApiException) as refused:
        await classes.merge_patch(name, {"spec": {"license": {"featureType": 4}}})
    _, _, message = refusal(refused.value)
    assert message.endswith(immutable(name, "spec.license.featureType", suggestion=name[:-1] + "10")), message


async def test_labels_annotations_and_unchanged_specs_of_a_vgpu_class_are_accepted(classes: Classes) -> None:
    name = unique("vgpu")
    obj = await classes.create(gpu_class(name))
    obj["metadata"]["labels"] = {"example.com/tier": "gold"}
    obj = await classes.update(obj)
    obj["metadata"]["annotations"] = {"example.com/owner": "platform"}
    obj = await classes.update(obj)
    obj = await classes.merge_patch(name, {"metadata": {"labels": {"example.com/tier": "silver"}}})
    # Re-applying the same spec (what `kubectl apply` of an unchanged file does) is no change.
    obj = await classes.merge_patch(name, {"spec": gpu_class(name)["spec"]})
    assert obj["metadata"]["labels"] == {"example.com/tier": "silver"}
    assert obj["metadata"]["annotations"] == {"example.com/owner": "platform"}
    assert obj["spec"] == gpu_class(name)["spec"]


async def test_a_passthrough_class_stays_editable_but_cannot_become_vgpu(classes: Classes) -> None:
    name = unique("pt")
    obj = await classes.create(gpu_class(name, mode="passthrough", feature_type=2))
    obj["spec"]["license"]["featureType"] = 4
    obj = await classes.update(obj)
    obj = await classes.merge_patch(name, {"spec": {"license": {"secretRef": {"namespace": "other", "name": "b"}}}})
    obj = await classes.update({**obj, "spec": {"mode": "passthrough"}})  # the whole license removed
    assert obj["spec"] == {"mode": "passthrough"}
    with pytest.raises(ApiException) as refused:
        await classes.merge_patch(name, {"spec": {"mode": "vgpu"}})
    code, _, message = refusal(refused.value)
    assert code == 422
    assert message.endswith(f"GPUClass {name}: spec.mode cannot change to vgpu: create a new class "
                            f"(for example {name}-v2) and move the claims to it"), message


async def test_a_class_of_another_mode_value_is_not_guarded(classes: Classes) -> None:
    """Only `vgpu` is licensed by licensectl; a class licensectl reports as invalid stays editable."""
    name = unique("odd")
    await classes.create(gpu_class(name, mode="mig"))
    obj = await classes.merge_patch(name, {"spec": {"license": {"featureType": 4}}})
    assert obj["spec"]["license"]["featureType"] == 4


# --------------------------------------------------------------------------------------------------
# Another group and plural (the chart's config.gpuGroup / config.gpuClassPlural), a richer schema
# --------------------------------------------------------------------------------------------------
OTHER = ClassResource(group="gpu.policy-test.licensectl.io", plural="testgpuclasses")


def class_crd_with_description(resource: ClassResource) -> dict[str, Any]:
    """The dev cluster's GPUClass CRD moved to `resource`, with one more spec field, `description`."""
    crd: dict[str, Any] = yaml.safe_load((GPU_CRD_DIR / "gpu.cozystack.io_gpuclasses.yaml").read_text())
    crd["metadata"]["name"] = f"{resource.plural}.{resource.group}"
    crd["spec"]["group"] = resource.group
    crd["spec"]["names"].update(plural=resource.plural, singular=resource.plural.removesuffix("es"))
    (version,) = crd["spec"]["versions"]
    assert version["name"] == resource.version
    version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["description"] = {"type": "string"}
    return crd


def chart_rendering(resource: ClassResource) -> tuple[dict[str, Any], dict[str, Any]]:
    """What templates/gpuclass-policy.yaml renders with config.gpuGroup/gpuClassPlural set (the chart
    test proves the two agree), renamed so it cannot meet the shipped policy."""
    policy, binding = gpuclass_policy()
    for rule in policy["spec"]["matchConstraints"]["resourceRules"]:
        rule.update(apiGroups=[resource.group], resources=[resource.plural])
    name = f"{policy['metadata']['name']}-other-group"
    policy["metadata"]["name"] = binding["metadata"]["name"] = binding["spec"]["policyName"] = name
    return policy, binding


@pytest_asyncio.fixture(loop_scope="session")
async def other_classes(api_client: ApiClient) -> AsyncIterator[Classes]:
    extensions = ApiextensionsV1Api(api_client)
    crd = class_crd_with_description(OTHER)
    await extensions.create_custom_resource_definition(crd)
    try:
        async def established() -> bool:
            got = await extensions.read_custom_resource_definition(crd["metadata"]["name"])
            return any(c.type == "Established" and c.status == "True" for c in got.status.conditions or [])

        await eventually(established, what="test class CRD established")
        policy, binding = chart_rendering(OTHER)
        async with policy_in_force(api_client, policy, binding, OTHER):
            yield Classes(api_client, OTHER)
    finally:
        await extensions.delete_custom_resource_definition(crd["metadata"]["name"])


async def test_the_policy_follows_the_configured_group_and_keeps_other_spec_fields_editable(
        other_classes: Classes) -> None:
    name = unique("vgpu")
    await other_classes.create(gpu_class(name, resource=OTHER, description="L40S, 2Q"))
    obj = await other_classes.merge_patch(name, {"spec": {"description": "L40S, 2Q, Frankfurt"}})
    assert obj["spec"]["description"] == "L40S, 2Q, Frankfurt"
    with pytest.raises(ApiException) as refused:
        await other_classes.merge_patch(name, {"spec": {"description": "moved", "license": {"featureType": 4}}})
    code, _, message = refusal(refused.value)
    assert code == 422 and message.endswith(immutable(name, "spec.license.featureType")), message
    assert (await other_classes.get(name))["spec"]["description"] == "L40S, 2Q, Frankfurt"
