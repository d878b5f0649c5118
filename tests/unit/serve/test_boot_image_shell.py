"""The shell around core/boot_image.py: projections of PVCs, DataVolumes and DataSources, the caches
(CDI absent must leave licensectl ready with the CDI marks unknown), the settings, and both webhook
endpoints answering through a real aiohttp server (warnings, the enforce denial, enforce off)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from licensectl import config
from licensectl.core import boot_image as bi
from licensectl.core.boot_image import DataVolumeRef, Judgement, Verdict
from licensectl.kube import api as kapi
from licensectl.kube import projections as p
from licensectl.kube.caches import Caches
from licensectl.serve.webhook import PATH, VALIDATE_PATH, Admission, Validation, make_webhook_app
from tests.unit.kube.test_projections import GARBAGE


# -- projections ----------------------------------------------------------------------------------
def test_data_volume_projection() -> None:
    def dv(spec: Any, labels: Any = None) -> DataVolumeRef | None:
        meta: dict[str, Any] = {"name": "root", "namespace": "t", "uid": "u"}
        if labels is not None:
            meta["labels"] = labels
        return p.data_volume_from({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                                   "metadata": meta, "spec": spec})

    assert dv({"sourceRef": {"kind": "DataSource", "name": "ubuntu"}}) == DataVolumeRef(
        "t", "root", False, data_source=("t", "ubuntu"))  # the namespace defaults to the DataVolume's
    assert dv({"sourceRef": {"kind": "DataSource", "namespace": "os-images", "name": "ubuntu"}},
              {bi.MARK_LABEL: "true"}) == DataVolumeRef("t", "root", True, data_source=("os-images", "ubuntu"))
    assert dv({"sourceRef": {"kind": "Other", "name": "x"}}) == DataVolumeRef("t", "root", False)
    assert dv({"source": {"pvc": {"namespace": "os-images", "name": "rhel9"}}}) == DataVolumeRef(
        "t", "root", False, source_pvc=("os-images", "rhel9"))
    assert dv({"source": {"http": {"url": "https://example.com/disk.img"}}}, {bi.MARK_LABEL: "yes"}) == \
        DataVolumeRef("t", "root", False)  # only "true" marks
    assert dv({"sourceRef": {"kind": "DataSource"}, "source": {"pvc": "x"}}, "junk") == DataVolumeRef(
        "t", "root", False)
    assert p.data_volume_from({"metadata": {"name": "x"}}) is None  # no namespace: unidentifiable


def test_boot_mark_projection() -> None:
    assert p.boot_mark_from({"metadata": {"name": "golden", "namespace": "t", "labels": {bi.MARK_LABEL: "true"}}}) \
        == bi.Marked("t", "golden")
    assert p.boot_mark_from({"metadata": {"namespace": "t"}}) is None


@pytest.mark.parametrize("obj", GARBAGE)
def test_garbage_never_raises(obj: Any) -> None:
    for fn in (p.data_volume_from, p.boot_mark_from):
        fn(obj)


# -- settings -------------------------------------------------------------------------------------
def test_settings() -> None:
    s = config.settings_from(None, {"LICENSECTL_VGPU_DRIVER_IMAGES": " registry.example.com/vgpu/ ,, quay.io/x/*",
                                    "LICENSECTL_VGPU_DRIVER_CHECK": "enforce"})
    assert s.vgpu_driver_images == "registry.example.com/vgpu/,quay.io/x/*"
    assert s.vgpu_driver_check == "enforce"
    assert config.Settings().vgpu_driver_check == "warn"
    with pytest.raises(ValueError, match="LICENSECTL_VGPU_DRIVER_CHECK"):
        config.settings_from(None, {"LICENSECTL_VGPU_DRIVER_CHECK": "deny"})
    with pytest.raises(ValueError, match="--vgpu-driver-images"):
        config.settings_from(_args(vgpu_driver_images="a b"), {})
    schema = config.helm_values_schema()["properties"]
    assert schema["vgpuDriverCheck"]["enum"] == ["warn", "enforce", "off", None]


def _args(**kw: Any) -> Any:
    import argparse

    return argparse.Namespace(**kw)


# -- caches: CDI absent ---------------------------------------------------------------------------
def _list_body(items: list[Any]) -> dict[str, Any]:
    return {"kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}


@pytest.fixture
async def apiserver() -> AsyncIterator[tuple[str, list[str]]]:
    """Answers every LIST with its items, 404 for CDI (not installed); watches end at once."""
    seen: list[str] = []
    marked_pvc = {"metadata": {"name": "golden", "namespace": "t", "labels": {bi.MARK_LABEL: "true"}}}

    async def handle(request: web.Request) -> web.Response:
        seen.append(f"{request.path}?{request.query_string}")
        if request.path.startswith("/apis/cdi.kubevirt.io/"):
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)
        if request.query.get("watch") == "true":
            await asyncio.sleep(0.2)
            return web.Response(body=b"")
        items = [marked_pvc] if request.path == "/api/v1/persistentvolumeclaims" else []
        return web.json_response(_list_body(items))

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", handle)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("")), seen
    finally:
        await server.close()


async def test_without_cdi_the_caches_are_ready_and_cdi_marks_unknown(apiserver: tuple[str, list[str]]) -> None:
    url, seen = apiserver
    session = aiohttp.ClientSession()
    client = kapi.KubeClient(host=url, session=session)
    caches = Caches(client, config.Settings(), on_change=lambda _k: None, with_kubevirt=False)
    assert caches.boot_marks is not None
    caches.start()
    try:
        for _ in range(100):
            if caches.core_synced() and caches.boot_marks.pvcs.synced:
                break
            await asyncio.sleep(0.05)
        assert caches.core_synced()  # nothing waits for CDI
        assert all(inf not in caches.core for inf in caches.boot_marks.all)
        assert set(caches.boot_marks.all) <= set(caches.all)  # exported by licensectl_informer_synced
        marks = caches.boot_marks.marks(("registry.example.com/vgpu/",))
        assert marks.pvcs is not None and (("t", "golden") in marks.pvcs)
        assert marks.datavolumes is None and marks.datasources is None
        judged = bi.judge(bi.BootVolume("t", "root", bi.Source.DATA_VOLUME, "imported"), marks)
        assert judged.verdict is Verdict.UNKNOWN
        assert bi.judge(bi.BootVolume("t", "root", bi.Source.PVC, "golden"), marks).verdict is Verdict.MARKED
        assert any(s.startswith("/api/v1/persistentvolumeclaims?") and "labelSelector=licensectl.io" in s
                   for s in seen)
        assert any("/apis/cdi.kubevirt.io/v1beta1/datasources?" in s and "labelSelector" in s for s in seen)
        # DataVolumes are all listed; the only selected request is the watch-cache probe before a LIST.
        assert not any("/apis/cdi.kubevirt.io/v1beta1/datavolumes?" in s and "labelSelector" in s
                       and "watch-cache-probe" not in s for s in seen)
    finally:
        await caches.stop()
        await session.close()


@pytest.mark.parametrize("settings", [config.Settings(vgpu_driver_check="off"), config.Settings(webhook_address="")])
def test_no_boot_mark_watches_without_the_check(settings: config.Settings) -> None:
    caches = Caches(kapi.KubeClient(host="http://127.0.0.1:1", session=None), settings,  # type: ignore[arg-type]
                    on_change=lambda _k: None, with_kubevirt=False)
    assert caches.boot_marks is None


# -- the webhook endpoints ------------------------------------------------------------------------
UNMARKED = Judgement(Verdict.UNMARKED, 'PVC "plain"', 'no mark on PVC "plain"')
MARKED = Judgement(Verdict.MARKED, 'PVC "golden"', 'PVC "golden" is marked')
UNKNOWN = Judgement(Verdict.UNKNOWN, 'DataVolume "x"', 'DataVolume "x": CDI DataVolumes are not observed')


def review(name: str = "vm1", *, kind: str = "VirtualMachineInstance", operation: str = "CREATE",
           dry_run: bool = False) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "kubevirt.io", "version": "v1", "kind": kind}, "operation": operation,
        "namespace": "t", "dryRun": dry_run, "object": {"metadata": {"name": name}, "spec": {}}}}


class Recorded:
    def __init__(self) -> None:
        self.admissions: list[Admission] = []
        self.validations: list[Validation] = []


async def serve(judgement: Judgement | None, *, enforce: bool, check: bool = True
                ) -> tuple[TestClient[Any, Any], Recorded]:
    rec = Recorded()
    by_name = {"plain": UNMARKED, "golden": MARKED, "x": UNKNOWN}

    def check_boot(namespace: str, vmi: Mapping[str, Any]) -> Judgement | None:
        return by_name.get(vmi["metadata"]["name"], judgement)

    app = make_webhook_app(decide=lambda ns, vmi: None, on_admission=rec.admissions.append,
                           check_boot=check_boot if check else None, enforce=enforce,
                           on_validation=rec.validations.append)
    client: TestClient[Any, Any] = TestClient(TestServer(app))
    await client.start_server()
    return client, rec


async def post(client: TestClient[Any, Any], path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(path, data=json.dumps(body), headers={"Content-Type": "application/json"})
    assert resp.status == 200
    out: dict[str, Any] = (await resp.json())["response"]
    assert out["uid"] == "u-1"
    return out


async def test_the_mutating_webhook_warns_and_never_refuses() -> None:
    client, rec = await serve(None, enforce=True)
    try:
        out = await post(client, PATH, review("plain"))
        assert out["allowed"] is True and out["warnings"] == [bi.warning(UNMARKED)]
        out = await post(client, PATH, review("x"))
        assert out["allowed"] is True and out["warnings"] == [bi.warning(UNKNOWN)]
        out = await post(client, PATH, review("golden"))
        assert out == {"uid": "u-1", "allowed": True}
        out = await post(client, PATH, review("no-vgpu"))  # check_boot says None: not a vGPU VMI
        assert out == {"uid": "u-1", "allowed": True}
        assert [a.boot for a in rec.admissions] == [UNMARKED, UNKNOWN, MARKED, None]
        assert rec.validations == []
        out = await post(client, PATH, review("plain", dry_run=True))
        assert rec.admissions[-1].dry_run and out["warnings"]  # the client still sees it; the app writes no Event
    finally:
        await client.close()


async def test_the_enforce_webhook_denies_only_unmarked() -> None:
    client, rec = await serve(None, enforce=True)
    try:
        out = await post(client, VALIDATE_PATH, review("plain"))
        assert out["allowed"] is False
        assert out["status"] == {"code": 403, "reason": "Forbidden", "message": bi.denial(UNMARKED)}
        for name in ("golden", "x", "no-vgpu"):
            assert (await post(client, VALIDATE_PATH, review(name)))["allowed"] is True
        assert [(v.name, v.denied) for v in rec.validations] == [
            ("plain", True), ("golden", False), ("x", False), ("no-vgpu", False)]
        # Not a VMI CREATE: allowed, not judged.
        assert (await post(client, VALIDATE_PATH, review("plain", operation="UPDATE")))["allowed"] is True
        assert len(rec.validations) == 4
        assert rec.admissions == []
    finally:
        await client.close()


@pytest.mark.parametrize("check", [True, False])
async def test_without_enforce_the_validating_endpoint_allows_everything(check: bool) -> None:
    """A ValidatingWebhookConfiguration registered without --vgpu-driver-check=enforce never refuses."""
    client, rec = await serve(None, enforce=False, check=check)
    try:
        assert (await post(client, VALIDATE_PATH, review("plain")))["allowed"] is True
        assert rec.validations == []
        out = await post(client, PATH, review("plain"))
        assert ("warnings" in out) is check
    finally:
        await client.close()


async def test_a_bad_body_is_a_400_on_both_paths() -> None:
    client, _ = await serve(None, enforce=True)
    try:
        for path in (PATH, VALIDATE_PATH):
            resp = await client.post(path, data=b"not json")
            assert resp.status == 400
            resp = await client.post(path, json={"request": {"uid": ""}})
            assert resp.status == 400
    finally:
        await client.close()
