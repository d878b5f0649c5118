"""Guest conditions as the store exports them: state, gridd's reason, wrong product.

See docs/operations.md#guest-conditions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from licensectl.controllers.guests import STATES, GuestStore
from licensectl.core.guest_report import GuestState, LicenseState

NOW = dt.datetime(2026, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
VWS = "NVIDIA RTX Virtual Workstation"
VCS = "NVIDIA Virtual Compute Server"


def state(s: LicenseState, *, product: str | None = VWS, reason: str | None = None,
          expiry: dt.datetime | None = None, at: dt.datetime = NOW) -> GuestState:
    return GuestState(uuid="5d307ca9-b3ef-428d-8be6-5b4c7e0ac3c2", hostname="vm", state=s, product=product,
                      expiry=expiry, driver_version="580.1", gpu_count=0 if s is LicenseState.DRIVER_MISSING else 1,
                      grace=s is LicenseState.GRACE, token_sha256=None, token_current=True, clock_skew_seconds=0.0,
                      reported_at=at, last_event=None, last_event_at=None, reason=reason)


def store() -> GuestStore:
    s = GuestStore(interval_seconds=60)
    s.start_receiving(NOW - dt.timedelta(hours=1))
    return s


def test_every_condition_is_a_state_of_its_own() -> None:
    assert set(STATES) == {"licensed", "unlicensed", "restricted", "grace", "expired", "driver_missing", "unknown"}


def test_reason_only_while_no_license_and_expiry_at_read_time() -> None:
    s = store()
    s.record("ns", "unl", state(LicenseState.UNLICENSED, reason="token_missing"))
    s.record("ns", "grace", state(LicenseState.GRACE, reason=None))
    s.record("ns", "ok", state(LicenseState.LICENSED, expiry=NOW + dt.timedelta(days=1)))
    # Licensed when reported; its lease ends before it is read: expired, reason lease_expired.
    s.record("ns", "ran-out", state(LicenseState.LICENSED, expiry=NOW - dt.timedelta(seconds=1)))
    s.record("ns", "nodrv", state(LicenseState.DRIVER_MISSING, product=None))
    views = {v.vmi: (v.state, v.reason) for v in s.views(NOW)}
    assert views == {"unl": ("unlicensed", "token_missing"), "grace": ("grace", "unknown"), "ok": ("licensed", None),
                     "ran-out": ("expired", "lease_expired"), "nodrv": ("driver_missing", None)}


def test_wrong_product_follows_the_class_feature_type() -> None:
    s = store()
    s.record("ml", "train1", state(LicenseState.LICENSED, product=VWS), feature_type=4)  # compute class, vWS held
    s.record("ml", "train2", state(LicenseState.LICENSED, product=VCS), feature_type=4)
    s.record("ws", "auto", state(LicenseState.LICENSED, product=VWS), feature_type=1)  # cannot tell
    s.record("ws", "none", state(LicenseState.UNLICENSED, product=None), feature_type=2)
    got = {v.vmi: v.wrong_product for v in s.views(NOW)}
    assert got == {"train1": True, "train2": False, "auto": None, "none": None}
    # A silent guest is judged on nothing: no wrong-product verdict from an old report.
    s.record("ml", "train1", dataclasses.replace(state(LicenseState.LICENSED), reported_at=NOW - dt.timedelta(hours=1)),
             feature_type=4)
    assert next(v for v in s.views(NOW) if v.vmi == "train1").wrong_product is None


def test_samples_carry_reason_and_wrong_product() -> None:
    s = store()
    s.record("ml", "train1", state(LicenseState.LICENSED, product=VWS), feature_type=4)
    s.record("ml", "train2", state(LicenseState.UNLICENSED, product=VCS, reason="token_corrupt"), feature_type=4)
    s.record("ml", "auto", state(LicenseState.LICENSED), feature_type=1)
    got = {(x.name, dict(x.labels)["vmi"], dict(x.labels).get("reason")): x.value for x in s.samples(NOW)
           if x.name in ("guest_unlicensed_reason", "guest_wrong_product")}
    # The wrong product is a series only where it is wrong (a detail series: docs/operations.md#metrics-cardinality).
    assert got == {("guest_wrong_product", "train1", None): 1.0,
                   ("guest_unlicensed_reason", "train2", "token_corrupt"): 1.0}
    states = {dict(x.labels)["state"] for x in s.samples(NOW) if x.name == "guest_license_state"
              and dict(x.labels)["vmi"] == "train2"}
    assert states == {"unlicensed"}
