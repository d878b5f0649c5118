"""The admission benchmark's arithmetic: quantiles from raw samples and from Prometheus buckets."""

from __future__ import annotations

import math

import pytest

from benchmarks.admission import diff_buckets, histogram_quantile, pct


def test_pct_nearest_rank() -> None:
    values = [float(i) for i in range(1, 101)]
    assert pct(values, 0.5) == 51.0  # rank round(0.5 * 99) = 50 (0-based)
    assert pct(values, 0.99) == 99.0
    assert pct([3.0], 0.99) == 3.0


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    # 100 observations: 90 under 5 ms, 10 between 5 and 25 ms.
    buckets = [(0.005, 90.0), (0.025, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(buckets, 0.5) == pytest.approx(0.005 * 50 / 90)
    assert histogram_quantile(buckets, 0.99) == pytest.approx(0.005 + 0.020 * 0.9)
    assert histogram_quantile([], 0.5) is None
    assert histogram_quantile([(0.005, 0.0), (math.inf, 0.0)], 0.5) is None
    # Everything above the last finite bucket: the answer is that bucket's bound, as in Prometheus.
    assert histogram_quantile([(0.005, 0.0), (math.inf, 4.0)], 0.5) == 0.005


def test_diff_buckets_is_the_window_between_two_scrapes() -> None:
    before = [(0.005, 10.0), (math.inf, 12.0)]
    after = [(0.005, 15.0), (math.inf, 20.0)]
    assert diff_buckets(after, before) == [(0.005, 5.0), (math.inf, 8.0)]
