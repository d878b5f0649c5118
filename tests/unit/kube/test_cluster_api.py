"""The Cluster API adapter's parsing of what it reads: Machine durations."""

from __future__ import annotations

import pytest

from licensectl.kube.cluster_api import go_duration_seconds


@pytest.mark.parametrize(("text", "seconds"), [
    ("10m0s", 600.0), ("1h", 3600.0), ("90s", 90.0), ("1h2m3s", 3723.0), ("1.5s", 1.5), ("500ms", 0.5),
    ("0s", 0.0), (" 20s ", 20.0),
])
def test_machine_drain_timeouts_read_as_metav1_durations(text: str, seconds: float) -> None:
    assert go_duration_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [None, "", "10", "ten minutes", "10m junk", "-5s", 600, "5x"])
def test_an_unreadable_duration_is_none_and_licensectl_s_default_applies(text: object) -> None:
    assert go_duration_seconds(text) is None
