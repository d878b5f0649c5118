"""How `licensectl status` reaches the controller: the service-proxy request it builds, the leader it
insists on, the errors it explains, and the document it turns the controller's answer into. (The
real thing, against a controller process behind the real API server, is in
tests/integration/test_status_cli.py.)"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from licensectl.cli.main import _parser
from licensectl.cli.status_fetch import (
    STATUS_SERVICE,
    STATUS_SERVICE_PORT,
    UNREADABLE_TOKEN_PROBLEM,
    ControllerTarget,
    ControllerUnreachable,
    fetch_controller_status,
    status_from_controller,
)
from licensectl.cli.status_offline import ClusterView, status_json
from licensectl.cli.status_render import status_table
from licensectl.config import Settings
from licensectl.core.entitlement import TenantSettings
from licensectl.core.model import KEY_TOKEN, GpuClaim, GpuClass, Namespace, ObjectRef, ReplicaSecret, SourceSecret
from licensectl.core.replication import ReplicationInputs, ReplicationPlan, plan_replication
from licensectl.core.rollout import RolloutPlan
from licensectl.kube.client import make_api_client
from licensectl_dev.testkit.local_http import serve
from tests.unit.kube.test_server_clock import kubeconfig_for

ROOT = Path(__file__).resolve().parents[3]

CONTROLLER_DOC: dict[str, Any] = {
    "version": "0.1.0", "identity": "licensectl-0", "leader": True, "ready": True,
    "replication": {
        "synced": True,
        "entitled": [{"namespace": "tenant-a", "class": "vws", "source": "licensectl-system/vws-token"},
                     {"namespace": "tenant-b", "class": "vws", "source": "licensectl-system/vws-token"},
                     {"namespace": "tenant-b", "class": "vcs", "source": "licensectl-system/vcs-token"}],
        "replica_counts": {"in_sync": 2, "drifted": 0, "missing": 1, "conflict": 0},
        "sources": {"vws": {"source_revision": "abcdefabcdef", "valid": True, "token": "readable"},
                    "vcs": {"valid": False, "reason": "token_empty", "message": "token is empty"}},
        "tenant_problems": [],
    },
    "rollout": {"synced": True, "sources": {"licensectl-system/vws-token": {
        "phase": "complete", "source_revision": "abcdefabcdef", "replica_revision": "0123456789ab",
        "affected": 2, "current": 2, "stale": 0, "restarting": 0,
        "failed": 0, "blocked": 0, "manual": 0, "overdue": 0, "unavailable": 0, "max_unavailable": 1,
        "pause_reason": None, "message": ""}}},
    "guests": {"counts": {"licensed": 1, "unlicensed": 1},
               "list": [{"namespace": "tenant-a", "vmi": "vm1", "state": "licensed", "product": "RTX vWS",
                         "expiry": None, "token_current": True, "reason": None, "wrong_product": False},
                        {"namespace": "tenant-b", "vmi": "vm2", "state": "unlicensed", "product": None,
                         "expiry": None, "token_current": False, "reason": "acquire_failed",
                         "wrong_product": None}]},
}


def test_the_proxy_path_names_service_and_port_and_escapes_them() -> None:
    t = ControllerTarget(namespace="licensectl-system")
    assert t.proxy_path() == "/api/v1/namespaces/licensectl-system/services/licensectl-metrics:metrics/proxy/v1/status"
    odd = ControllerTarget(namespace="ns", service="a/b", port="8080")
    assert odd.proxy_path() == "/api/v1/namespaces/ns/services/a%2Fb:8080/proxy/v1/status"


def test_defaults_match_the_shipped_service(capsys: pytest.CaptureFixture[str]) -> None:
    """The default Service and port name are the ones manifests/ and the chart ship."""
    docs = list(yaml.safe_load_all((ROOT / "manifests/base/services.yaml").read_text()))
    svc = next(d for d in docs if d["metadata"]["name"] == STATUS_SERVICE)
    assert [p["name"] for p in svc["spec"]["ports"]] == [STATUS_SERVICE_PORT]
    chart = (ROOT / "charts/licensectl/templates/services.yaml").read_text()
    assert f"name: {STATUS_SERVICE}\n" in chart and f"- name: {STATUS_SERVICE_PORT}\n" in chart
    with pytest.raises(SystemExit):
        _parser().parse_args(["status", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert f"(default: {STATUS_SERVICE})" in helptext and f"(default: {STATUS_SERVICE_PORT})" in helptext


def test_the_controller_document_becomes_the_status_view() -> None:
    doc = status_from_controller(CONTROLLER_DOC)
    assert doc["from"] == "controller" and doc["controller"]["identity"] == "licensectl-0"
    # A controller that reports no class checks (an older release) leaves the class fields empty.
    no_class = {"feature_type_check": None, "feature_type_message": None, "license_change": None}
    assert doc["sources"] == [
        {"class": "vcs", "source": "licensectl-system/vcs-token", "valid": False, "source_revision": None,
         "token": None, "problem": "token is empty", "entitled_namespaces": 1, **no_class},
        {"class": "vws", "source": "licensectl-system/vws-token", "valid": True, "source_revision": "abcdefabcdef",
         "token": "readable", "problem": None, "entitled_namespaces": 2, **no_class}]
    assert doc["replicas"]["missing"] == 1
    assert doc["guests"] == CONTROLLER_DOC["guests"]
    table = status_table(doc)
    assert table.startswith("FROM CONTROLLER licensectl-0 (leader")
    assert any(line.split()[:3] == ["tenant-b", "vm2", "unlicensed"] for line in table.splitlines())
    # The guests table shows gridd's reason and the wrong-product flag.
    assert any(line.split()[:4] == ["tenant-b", "vm2", "unlicensed", "acquire_failed"] for line in table.splitlines())
    header = next(line for line in table.splitlines() if line.startswith("NAMESPACE"))
    assert "REASON" in header and "WRONG PRODUCT" in header


def test_a_standby_answer_carries_no_guest_states_and_says_so() -> None:
    doc = status_from_controller({**CONTROLLER_DOC, "leader": False})
    assert doc["guests"] is None
    assert "STANDBY" in status_table(doc)


# -- against a fake API server: which replica answers, and what failures say ------------------------
@contextlib.asynccontextmanager
async def apiserver(answers: list[tuple[int, dict[str, Any]]], seen: list[str]) -> AsyncIterator[str]:
    """Answers proxied /v1/status requests from `answers` in turn (the last one repeats)."""

    async def proxied(request: web.Request) -> web.Response:
        seen.append(request.path)
        status, body = answers[min(len(seen) - 1, len(answers) - 1)]
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/services/{svc}/proxy/v1/status", proxied)
    async with serve(app) as url:
        yield url


async def fetch(tmp_path: Path, answers: list[tuple[int, dict[str, Any]]], seen: list[str]) -> dict[str, Any]:
    async with apiserver(answers, seen) as server:
        api = await make_api_client(Settings(kubeconfig=str(kubeconfig_for(server, tmp_path / "kc"))))
        try:
            return await fetch_controller_status(api, ControllerTarget(namespace="licensectl-system"), attempts=4)
        finally:
            await api.close()


async def test_through_the_service_it_asks_again_until_the_leader_answers(tmp_path: Path) -> None:
    seen: list[str] = []
    standby = {**CONTROLLER_DOC, "leader": False, "identity": "licensectl-1"}
    doc = await fetch(tmp_path, [(200, standby), (200, standby), (200, CONTROLLER_DOC)], seen)
    assert doc["identity"] == "licensectl-0" and len(seen) == 3
    assert set(seen) == {"/api/v1/namespaces/licensectl-system/services/licensectl-metrics:metrics/proxy/v1/status"}


async def test_a_standby_is_kept_only_when_no_leader_answers(tmp_path: Path) -> None:
    seen: list[str] = []
    doc = await fetch(tmp_path, [(200, {**CONTROLLER_DOC, "leader": False})], seen)
    assert doc["leader"] is False and len(seen) == 4


@pytest.mark.parametrize(("status", "says"), [
    (403, "may not get services/proxy in licensectl-system"),
    (404, "no Service licensectl-system/licensectl-metrics with port metrics"),
    (503, "no ready endpoint of Service licensectl-system/licensectl-metrics answered"),
    (500, "HTTP 500"),
])
async def test_proxy_failures_say_what_to_fix(tmp_path: Path, status: int, says: str) -> None:
    seen: list[str] = []
    with pytest.raises(ControllerUnreachable, match=says):
        await fetch(tmp_path, [(status, {"kind": "Status", "reason": "X", "code": status})], seen)


async def test_an_answer_that_is_not_a_status_document_is_refused(tmp_path: Path) -> None:
    seen: list[str] = []
    with pytest.raises(ControllerUnreachable, match="did not answer with a licensectl status document"):
        await fetch(tmp_path, [(200, {"hello": "world"})], seen)
    assert json.dumps(CONTROLLER_DOC)  # the fixture itself is plain JSON


def test_the_status_table_shows_each_rotation() -> None:
    rotation = {"licensectl-system/vws-token": {
        "phase": "aborted", "wave": 0, "stable": "aaaaaaaaaaaa", "candidate": "bbbbbbbbbbbb", "canary": ["tenant-a"],
        "evidence": True, "reason": "canary: 1 guest(s) failed", "wave_started_at": None},
        "licensectl-system/vcs-token": {"phase": "invalid"}}
    doc = status_from_controller({**CONTROLLER_DOC, "rotation": rotation})
    assert doc["rotations"] == rotation
    lines = status_table(doc).splitlines()
    assert "ROTATIONS" in lines
    assert any(line.split()[:6] == ["licensectl-system/vws-token", "aborted", "-", "aaaaaaaaaaaa",
                                    "bbbbbbbbbbbb", "tenant-a"] for line in lines)
    assert any(line.split()[:3] == ["licensectl-system/vcs-token", "invalid", "-"] for line in lines)
    for phase, wave, label in (("canary", 0, "canary"), ("promoting", 2, "step"), ("promoted", 2, "-")):
        running = {"licensectl-system/vws-token": {**rotation["licensectl-system/vws-token"], "phase": phase,
                                                    "wave": wave}}
        lines = status_table(status_from_controller({**CONTROLLER_DOC, "rotation": running})).splitlines()
        assert any(line.split()[:3] == ["licensectl-system/vws-token", phase, label] for line in lines), phase
    assert "ROTATIONS" not in status_table(status_from_controller(CONTROLLER_DOC))


def test_the_class_line_shows_the_feature_type_check_and_a_held_change() -> None:
    change = {"from": ["licensectl-system/vws-token:1"], "to": "licensectl-system/vws-token:4", "held": 2,
              "accept": "licensectl.io/accept-license-change=licensectl-system/vws-token:4"}
    classes = {"vws": {"feature_type_check": "mismatch", "feature_type_message": "profile L40S-2Q is a Q-series "
                       "vGPU type, which needs NVIDIA RTX Virtual Workstation; featureType 4 cannot license it",
                       "license_change": change},
               "vcs": {"feature_type_check": "no_profile", "feature_type_message": None, "license_change": None}}
    repl = {**CONTROLLER_DOC["replication"], "classes": classes,
            "replica_counts": {"in_sync": 1, "drifted": 0, "missing": 0, "conflict": 0, "held": 2}}
    doc = status_from_controller({**CONTROLLER_DOC, "replication": repl})
    vws = next(s for s in doc["sources"] if s["class"] == "vws")
    assert (vws["feature_type_check"], vws["license_change"]) == ("mismatch", change)
    lines = status_table(doc).splitlines()
    header = next(line for line in lines if line.startswith("CLASS"))
    assert "FEATURETYPE" in header and "LICENSE CHANGE" in header
    row = next(line for line in lines if line.startswith("vws "))
    assert "MISMATCH" in row and "HELD 2" in row
    assert "no profile" in next(line for line in lines if line.startswith("vcs "))
    problems = lines[lines.index("CLASS PROBLEMS") + 1:]
    assert any("license changed in place from licensectl-system/vws-token:1 to licensectl-system/vws-token:4; "
               "2 replicas held. Accept with: kubectl annotate gpuclass vws "
               "licensectl.io/accept-license-change=licensectl-system/vws-token:4" in line for line in problems)
    assert any("featureType 4 cannot license it" in line for line in problems)
    assert "REPLICAS  in_sync=1  drifted=0  missing=0  conflict=0  held=2" in lines
    # A controller of an older release says nothing about classes: "-", and no CLASS PROBLEMS section.
    plain = status_table(status_from_controller(CONTROLLER_DOC)).splitlines()
    assert "CLASS PROBLEMS" not in plain
    assert next(line for line in plain if line.startswith("vws ")).split()[5:7] == ["-", "-"]


def test_the_status_table_shows_delivery_readiness() -> None:
    """One DELIVERY line from the controller's `delivery` block (the leader's dry-run probe), below REPLICAS."""
    ok = {"ready": True, "prober": True, "last_result": "mutated", "last_success_seconds_ago": 4.2, "error": None,
          "consecutive_failures": 0, "webhook_configurations": [
              {"kind": "MutatingWebhookConfiguration", "name": "licensectl", "problem": None}]}
    doc = status_from_controller({**CONTROLLER_DOC, "delivery": ok})
    assert doc["delivery"] == ok
    lines = status_table(doc).splitlines()
    assert lines[lines.index("DELIVERY  ready (last successful probe 4.2s ago)") - 2].startswith("REPLICAS  ")
    failing = {**ok, "ready": False, "last_result": "unchanged", "last_success_seconds_ago": 93.0,
               "error": "the apiserver admitted the probe VMI unchanged", "consecutive_failures": 7,
               "webhook_configurations": [
                   {"kind": "MutatingWebhookConfiguration", "name": "licensectl", "problem": "no_ca_bundle"}]}
    lines = status_table(status_from_controller({**CONTROLLER_DOC, "delivery": failing})).splitlines()
    at = lines.index("DELIVERY  NOT READY: the apiserver admitted the probe VMI unchanged (7 failures)")
    assert lines[at + 1] == "  MutatingWebhookConfiguration licensectl: no_ca_bundle"
    stale = {**ok, "ready": False, "last_success_seconds_ago": 60.0}  # a mutated answer, but too old to count
    assert ("DELIVERY  NOT READY: no fresh probe answer, last success 60s ago"
            in status_table(status_from_controller({**CONTROLLER_DOC, "delivery": stale})))
    standby = {**ok, "ready": False, "prober": False, "last_result": None, "last_success_seconds_ago": None,
               "error": "standby: only the leader probes"}
    assert ("DELIVERY  not probed here (a standby: only the leader probes)"
            in status_table(status_from_controller({**CONTROLLER_DOC, "leader": False, "delivery": standby})))
    no_webhook = status_table(status_from_controller({**CONTROLLER_DOC, "delivery": {"ready": True}}))
    assert "DELIVERY  ready (no admission webhook: nothing to probe)" in no_webhook.splitlines()
    # A controller of an older release sends no block, and the offline view has no probe: no DELIVERY line.
    assert "DELIVERY" not in status_table(status_from_controller(CONTROLLER_DOC))
    offline = {**status_from_controller({**CONTROLLER_DOC, "delivery": ok}), "from": "offline",
               "offline_reason": "--offline given"}
    assert "DELIVERY" not in status_table(offline)


def test_the_offline_view_computes_the_same_class_fields() -> None:
    """`--offline` recomputes the plan on this workstation: the class fields come from the same helper."""
    src = ObjectRef("licensing", "nls-token")
    root = Namespace("tenant-root", "uid-root",
                     {"tenant.cozystack.io/tenant-root": "", "gpu.cozystack.io/vgpu": "true"})
    cls = GpuClass("vws", "uid-vws", "vgpu", src, 4, profile="L40S-2Q")
    now = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)

    def plan(c: GpuClass, replicas: dict[tuple[str, str], ReplicaSecret]) -> ReplicationPlan:
        return plan_replication(ReplicationInputs(
            namespaces={"tenant-root": root}, classes={"vws": c}, claims=[GpuClaim("tenant-root", "g", "vws")],
            sources={src: SourceSecret("licensing", "nls-token", "u", "1", {KEY_TOKEN: b"t"})}, replicas=replicas,
            conflicts=frozenset(), credential_for=lambda ns: "", report_url="http://r.invalid", token_key=KEY_TOKEN,
            tenant=TenantSettings(), now=now))

    [d] = plan(cls, {}).creates
    written = {(d.namespace, d.name): ReplicaSecret(d.namespace, d.name, "u", "1", d.labels, d.annotations,
                                                    d.data_digest)}
    rep = plan(dataclasses.replace(cls, feature_type=1), written)  # edited in place: held
    view = ClusterView(replication=rep, rollout=RolloutPlan(actions=(), vmi_states={}, next_wakeup=None, sources={}),
                       sources={}, now=now)
    [line] = status_json(view, None)["sources"]
    assert line["feature_type_check"] == "ok"
    assert line["license_change"] == {"from": ["licensing/nls-token:4"], "to": "licensing/nls-token:1", "held": 1,
                                      "accept": "licensectl.io/accept-license-change=licensing/nls-token:1"}
    assert status_json(view, None)["replicas"]["held"] == 1
    # b"t" is not a JWT: delivered (valid), its problem said as the controller's view says it.
    assert (line["valid"], line["token"], line["problem"]) == (True, "unreadable", UNREADABLE_TOKEN_PROBLEM)
