"""The guest fleet's pure parts (profile choice, boot records) and its boot/probe bookkeeping."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException

from licensectl.core.guest_report import REASON_ACQUIRE_FAILED, REASON_TOKEN_MISSING, parse_gridd_log, unlicensed_reason
from licensectl.core.model import ANN_REVISION, ANN_SOURCE_REVISION, KEY_TOKEN
from licensectl_dev.devcluster import guest_fleet
from licensectl_dev.devcluster.guest_fleet import (
    REGISTER_FAILURE_LOG,
    Boot,
    GuestFleet,
    acquire_failed_profile,
    always_licensed,
    boot_record,
    constant,
    licensed_unless,
    needs_boot,
    ready_vmis,
    token_bytes,
    token_sha256,
)
from licensectl_dev.devcluster.guest_sim import FIXTURES, GuestProfile, SimulatedGuest, journal_text, mounted_secret
from licensectl_dev.testkit.poll import eventually

T0 = dt.datetime(2026, 4, 2, 12, 0, tzinfo=dt.UTC)
GOOD, BAD = b"token-good", b"token-bad"


def vmi(name: str, uid: str, *, ready: bool = True, ns: str = "t1", secret: str | None = "license") -> dict[str, Any]:
    spec: dict[str, Any] = {"domain": {"firmware": {"uuid": f"uuid-{uid}"}}, "volumes": []}
    if secret is not None:
        spec["volumes"] = [{"name": "cloudinit", "cloudInitNoCloud": {}},
                           {"name": "lic", "secret": {"secretName": secret}}]
    return {"metadata": {"namespace": ns, "name": name, "uid": uid}, "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def secret(token: bytes | None, *, revision: str = "r1", source_revision: str | None = None) -> dict[str, Any]:
    ann = {ANN_REVISION: revision}
    if source_revision is not None:
        ann[ANN_SOURCE_REVISION] = source_revision
    data = {} if token is None else {KEY_TOKEN: base64.b64encode(token).decode()}
    return {"metadata": {"name": "license", "annotations": ann}, "data": data}


def reason_of(profile: GuestProfile) -> str:
    """The reason the controller derives from the gridd log in the profile's journal."""
    return unlicensed_reason(parse_gridd_log(journal_text(profile.gridd_log).splitlines()))


# -- profile choice -------------------------------------------------------------------------------

def test_licensed_unless_refuses_exactly_the_bad_tokens_with_an_acquire_failure() -> None:
    choose = licensed_unless({BAD})
    bad, good, empty = choose(BAD), choose(GOOD), choose(b"")
    assert bad.name == "acquire-failed" and bad.xml is None and bad.gridd_log == REGISTER_FAILURE_LOG
    assert bad.text_fixture is not None and "Unlicensed" in (FIXTURES / bad.text_fixture).read_text()
    assert reason_of(bad) == REASON_ACQUIRE_FAILED
    for p in (good, empty):
        assert p.name == "licensed" and p.xml is not None and p.lease is not None


def test_acquire_failed_reason_differs_from_the_default_unlicensed_one() -> None:
    # The failing profile is not just "unlicensed": gridd says the server refused, not that the token is missing.
    assert reason_of(acquire_failed_profile()) == REASON_ACQUIRE_FAILED
    assert reason_of(GuestProfile.unlicensed()) == REASON_TOKEN_MISSING


def test_default_and_constant_profiles_ignore_the_token() -> None:
    assert always_licensed(BAD).name == "licensed"
    p = GuestProfile.quiet()
    assert constant(p)(GOOD) is p and constant(p)(BAD) is p


# -- VMIs, tokens, boot records -------------------------------------------------------------------

def test_ready_vmis_keeps_ready_ones_with_identity() -> None:
    no_uid = vmi("c", "")
    items = [vmi("a", "u1"), vmi("b", "u2", ready=False), no_uid, {"metadata": {"namespace": "t1", "name": "d"}},
             vmi("a", "u9", ns="t2")]
    got = ready_vmis(items)
    assert set(got) == {("t1", "a"), ("t2", "a")}
    assert got[("t2", "a")]["metadata"]["uid"] == "u9"


def test_mounted_secret_is_the_secret_volume() -> None:
    assert mounted_secret(vmi("a", "u1", secret="licensectl-x")) == "licensectl-x"
    assert mounted_secret(vmi("a", "u1", secret=None)) is None
    assert mounted_secret({"spec": {}}) is None


def test_token_bytes_and_hash() -> None:
    assert token_bytes(secret(GOOD)) == GOOD
    assert token_bytes(secret(None)) == b"" and token_bytes(None) == b""
    assert token_bytes({"data": {KEY_TOKEN: "%%% not base64"}}) == b""
    assert token_sha256(GOOD) == hashlib.sha256(GOOD).hexdigest()
    assert token_sha256(b"") == ""


def test_needs_boot_on_first_and_each_new_vmi_uid() -> None:
    b = Boot("u1", "license", "r1", "", "h", T0)
    assert needs_boot([], "u1")
    assert not needs_boot([b], "u1")
    assert needs_boot([b], "u2")
    assert not needs_boot([b, Boot("u2", "license", "r2", "", "h", T0)], "u2")


def test_boot_record_reads_revisions_at_boot_and_hashes_the_token() -> None:
    rec = boot_record(vmi("a", "u1"), secret(GOOD, revision="r7", source_revision="s3"), replica="license", at=T0,
                      profile="licensed", install_rc=0)
    assert rec == Boot("u1", "license", "r7", "s3", hashlib.sha256(GOOD).hexdigest(), T0, "licensed", 0)
    assert GOOD.hex() not in repr(rec) and GOOD.decode() not in repr(rec)
    no_source = boot_record(vmi("a", "u1"), secret(GOOD), replica="license", at=T0)
    assert no_source.source_revision == "" and no_source.revision == "r1"
    absent = boot_record(vmi("a", "u1"), None, replica="license", at=T0)
    assert (absent.revision, absent.source_revision, absent.token_sha256) == ("", "", "")


# -- set_profile: a re-boot may license differently -----------------------------------------------

def _smi(g: SimulatedGuest, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(g.bin / "nvidia-smi"), *args], capture_output=True, text=True, check=False)


def test_set_profile_rewrites_driver_output_journal_and_clock() -> None:
    g = SimulatedGuest("t1", "a", GuestProfile.skewed(dt.timedelta(minutes=5)))
    try:
        assert _smi(g, "-q", "-x").returncode == 0 and "Licensed (Expiry" in _smi(g, "-q", "-x").stdout
        assert (g.bin / "date").exists()
        g.set_profile(acquire_failed_profile())
        assert g.profile.name == "acquire-failed"
        assert _smi(g, "-q", "-x").returncode == 9  # no XML: the probe falls back to the text output
        assert "Unlicensed" in _smi(g, "-q").stdout
        assert "Failed to acquire license" in (g.base / "journal.txt").read_text()
        assert not (g.bin / "date").exists() and not (g.base / "smi.xml").exists()
        g.set_profile(GuestProfile.driver_missing())
        assert not (g.bin / "nvidia-smi").exists() and (g.base / "journal.txt").read_text() == ""
        g.set_profile(GuestProfile.licensed())
        assert "Licensed (Expiry" in _smi(g, "-q", "-x").stdout
        assert (g.bin / "systemctl").exists()
    finally:
        g.cleanup()


async def test_back_to_back_probes_of_one_guest_carry_increasing_clocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller refuses a report whose whole-second clock is not newer than the last (a replay); a
    real guest probes once a minute, so the simulated one never runs two probes in one second."""
    g = SimulatedGuest("t1", "a", GuestProfile.licensed())
    seconds: list[int] = []

    async def run(script: str) -> int:
        seconds.append(int(time.time()))
        return 0

    monkeypatch.setattr(g, "_run", run)
    try:
        for _ in range(3):
            assert await g.probe() == 0
    finally:
        g.cleanup()
    assert seconds == sorted(set(seconds)) and len(seconds) == 3, seconds


# -- the fleet's bookkeeping, over a fake apiserver and fake guests --------------------------------

class FakeCluster:
    """What the fleet reads: the VMI list and Secrets (by namespace/name)."""

    def __init__(self) -> None:
        self.vmis: list[dict[str, Any]] = []
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.lists = 0

    def raw(self, api: Any) -> Any:
        cluster = self

        class Raw:
            async def list_cluster_custom_object(self, *args: Any) -> dict[str, Any]:
                cluster.lists += 1
                return {"items": list(cluster.vmis)}

            async def read_namespaced_secret(self, name: str, namespace: str) -> dict[str, Any]:
                if (namespace, name) not in cluster.secrets:
                    raise ApiException(status=404, reason="NotFound")
                return cluster.secrets[(namespace, name)]

        return Raw()


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    c = FakeCluster()
    monkeypatch.setattr(guest_fleet, "RawApi", c.raw)
    monkeypatch.setattr(guest_fleet, "CustomObjectsApi", lambda api: api)
    monkeypatch.setattr(guest_fleet, "CoreV1Api", lambda api: api)
    installs: list[tuple[str, str, str, bytes]] = []

    async def install(self: SimulatedGuest, vmi: dict[str, Any], sec: dict[str, Any] | None, *,
                      report_url: str | None = None) -> int:
        installs.append((self.vmi, vmi["metadata"]["uid"], self.profile.name, token_bytes(sec)))
        return 0

    async def probe(self: SimulatedGuest) -> int:
        return 0

    monkeypatch.setattr(SimulatedGuest, "install", install)
    monkeypatch.setattr(SimulatedGuest, "probe", probe)
    c.installs = installs  # type: ignore[attr-defined]
    yield c


def test_fleet_boots_once_per_vmi_uid_with_the_profile_of_that_boots_token(cluster: FakeCluster) -> None:
    f = GuestFleet(object(), "https://127.0.0.1:1/v1/reports", profile_for=licensed_unless({BAD}),  # type: ignore[arg-type]
                   clock=lambda: T0)
    f.add("t1", "a")
    f.add("t1", "b")
    cluster.secrets[("t1", "license")] = secret(BAD, revision="r1")

    async def scenario() -> None:
        cluster.vmis = [vmi("a", "u1"), vmi("b", "u2", ready=False)]
        await f.run_once()
        await f.run_once()  # same VMI: probes again, no re-boot
        assert [b.vmi_uid for b in f.boots("t1", "a")] == ["u1"] and f.probes("t1", "a") == 2
        assert f.boots("t1", "b") == [] and f.last_boot("t1", "b") is None and f.guest("t1", "b") is None
        # A restart (new VMI uid) after a rotation: the guest re-boots with the new token and licenses.
        cluster.secrets[("t1", "license")] = secret(GOOD, revision="r2", source_revision="s2")
        cluster.vmis = [vmi("a", "u3"), vmi("b", "u2"), vmi("unregistered", "u4")]
        await f.run_once()

    try:
        asyncio.run(scenario())
        boots = f.boots("t1", "a")
        assert [(b.vmi_uid, b.revision, b.source_revision, b.profile) for b in boots] == [
            ("u1", "r1", "", "acquire-failed"), ("u3", "r2", "s2", "licensed")]
        assert boots[0].token_sha256 == token_sha256(BAD) and boots[1].token_sha256 == token_sha256(GOOD)
        assert f.last_boot("t1", "a") == boots[1] and f.probes("t1", "a") == 3
        assert f.last_boot("t1", "b") is not None and f.last_boot("t1", "b").vmi_uid == "u2"  # type: ignore[union-attr]
        assert f.boots("t1", "unregistered") == []
        assert cluster.lists == 3 and f.rounds == 3  # one LIST per round
        installs = cluster.installs  # type: ignore[attr-defined]
        assert [(i[0], i[1], i[2]) for i in installs] == [
            ("a", "u1", "acquire-failed"), ("a", "u3", "licensed"), ("b", "u2", "licensed")]
        guest = f.guest("t1", "a")
        assert guest is not None and guest.profile.name == "licensed"
    finally:
        f.cleanup()
    assert guest is not None and not guest.base.exists()


def test_fleet_boots_without_a_disk_when_the_secret_is_absent_and_per_guest_override_wins(
        cluster: FakeCluster) -> None:
    f = GuestFleet(object(), "u", clock=lambda: T0)  # type: ignore[arg-type]
    f.add("t1", "a", profile_for=constant(GuestProfile.unlicensed()))
    f.add("t1", "n")
    cluster.vmis = [vmi("a", "u1"), vmi("n", "u2", secret=None)]
    try:
        asyncio.run(f.run_once())
        a, n = f.last_boot("t1", "a"), f.last_boot("t1", "n")
        assert a == Boot("u1", "license", "", "", "", T0, "unlicensed", 0)  # the optional Secret does not exist
        assert n == Boot("u2", "", "", "", "", T0, "licensed", 0)
    finally:
        f.cleanup()


def test_fleet_start_stop_runs_rounds_until_stopped(cluster: FakeCluster) -> None:
    f = GuestFleet(object(), "u", interval_seconds=0.01)  # type: ignore[arg-type]
    f.add("t1", "a")
    cluster.vmis = [vmi("a", "u1")]

    async def scenario() -> int:
        async with f:
            await eventually(lambda: f.rounds >= 3, timeout=5, interval=0.01, what="three rounds")
        after = f.rounds
        await asyncio.sleep(0.05)
        assert f.rounds == after  # stopped
        return after

    assert asyncio.run(scenario()) >= 3
    assert len(f.boots("t1", "a")) == 1 and f.guest("t1", "a") is None  # cleaned up on exit
