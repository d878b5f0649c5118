"""A Windows guest and its Linux twin are the same to licensectl: the same driver output and the same
gridd events, sent by the Windows agent (`os: windows`, Windows-format log lines in local time and
the guest's UTC offset) or by the Linux probe (journal lines in UTC), give the same guest state and
the same series -- so the same alerts, which read nothing else. Licensed, unlicensed ("No pool
features found"), wrong product and silent, as the issue's acceptance asks."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from licensectl.controllers.guests import MISSED_INTERVALS, GuestStore
from licensectl.core.guest_report import evaluate, parse_report, render_report
from licensectl_dev.devcluster.guest_sim import derived_xml_with_expiry

NOW = dt.datetime(2026, 12, 7, 18, 30, 5, tzinfo=dt.UTC)
INTERVAL = 60.0
UUID = "7c1e3a52-0d4b-4f7e-9a61-2b8f5d3c9e10"
SHA = "cd" * 32
WINDOWS_OFFSET = dt.timedelta(hours=5, minutes=30)
VWS = "NVIDIA RTX Virtual Workstation"
ACQUIRED = f"License acquired successfully. (Info: api.cls.licensing.nvidia.com, {VWS}; Expiry: 2026-12-8 18:30:0 GMT)"
NO_POOL = (f"Failed to acquire license from api.cls.licensing.nvidia.com (Info: {VWS} - Error: No pool features "
           f"found for : {VWS})")


@dataclass(frozen=True)
class Scenario:
    xml: str
    events: Sequence[tuple[dt.timedelta, str]]  # (before NOW, gridd message)
    feature_type: int | None = None
    silent_for: float = 0.0  # seconds since the report when the series are read


def unlicensed_xml() -> str:
    """Derived from the recorded L40S-2Q XML: the status an unlicensed guest's driver prints."""
    return re.sub(r"<license_status>[^<]*</license_status>", "<license_status>Unlicensed</license_status>",
                  derived_xml_with_expiry(NOW), count=1)


SCENARIOS = {
    "licensed": Scenario(derived_xml_with_expiry(NOW + dt.timedelta(hours=20)),
                         [(dt.timedelta(hours=4), ACQUIRED)]),
    "unlicensed-no-pool": Scenario(unlicensed_xml(), [(dt.timedelta(minutes=3), NO_POOL),
                                                      (dt.timedelta(minutes=2), NO_POOL)]),
    # A vWS license held by a guest of a Virtual Compute Server class (FeatureType 4).
    "wrong-product": Scenario(derived_xml_with_expiry(NOW + dt.timedelta(hours=20)),
                              [(dt.timedelta(hours=4), ACQUIRED)], feature_type=4),
    "silent": Scenario(derived_xml_with_expiry(NOW + dt.timedelta(hours=20)),
                       [(dt.timedelta(hours=4), ACQUIRED)], silent_for=(MISSED_INTERVALS + 1) * INTERVAL),
}


def linux_body(s: Scenario) -> bytes:
    log = "\n".join(f"{(NOW - ago).strftime('%Y-%m-%dT%H:%M:%S')}+00:00 vm-1 nvidia-gridd[837]: {msg}"
                    for ago, msg in s.events)
    return render_report(uuid=UUID, hostname="vm-1", clock=int(NOW.timestamp()), token_sha256=SHA,
                         probe_version="1.1", sections=[("nvidia-smi-xml", s.xml), ("gridd-log", log)])


def windows_body(s: Scenario) -> bytes:
    local = [(NOW - ago + WINDOWS_OFFSET, msg) for ago, msg in s.events]
    log = "\n".join(f"{t.strftime('%a %b %d %H:%M:%S %Y')}:<1>:{msg}" for t, msg in local)
    return render_report(uuid=UUID, hostname="vm-1", clock=int(NOW.timestamp()), token_sha256=SHA,
                         probe_version="1.0.0", sections=[("nvidia-smi-xml", s.xml), ("gridd-log", log)],
                         guest_os="windows", utc_offset="+05:30")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_windows_guest_gives_the_same_state_and_series_as_its_linux_twin(name: str) -> None:
    s = SCENARIOS[name]
    store = GuestStore(INTERVAL)
    states = {}
    for vmi, body in (("linux", linux_body(s)), ("windows", windows_body(s))):
        report = parse_report(body)
        assert report.guest_os == (None if vmi == "linux" else "windows")
        states[vmi] = evaluate(report, current_token_sha256=SHA, now=NOW)
        store.record("tenant-a", vmi, states[vmi], feature_type=s.feature_type)
    assert states["windows"] == states["linux"]
    assert states["windows"].last_event_at is not None
    assert states["windows"].last_event_at == NOW - s.events[-1][0]

    read_at = NOW + dt.timedelta(seconds=s.silent_for)
    series: dict[str, set[tuple[str, tuple[tuple[str, str], ...], float]]] = {"linux": set(), "windows": set()}
    for sample in store.samples(read_at, [("tenant-a", "linux"), ("tenant-a", "windows")]):
        labels = dict(sample.labels)
        vmi = labels.pop("vmi", None)
        if vmi is not None:
            series[vmi].add((sample.name, tuple(sorted(labels.items())), sample.value))
    assert series["windows"] == series["linux"]
    state = {dict(lbl)["state"] for n, lbl, _ in series["windows"] if n == "guest_license_state"}
    expected = {"licensed": "licensed", "unlicensed-no-pool": "unlicensed", "wrong-product": "licensed",
                "silent": "unknown"}[name]
    assert state == {expected}
    wrong = [n for n, _, _ in series["windows"] if n == "guest_wrong_product"]
    assert wrong == (["guest_wrong_product"] if name == "wrong-product" else [])
    reasons = {dict(lbl).get("reason") for n, lbl, _ in series["windows"] if n == "guest_unlicensed_reason"}
    assert reasons == ({"acquire_failed"} if name == "unlicensed-no-pool" else set())
