"""Guest series: the tenant label, the per-VMI / per-tenant switch, and judging silence from the
moment a replica started receiving reports (so a failover does not call the fleet silent)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from pathlib import Path

from licensectl.controllers.guests import MISSED_INTERVALS, GuestStore
from licensectl.core.entitlement import TenantSettings, customer_tenant
from licensectl.core.guest_report import GuestState, LicenseState
from licensectl.core.model import Namespace
from licensectl.metrics import SNAPSHOT_GAUGES, GaugeSample

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
INTERVAL = 60.0
DOCS = Path(__file__).resolve().parents[3] / "docs" / "operations.md"

TREE = {
    "tenant-root": Namespace("tenant-root", "u-root"),
    "tenant-acme": Namespace("tenant-acme", "u-acme", owner_name="tenant-root", owner_uid="u-root"),
    "tenant-acme-ml": Namespace("tenant-acme-ml", "u-ml", owner_name="tenant-acme", owner_uid="u-acme"),
    "tenant-acme-ml-gpu": Namespace("tenant-acme-ml-gpu", "u-gpu", owner_name="tenant-acme-ml", owner_uid="u-ml"),
    "tenant-orphan": Namespace("tenant-orphan", "u-o", owner_name="tenant-gone", owner_uid="u-gone"),
    "tenant-loop-a": Namespace("tenant-loop-a", "u-a", owner_name="tenant-loop-b", owner_uid="u-b"),
    "tenant-loop-b": Namespace("tenant-loop-b", "u-b", owner_name="tenant-loop-a", owner_uid="u-a"),
    "default": Namespace("default", "u-d"),
}


def report(state: LicenseState = LicenseState.LICENSED, at: dt.datetime = T0, *,
           expiry: dt.datetime | None = None) -> GuestState:
    return GuestState(uuid="u", hostname="h", state=state, product="NVIDIA Virtual Compute Server",
                      expiry=expiry, driver_version="550.90", gpu_count=1, grace=False, token_sha256="ab" * 32,
                      token_current=True, clock_skew_seconds=0.5, reported_at=at, last_event=None,
                      last_event_at=None)


def tenant_of(ns: str) -> str:
    return customer_tenant(ns, TREE, TenantSettings())


def by_name(samples: list[GaugeSample], name: str) -> list[GaugeSample]:
    return [s for s in samples if s.name == name]


def test_customer_tenant_is_the_top_level_tenant_under_root() -> None:
    s = TenantSettings()
    assert customer_tenant("tenant-acme-ml-gpu", TREE, s) == "tenant-acme"
    assert customer_tenant("tenant-acme-ml", TREE, s) == "tenant-acme"
    assert customer_tenant("tenant-acme", TREE, s) == "tenant-acme"
    assert customer_tenant("tenant-root", TREE, s) == "tenant-root"
    # Outside the tree, broken or cyclic chains: the namespace is its own tenant, never guessed.
    assert customer_tenant("default", TREE, s) == "default"
    assert customer_tenant("tenant-orphan", TREE, s) == "tenant-orphan"
    assert customer_tenant("tenant-loop-a", TREE, s) == "tenant-loop-a"
    assert customer_tenant("not-cached", TREE, s) == "not-cached"


def test_per_vmi_series_carry_the_customer_tenant_and_aggregate_per_tenant() -> None:
    store = GuestStore(INTERVAL)
    store.start_receiving(T0)
    store.record("tenant-acme-ml", "vm1", report())
    store.record("tenant-acme-ml-gpu", "vm2", report(LicenseState.UNLICENSED))
    store.record("tenant-acme", "vm3", report())
    live = [("tenant-acme-ml", "vm1"), ("tenant-acme-ml-gpu", "vm2"), ("tenant-acme", "vm3")]
    out = list(store.samples(T0, live, tenant_of=tenant_of))
    states = by_name(out, "guest_license_state")
    assert {dict(s.labels)["tenant"] for s in states} == {"tenant-acme"}
    assert {dict(s.labels)["namespace"] for s in states} == {"tenant-acme", "tenant-acme-ml", "tenant-acme-ml-gpu"}
    # One series per guest, its state a label, value 1.
    assert sorted((dict(s.labels)["vmi"], dict(s.labels)["state"], s.value) for s in states) == [
        ("vm1", "licensed", 1.0), ("vm2", "unlicensed", 1.0), ("vm3", "licensed", 1.0)]
    guests = {(dict(s.labels)["tenant"], dict(s.labels)["state"]): s.value for s in by_name(out, "guests")}
    assert guests == {("tenant-acme", "licensed"): 2.0, ("tenant-acme", "unlicensed"): 1.0}
    tokens = {(dict(s.labels)["tenant"], dict(s.labels)["token"]): s.value for s in by_name(out, "guests_reporting")}
    assert tokens == {("tenant-acme", "current"): 3.0}


def test_per_tenant_mode_drops_every_per_vmi_series_and_keeps_the_aggregate() -> None:
    store = GuestStore(INTERVAL)
    store.start_receiving(T0)
    store.record("tenant-acme-ml", "vm1", report(expiry=T0 + dt.timedelta(days=1)))
    store.record("tenant-acme-ml", "vm2", report(LicenseState.UNLICENSED))
    live = [("tenant-acme-ml", "vm1"), ("tenant-acme-ml", "vm2")]
    out = list(store.samples(T0, live, tenant_of=tenant_of, per_vmi=False))
    assert out, "the per-tenant aggregate must stay"
    assert all(not any(k == "vmi" for k, _ in s.labels) for s in out)
    assert {s.name for s in out} == {"guests", "guests_reporting"}
    assert sorted((dict(s.labels)["state"], s.value) for s in by_name(out, "guests")) == [
        ("licensed", 1.0), ("unlicensed", 1.0)]


def test_a_new_receiver_waits_for_every_guest_to_have_its_chance() -> None:
    """After a failover the new leader has heard from nobody: silence counts from its takeover."""
    store = GuestStore(INTERVAL)
    live = [("tenant-acme", "quiet"), ("tenant-acme", "talks")]
    took_over = T0 + dt.timedelta(hours=5)  # long after process start
    store.start_receiving(took_over)
    store.record("tenant-acme", "talks", report(at=took_over + dt.timedelta(seconds=10)))
    just_before = took_over + dt.timedelta(seconds=MISSED_INTERVALS * INTERVAL)
    views = {v.vmi: v.state for v in store.views(just_before, live)}
    assert views == {"talks": "licensed"}  # the quiet one is not judged yet, and not called unknown
    assert store.counts(just_before, live)["unknown"] == 0
    after = just_before + dt.timedelta(seconds=1)
    views = {v.vmi: v.state for v in store.views(after, live)}
    assert views == {"talks": "licensed", "quiet": "unknown"}
    # A second start (renewed leadership) does not restart the patience.
    store.start_receiving(after)
    assert store.receiving_since == took_over


def test_a_standby_forgets_what_it_heard_and_exports_nothing() -> None:
    store = GuestStore(INTERVAL)
    store.start_receiving(T0)
    store.record("tenant-acme", "vm1", report())
    store.stop_receiving()
    live = [("tenant-acme", "vm1")]
    late = T0 + dt.timedelta(hours=1)
    assert store.receiving_since is None
    assert store.get("tenant-acme", "vm1") is None
    assert list(store.samples(late, live, tenant_of=tenant_of)) == []
    # Leader again: the old report (an hour old) is gone, so it cannot show a stale "licensed".
    store.start_receiving(late)
    assert store.views(late, live) == []


def per_vmi_series_max() -> int:
    """Every per-VMI series a fully reported guest can have (each state, plus the rest)."""
    store = GuestStore(INTERVAL)
    store.start_receiving(T0)
    store.record("tenant-acme", "vm1", report(LicenseState.UNLICENSED, expiry=T0 + dt.timedelta(days=1)))
    out = list(store.samples(T0, [("tenant-acme", "vm1")], tenant_of=tenant_of))
    per_vmi = [s for s in out if any(k == "vmi" for k, _ in s.labels)]
    names = {s.name for s in per_vmi}
    # Series that only appear for some conditions (reason, wrong product): count each once more.
    optional = {n for n in SNAPSHOT_GAUGES if n.startswith("guest_") and n not in names}
    return len(per_vmi) + len(optional)


def test_the_documented_series_per_vmi_is_what_samples_yields() -> None:
    text = DOCS.read_text()
    m = re.search(r"at most \*\*(\d+) series per VMI\*\*", text)
    assert m, "docs/operations.md#metrics-cardinality must state the series per VMI"
    assert int(m.group(1)) == per_vmi_series_max()


def test_sample_names_are_all_declared() -> None:
    store = GuestStore(INTERVAL)
    store.start_receiving(T0)
    store.record("tenant-acme", "vm1", dataclasses.replace(report(), clock_skew_seconds=-3.0))
    assert {s.name for s in store.samples(T0, [("tenant-acme", "vm1")])} <= set(SNAPSHOT_GAUGES)


def per_vmi_names(out: list[GaugeSample], vmi: str) -> set[str]:
    return {s.name for s in out if dict(s.labels).get("vmi") == vmi}


def test_a_healthy_guest_has_two_series_and_one_that_needs_a_look_its_detail() -> None:
    store = GuestStore(INTERVAL)
    store.start_receiving(T0)
    day = dt.timedelta(days=1)
    store.record("tenant-acme", "healthy", report(expiry=T0 + day))
    store.record("tenant-acme", "old-token", dataclasses.replace(report(expiry=T0 + day), token_current=False))
    store.record("tenant-acme", "skewed", dataclasses.replace(report(expiry=T0 + day), clock_skew_seconds=-61.0))
    store.record("tenant-acme", "slight", dataclasses.replace(report(expiry=T0 + day), clock_skew_seconds=59.0))
    store.record("tenant-acme", "down", report(LicenseState.UNLICENSED))
    live = [("tenant-acme", v) for v in ("healthy", "old-token", "skewed", "slight", "down", "silent")]
    late = T0 + dt.timedelta(seconds=(MISSED_INTERVALS + 1) * INTERVAL)
    out = list(store.samples(T0, live, tenant_of=tenant_of))
    two = {"guest_license_state", "guest_license_expiry_timestamp_seconds"}
    assert per_vmi_names(out, "healthy") == two
    assert per_vmi_names(out, "slight") == two  # within a minute: healthy
    detail = {"guest_last_report_timestamp_seconds", "guest_token_current", "guest_clock_skew_seconds",
              "guest_license_lease_seconds"}
    assert per_vmi_names(out, "old-token") == two | detail
    assert per_vmi_names(out, "skewed") == two | detail
    assert per_vmi_names(out, "down") == {"guest_license_state", "guest_unlicensed_reason"} | detail - {
        "guest_license_lease_seconds"}  # no expiry reported: no lease to show
    # A silent guest, once judged: its state only.
    silent = list(store.samples(late, live, tenant_of=tenant_of))
    assert per_vmi_names(silent, "silent") == {"guest_license_state"}
    assert [dict(s.labels)["state"] for s in silent if dict(s.labels).get("vmi") == "silent"] == ["unknown"]
    # Silent guests are not reporting: the token aggregate counts fresh reports only.
    tokens = {dict(s.labels)["token"]: s.value for s in by_name(out, "guests_reporting")}
    assert tokens == {"current": 4.0, "stale": 1.0}


def test_a_lease_near_its_renewal_deadline_brings_the_detail_back() -> None:
    store = GuestStore(INTERVAL)
    store.start_receiving(T0)
    key = ("tenant-acme", "vm")
    exp = T0 + dt.timedelta(minutes=15)
    store.record(*key, report(at=T0, expiry=exp))
    store.record(*key, report(at=T0 + dt.timedelta(minutes=1), expiry=exp))  # lease observed: 900 s

    def names(minutes: float) -> set[str]:
        at = T0 + dt.timedelta(minutes=minutes)
        store.record(*key, report(at=at, expiry=exp))  # a fresh report, the same expiry: no renewal
        return per_vmi_names(list(store.samples(at, [key])), "vm")

    assert names(1) == {"guest_license_state", "guest_license_expiry_timestamp_seconds"}  # 14 of 15 left
    assert "guest_license_lease_seconds" not in names(5.9)  # 9.1 minutes left: above 60%
    assert {"guest_license_lease_seconds", "guest_last_report_timestamp_seconds"} <= names(6.1)


def test_token_current_is_judged_against_the_replica_now_not_when_the_report_came() -> None:
    """A replica rewritten with a new token: the guest's last report (made against the old one) is not
    "current" any more, in the view and in the series, until a report shows the new token."""
    store = GuestStore(INTERVAL)
    store.start_receiving(T0 - dt.timedelta(hours=1))
    store.record("tenant-acme", "vm1", report())
    replica_token: dict[str, str | None] = {"sha": "ab" * 32}

    def token_sha_for(ns: str, vmi: str) -> str | None:
        return replica_token["sha"] if (ns, vmi) == ("tenant-acme", "vm1") else None

    def seen() -> tuple[bool | None, list[float], list[tuple[tuple[str, str], ...]]]:
        (v,) = store.views(T0, token_sha_for=token_sha_for)
        samples = list(store.samples(T0, tenant_of=tenant_of, token_sha_for=token_sha_for))
        return (v.token_current, [s.value for s in by_name(samples, "guest_token_current")],
                [s.labels for s in by_name(samples, "guests_reporting")])

    assert seen() == (True, [], [(("tenant", "tenant-acme"), ("token", "current"))])
    replica_token["sha"] = "cd" * 32  # the new token is written; the guest has not reported since
    assert seen() == (False, [0.0], [(("tenant", "tenant-acme"), ("token", "stale"))])
    # Its next report shows the new token: current again.
    store.record("tenant-acme", "vm1", dataclasses.replace(report(), token_sha256="cd" * 32, token_current=True))
    assert seen()[0] is True
    # The replica's token unknown (no plan yet): the report's own judgement stands.
    replica_token["sha"] = None
    assert seen()[0] is True
