"""The benchmarks' pure helpers: /proc parsing, fleet shapes, tables (metrics parsing: test_testkit.py)."""

from __future__ import annotations

import base64
import itertools
import json

import pytest

from benchmarks.common import (
    WATCHED_LISTS,
    InformerRecovery,
    Recovery,
    fake_tokens,
    fmt_mib,
    fmt_num,
    fmt_ratio,
    fmt_seconds,
    format_table,
    gc_pauses_between,
    informer_recoveries,
    informers_recovered,
    level_sizes,
    lists_served,
    parse_proc_stat_cpu,
    parse_proc_status,
    ratio,
    spread,
    tenant_tree,
)
from benchmarks.rollout import SIM, bottleneck
from licensectl_dev.testkit.metrics_text import parse_metrics


def test_parse_proc_status_in_bytes() -> None:
    text = "Name:\tpython\nVmPeak:\t  300000 kB\nVmHWM:\t  153600 kB\nVmRSS:\t  102400 kB\nThreads:\t3\n"
    mem = parse_proc_status(text)
    assert mem["VmHWM"] == 150 * 1024 * 1024
    assert mem["VmRSS"] == 100 * 1024 * 1024
    assert "Threads" not in mem and "Name" not in mem


def test_parse_proc_stat_cpu_handles_spaces_and_parens_in_comm() -> None:
    # Fields after comm: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    rest = "S 1 2 3 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 12345"
    assert parse_proc_stat_cpu(f"4242 (python) {rest}", 100) == pytest.approx(3.0)
    assert parse_proc_stat_cpu(f"4242 (a (weird) name) {rest}", 100) == pytest.approx(3.0)
    assert parse_proc_stat_cpu(f"4242 (x) {rest}", 250) == pytest.approx(1.2)


@pytest.mark.parametrize(("count", "depth"), [(5000, 4), (500, 4), (50, 2), (3, 4), (1, 4), (7, 1)])
def test_tenant_tree_shape(count: int, depth: int) -> None:
    tree = tenant_tree(count, depth)
    assert len(tree) == count
    assert len({t.name for t in tree}) == count
    assert max((t.depth for t in tree), default=0) <= depth
    seen = {"tenant-root"}
    by_name = {t.name: t for t in tree}
    for t in tree:
        assert t.parent in seen, "parents come before their children"
        seen.add(t.name)
        # Cozystack naming: the name is the parent's name plus one dash-free part.
        expected_prefix = "tenant-" if t.parent == "tenant-root" else t.parent + "-"
        assert t.name.startswith(expected_prefix)
        assert "-" not in t.name[len(expected_prefix):]
        assert t.depth == (1 if t.parent == "tenant-root" else by_name[t.parent].depth + 1)
        assert len(t.name) <= 63


def test_tenant_tree_full_scale_reaches_depth_four() -> None:
    depths = [t.depth for t in tenant_tree(5000, 4)]
    assert sorted(set(depths)) == [1, 2, 3, 4]
    assert [depths.count(d) for d in (1, 2, 3, 4)] == level_sizes(5000, 4) == [500, 1000, 1500, 2000]


def test_level_sizes_never_leave_a_gap() -> None:
    for count in range(0, 40):
        sizes = level_sizes(count, 4)
        assert sum(sizes) == count
        first_empty = next((i for i, s in enumerate(sizes) if s == 0), len(sizes))
        assert all(s == 0 for s in sizes[first_empty:])
    with pytest.raises(ValueError):
        level_sizes(5, 0)


def test_spread() -> None:
    assert spread(2000, 500) == [4] * 500
    assert spread(10, 4) == [3, 3, 2, 2]
    assert spread(2, 4) == [1, 1, 0, 0]
    with pytest.raises(ValueError):
        spread(1, 0)


def test_ratio_and_formatting() -> None:
    assert ratio(30.0, 10.0) == 3.0
    assert ratio(1.0, 0.0) is None
    assert fmt_ratio(ratio(7.0, 2.0)) == "3.50x"
    assert fmt_ratio(None) == "n/a"
    assert fmt_seconds(0.0425) == "42 ms"
    assert fmt_seconds(12.345) == "12.35 s"
    assert fmt_seconds(900.0) == "900 s (15.0 min)"
    assert fmt_seconds(None) == "n/a"
    assert fmt_mib(150 * 1024 * 1024) == "150.0 MiB"
    assert fmt_num(5000.0) == "5,000"
    assert fmt_num(2.345) == "2.35"
    assert fmt_num(None) == "n/a"


def test_format_table_aligns_columns() -> None:
    out = format_table("T", ["metric", "value"], [["a", "1"], ["longer name", "22"]])
    lines = out.splitlines()
    assert lines[0] == "T"
    assert lines[1] == "| metric      | value |"
    assert lines[2] == "|-------------|-------|"
    assert lines[3] == "| a           | 1     |"
    assert lines[4] == "| longer name | 22    |"
    with pytest.raises(ValueError):
        format_table("T", ["a", "b"], [["only one"]])


def test_bottleneck_reading() -> None:
    sat = bottleneck({"controller": 0.2, SIM: 0.95, "etcd": 0.1}, 2, 200, 200, 0.01)
    assert sat.startswith("the simulator/proxy process saturated one core")
    assert "never reached" not in sat and "lagged" not in sat
    ctl = bottleneck({"controller": 0.97, SIM: 0.3}, 2, 10, 200, 0.5)
    assert ctl.startswith("the controller saturated one core")
    assert "never reached (10 of 200)" in ctl and "p95 500 ms" in ctl
    machine = bottleneck({"controller": 0.8, SIM: 0.8, "kube-apiserver": 0.6}, 2, 200, 200, 0.0)
    assert machine.startswith("the machine is CPU-bound")
    idle = bottleneck({"controller": 0.26, SIM: 0.42, "kube-apiserver": 0.36}, 2, 96, 200, 0.0, host_load=1.5)
    assert idle.startswith(f"no benchmarked process saturated a core (busiest {SIM} 42%)")
    assert "oversubscribed" not in idle
    busy_host = bottleneck({"controller": 0.26, SIM: 0.42}, 2, 200, 200, 0.0, host_load=6.5)
    assert busy_host.endswith("host oversubscribed (load 6.5 on 2 cores): part of the latency is waiting for a CPU")


def _scrape(synced: dict[str, int], ready: int) -> str:
    lines = ["# TYPE licensectl_informer_synced gauge"]
    lines += [f'licensectl_informer_synced{{resource="{r}"}} {v}' for r, v in synced.items()]
    return "\n".join([*lines, "# TYPE licensectl_ready gauge", f"licensectl_ready {ready}", ""])


def test_recovered_only_when_every_informer_is_synced_and_the_controller_ready() -> None:
    assert informers_recovered(parse_metrics(_scrape({"namespaces": 1, "secrets": 1}, 1)))
    assert not informers_recovered(parse_metrics(_scrape({"namespaces": 1, "secrets": 0}, 1)))
    assert not informers_recovered(parse_metrics(_scrape({"namespaces": 1}, 0)))
    assert not informers_recovered(parse_metrics(_scrape({}, 1)))  # no informer reported yet


def test_fake_tokens_expire_90_days_apart_and_name_their_rotation() -> None:
    payloads = [json.loads(base64.urlsafe_b64decode(t.split(b".")[1] + b"==")) for t in fake_tokens(3)]
    assert [p["rotation"] for p in payloads] == [1, 2, 3]
    assert [b["exp"] - a["exp"] for a, b in itertools.pairwise(payloads)] == [86400 * 90, 86400 * 90]


def test_loop_lag_between_two_scrapes_counts_only_the_samples_between_them() -> None:
    from prometheus_client import generate_latest

    from benchmarks.common import loop_lag_between
    from licensectl.metrics import Metrics
    from licensectl_dev.testkit.metrics_text import parse_metrics

    m = Metrics()
    for lag in (0.0005, 0.3):  # before the first scrape: not counted
        m.loop_lag.observe(lag)
    before = parse_metrics(generate_latest(m.registry).decode())
    for lag in (0.0005, 0.002, 0.07, 0.2):
        m.loop_lag.observe(lag)
    after = parse_metrics(generate_latest(m.registry).decode())
    assert loop_lag_between(before, after) == "4 samples, 1 later than 100 ms, worst ≤ 0.25 s"
    assert loop_lag_between(before, before) == "no samples"
    assert loop_lag_between(before, parse_metrics("")).startswith("n/a")


class _Restarting:
    """An apiserver whose watch caches fill one kind at a time: 429 for a selected LIST of a kind until
    its turn; an unselected LIST with a limit is read from etcd and answers at once (KEP-4568)."""

    def __init__(self, fills_after: dict[str, int]) -> None:
        self.fills_after = dict(fills_after)
        self.calls: list[str] = []

    async def call_api(self, path: str, method: str, **kw: object) -> object:
        self.calls.append(path)
        params = dict(kw["query_params"])  # type: ignore[call-overload]
        assert method == "GET" and params["limit"] == 1
        if "labelSelector" not in params:
            return {}
        if self.calls.count(path) <= self.fills_after.get(path, 0):
            raise RuntimeError("429 storage is initializing")
        return {}


async def test_lists_served_waits_for_every_watched_kind_and_asks_each_only_until_it_answered() -> None:
    slow = WATCHED_LISTS[-1]
    api = _Restarting({slow: 3, WATCHED_LISTS[0]: 1})
    took = await lists_served(api, every=0.0)  # type: ignore[arg-type]
    assert took is not None and took >= 0
    assert api.calls.count(slow) == 4 and api.calls.count(WATCHED_LISTS[0]) == 2
    assert all(api.calls.count(p) == 1 for p in WATCHED_LISTS[1:-1])
    never = _Restarting({slow: 10**9})
    assert await lists_served(never, within=0.05, every=0.01) is None  # type: ignore[arg-type]


def test_informer_recoveries_count_the_lists_and_restarts_between_the_scrapes() -> None:
    before = parse_metrics("\n".join([
        "# TYPE licensectl_informer_synced gauge",
        'licensectl_informer_synced{resource="vmis"} 1',
        "# TYPE licensectl_informer_list_duration_seconds histogram",
        'licensectl_informer_list_duration_seconds_count{resource="vmis",result="ok"} 1',
        'licensectl_informer_list_duration_seconds_sum{resource="vmis",result="ok"} 2.0',
        "# TYPE licensectl_watch_restarts_total counter",
        'licensectl_watch_restarts_total{resource="vmis",reason="timeout"} 4', ""]))
    after = parse_metrics("\n".join([
        "# TYPE licensectl_informer_synced gauge",
        'licensectl_informer_synced{resource="vmis"} 1',
        'licensectl_informer_synced{resource="source:ns/token"} 1',
        "# TYPE licensectl_informer_list_duration_seconds histogram",
        'licensectl_informer_list_duration_seconds_count{resource="vmis",result="ok"} 2',
        'licensectl_informer_list_duration_seconds_sum{resource="vmis",result="ok"} 5.5',
        'licensectl_informer_list_duration_seconds_count{resource="vmis",result="error"} 3',
        'licensectl_informer_list_duration_seconds_sum{resource="vmis",result="error"} 0.1',
        "# TYPE licensectl_watch_restarts_total counter",
        'licensectl_watch_restarts_total{resource="vmis",reason="timeout"} 4',
        'licensectl_watch_restarts_total{resource="vmis",reason="gone"} 1',
        'licensectl_watch_restarts_total{resource="vmis",reason="error"} 7', ""]))
    source, vmis = informer_recoveries(before, after, {"vmis": 4.25})
    assert vmis == InformerRecovery("vmis", 4.25, lists=1, list_seconds=3.5, failed_lists=3,
                                    watch_restarts={"gone": 1, "error": 7})
    assert vmis.describe() == "vmis: synced 4.25 s, 1 LIST(s) 3.50 s, 3 failed, watch restarts error 7, gone 1"
    assert source.resource == "source:ns/token" and source.synced_after is None and source.lists == 0
    assert source.describe() == "source:ns/token: not synced, no relist, 0 failed, watch restarts none"


def test_gc_pauses_between_two_scrapes_count_only_full_collections_between_them() -> None:
    def scrape(count: int, total: float, buckets: dict[str, int]) -> str:
        lines = ["# TYPE licensectl_gc_pause_seconds histogram",
                 'licensectl_gc_pause_seconds_count{generation="0"} 999',
                 f'licensectl_gc_pause_seconds_count{{generation="2"}} {count}',
                 f'licensectl_gc_pause_seconds_sum{{generation="2"}} {total}']
        lines += [f'licensectl_gc_pause_seconds_bucket{{generation="2",le="{le}"}} {n}' for le, n in buckets.items()]
        return "\n".join([*lines, ""])

    before = parse_metrics(scrape(2, 0.05, {"0.025": 2, "0.05": 2, "0.1": 2, "0.25": 2, "+Inf": 2}))
    after = parse_metrics(scrape(5, 0.35, {"0.025": 3, "0.05": 4, "0.1": 4, "0.25": 5, "+Inf": 5}))
    assert gc_pauses_between(before, after) == (
        "3 full collections, 0.30 s in all, 1 longer than 50 ms, worst ≤ 0.25 s")
    assert gc_pauses_between(before, before) == "none"
    assert gc_pauses_between(before, parse_metrics("")).startswith("n/a")


def test_recovery_synced_after_is_the_last_picked_cache_and_unknown_if_one_never_synced() -> None:
    def cache(name: str, at: float | None) -> InformerRecovery:
        return InformerRecovery(name, at, lists=1, list_seconds=1.0, failed_lists=0, watch_restarts={})

    rec = Recovery(outage=35, restart=4, unhealthy_seen=True, to_ready=18, to_leader=0.1,
                   per_informer=(cache("replicas", 0.5), cache("gpuclaims", 7.0), cache("virtualmachines", 18.0)))
    assert rec.synced_after(lambda r: r in {"replicas", "gpuclaims"}) == 7.0
    assert rec.synced_after(lambda r: r == "virtualmachines") == 18.0
    assert rec.synced_after(lambda r: r == "datavolumes") is None  # none picked
    late = Recovery(outage=35, restart=4, unhealthy_seen=True, to_ready=None, to_leader=None,
                    per_informer=(cache("replicas", 0.5), cache("gpuclaims", None)))
    assert late.synced_after(lambda r: True) is None
