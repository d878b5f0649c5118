"""The report benchmark's pure helpers: fleet, body templates, Lua literals, result parsing, checks."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from prometheus_client import generate_latest

from benchmarks.reports import (
    CLOCK_WINDOW_SECONDS,
    GUEST_CLOCK_LAG_SECONDS,
    MARKER,
    PLACEHOLDERS,
    VARIANTS,
    Identity,
    Reflection,
    bucket_allowance,
    clock_base,
    count_bound,
    counts_agree,
    fill,
    fleet,
    lua_script,
    lua_string,
    parse_load_output,
    reflection,
    slope_per_second,
    split_template,
    store_clocks,
    templates,
)
from licensectl.controllers.guests import SKEW_DETAIL_SECONDS, GuestStore
from licensectl.core.guest_report import evaluate, parse_report, render_report
from licensectl.metrics import Metrics
from licensectl_dev.testkit.metrics_text import Scrape, parse_metrics

NOW = dt.datetime(2026, 5, 1, 12, 0, 0, tzinfo=dt.UTC)


def lua_unescape(literal: str) -> bytes:
    """Decode what lua_string produces (printable ASCII and \\ddd escapes only)."""
    assert literal[0] == literal[-1] == '"'
    body = literal[1:-1]
    assert re.fullmatch(r'(?:[ !#-\[\]-~]|\\[0-9]{3})*', body), "unexpected character in a Lua literal"
    return re.sub(rb"\\([0-9]{3})", lambda m: bytes([int(m.group(1))]), body.encode())


# ---------------------------------------------------------------------------------------------
# Fleet
# ---------------------------------------------------------------------------------------------
def test_fleet_is_deterministic_and_distinct() -> None:
    a, b = fleet(7, 3), fleet(7, 3)
    assert a == b
    assert len(a) == 21
    assert len({i.uuid for i in a}) == 21
    assert len({(i.namespace, i.vmi) for i in a}) == 21
    assert len({i.namespace for i in a}) == 7
    assert [i.variant for i in a[:10]] == [k % len(VARIANTS) for k in range(10)]
    # One token hash per namespace (one replica per namespace), valid as a report field.
    assert len({(i.namespace, i.token_sha256) for i in a}) == 7
    assert all(re.fullmatch(r"[0-9a-f]{64}", i.token_sha256) for i in a)


def test_fleet_rejects_empty_shapes() -> None:
    with pytest.raises(ValueError):
        fleet(0, 5)
    with pytest.raises(ValueError):
        fleet(5, 0)


# ---------------------------------------------------------------------------------------------
# Templates
# ---------------------------------------------------------------------------------------------
def test_split_and_fill_reproduce_render_report() -> None:
    ident = fleet(1, 1)[0]
    sections = [("gridd-log", "Apr 02 19:11:13 vm nvidia-gridd[837]: Started (837)\n")]
    template = render_report(uuid=PLACEHOLDERS[0], hostname=PLACEHOLDERS[1], clock=int(PLACEHOLDERS[2]),
                             token_sha256=PLACEHOLDERS[3], probe_version="1.0", sections=sections)
    parts = split_template(template)
    assert len(parts) == 5
    clock = int(NOW.timestamp())
    assert fill(parts, [ident.uuid, ident.vmi, str(clock), ident.token_sha256]) == render_report(
        uuid=ident.uuid, hostname=ident.vmi, clock=clock, token_sha256=ident.token_sha256, probe_version="1.0",
        sections=sections)


@pytest.mark.parametrize(
    "body",
    [b"a X b Y c", b"a Y b X c Z", b"a X b X c Y Z"],
    ids=["missing", "out-of-order", "twice"],
)
def test_split_template_refuses_bad_templates(body: bytes) -> None:
    with pytest.raises(ValueError):
        split_template(body, ["X", "Y", "Z"])


def test_fill_needs_one_value_per_placeholder() -> None:
    assert fill([b"<", b"|", b">"], ["a", "b"]) == b"<a|b>"
    with pytest.raises(ValueError):
        fill([b"<", b">"], ["a", "b"])


def test_every_fixture_variant_fills_into_a_valid_report() -> None:
    parts = templates()
    assert len(parts) == len(VARIANTS)
    ident = fleet(1, 1)[0]
    clock = int(NOW.timestamp())
    formats = set()
    for p in parts:
        report = parse_report(fill(p, [ident.uuid, ident.vmi, str(clock), ident.token_sha256]))
        assert (report.uuid, report.hostname, report.clock, report.token_sha256) == (
            ident.uuid, ident.vmi, NOW, ident.token_sha256)
        assert report.gpus and report.events  # real nvidia-smi output and gridd lines, not empty shells
        formats.add(report.smi_format)
    assert formats == {"xml", "text"}


# ---------------------------------------------------------------------------------------------
# Lua
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data",
    [b"", b"plain text", b'quote " and \\ backslash', b"line\nbreak\r\ttab", "ünïcode".encode(), bytes(range(256)),
     b"\x01" + b"23"],  # an escape followed by digits must not merge with them
)
def test_lua_string_round_trips(data: bytes) -> None:
    assert lua_unescape(lua_string(data)) == data


def test_lua_script_lists_every_identity_once() -> None:
    ids = fleet(3, 2)
    parts = [[b"a", b"b", b"c", b"d", b"e"]] * len(VARIANTS)
    creds = {i.namespace: f"cred-{i.namespace}" for i in ids}
    script = lua_script(ids, parts, creds, base_clock=1_777_000_000, per_thread_cap=42)

    def table(name: str) -> list[str]:
        m = re.search(rf"^local {name} = \{{(.*)\}}$", script, re.MULTILINE)
        assert m is not None, name
        return m.group(1).split(",")

    assert [lua_unescape(u).decode() for u in table("ID_UUID")] == [i.uuid for i in ids]
    namespaces = [lua_unescape(n).decode() for n in table("NS")]
    # Each identity points (1-based) at its namespace, whose credential sits at the same index.
    assert [namespaces[int(k) - 1] for k in table("ID_NS")] == [i.namespace for i in ids]
    assert [lua_unescape(c).decode() for c in table("CRED")] == [f"Bearer cred-{ns}" for ns in namespaces]
    assert [int(v) - 1 for v in table("ID_VAR")] == [i.variant for i in ids]
    assert "local BASE = 1777000000" in script and "local CAP = 42" in script


# ---------------------------------------------------------------------------------------------
# Bounds
# ---------------------------------------------------------------------------------------------
def test_clock_base_keeps_every_clock_inside_the_window_and_behind_the_server() -> None:
    now, per_vmi, window = 1_777_000_000, 1_000, 3_600
    base = clock_base(now, per_vmi, window)
    assert abs(base + 1 - now) <= window and abs(base + per_vmi - now) <= window
    # The newest clock any VMI sends is the lag behind `now`; the server's clock only moves on.
    assert base + per_vmi == now - GUEST_CLOCK_LAG_SECONDS
    assert clock_base(now, per_vmi, window, lag=0) == now - per_vmi
    with pytest.raises(ValueError):
        clock_base(now, window, window)
    with pytest.raises(ValueError):  # fits the window, but not with the lag
        clock_base(now, window - GUEST_CLOCK_LAG_SECONDS, window)
    with pytest.raises(ValueError):
        clock_base(now, 0, window)


def test_guest_clock_lag_is_well_past_the_detail_threshold() -> None:
    # docs/operations.md#metrics-cardinality: a clock off by a minute or more gets the detail series.
    assert GUEST_CLOCK_LAG_SECONDS >= 2 * SKEW_DETAIL_SECONDS
    assert GUEST_CLOCK_LAG_SECONDS < CLOCK_WINDOW_SECONDS / 10


def test_count_bound_scales_with_duration() -> None:
    total10, per_vmi10 = count_bound(10, 5_000)
    total60, per_vmi60 = count_bound(60, 5_000)
    assert total60 == 6 * total10
    assert per_vmi60 * 5_000 >= total60 and per_vmi10 * 5_000 >= total10
    assert clock_base(1_777_000_000, per_vmi60) < 1_777_000_000  # the full run fits the clock window


def test_bucket_allowance() -> None:
    assert bucket_allowance(60, 5, 2.0) == 70
    assert bucket_allowance(60, 5, -1.0) == 60


def test_slope_per_second() -> None:
    assert slope_per_second([(t, 100 + 3 * t) for t in range(10)]) == pytest.approx(3.0)
    assert slope_per_second([(t, 7.0) for t in range(5)]) == 0.0
    assert slope_per_second([(1.0, 5.0)]) is None
    assert slope_per_second([(1.0, 5.0), (1.0, 6.0)]) is None


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------
def test_parse_load_output() -> None:
    js = {"duration_us": 2_500_000, "requests": 10, "bytes": 1, "capped_threads": 0,
          "errors": {"connect": 0, "read": 1, "write": 0, "status": 2, "timeout": 3},
          "latency_us": {"p50": 1500, "p90": 2000, "p99": 9000, "p999": 9500, "max": 10_000, "mean": 1600.5},
          "codes": {"202": 8, "409": 2}, "accepted": [[1, 100], [3, 105]], "unknown": [[2, 101]]}
    out = parse_load_output(f"Running 3s test\n  16 threads\n{MARKER}{json.dumps(js)}\nRequests/sec: 4\n")
    assert out.per_second == 4.0
    assert out.codes == {202: 8, 409: 2}
    assert out.accepted == {0: 100, 2: 105}  # Lua indices are 1-based
    assert out.unknown == [(1, 101)]
    assert out.latency["p99"] == pytest.approx(0.009)
    assert out.socket_errors == 4  # status errors (4xx/5xx answers) are not socket errors
    with pytest.raises(ValueError):
        parse_load_output("Running 3s test\n")


def _scrape_after(ids: list[Identity], clocks: dict[int, int], *, first_report: dt.datetime) -> Scrape:
    """What the benchmark server exposes after identity k sent one report with guest clock clocks[k],
    judged as the server does: against the replica's token hash (the one the load sends), received
    a second apart from `first_report` on (with microseconds, as dt.datetime.now() gives)."""
    parts = templates()
    store = GuestStore(60.0)
    now = first_report
    for k, clock in clocks.items():
        ident = ids[k]
        body = fill(parts[ident.variant], [ident.uuid, ident.vmi, str(clock), ident.token_sha256])
        now = first_report + dt.timedelta(seconds=k, microseconds=123_457)
        store.record(ident.namespace, ident.vmi,
                     evaluate(parse_report(body), current_token_sha256=ident.token_sha256, now=now))
    metrics = Metrics()
    metrics.snapshots.add(lambda: store.samples(now, [(i.namespace, i.vmi) for i in ids]))
    return parse_metrics(generate_latest(metrics.registry).decode())


def test_store_clocks_recover_the_load_clocks_of_every_variant() -> None:
    ids = fleet(1, len(VARIANTS) + 1)  # one VMI per fixture variant, and one that never reports
    per_vmi = 50
    base = clock_base(int(NOW.timestamp()), per_vmi)
    # Each VMI's last report anywhere in base+1 .. base+per_vmi, received from NOW on (the server
    # starts after the harness picks the base).
    clocks = {k: base + 1 + (k * 7) % per_vmi for k in range(len(VARIANTS))}
    snap = _scrape_after(ids, clocks, first_report=NOW)
    # Every reporting guest, healthy-looking fixtures included, has its detail series.
    assert store_clocks(snap) == {(ids[k].namespace, ids[k].vmi): c for k, c in clocks.items()}


def test_without_the_lag_a_healthy_guest_has_no_clock_series() -> None:
    # Why the load's clocks lag: with the guest's clock right, some fixtures are healthy guests
    # (licensed, current token) and export only their state and expiry, so their reports could
    # not be checked against the series.
    ids = fleet(1, len(VARIANTS))
    clocks = {k: int(NOW.timestamp()) + k for k in range(len(VARIANTS))}
    snap = _scrape_after(ids, clocks, first_report=NOW)
    healthy = {(i.namespace, i.vmi) for i in ids} - set(store_clocks(snap))
    assert healthy
    states = {dict(labels).get("vmi"): dict(labels).get("state") for (name, labels), _ in snap.samples.items()
              if name == "licensectl_guest_license_state"}
    assert all(states[vmi] == "licensed" for _, vmi in healthy)


def _ids() -> list[Identity]:
    return fleet(1, 4)


def test_reflection_all_reflected() -> None:
    ids = _ids()
    stored = {("tenant-bench-0", "vm-0"): 10, ("tenant-bench-0", "vm-1"): 20}
    ref = reflection(ids, {0: 10, 1: 20}, [], stored)
    assert ref == Reflection(accepted_vmis=2, reflected=2, missing=0, stale=0, unexpected=0, landed=0)
    assert ref.ok


def test_reflection_counts_missing_stale_and_unexpected() -> None:
    ids = _ids()
    stored = {("tenant-bench-0", "vm-1"): 19, ("tenant-bench-0", "vm-3"): 5}
    ref = reflection(ids, {0: 10, 1: 20}, [], stored)
    assert (ref.accepted_vmis, ref.reflected, ref.missing, ref.stale, ref.unexpected) == (2, 0, 1, 1, 1)
    assert not ref.ok


def test_reflection_accepts_a_newer_unknown_outcome_report() -> None:
    ids = _ids()
    # vm-0: the last request (clock 11) got no response but landed; vm-1: it did not land;
    # vm-2: only ever sent one request, in flight at the end, and it landed.
    stored = {("tenant-bench-0", "vm-0"): 11, ("tenant-bench-0", "vm-1"): 20, ("tenant-bench-0", "vm-2"): 7}
    ref = reflection(ids, {0: 10, 1: 20}, [(0, 11), (1, 21), (2, 7)], stored)
    assert ref == Reflection(accepted_vmis=3, reflected=3, missing=0, stale=0, unexpected=0, landed=2)
    assert ref.ok
    # An unknown request older than the last 202 cannot be what the store should hold.
    assert not reflection(ids, {0: 10}, [(0, 9)], {("tenant-bench-0", "vm-0"): 9}).ok


def test_counts_agree() -> None:
    ref = Reflection(accepted_vmis=5, reflected=5, missing=0, stale=0, unexpected=0, landed=2)
    assert counts_agree(100, 102.0, ref, unknown=3, socket_errors=0)
    assert not counts_agree(100, 103.0, ref, unknown=3, socket_errors=0)  # one accepted report unaccounted for
    assert not counts_agree(100, 101.0, ref, unknown=3, socket_errors=0)
    # With socket errors, a lost request may have landed and been superseded: only bounds hold.
    assert counts_agree(100, 103.0, ref, unknown=3, socket_errors=1)
    assert not counts_agree(100, 104.0, ref, unknown=3, socket_errors=1)
    assert not counts_agree(100, 101.0, ref, unknown=3, socket_errors=1)
