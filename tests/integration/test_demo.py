"""The README's first command, bounded: the demo runs to completion and its JSON shows the outcomes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.cluster  # the demo starts its own control plane
@pytest.mark.timeout(400)
def test_bounded_demo_outcomes(tmp_path: Path, control_plane: object) -> None:
    # `control_plane` only guarantees the binaries are built (the demo starts its own control plane).
    out = tmp_path / "demo.json"
    proc = subprocess.run(
        [sys.executable, "-m", "licensectl", "demo", "--duration", "60", "--prometheus", "--metrics-port", "0",
         "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=360)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())

    # Replicas exist exactly in the entitled (namespace, class) pairs.
    assert doc["replicas"] == doc["expected_entitled"]
    # The rotation rolled out: every graphics VM restarted exactly once, nothing else restarted.
    assert doc["rollout_complete"] is True
    assert doc["rollout"]["current"] == len(doc["graphics_vms"]) and doc["rollout"]["failed"] == 0
    for vm, n in doc["restarts"].items():
        assert n == (1 if vm in doc["graphics_vms"] else 0), (vm, n)
    # Limits held at every moment (from the simulator's record).
    assert doc["max_concurrent_unavailable"] <= doc["limits"]["max_unavailable"]
    for ns, n in doc["max_concurrent_unavailable_per_namespace"].items():
        assert n <= doc["limits"]["max_per_namespace"], ns
    # Guest states match the simulated guests.
    want = {"licensed": "licensed", "expiring": "licensed", "unlicensed": "unlicensed", "silent": "unknown"}
    for vm, profile in doc["guest_profiles"].items():
        assert doc["guests"][vm]["state"] == want[profile], vm
        if profile in ("licensed", "expiring"):
            assert doc["guests"][vm]["token_current"] is True, vm
    # The expected alerts are active (pending or firing) in a real Prometheus with the shipped rules.
    assert set(doc["expected_alerts"]) <= set(doc["alerts"]), doc["alerts"]
    # ...for exactly the guests they concern: train1 holds the workstation product under a compute
    # class (wrong product); train2 is unlicensed with gridd's reason from its log.
    for name, guests in doc["expected_alert_guests"].items():
        assert doc["alert_guests"].get(name) == guests, (name, doc["alert_guests"])
    assert doc["alert_reasons"] == {"tenant-globex-ml/train2": "token_missing"}
    # Nothing left behind: the demo printed its own teardown line.
    assert "stopped: control plane" in proc.stdout
