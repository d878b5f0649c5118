"""The restart pre-flight's VMI (kube/preflight.py): the object KubeVirt's VM controller would create, as the
simulator's virt-controller builds it (licensectl_dev/devcluster/vm_semantics.py), so admission sees the same."""

from __future__ import annotations

import copy

from licensectl.kube.preflight import vmi_for
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.vm_semantics import vmi_from_vm


def vm(**kw: object) -> dict[str, object]:
    body = fleet.vm_body("tenant-a", "worker-1", gpu_claims=["gpu"],
                         labels={"cluster.x-k8s.io/cluster-name": "k8s"}, **kw)  # type: ignore[arg-type]
    body["metadata"].update({"uid": "vm-uid-1", "generation": 7})
    body["spec"]["template"]["metadata"]["annotations"] = {"tenant/note": "x"}
    return body


def test_the_dry_run_vmi_is_the_one_virt_controller_makes_without_block_owner_deletion() -> None:
    source = vm()
    before = copy.deepcopy(source)
    got = vmi_for(source)
    assert source == before  # the VM (a cache copy, say) is not changed
    want = vmi_from_vm(copy.deepcopy(source))
    (owner,) = want["metadata"]["ownerReferences"]
    del owner["blockOwnerDeletion"]  # OwnerReferencesPermissionEnforcement would ask for rights we lack
    assert got == want
    assert got["metadata"]["annotations"] == {"tenant/note": "x", "kubevirt.io/vm-generation": "7"}
    assert got["spec"]["domain"]["firmware"]["uuid"]  # the stable firmware UUID, filled in


def test_a_template_firmware_uuid_is_kept_and_a_bare_vm_still_gives_an_object() -> None:
    assert vmi_for(vm(firmware_uuid="u-1"))["spec"]["domain"]["firmware"]["uuid"] == "u-1"
    bare = vmi_for({"metadata": {"name": "v", "namespace": "n"}})
    assert bare["metadata"]["name"] == "v" and bare["kind"] == "VirtualMachineInstance"
