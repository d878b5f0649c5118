"""The rollout benchmark's pure readings: which VMs a rotation rolled, restarts per VM, the peak of
unavailable VMs in a window, revision-store writes at the proxy, and the wave timeline from Events."""

from __future__ import annotations

import datetime as dt
from typing import Any

from benchmarks.common import CONTROLLER_NS
from benchmarks.rollout import (
    ONE_STEP,
    SAFE,
    after_settle,
    controller_args,
    exactly_once,
    first_new_revision_time,
    is_store_write,
    peak_unavailable,
    restart_revisions,
    restarts_per_vm,
    vms_rolled,
    wave_label,
    wave_offsets,
)
from licensectl.config import Settings
from licensectl.core.model import ANN_RESTART_RESULT, ANN_RESTART_REVISION
from licensectl.core.rollout import RESULT_DONE
from licensectl.core.rotation import CanarySpec, parse_steps
from licensectl_dev.devcluster.ledger import Interval, RestartRecord


def vm(ns: str, name: str, revision: str | None = None, result: str | None = None) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if revision is not None:
        ann[ANN_RESTART_REVISION] = revision
    if result is not None:
        ann[ANN_RESTART_RESULT] = result
    return {"metadata": {"namespace": ns, "name": name, "annotations": ann}}


def test_one_step_is_no_canary_and_one_step_and_safe_is_the_shipped_default() -> None:
    assert CanarySpec.parse(ONE_STEP["canary"]).none
    assert parse_steps(ONE_STEP["rollout_steps"]) == (100.0,)
    assert {"canary": Settings().canary, "rollout_steps": Settings().rollout_steps} == SAFE
    assert not CanarySpec.parse(SAFE["canary"]).none and len(parse_steps(SAFE["rollout_steps"])) > 1
    args = controller_args(ONE_STEP)
    assert args[args.index("--canary") + 1] == "0"
    assert args[args.index("--rollout-steps") + 1] == "100%"
    assert args[args.index("--settle-seconds") + 1] == "0"
    assert args[args.index("--max-unavailable") + 1] == "10%"
    safe = controller_args(SAFE)
    assert safe[safe.index("--canary") + 1] == Settings().canary


def test_vms_rolled_counts_done_for_a_new_revision_only() -> None:
    first_boot = [vm("a", "v0"), vm("a", "v1")]
    before = restart_revisions(first_boot)
    assert before == {("a", "v0"): "", ("a", "v1"): ""}
    after = [vm("a", "v0", "r1", RESULT_DONE), vm("a", "v1", "r1")]  # v1: issued, not done yet
    assert vms_rolled(after, before) == 1
    # The next rotation on the same fleet: the old "done" for r1 does not count.
    before2 = restart_revisions(after)
    assert vms_rolled(after, before2) == 0
    assert vms_rolled([vm("a", "v0", "r2", RESULT_DONE), vm("a", "v1", "r1", RESULT_DONE)], before2) == 1
    assert vms_rolled([vm("a", "v0", "r2", "failed")], before2) == 0
    assert vms_rolled([{"metadata": {"namespace": "a", "name": "v0"}}], {}) == 0


def test_restarts_per_vm_and_exactly_once() -> None:
    recs = [RestartRecord(1.0, "a", "v0", "u0", 202, ""), RestartRecord(2.0, "a", "v1", "u1", 202, ""),
            RestartRecord(3.0, "a", "v1", "u1", 409, "conflict")]
    per = restarts_per_vm(recs)
    assert per == {("a", "v0"): 1, ("a", "v1"): 1}
    assert exactly_once(per, 2) == "1.00 (2 of 2 VMs exactly once)"
    assert exactly_once(per, 4) == "0.50 (2 of 4 VMs exactly once)"
    per[("a", "v1")] += 1
    assert exactly_once(per, 2) == "1.50 (1 of 2 VMs exactly once)"
    assert exactly_once(per, 0) == "n/a (1 of 0 VMs exactly once)"


def test_peak_unavailable_counts_only_the_window_and_ends_before_starts() -> None:
    ivs = [Interval("a", "old1", 1.0, 2.0), Interval("a", "old2", 1.5, 2.5),  # an earlier rotation
           Interval("a", "v0", 10.0, 12.0), Interval("a", "v1", 12.0, 13.0),  # back to back: never 2
           Interval("b", "v0", 12.5, None)]  # still down
    assert peak_unavailable(ivs, since=0.0) == 2
    assert peak_unavailable(ivs, since=10.0) == 2  # v1 and b/v0 overlap from 12.5
    assert peak_unavailable(ivs[:4], since=10.0) == 1
    assert peak_unavailable([], since=0.0) == 0


def test_is_store_write() -> None:
    base = f"/api/v1/namespaces/{CONTROLLER_NS}/secrets"
    assert is_store_write("PUT", f"{base}/licensectl-revisions-abc")
    assert is_store_write("POST", base)
    assert is_store_write("PATCH", f"{base}/licensectl-tls")
    assert not is_store_write("GET", f"{base}/licensectl-revisions-abc")
    assert not is_store_write("PUT", "/api/v1/namespaces/tenant-a/secrets/nvidia-license-vgpu")
    assert not is_store_write("PUT", f"/api/v1/namespaces/{CONTROLLER_NS}/secretsx")
    assert not is_store_write("POST", f"/api/v1/namespaces/{CONTROLLER_NS}/events")
    assert is_store_write("PUT", "/api/v1/namespaces/other/secrets/x", namespace="other")


def test_wave_timeline_from_events() -> None:
    t0 = dt.datetime(2025, 1, 1, 12, 0, 0, 400_000, tzinfo=dt.UTC)

    def at(s: int) -> dt.datetime:  # Event times have one-second resolution
        return t0.replace(microsecond=0) + dt.timedelta(seconds=s)

    events = [
        (at(-300), "RotationStarted", "an earlier rotation"),
        (at(12), "RotationStepStarted", "canary passed (0 of 0 reporting guest(s) licensed); step 1 of 3: 10% ..."),
        (at(0), "RotationStarted", "Candidate revision abc (new source revision): canary in 1 namespace(s) t1"),
        (at(5), "NoGuestEvidence", "No guest of this source has ever reported"),
        (at(30), "RotationStepStarted", "step 1 of 3 passed (0 of 0 reporting guest(s) licensed); step 2 of 3: ..."),
        (at(61), "RotationPromoted", "Candidate revision abc runs everywhere"),
    ]
    assert wave_offsets(events, t0) == "started +0s, step 1 +12s, step 2 +30s, promoted +61s"
    assert wave_offsets([], t0) == "none"
    assert wave_label("RotationStepStarted", "odd message") == "step"


def test_first_restart_is_measured_from_the_end_of_the_first_settle_period() -> None:
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
    before = {("a", "r"): "old", ("b", "r"): "old", ("c", "r"): "old"}
    after = {("a", "r"): ("new", t0 + dt.timedelta(seconds=2)), ("b", "r"): ("new", t0 + dt.timedelta(seconds=1)),
             ("c", "r"): ("old", t0 - dt.timedelta(seconds=90)),  # not rewritten (yet): not the rollout's
             ("d", "r"): ("new", None)}  # unreadable time: ignored
    first = first_new_revision_time(before, after)
    assert first == t0 + dt.timedelta(seconds=1)
    assert first_new_revision_time(before, {("c", "r"): ("old", t0)}) is None
    # Rotation written at 12:00:00.5, first replica stamped 12:00:01, settle 2 s: eligible at +2.5 s.
    rot = t0 + dt.timedelta(seconds=0.5)
    assert after_settle(t_first=3.25, t_rot_wall=rot, first_revision=first, settle=2.0) == 0.75
    assert after_settle(t_first=None, t_rot_wall=rot, first_revision=first, settle=2.0) is None
    assert after_settle(t_first=3.0, t_rot_wall=rot, first_revision=None, settle=2.0) is None
