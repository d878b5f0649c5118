"""The drain shell's reads of Cluster API's objects: a failed read is no answer."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from licensectl import config
from licensectl.controllers.worker_drain import WorkerDrainer
from licensectl.core import drain
from licensectl.core.defaults import DRAIN_HOLD_RETRIES
from licensectl.core.model import Vm
from licensectl.core.ports import MachineSays
from licensectl.kube.api import ApiException, KubeClient
from licensectl.kube.cluster_api import ClusterApiReader
from licensectl.kube.tenant import TenantClusters


class _CustomObjects:
    """Answers the drainer's GETs from `objects`; a value that is an exception is raised instead."""

    def __init__(self, objects: dict[tuple[str, str], Any]) -> None:
        self.objects = objects

    async def get_namespaced_custom_object(self, _group: str, _version: str, _ns: str, plural: str,
                                           name: str) -> dict[str, Any]:
        got = self.objects.get((plural, name), ApiException(status=404))
        if isinstance(got, BaseException):
            raise got
        return dict(got)


def _drainer(objects: dict[tuple[str, str], Any]) -> WorkerDrainer:
    """A drainer whose management-cluster reads come from `objects` (its client never connects)."""
    unused = TenantClusters(KubeClient(host="https://unused.invalid", session=None))  # type: ignore[arg-type]
    return WorkerDrainer(cluster_api=ClusterApiReader(_CustomObjects(objects)), tenants=unused,
                         kubevirt=None, events=None, metrics=None,  # type: ignore[arg-type]
                         settings=config.Settings(), clock=lambda: dt.datetime(2026, 1, 1, tzinfo=dt.UTC))


WORKER = drain.WorkerIdentity.from_vm("t", "kx-md-0", {drain.LABEL_CLUSTER_NAME: "kx",
                                                       drain.LABEL_ROLE: "worker"})
OWNED = {"metadata": {"ownerReferences": [{"kind": "Machine", "name": "m", "controller": True}]}}


async def test_a_failed_machine_read_is_no_answer_never_an_unexcluded_machine() -> None:
    assert WORKER is not None
    excluded = {"metadata": {"annotations": {drain.ANN_EXCLUDE_NODE_DRAINING: ""}}, "spec": {"nodeDrainTimeout": "90s"}}
    assert await _drainer({("kubevirtmachines", "kx-md-0"): OWNED, ("machines", "m"): excluded})._machine(
        WORKER) == MachineSays(90.0, True)
    for failing in (ApiException(status=500), TimeoutError()):
        assert await _drainer({("kubevirtmachines", "kx-md-0"): OWNED, ("machines", "m"): failing})._machine(
            WORKER) is None
        assert await _drainer({("kubevirtmachines", "kx-md-0"): failing})._machine(WORKER) is None
    # Absent is an answer: no KubevirtMachine, or no Machine, means Cluster API's defaults.
    assert await _drainer({})._machine(WORKER) == MachineSays()
    assert await _drainer({("kubevirtmachines", "kx-md-0"): OWNED})._machine(WORKER) == MachineSays()


async def test_a_failed_cluster_read_keeps_the_policy_last_read_or_gives_none() -> None:
    d = _drainer({("clusters", "kx"): ApiException(status=503)})
    assert await d._policy("t", "kx") is None
    d.cluster_api = ClusterApiReader(_CustomObjects({("clusters", "kx"): {"metadata": {"annotations": {
        drain.ANN_MAX_DISRUPTED_WORKERS: "3"}}}}))
    assert (await d._policy("t", "kx")) == drain.ClusterPolicy(3, False)
    d.cluster_api = ClusterApiReader(_CustomObjects({("clusters", "kx"): ApiException(status=500)}))
    assert (await d._policy("t", "kx")) == drain.ClusterPolicy(3, False)
    assert d.worker_limits() == {"t/kx": 3}


async def test_a_held_cycle_is_tried_again_once_per_hold_not_at_the_next_resync() -> None:
    assert WORKER is not None
    d = _drainer({})
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    vm = Vm("t", "kx-md-0", "Always", resource_version="1")
    cycle = drain.DrainIntent(drain.Step.DRAIN, "r1", now, now, node="kx-md-0", cordoned=True)
    held = drain.Blocked(drain.BlockReason.CLUSTER_UNREACHABLE, cycle)
    hold = dt.timedelta(seconds=DRAIN_HOLD_RETRIES * d.settings.drain_retry_seconds)
    assert await d._act(vm, WORKER, held, None, None) == [now + hold]
    closed = drain.Blocked(drain.BlockReason.PDB_BLOCKED, dataclasses.replace(cycle, step=drain.Step.BLOCKED,
                                                                              reason=drain.BlockReason.PDB_BLOCKED))
    assert await d._act(vm, WORKER, closed, None, None) == []  # closed for its revision: nothing to retry
