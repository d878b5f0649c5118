"""The server clock corrects a skewed local clock from apiserver Date headers."""

from __future__ import annotations

import datetime as dt
import time
from email.utils import format_datetime

from licensectl.kube.server_clock import ServerClock


def header(epoch: float) -> str:
    return format_datetime(dt.datetime.fromtimestamp(int(epoch), dt.UTC), usegmt=True)


def test_no_samples_means_local_time() -> None:
    c = ServerClock()
    assert c.offset == 0.0
    assert abs(c.now().timestamp() - time.time()) < 1.0


def test_offset_follows_the_server_and_ignores_outliers_and_garbage() -> None:
    c = ServerClock(min_interval=0.0)
    local = 1_800_000_000.25
    for i in range(9):
        c.observe(header(local + i + 120), local + i)  # server 120 s ahead
    c.observe(header(local - 5000), local + 10)  # one wild sample
    c.observe("not a date", local + 11)
    c.observe(None, local + 12)
    assert 119.0 <= c.offset <= 121.0
    assert abs(c.now().timestamp() - (time.time() + c.offset)) < 1.0


def test_server_behind_gives_negative_offset() -> None:
    c = ServerClock(min_interval=0.0)
    local = 1_800_000_000.0
    for i in range(5):
        c.observe(header(local + i - 30), local + i)
    assert -31.0 <= c.offset <= -29.0


def test_samples_are_rate_limited() -> None:
    c = ServerClock(min_interval=1.0)
    local = 1_800_000_000.0
    c.observe(header(local + 60), local)
    c.observe(header(local - 60), local + 0.5)  # ignored: within the interval
    assert 59.0 <= c.offset <= 61.0
