"""The README's first command, bounded: the demo runs to completion and its JSON shows the outcomes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The drain of one worker as the demo prints it, read from the clusters' state.
DRAIN_LINE = (r"^   {worker}: cordoned, (?:\d+ pods? evicted|no pod to evict), restarted, node back \(new boot\), "
              r"uncordoned  \(drain-step cordon > .*restart.* > uncordon; cordoned [\d.]+ s\)$")


@pytest.mark.cluster  # the demo starts its own control planes
@pytest.mark.timeout(400)
def test_bounded_demo_outcomes(tmp_path: Path, control_plane: object) -> None:
    # `control_plane` only guarantees the binaries are built (the demo starts its own control planes).
    # --duration is also the rollout's deadline. The canary and the steps follow the new token's hash, so
    # the wave order varies; when the tenant cluster's namespace (desk1 and the two drained workers, one
    # at a time) has a wave of its own, the rollout ends about 63 s in: 120 s keeps a margin for a machine
    # that also runs the other half of the suite (`make test` runs two processes).
    out = tmp_path / "demo.json"
    proc = subprocess.run(
        [sys.executable, "-m", "licensectl_dev.demo", "--duration", "120", "--prometheus", "--metrics-port", "0",
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
    # Guest states match the simulated guests (the Windows desktop reports the Windows agent's way).
    want = {"licensed": "licensed", "expiring": "licensed", "unlicensed": "unlicensed", "silent": "unknown",
            "windows": "licensed"}
    assert "windows" in doc["guest_profiles"].values()
    for vm, profile in doc["guest_profiles"].items():
        assert doc["guests"][vm]["state"] == want[profile], vm
        if profile in ("licensed", "expiring", "windows"):
            assert doc["guests"][vm]["token_current"] is True, vm
    # The expected alerts are active (pending or firing) in a real Prometheus with the shipped rules.
    assert set(doc["expected_alerts"]) <= set(doc["alerts"]), doc["alerts"]
    # ...for exactly the guests they concern: train1 holds the workstation product under a compute
    # class (wrong product); train2 is unlicensed with gridd's reason from its log.
    for name, guests in doc["expected_alert_guests"].items():
        assert doc["alert_guests"].get(name) == guests, (name, doc["alert_guests"])
    assert doc["alert_reasons"] == {"tenant-globex-ml/train2": "token_missing"}

    # The tenant Kubernetes cluster: each GPU worker was drained before its restart, once, in order --
    # cordoned, its `web` Pods evicted, the VMI restarted, the Node back Ready with a new boot ID,
    # uncordoned -- as the watches on the VMs, VMIs, Nodes and Pods saw it, and the demo printed it.
    tc = doc["tenant_cluster"]
    assert tc["workers"] == ["ka-md-0", "ka-md-1"]
    for worker in tc["workers"]:
        assert f"{tc['namespace']}/{worker}" in doc["graphics_vms"]  # restarted exactly once (above)
        d = tc["drains"][worker]
        assert d["cordons"] == 1, (worker, d)
        whats = [what for _, what in d["events"]]
        order = [whats.index("cordoned"), whats.index("restarted"), whats.index("node back (new boot)"),
                 whats.index("uncordoned")]
        assert order == sorted(order), (worker, whats)
        assert all(order[0] < i < order[1] for i, what in enumerate(whats) if what == "evicted"), (worker, whats)
        # The intent licensectl wrote on the VM before each step: cordon first, the restart, uncordon last.
        assert d["steps"][0] == "cordon" and "restart" in d["steps"] and d["steps"][-1] == "uncordon", d["steps"]
        assert re.search(DRAIN_LINE.format(worker=re.escape(worker)), proc.stdout, re.M), (worker, proc.stdout[-4000:])
    # Two replicas on two workers drained in turn: every replica was evicted at least once, at least two
    # evictions in all; no Node went down with a `web` Pod still on it; one worker disrupted at a time.
    assert sum(tc["drains"][w]["evicted"] for w in tc["workers"]) >= 2, tc["drains"]
    assert tc["down_with_pods"] == [] and tc["max_disrupted_workers"] == 1, tc
    # The PodDisruptionBudget held: the Deployment never had fewer than one Ready replica (of two).
    dep = tc["deployment"]
    assert dep["replicas"] == 2 and dep["min_ready"] is not None and dep["min_ready"] >= 1, dep
    assert dep["observations"] > 10, dep
    assert re.search(r"^   Deployment web: kept at least [1-9] of 2 replicas Ready throughout", proc.stdout, re.M)
    # Every Node schedulable again and free of licensectl's marker.
    assert tc["left_cordoned"] == [], tc["left_cordoned"]
    # Nothing left behind: the demo printed its own teardown line (tenant control plane included).
    assert "stopped: control plane, tenant cluster," in proc.stdout
