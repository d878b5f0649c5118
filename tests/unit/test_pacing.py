"""The loops' pacing rule (licensectl/pacing.py): coalescing after events, a duty bound for expensive passes."""

from __future__ import annotations

import pytest

from licensectl.pacing import Pacing, idle_before_next_pass

ROLLOUT = Pacing(window=0.5, idle_per_busy=2.0)
REPLICATION = Pacing(window=0.05)


def test_after_an_event_a_cheap_pass_waits_the_whole_window_however_long_the_loop_slept() -> None:
    assert idle_before_next_pass(ROLLOUT, triggered=True, since_start=30.0, since_end=29.9, pass_cpu=0.01) == 0.5


def test_a_timed_wakeup_only_keeps_passes_a_window_apart() -> None:
    assert idle_before_next_pass(ROLLOUT, triggered=False, since_start=0.2, since_end=0.1,
                                 pass_cpu=0.01) == pytest.approx(0.3)
    assert idle_before_next_pass(ROLLOUT, triggered=False, since_start=5.0, since_end=4.9, pass_cpu=0.01) == 0.0


def test_an_expensive_pass_keeps_the_loop_idle_twice_its_cpu_time_since_it_ended() -> None:
    # A one-second plan (20,000 VMIs) woken by a replica write right away: two seconds idle, not 0.5.
    assert idle_before_next_pass(ROLLOUT, triggered=True, since_start=1.0, since_end=0.0, pass_cpu=1.0) == 2.0
    # Woken 1.5 s after it ended: the idle time already spent counts.
    assert idle_before_next_pass(ROLLOUT, triggered=True, since_start=2.5, since_end=1.5,
                                 pass_cpu=1.0) == pytest.approx(0.5)
    # A timed wakeup (a settle period ending) is held back the same way, and no longer.
    assert idle_before_next_pass(ROLLOUT, triggered=False, since_start=1.2, since_end=0.2,
                                 pass_cpu=1.0) == pytest.approx(1.8)
    assert idle_before_next_pass(ROLLOUT, triggered=False, since_start=4.0, since_end=3.0, pass_cpu=1.0) == 0.0


@pytest.mark.parametrize("cpu", [0.0, 0.01, 0.5, 3.0])
def test_without_a_duty_bound_only_the_window_counts(cpu: float) -> None:
    assert idle_before_next_pass(REPLICATION, triggered=True, since_start=cpu, since_end=0.0, pass_cpu=cpu) == 0.05


def test_the_share_of_time_an_always_triggered_loop_spends_in_passes_is_bounded() -> None:
    """Back-to-back events, passes of growing cost: busy time ≤ 1/(1+2) of the total once passes dominate."""
    busy = idle = 0.0
    for cpu in [0.1 * k for k in range(1, 40)]:
        busy += cpu
        idle += idle_before_next_pass(ROLLOUT, triggered=True, since_start=cpu, since_end=0.0, pass_cpu=cpu)
    assert busy / (busy + idle) <= 1 / 3 + 1e-9
