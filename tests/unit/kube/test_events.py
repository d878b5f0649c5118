"""The Event recorder (kube/events.py): a repeat is one patch of a count, never a new object, and a
write failure never reaches the reconcile that emitted it."""

from __future__ import annotations

import datetime as dt
from typing import Any

from licensectl.core.ports import InvolvedObject
from licensectl.kube.api import ApiException
from licensectl.kube.events import EventRecorder, event_name

OBJ = InvolvedObject("v1", "Secret", "licensectl-system", "nls-token")


class FakeEventsApi:
    """Records calls; holds Events by (namespace, name) like the apiserver."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail: int | None = None

    async def create_namespaced_event(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        self.calls.append(("create", name))
        if self.fail is not None:
            raise ApiException(status=self.fail)
        if (ns, name) in self.events:
            raise ApiException(status=409)
        self.events[(ns, name)] = dict(body)
        return body

    async def patch_namespaced_event(self, name: str, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", name))
        if (ns, name) not in self.events:
            raise ApiException(status=404)
        self.events[(ns, name)].update(body)
        return self.events[(ns, name)]


class Clock:
    def __init__(self) -> None:
        self.t = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.t


def recorder(api: FakeEventsApi, clock: Clock, *, min_interval: float = 300.0) -> EventRecorder:
    r = EventRecorder(None, min_interval=min_interval, clock=clock)  # type: ignore[arg-type]
    r._api = api  # the raw wrapper's calls, without HTTP
    return r


async def test_a_repeat_is_one_patch_of_the_count_not_a_new_object() -> None:
    api, clock = FakeEventsApi(), Clock()
    r = recorder(api, clock)
    name = event_name(OBJ, "LicenseRotated", "m")
    await r.emit(OBJ, "Normal", "LicenseRotated", "m")
    clock.t += dt.timedelta(seconds=301)
    await r.emit(OBJ, "Normal", "LicenseRotated", "m")
    clock.t += dt.timedelta(seconds=301)
    await r.emit(OBJ, "Normal", "LicenseRotated", "m")
    assert api.calls == [("create", name), ("patch", name), ("patch", name)]
    assert len(api.events) == 1 and api.events[("licensectl-system", name)]["count"] == 3


async def test_repeats_within_the_interval_write_nothing() -> None:
    api, clock = FakeEventsApi(), Clock()
    r = recorder(api, clock)
    for _ in range(5):
        await r.emit(OBJ, "Warning", "RestartBlocked", "m")
        clock.t += dt.timedelta(seconds=10)
    assert [verb for verb, _ in api.calls] == ["create"]


async def test_an_event_written_before_a_restart_is_bumped_not_duplicated() -> None:
    api, clock = FakeEventsApi(), Clock()
    await recorder(api, clock).emit(OBJ, "Warning", "ReplicaConflict", "m")
    api.calls.clear()
    await recorder(api, clock).emit(OBJ, "Warning", "ReplicaConflict", "m")  # a new process: counts unknown
    name = event_name(OBJ, "ReplicaConflict", "m")
    assert api.calls == [("create", name), ("patch", name)]
    assert api.events[("licensectl-system", name)]["count"] == 2


async def test_a_deleted_event_is_created_again() -> None:
    api, clock = FakeEventsApi(), Clock()
    r = recorder(api, clock, min_interval=0.0)
    await r.emit(OBJ, "Warning", "RestartFailed", "m")
    api.events.clear()  # expired (the apiserver's event TTL) or deleted by someone
    await r.emit(OBJ, "Warning", "RestartFailed", "m")
    name = event_name(OBJ, "RestartFailed", "m")
    assert api.calls == [("create", name), ("patch", name), ("create", name)]
    assert api.events[("licensectl-system", name)]["count"] == 1


async def test_write_failures_are_swallowed() -> None:
    api, clock = FakeEventsApi(), Clock()
    api.fail = 500
    r = recorder(api, clock)
    await r.emit(OBJ, "Warning", "RestartFailed", "m")  # must not raise
    assert api.events == {} and r.emitted[-1][2] == "RestartFailed"


async def test_cluster_scoped_objects_get_their_events_in_default() -> None:
    api, clock = FakeEventsApi(), Clock()
    cls = InvolvedObject("gpu.cozystack.io/v1alpha1", "GPUClass", "", "vws")
    await recorder(api, clock).emit(cls, "Warning", "LicenseSourceInvalid", "m")
    ((ns, _),) = api.events
    assert ns == "default"


async def test_a_failed_write_is_tried_again_soon_not_after_the_interval() -> None:
    api, clock = FakeEventsApi(), Clock()
    r = recorder(api, clock)
    name = event_name(OBJ, "LicenseSourceInvalid", "m")
    api.fail = 500
    await r.emit(OBJ, "Warning", "LicenseSourceInvalid", "m")
    api.fail = None
    clock.t += dt.timedelta(seconds=5)
    await r.emit(OBJ, "Warning", "LicenseSourceInvalid", "m")  # still within the retry delay
    assert api.events == {}
    clock.t += dt.timedelta(seconds=6)
    api.calls.clear()
    await r.emit(OBJ, "Warning", "LicenseSourceInvalid", "m")
    assert api.calls == [("create", name)]  # retried as the create it was, not a patch that 404s
    assert api.events[("licensectl-system", name)]["count"] == 1
    clock.t += dt.timedelta(seconds=60)
    await r.emit(OBJ, "Warning", "LicenseSourceInvalid", "m")  # written: repeats wait the full interval
    assert api.events[("licensectl-system", name)]["count"] == 1


async def test_a_write_into_a_terminating_namespace_is_not_retried() -> None:
    api, clock = FakeEventsApi(), Clock()
    r = recorder(api, clock)
    api.fail = 403
    await r.emit(OBJ, "Warning", "ReplicaDeleted", "m")
    api.fail = None
    clock.t += dt.timedelta(seconds=60)
    await r.emit(OBJ, "Warning", "ReplicaDeleted", "m")
    assert api.events == {} and len(api.calls) == 1
