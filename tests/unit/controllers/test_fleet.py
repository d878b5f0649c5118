"""FleetView: the fleet-wide queries are derived once per cache generation, and follow the caches."""

from __future__ import annotations

from licensectl import config
from licensectl.controllers.fleet import FleetView
from licensectl.core.model import ReplicaSecret, Vmi
from licensectl_dev.testkit.memory import MemoryCaches


def _vmi(name: str, *, secrets: tuple[str, ...] = (), uuid: str | None = None) -> Vmi:
    return Vmi(namespace="t", name=name, uid=f"u-{name}", created_us=1.0, owner_vm=name, phase="Running",
               ready=True, running_since_us=2.0, secret_volumes=secrets, firmware_uuid=uuid)


def _fleet() -> tuple[FleetView, MemoryCaches]:
    caches = MemoryCaches()
    return FleetView(caches, config.Settings()), caches  # type: ignore[arg-type]


def test_affected_vmis_are_those_mounting_a_replica_and_are_derived_once_per_generation() -> None:
    fleet, caches = _fleet()
    assert caches.vmis is not None
    caches.vmis.put(_vmi("a", secrets=("lic",)), _vmi("b"))
    caches.replicas.put(ReplicaSecret("t", "lic", "r1", "1"))
    first = fleet.affected_vmis()
    assert first == (("t", "a"),)
    assert fleet.affected_vmis() is first  # same generations: the same answer, not derived again
    caches.vmis.put(_vmi("b", secrets=("lic",)))
    assert fleet.affected_vmis() == (("t", "a"), ("t", "b"))
    starts = fleet.vmi_starts()
    assert set(starts) == {("t", "a"), ("t", "b")} and fleet.vmi_starts() is starts


def test_the_firmware_uuid_index_is_rebuilt_only_after_the_vmis_changed() -> None:
    fleet, caches = _fleet()
    assert caches.vmis is not None
    caches.vmis.put(_vmi("a", uuid="ABC"))
    assert fleet.uuid_known("t", "abc") == "a"
    caches.vmis.put(_vmi("b", uuid="DEF"))
    assert fleet.uuid_known("t", "def") is None  # the App calls vmis_changed on the cache's event
    fleet.vmis_changed()
    assert fleet.uuid_known("t", "DEF") == "b"


def test_without_loops_attached_there_is_nothing_to_decide_from() -> None:
    fleet, _ = _fleet()
    assert fleet.replication_plan() is None and fleet.rollout_plan() is None and fleet.rotations() is None
    assert fleet.delivery_view() is None and fleet.wanted_volumes([]) == {} and fleet.delivery_ready()
    assert fleet.token_sha("t", "a") is None
