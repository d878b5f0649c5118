"""The Go peer benchmark's pure parts: which namespaces the peer selects, its command line, the
convergence count over listed copies, and the comparison rows (ratios licensectl / peer)."""

from __future__ import annotations

from typing import Any

from benchmarks import __main__ as bench_main
from benchmarks.common import ROOT, SOURCE_NS
from benchmarks.peer import (
    GOAL_CPU_RATIO,
    PEER_COPY_NAME,
    PEER_WORKERS,
    Phase,
    Side,
    comparison_rows,
    count_in_sync,
    namespace_selector,
    peer_argv,
)
from licensectl_dev.devcluster import fleet
from licensectl_dev.devcluster.gotools import TOOLS
from licensectl_dev.testkit.world import SOURCE_NAME

WANT = {"client_configuration_token.tok": "dG9rZW4y", "gridd.conf": "Y29uZg=="}


def copy(ns: str, data: dict[str, str], name: str = PEER_COPY_NAME) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "labels": {"peer-replica": "true"}}, "data": data}


def test_selector_picks_the_tenants_below_the_root_but_not_the_root() -> None:
    sel = namespace_selector()
    assert sel == f"{fleet.TENANT_LABEL_PREFIX}{ROOT},kubernetes.io/metadata.name!={ROOT}"


def test_peer_argv_lifts_the_rate_limit_and_names_source_and_tenants() -> None:
    argv = peer_argv("/bin/peer", "/k/config", workers=7)

    def flag(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert argv[0] == "/bin/peer"
    assert flag("-kubeconfig") == "/k/config"
    assert flag("-source") == f"{SOURCE_NS}/{SOURCE_NAME}"
    assert flag("-namespace-selector") == namespace_selector()
    assert flag("-copy-name") == PEER_COPY_NAME
    assert flag("-workers") == "7"
    assert float(flag("-qps")) < 0, "a negative QPS: client-go builds no rate limiter"
    default = peer_argv("p", "k")
    assert default[default.index("-workers") + 1] == str(PEER_WORKERS)


def test_count_in_sync_counts_namespaces_with_equal_data_only() -> None:
    items = [
        copy("tenant-a0", WANT),
        copy("tenant-a1", {**WANT, "client_configuration_token.tok": "b2xk"}),  # still the old token
        copy("tenant-a2", {"client_configuration_token.tok": WANT["client_configuration_token.tok"]}),  # a key short
        copy("tenant-a3", {**WANT, "extra": "eA=="}),  # a key too many
        copy("tenant-a4", WANT, name="other"),  # not the peer's copy
        {"metadata": {"name": PEER_COPY_NAME, "namespace": "tenant-a5"}},  # no data at all
        copy("tenant-a6", dict(WANT)),
    ]
    assert count_in_sync(items, WANT) == 2
    assert count_in_sync([], WANT) == 0
    # The same namespace listed twice counts once.
    assert count_in_sync([copy("tenant-a0", WANT), copy("tenant-a0", WANT)], WANT) == 1


def test_comparison_rows_give_ratios_licensectl_over_peer() -> None:
    lic = Side(cold=Phase(cpu=6.0, wall=20.0, control_plane_cpu=30.0),
               rotation=Phase(cpu=3.0, wall=10.0, control_plane_cpu=15.0), peak_rss=80 * 1024 * 1024)
    peer = Side(cold=Phase(cpu=4.0, wall=10.0, control_plane_cpu=20.0),
                rotation=Phase(cpu=3.0, wall=8.0, control_plane_cpu=12.0), peak_rss=40 * 1024 * 1024)
    rows = {r[0]: r for r in comparison_rows(lic, peer, 3_000)}
    assert all(len(r) == 6 for r in rows.values())
    cold = rows["cold start: replicator CPU"]
    assert cold[1:5] == ["6.00 s", "4.00 s", "1.50x", f"≤ {GOAL_CPU_RATIO:.1f}x"]
    assert "per copy 2.00 ms vs 1.33 ms" in cold[5]
    assert rows["rotation: replicator CPU"][3] == "1.00x"
    assert rows["rotation: wall"][3] == "1.25x"
    assert rows["peak RSS (VmHWM)"][1:4] == ["80.0 MiB", "40.0 MiB", "2.00x"]


def test_comparison_rows_without_peer_cpu_say_na() -> None:
    zero = Phase(cpu=0.0, wall=0.0, control_plane_cpu=0.0)
    rows = comparison_rows(Side(zero, zero, 0), Side(zero, zero, 0), 3_000)
    assert {r[3] for r in rows} == {"n/a"}


def test_peer_is_opt_in_and_its_tool_is_registered() -> None:
    assert "peer" in bench_main.BENCHMARKS
    assert "peer" in bench_main.OPT_IN, "`all` must not run the Go peer comparison"
    assert "replicator-peer" in TOOLS
