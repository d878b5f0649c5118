"""Guest-report endpoint: reports/s on one core, p50/p99 latency and RSS over a bounded loopback load.

`python -m benchmarks reports [--scale small|full]` (also `python -m benchmarks.reports`).

The server is its own process, pinned to one core, running the real pieces the controller wires
together (`make_reports_app` + `GuestStore` + `Metrics`, as `licensectl.app.App` does) over an
in-memory VMI index (namespaces x VMIs). Only the rate limits are raised, so the limiter does not cap
the measurement; the limiter is shown separately with its default limits. Load comes from `wrk`
(pinned to the other core, one connection per thread) with a generated Lua script that cycles
through every (namespace, SMBIOS UUID, credential) identity and real fixture payloads
(tests/fixtures/nvidia), each VMI's guest clock strictly increasing so replay protection passes and
at least GUEST_CLOCK_LAG_SECONDS behind the server's clock, so every guest exports its detail series.

In the same run, the same load goes to a trivial aiohttp handler in the same server setup that reads
the body and answers 202: the endpoint's throughput is reported as a ratio of that raw floor.
After the load every accepted report must be reflected: `licensectl_reports_total{result="accepted"}`
equals the 202s the client saw, and for every VMI that got a 202 the guest series in /metrics carry
exactly its last accepted report (guest clock = last report time + clock skew, both detail series).
A mismatch makes the exit code non-zero. Times are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import re
import resource
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
from aiohttp import web

from benchmarks.common import (
    MIB,
    REPO_ROOT,
    cpu_model,
    fmt_mib,
    fmt_num,
    fmt_ratio,
    format_table,
    proc_cpu_seconds,
    proc_memory,
    progress,
    ratio,
)
from licensectl import __version__
from licensectl.core.credentials import KeyRing, derive_credential
from licensectl.core.guest_report import (
    DEFAULT_LIMITS,
    SECTION_GRIDD_LOG,
    SECTION_SMI_TEXT,
    SECTION_SMI_XML,
    parse_report,
    render_report,
)
from licensectl_dev.testkit.metrics_text import Scrape, parse_metrics

FIXTURES: Final = REPO_ROOT / "tests" / "fixtures" / "nvidia"
REPORTS_PATH: Final = "/v1/reports"  # licensectl.serve.reports.REPORTS_PATH
NAMESPACE_HEADER: Final = "X-Licensectl-Namespace"  # licensectl.serve.reports.NAMESPACE_HEADER
CONTENT_TYPE: Final = "text/plain; charset=utf-8"
GOAL_PER_SECOND: Final = 5_000
BUSY_CORE: Final = 0.9  # below this share of its core the server was not the bottleneck, the machine was
MARKER: Final = "BENCH-JSON "
# The most requests per second the count bound allows; it also bounds how far guest clocks advance.
MAX_RATE: Final = 50_000
CLOCK_WINDOW_SECONDS: Final = 3600  # EndpointLimits.clock_window default
# Every generated guest clock is at least this far behind the server's clock. A guest exports
# `licensectl_guest_last_report_timestamp_seconds` and `licensectl_guest_clock_skew_seconds`, which
# the reflection check reads, only while it needs a look (docs/operations.md#metrics-cardinality):
# a licensed guest on its replica's token with a normal clock (the expiry-N/A fixture below) has its
# state and expiry series only, and would count as missing. A clock off by a minute or more
# (SKEW_DETAIL_SECONDS in licensectl/controllers/guests.py; twice that here, so clock steps on the
# machine cannot bring a guest back under it) makes every guest need a look without changing the
# server's work per report: the same parse, checks and store write; detail series cost only at the
# one scrape after the load. The token hash stays the replica's, so what each report carries and how
# the server judges it is otherwise unchanged, and the expected guest clock is simply the one sent.
GUEST_CLOCK_LAG_SECONDS: Final = 120
UNLIMITED: Final = 1e12

# Placeholders rendered into a template body and replaced per request by the load generator.
PH_UUID: Final = "00000000-feed-4bad-8bad-00000000beef"
PH_HOST: Final = "bench-placeholder-host"
PH_CLOCK: Final = 987654321012
PH_SHA: Final = "f" * 63 + "e"
PLACEHOLDERS: Final = (PH_UUID, PH_HOST, str(PH_CLOCK), PH_SHA)

# Real fixture payloads: nvidia-smi output (XML or text) paired with a gridd log, as the probe sends.
VARIANTS: Final = (
    ("smi-qx-licensed-l40s-2q-trimmed.xml", "gridd-log-acquired-cls.txt"),
    ("smi-q-licensed-expiry-na-vws.txt", "gridd-log-acquired-dls-no-timestamps.txt"),
    ("smi-q-unlicensed-vcs.txt", "gridd-log-unlicensed-warning.txt"),
    ("smi-q-unlicensed-restricted-vcs.txt", "gridd-log-register-failure.txt"),
    ("smi-q-licensed-unpadded-date.txt", "gridd-log-renew-return-windows-format.txt"),
    ("smi-q-licensed-no-product-line.txt", "gridd-log-missing-token.txt"),
    ("smi-qx-licensed-l40s-2q-trimmed.xml", "gridd-log-corrupt-token-shutdown.txt"),
    ("smi-q-licensed-expiry-na-vws.txt", "gridd-log-missing-gridd-conf.txt"),
)


@dataclass(frozen=True)
class ReportsScale:
    duration: float  # seconds of load per server
    connections: int
    namespaces: int
    per_namespace: int


SCALES: Final = {
    "small": ReportsScale(duration=10.0, connections=16, namespaces=1_000, per_namespace=5),
    "full": ReportsScale(duration=60.0, connections=16, namespaces=1_000, per_namespace=5),
}


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Identity:
    """One guest: the VMI, its firmware UUID, the token hash its replica holds, its payload variant."""

    namespace: str
    vmi: str
    uuid: str
    token_sha256: str
    variant: int


def fleet(namespaces: int, per_namespace: int, variants: int = len(VARIANTS)) -> list[Identity]:
    """A deterministic fleet, so the server and the load generator agree without sharing state."""
    if namespaces < 1 or per_namespace < 1 or variants < 1:
        raise ValueError("namespaces, per_namespace and variants must be positive")
    out: list[Identity] = []
    for n in range(namespaces):
        ns = f"tenant-bench-{n}"
        sha = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"licensectl-bench/token/{ns}").hex * 2
        for v in range(per_namespace):
            vmi = f"vm-{v}"
            out.append(Identity(ns, vmi, str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"licensectl-bench/{ns}/{vmi}")),
                                sha, len(out) % variants))
    return out


def split_template(body: bytes, placeholders: Sequence[str] = PLACEHOLDERS) -> list[bytes]:
    """The literal pieces around `placeholders`, which must each occur once and in this order."""
    parts: list[bytes] = []
    rest = body
    for ph in placeholders:
        token = ph.encode()
        if body.count(token) != 1:
            raise ValueError(f"placeholder {ph!r} must occur exactly once in the template")
        before, sep, rest = rest.partition(token)
        if not sep:
            raise ValueError(f"placeholder {ph!r} out of order")
        parts.append(before)
    parts.append(rest)
    return parts


def fill(parts: Sequence[bytes], values: Sequence[str]) -> bytes:
    """Interleave template pieces with values (what the Lua script does per request)."""
    if len(parts) != len(values) + 1:
        raise ValueError("need exactly one value per placeholder")
    out = [parts[0]]
    for v, p in zip(values, parts[1:], strict=True):
        out += [v.encode(), p]
    return b"".join(out)


def lua_string(data: bytes | str) -> str:
    """A Lua string literal for any bytes: printable ASCII kept, everything else as 3-digit escapes."""
    raw = data.encode() if isinstance(data, str) else data
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:03d}" for b in raw) + '"'


def clock_base(now: int, max_per_vmi: int, window: int = CLOCK_WINDOW_SECONDS,
               lag: int = GUEST_CLOCK_LAG_SECONDS) -> int:
    """First guest clock: each VMI's clock goes base+1 .. base+max_per_vmi, the newest `lag` seconds
    before `now` (the server's clock only moves on from there, so every guest stays at least `lag`
    behind it) and the oldest within the clock window, with the rest of the window left for the run."""
    if max_per_vmi < 1 or lag < 0:
        raise ValueError("max_per_vmi must be positive and lag not negative")
    if max_per_vmi + lag >= window:
        raise ValueError(f"too many reports per VMI to keep guest clocks inside the clock window and {lag} s "
                         "behind the server's clock")
    return now - lag - max_per_vmi


def count_bound(duration: float, identities: int) -> tuple[int, int]:
    """(total request bound, most reports one VMI can get) for a run of `duration` seconds."""
    total = math.ceil(duration * MAX_RATE)
    return total, total // identities + 1


def lua_script(ids: Sequence[Identity], templates: Sequence[Sequence[bytes]], credentials: Mapping[str, str],
               *, base_clock: int, per_thread_cap: int) -> str:
    """The wrk script. One connection per thread makes request() and response() strictly
    alternate, so each response is attributed to the identity and guest clock just sent."""
    namespaces = sorted({i.namespace for i in ids})
    ns_index = {ns: k + 1 for k, ns in enumerate(namespaces)}

    def table(items: Iterable[str]) -> str:
        return "{" + ",".join(items) + "}"

    lines = [
        "-- generated by benchmarks/reports.py: one request per call, identities cycled per thread",
        f"local NS = {table(lua_string(ns) for ns in namespaces)}",
        f"local CRED = {table(lua_string('Bearer ' + credentials[ns]) for ns in namespaces)}",
        f"local ID_NS = {table(str(ns_index[i.namespace]) for i in ids)}",
        f"local ID_UUID = {table(lua_string(i.uuid) for i in ids)}",
        f"local ID_HOST = {table(lua_string(i.vmi) for i in ids)}",
        f"local ID_SHA = {table(lua_string(i.token_sha256) for i in ids)}",
        f"local ID_VAR = {table(str(i.variant + 1) for i in ids)}",
        f"local PARTS = {table(table(lua_string(p) for p in t) for t in templates)}",
        f"local BASE = {base_clock}",
        f"local CAP = {per_thread_cap}",
        f"local PATH = {lua_string(REPORTS_PATH)}",
        f"local CTYPE = {lua_string(CONTENT_TYPE)}",
        f"local NSHDR = {lua_string(NAMESPACE_HEADER)}",
        _LUA_BODY,
    ]
    return "\n".join(lines) + "\n"


_LUA_BODY: Final = r"""
local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  nthreads = tonumber(args[1])
  cursor = tid + 1
  sent = 0
  capped = 0
  seq = {}
  codes = {}
  last_ok = {}
  lost = {}
  inflight = nil
  inflight_clock = nil
end

function request()
  if inflight ~= nil then  -- its response never came (socket error): outcome unknown
    lost[#lost + 1] = string.format("[%d,%d]", inflight, inflight_clock)
  end
  local i = cursor
  cursor = cursor + nthreads
  if cursor > #ID_NS then cursor = tid + 1 end
  local s = (seq[i] or 0) + 1
  seq[i] = s
  inflight = i
  inflight_clock = BASE + s
  local p = PARTS[ID_VAR[i]]
  local body = p[1] .. ID_UUID[i] .. p[2] .. ID_HOST[i] .. p[3] .. string.format("%d", BASE + s) ..
               p[4] .. ID_SHA[i] .. p[5]
  local n = ID_NS[i]
  sent = sent + 1
  return wrk.format("POST", PATH, {["Authorization"] = CRED[n], [NSHDR] = NS[n], ["Content-Type"] = CTYPE}, body)
end

function response(status, headers, body)
  codes[status] = (codes[status] or 0) + 1
  if status == 202 and inflight ~= nil then last_ok[inflight] = inflight_clock end
  inflight = nil
  if sent >= CAP then
    capped = 1
    wrk.thread:stop()
  end
end

function done(summary, latency, requests)
  local all_codes, ok, capped_threads, unknown = {}, {}, 0, {}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("codes")) do all_codes[k] = (all_codes[k] or 0) + v end
    for k, v in pairs(t:get("last_ok")) do ok[k] = v end
    capped_threads = capped_threads + t:get("capped")
    for _, l in ipairs(t:get("lost")) do unknown[#unknown + 1] = l end
    local i = t:get("inflight")
    if i ~= nil then unknown[#unknown + 1] = string.format("[%d,%d]", i, t:get("inflight_clock")) end
  end
  local out = {}
  local function add(s) out[#out + 1] = s end
  add(string.format('{"duration_us":%d,"requests":%d,"bytes":%d,"capped_threads":%d,', summary.duration,
      summary.requests, summary.bytes, capped_threads))
  local e = summary.errors
  add(string.format('"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},', e.connect,
      e.read, e.write, e.status, e.timeout))
  add(string.format('"latency_us":{"p50":%d,"p90":%d,"p99":%d,"p999":%d,"max":%d,"mean":%.1f},',
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
      latency.max, latency.mean))
  add('"codes":{')
  local first = true
  for k, v in pairs(all_codes) do
    add(string.format('%s"%d":%d', first and "" or ",", k, v))
    first = false
  end
  add('},"accepted":[')
  first = true
  for k, v in pairs(ok) do
    add(string.format('%s[%d,%d]', first and "" or ",", k, v))
    first = false
  end
  add('],"unknown":[' .. table.concat(unknown, ",") .. ']}')
  io.write("BENCH-JSON " .. table.concat(out) .. "\n")
end
"""


@dataclass(frozen=True)
class LoadResult:
    """What the load generator measured (latencies in seconds)."""

    duration: float
    requests: int
    codes: Mapping[int, int]
    errors: Mapping[str, int]
    latency: Mapping[str, float]
    accepted: Mapping[int, int]  # identity index (0-based) -> guest clock of its last 202
    # (identity index, guest clock) of requests sent without a response: in flight at the end, or
    # lost to a socket error. The server may or may not have accepted them.
    unknown: Sequence[tuple[int, int]]
    capped_threads: int

    @property
    def per_second(self) -> float:
        return self.requests / self.duration if self.duration > 0 else 0.0

    @property
    def socket_errors(self) -> int:
        return sum(v for k, v in self.errors.items() if k != "status")


def parse_load_output(stdout: str) -> LoadResult:
    """The JSON line the Lua `done()` prints, among wrk's own text output."""
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            js = json.loads(line[len(MARKER):])
            return LoadResult(
                duration=js["duration_us"] / 1e6,
                requests=int(js["requests"]),
                codes={int(k): int(v) for k, v in js["codes"].items()},
                errors={k: int(v) for k, v in js["errors"].items()},
                latency={k: float(v) / 1e6 for k, v in js["latency_us"].items()},
                accepted={int(k) - 1: int(v) for k, v in js["accepted"]},
                unknown=[(int(k) - 1, int(v)) for k, v in js.get("unknown", [])],
                capped_threads=int(js["capped_threads"]),
            )
    raise ValueError("load generator printed no result line")


def store_clocks(snap: Scrape) -> dict[tuple[str, str], int]:
    """Guest clock of the report each VMI's series reflect: last report time + clock skew.

    Both are detail series: a guest that does not need a look has neither, which is why the load's
    guest clocks lag (GUEST_CLOCK_LAG_SECONDS)."""
    last: dict[tuple[str, str], float] = {}
    skew: dict[tuple[str, str], float] = {}
    for (name, labels), value in snap.samples.items():
        lab = dict(labels)
        key = (lab.get("namespace", ""), lab.get("vmi", ""))
        if name == "licensectl_guest_last_report_timestamp_seconds":
            last[key] = value
        elif name == "licensectl_guest_clock_skew_seconds":
            skew[key] = value
    return {k: round(v + skew[k]) for k, v in last.items() if k in skew}


@dataclass(frozen=True)
class Reflection:
    accepted_vmis: int  # VMIs with an accepted report (a 202, or an unknown-outcome request that landed)
    reflected: int  # of those, VMIs whose series carry exactly their last accepted report
    missing: int  # a 202 was seen, but the VMI has no series
    stale: int  # the series carry another report than the last accepted one
    unexpected: int  # series for a VMI the client never sent an accepted or unknown-outcome report for
    landed: int  # unknown-outcome requests whose report is the one the series carry

    @property
    def ok(self) -> bool:
        return self.reflected == self.accepted_vmis and self.missing == self.stale == self.unexpected == 0


def reflection(ids: Sequence[Identity], accepted: Mapping[int, int], unknown: Sequence[tuple[int, int]],
               stored: Mapping[tuple[str, str], int]) -> Reflection:
    """Compare what the client saw accepted with the guest state the server exposes.

    A VMI is reflected when its series carry its last 202, or a newer report whose response never
    arrived (that one evidently landed).
    """
    def key(i: int) -> tuple[str, str]:
        return ids[i].namespace, ids[i].vmi

    want = {key(i): clock for i, clock in accepted.items()}
    maybe: dict[tuple[str, str], set[int]] = {}
    for i, clock in unknown:
        maybe.setdefault(key(i), set()).add(clock)
    reflected = missing = stale = landed = accepted_vmis = 0
    for k in set(want) | set(maybe):
        got = stored.get(k)
        if got is None:
            missing += k in want
            accepted_vmis += k in want
            continue
        accepted_vmis += 1
        if got == want.get(k):
            reflected += 1
        elif got in maybe.get(k, ()) and got > want.get(k, -1):
            reflected += 1
            landed += 1
        else:
            stale += 1
    unexpected = sum(1 for k in stored if k not in want and k not in maybe)
    return Reflection(accepted_vmis, reflected, missing, stale, unexpected, landed)


def counts_agree(client_202: int, metric_accepted: float, ref: Reflection, unknown: int, socket_errors: int) -> bool:
    """reports_total{accepted} = 202s seen + unknown-outcome requests that were accepted.

    Without socket errors the unknown ones are only the last request of each connection, so each
    that was accepted is the newest report of its VMI and shows in the series: the sum is exact.
    """
    extra = metric_accepted - client_202
    if socket_errors == 0:
        return extra == ref.landed
    return ref.landed <= extra <= unknown


def slope_per_second(samples: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t, value) samples; None with fewer than two distinct times."""
    if len(samples) < 2:
        return None
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    if var == 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in samples) / var


def bucket_allowance(burst: float, rate: float, elapsed: float) -> float:
    """The most a token bucket that starts full can grant over `elapsed` seconds."""
    return burst + rate * max(0.0, elapsed)


def fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    return f"{seconds * 1000:.2f} ms" if seconds < 0.1 else f"{seconds * 1000:.0f} ms"


def fmt_codes(codes: Mapping[int, int]) -> str:
    return ", ".join(f"{k}: {v:,}" for k, v in sorted(codes.items())) or "none"


def fmt_slope(bytes_per_second: float | None) -> str:
    return "n/a" if bytes_per_second is None else f"{bytes_per_second * 60 / MIB:+.2f} MiB/min"


# ---------------------------------------------------------------------------------------------
# Payloads
# ---------------------------------------------------------------------------------------------
def variant_sections(smi: str, log: str, fixtures: Path = FIXTURES) -> list[tuple[str, str]]:
    kind = SECTION_SMI_XML if smi.endswith(".xml") else SECTION_SMI_TEXT
    return [(kind, (fixtures / smi).read_text()), (SECTION_GRIDD_LOG, (fixtures / log).read_text())]


def templates(fixtures: Path = FIXTURES) -> list[list[bytes]]:
    """One template per variant, checked: a filled template parses and equals render_report's body."""
    out = []
    for smi, log in VARIANTS:
        sections = variant_sections(smi, log, fixtures)
        parts = split_template(render_report(uuid=PH_UUID, hostname=PH_HOST, clock=PH_CLOCK, token_sha256=PH_SHA,
                                             probe_version="1.0", sections=sections))
        sample = Identity("ns", "vm-0", str(uuidlib.uuid4()), "a" * 64, 0)
        clock = int(time.time())
        body = fill(parts, [sample.uuid, sample.vmi, str(clock), sample.token_sha256])
        if body != render_report(uuid=sample.uuid, hostname=sample.vmi, clock=clock,
                                 token_sha256=sample.token_sha256, probe_version="1.0", sections=sections):
            raise RuntimeError(f"template of {smi} + {log} does not reproduce render_report")
        parse_report(body)  # raises ReportError if the fixture pair is not a valid report
        out.append(parts)
    return out


# ---------------------------------------------------------------------------------------------
# Server process: `python -m benchmarks.reports serve --mode endpoint|floor|limited`
# ---------------------------------------------------------------------------------------------
async def serve(mode: str, namespaces: int, per_namespace: int, cpu: int | None) -> None:
    """Serve until stdin closes; the signing key is the first stdin line (hex), never an argument."""
    from licensectl import config, logs
    from licensectl.controllers.guests import GuestStore
    from licensectl.core.readiness import Readiness
    from licensectl.metrics import Metrics
    from licensectl.serve.http import make_internal_app, start_site
    from licensectl.serve.reports import EndpointLimits, make_reports_app

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    logs.configure("json", config.Settings().log_level)  # the controller's default level
    loop = asyncio.get_running_loop()
    key = bytes.fromhex((await loop.run_in_executor(None, sys.stdin.readline)).strip())
    ring = KeyRing(current=key)
    ids = fleet(namespaces, per_namespace)
    index = {(i.namespace, i.uuid): i.vmi for i in ids}
    shas = {(i.namespace, i.vmi): i.token_sha256 for i in ids}
    live = [(i.namespace, i.vmi) for i in ids]
    metrics = Metrics()
    guests = GuestStore(config.Settings().report_interval_seconds)
    roll_trigger = asyncio.Event()

    def now() -> dt.datetime:
        return dt.datetime.now(dt.UTC)

    def on_report(namespace: str, vmi: str, state: Any) -> None:  # as App._on_report
        guests.record(namespace, vmi, state)
        roll_trigger.set()

    metrics.snapshots.add(lambda: guests.samples(now(), live))
    if mode == "floor":
        async def floor(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response({"result": "accepted"}, status=202)

        app = web.Application(client_max_size=DEFAULT_LIMITS.max_body_bytes + 1)
        app.router.add_post(REPORTS_PATH, floor)
    else:
        limits = EndpointLimits() if mode == "limited" else EndpointLimits(
            namespace_rate=UNLIMITED, namespace_burst=UNLIMITED, global_rate=UNLIMITED, global_burst=UNLIMITED)
        app = make_reports_app(
            keyring_provider=lambda: ring,
            uuid_known=lambda ns, u: index.get((ns, u.lower())),  # App._uuid_known: a dict over the VMI cache
            token_sha_for=lambda ns, vmi: shas.get((ns, vmi)),
            on_report=on_report,
            on_result=lambda r: metrics.reports_total.labels(r).inc(),
            limits=limits,
            clock=now,
        )
    up = Readiness(True, "ok")
    internal = make_internal_app(metrics, ready=lambda: up, live=lambda: up,
                                 status=lambda: {"guests": guests.counts(now(), live)})
    runners = []
    runner, reports_port = await start_site(app, "127.0.0.1:0")
    runners.append(runner)
    runner, metrics_port = await start_site(internal, "127.0.0.1:0")
    runners.append(runner)
    sys.stdout.write(json.dumps({"reports_port": reports_port, "metrics_port": metrics_port}) + "\n")
    sys.stdout.flush()
    await loop.run_in_executor(None, sys.stdin.read)  # until the harness closes stdin (or dies)
    for r in runners:
        await r.cleanup()


@dataclass
class Server:
    """A server process in one mode, its RSS sampled once a second while the load runs."""

    mode: str
    scale: ReportsScale
    key: bytes
    cpu: int | None
    proc: asyncio.subprocess.Process | None = None
    reports_port: int = 0
    metrics_port: int = 0
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> None:
        fd, path = tempfile.mkstemp(prefix=f"licensectl-bench-reports-{self.mode}-", suffix=".log")
        self.log_path = Path(path)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, "-m", "benchmarks.reports", "serve", "--mode", self.mode,
               "--namespaces", str(self.scale.namespaces), "--per-namespace", str(self.scale.per_namespace)]
        if self.cpu is not None:
            cmd += ["--cpu", str(self.cpu)]
        with os.fdopen(fd, "wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log, env=env,
                cwd=REPO_ROOT)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(self.key.hex().encode() + b"\n")
        await self.proc.stdin.drain()
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
            ports = json.loads(line)
        except (TimeoutError, ValueError):
            await self.stop()
            raise RuntimeError(f"{self.mode} server did not start:\n{self.log_tail()}") from None
        self.reports_port, self.metrics_port = int(ports["reports_port"]), int(ports["metrics_port"])

    def rss(self) -> int:
        return proc_memory(self.pid).get("VmRSS", 0)

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    async def scrape(self) -> Scrape:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s, \
                s.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as r:
            r.raise_for_status()
            return parse_metrics(await r.text(), time.monotonic())

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()


# ---------------------------------------------------------------------------------------------
# One load run
# ---------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    mode: str
    load: LoadResult
    rss_idle: int
    rss: list[tuple[float, int]]  # (seconds since load start, VmRSS)
    server_cpu: float  # seconds of CPU during the load
    client_cpu: float
    reflection: Reflection | None = None
    metric_accepted: float | None = None
    metric_results: Mapping[str, float] = dataclasses.field(default_factory=dict)


def _pin(cpus: set[int]) -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, cpus)


async def run_load(mode: str, scale: ReportsScale, key: bytes, script: Path, ids: Sequence[Identity],
                   server_cpu: int | None, client_cpus: set[int], wrk: str) -> RunResult:
    server = Server(mode, scale, key, server_cpu)
    await server.start()
    try:
        await asyncio.sleep(1.0)
        rss_idle = server.rss()
        url = f"http://127.0.0.1:{server.reports_port}{REPORTS_PATH}"
        cmd = [wrk, "-t", str(scale.connections), "-c", str(scale.connections), "-d", f"{scale.duration:.0f}s",
               "--timeout", "10s", "-s", str(script), url, "--", str(scale.connections)]
        progress(f"{mode}: {scale.duration:.0f}s of load, {scale.connections} connections")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu0 = proc_cpu_seconds(server.pid)
        start = time.monotonic()
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE,
                                                    preexec_fn=lambda: _pin(client_cpus))
        samples: list[tuple[float, int]] = []

        async def sample() -> None:
            while True:
                await asyncio.sleep(1.0)
                samples.append((time.monotonic() - start, server.rss()))

        sampler = asyncio.create_task(sample())
        try:
            out, err = await asyncio.wait_for(proc.communicate(), scale.duration + 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError("load generator did not finish in time") from None
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
        server_cpu_s = proc_cpu_seconds(server.pid) - cpu0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise RuntimeError(f"wrk exited with {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
        load = parse_load_output(out.decode(errors="replace"))
        result = RunResult(mode, load, rss_idle, samples, server_cpu_s,
                           (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime))
        if mode == "endpoint":
            await asyncio.sleep(0.5)  # let the server finish requests whose client went away
            snap = await server.scrape()
            result.metric_results = snap.by_label("licensectl_reports_total", "result")
            result.metric_accepted = snap.value("licensectl_reports_total", result="accepted")
            result.reflection = reflection(ids, load.accepted, load.unknown, store_clocks(snap))
        progress(f"{mode}: {load.requests:,} requests, {load.per_second:,.0f}/s, codes {fmt_codes(load.codes)}")
        return result
    finally:
        await server.stop()


# ---------------------------------------------------------------------------------------------
# The limiter with its default limits
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LimiterRow:
    scenario: str
    sent: int
    codes: Mapping[int, int]
    elapsed: float
    allowance: float
    retry_after_ok: bool


async def _burst(url: str, lanes: Sequence[Sequence[tuple[Identity, int]]], credentials: Mapping[str, str],
                 parts: Sequence[Sequence[bytes]]) -> tuple[Counter[int], float, bool]:
    """Send every lane concurrently, each lane in order (a VMI stays in one lane: no replays)."""
    codes: Counter[int] = Counter()
    retry_ok = True
    conn = aiohttp.TCPConnector(limit=len(lanes))
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=30)) as s:
        async def worker(lane: Sequence[tuple[Identity, int]]) -> None:
            nonlocal retry_ok
            for ident, clock in lane:
                body = fill(parts[ident.variant], [ident.uuid, ident.vmi, str(clock), ident.token_sha256])
                headers = {"Authorization": f"Bearer {credentials[ident.namespace]}",
                           NAMESPACE_HEADER: ident.namespace, "Content-Type": CONTENT_TYPE}
                async with s.post(url, data=body, headers=headers) as r:
                    await r.read()
                    codes[r.status] += 1
                    if r.status == 429 and not r.headers.get("Retry-After", "").isdigit():
                        retry_ok = False

        start = time.monotonic()
        await asyncio.gather(*(worker(lane) for lane in lanes))
        return codes, time.monotonic() - start, retry_ok


async def run_limiter(scale: ReportsScale, key: bytes, ids: Sequence[Identity], credentials: Mapping[str, str],
                      parts: Sequence[Sequence[bytes]], server_cpu: int | None) -> list[LimiterRow]:
    """Default EndpointLimits: one namespace bursting past its bucket, then the whole fleet past the global one."""
    from licensectl.serve.reports import EndpointLimits

    lim = EndpointLimits()
    base = int(time.time()) - 60
    rows: list[LimiterRow] = []
    by_ns: dict[str, list[Identity]] = {}
    for i in ids:
        by_ns.setdefault(i.namespace, []).append(i)
    namespaces = sorted(by_ns)

    # 1. One namespace sends 100 reports at once (its VMIs in turn, clocks increasing).
    burst_n = int(lim.namespace_burst) + 40
    one = by_ns[namespaces[0]]
    lanes = [[(vm, base + 1 + k) for k in range(-(-burst_n // len(one)))] for vm in one]
    burst_n = sum(len(lane) for lane in lanes)
    server = Server("limited", scale, key, server_cpu)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.reports_port}{REPORTS_PATH}"
        codes, elapsed, retry_ok = await _burst(url, lanes, credentials, parts)
        rows.append(LimiterRow(f"one namespace, burst of {burst_n}", burst_n, codes, elapsed,
                               bucket_allowance(lim.namespace_burst, lim.namespace_rate, elapsed), retry_ok))
        other = by_ns[namespaces[1]][0]
        codes, elapsed, retry_ok = await _burst(url, [[(other, base + 1)]], credentials, parts)
        rows.append(LimiterRow("then another namespace", 1, codes, elapsed,
                               bucket_allowance(lim.namespace_burst, lim.namespace_rate, elapsed), retry_ok))
    finally:
        await server.stop()

    # 2. A fresh server: one report per VMI across the fleet, past the global burst.
    global_n = min(len(ids), int(lim.global_burst) + 500)
    server = Server("limited", scale, key, server_cpu)
    await server.start()
    try:
        url = f"http://127.0.0.1:{server.reports_port}{REPORTS_PATH}"
        lanes = [[(i, base + 1) for i in ids[w:global_n:16]] for w in range(16)]
        codes, elapsed, retry_ok = await _burst(url, lanes, credentials, parts)
        rows.append(LimiterRow(f"{global_n:,} VMIs in {global_n // scale.per_namespace:,} namespaces, one report each",
                               global_n, codes, elapsed,
                               bucket_allowance(lim.global_burst, lim.global_rate, elapsed), retry_ok))
    finally:
        await server.stop()
    return rows


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------
def _rss_cells(r: RunResult) -> list[str]:
    values = [v for _, v in r.rss]
    second_half = [(t, v) for t, v in r.rss if t >= (r.rss[-1][0] / 2 if r.rss else 0)]
    return [
        fmt_mib(r.rss_idle),
        " / ".join(fmt_mib(x) for x in (values[0], max(values), values[-1])) if values else "n/a",
        f"{fmt_slope(slope_per_second(r.rss))} (2nd half {fmt_slope(slope_per_second(second_half))})",
    ]


def load_table(scale_name: str, scale: ReportsScale, floor: RunResult, endpoint: RunResult,
               variants_bytes: Sequence[int]) -> str:
    def col(r: RunResult) -> list[str]:
        load = r.load
        other = {k: v for k, v in load.codes.items() if k != 202}
        return [
            f"{load.requests:,} in {load.duration:.1f} s",
            f"{load.codes.get(202, 0):,}",
            fmt_codes(other),
            f"{load.socket_errors:,}" + (f" (count bound hit by {load.capped_threads} threads)"
                                          if load.capped_threads else ""),
            f"{load.per_second:,.0f}",
            *(fmt_ms(load.latency[p]) for p in ("p50", "p90", "p99", "max")),
            f"{100 * r.server_cpu / load.duration:.0f}%" if load.duration else "n/a",
            fmt_num(ratio(load.requests, r.server_cpu), 0),
            f"{100 * r.client_cpu / load.duration:.0f}%" if load.duration else "n/a",
            *_rss_cells(r),
        ]

    labels = ["requests", "202 accepted", "other status codes", "socket errors", "reports/s",
              "latency p50", "latency p90", "latency p99", "latency max", "server CPU (1 core = 100%)",
              "reports per server CPU-second", "load generator CPU", "RSS idle before load",
              "RSS start / peak / end", "RSS slope"]
    rows = [[label, f, e] for label, f, e in zip(labels, col(floor), col(endpoint), strict=True)]
    r = ratio(endpoint.load.per_second, floor.load.per_second)
    rows.insert(5, ["ratio to floor", "1.00x", fmt_ratio(r)])
    per_cpu_endpoint = ratio(endpoint.load.requests, endpoint.server_cpu) or 0.0
    per_cpu = ratio(per_cpu_endpoint, ratio(floor.load.requests, floor.server_cpu) or 0.0)
    rows.insert(6, [f"goal >= {GOAL_PER_SECOND:,}/s on one core", "",
                    f"wall clock: {_met(endpoint.load.per_second)}; per server CPU-second: {_met(per_cpu_endpoint)}"])
    rows.insert(13, ["ratio to floor per server CPU-second", "1.00x", fmt_ratio(per_cpu)])
    rows.insert(13, [f"server had its core (>= {BUSY_CORE:.0%} busy)", *(_had_core(r) for r in (floor, endpoint))])
    title = (f"Guest-report endpoint [{scale_name}]: {scale.duration:.0f} s loopback load per server, "
             f"{scale.connections} keep-alive connections, server pinned to 1 core, "
             f"{scale.namespaces:,} namespaces x {scale.per_namespace} VMIs, "
             f"{len(VARIANTS)} fixture payloads of {min(variants_bytes):,}-{max(variants_bytes):,} bytes")
    return format_table(title, ["", "raw aiohttp floor (read body, 202)", "POST /v1/reports (auth + parse + store)"],
                        rows)


def _had_core(r: RunResult) -> str:
    if r.load.duration and r.server_cpu / r.load.duration >= BUSY_CORE:
        return "yes"
    return "no: other work shares the core, compare per CPU-second"


def _met(per_second: float) -> str:
    return f"{'met' if per_second >= GOAL_PER_SECOND else 'not met'} ({per_second:,.0f}/s)"


def reflection_table(r: RunResult) -> str:
    ref = r.reflection
    assert ref is not None
    seen = r.load.codes.get(202, 0)
    rows = [
        ["202 responses seen by the client", f"{seen:,}"],
        ['licensectl_reports_total{result="accepted"}', fmt_num(r.metric_accepted)],
        ["licensectl_reports_total by result", ", ".join(f"{k} {fmt_num(v)}" for k, v in
                                                         sorted(r.metric_results.items())) or "none"],
        ["requests without a response (in flight at the end, or lost)", f"{len(r.load.unknown):,}"],
        ["  of which accepted (their report is the VMI's current state)", f"{ref.landed:,}"],
        ["VMIs with an accepted report", f"{ref.accepted_vmis:,}"],
        ["VMIs whose guest series carry their last accepted report", f"{ref.reflected:,}"],
        ["missing / stale / unexpected", f"{ref.missing:,} / {ref.stale:,} / {ref.unexpected:,}"],
        ["result", "OK" if accepted_matches(r) else "MISMATCH"],
    ]
    return format_table("Accepted vs reflected (endpoint run, read from /metrics)", ["check", "value"], rows)


def accepted_matches(r: RunResult) -> bool:
    return (r.reflection is not None and r.metric_accepted is not None and r.reflection.ok
            and counts_agree(r.load.codes.get(202, 0), r.metric_accepted, r.reflection, len(r.load.unknown),
                             r.load.socket_errors))


def limiter_table(rows: Sequence[LimiterRow]) -> str:
    from licensectl.serve.reports import EndpointLimits

    lim = EndpointLimits()
    return format_table(
        f"Rate limiter at its defaults (per namespace {lim.namespace_rate:g}/s burst {lim.namespace_burst:g}, "
        f"global {lim.global_rate:g}/s burst {lim.global_burst:g})",
        ["scenario", "sent", "202", "429", "other", "bucket allowance (burst + rate x elapsed)", "Retry-After on 429"],
        [[r.scenario, f"{r.sent:,}", f"{r.codes.get(202, 0):,}", f"{r.codes.get(429, 0):,}",
          fmt_codes({k: v for k, v in r.codes.items() if k not in (202, 429)}),
          f"{r.allowance:,.1f} over {r.elapsed:.2f} s", "yes" if r.retry_after_ok else "NO"] for r in rows])


def loadavg() -> str:
    """1-minute load average: other work on the machine skews every number here."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except (OSError, IndexError):
        return "n/a"


def machine_table(wrk_version: str, load_before: str, load_after: str) -> str:
    return format_table("Machine", ["item", "value"], [
        ["cores", str(os.cpu_count())],
        ["cpu", cpu_model()],
        ["load average (1 min) before / after", f"{load_before} / {load_after}"],
        ["python", f"{platform.python_implementation()} {platform.python_version()}"],
        ["aiohttp", aiohttp.__version__],
        ["load generator", wrk_version],
        ["licensectl", __version__],
        ["kernel", platform.release()],
    ])


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------
def _cpus() -> tuple[int | None, set[int]]:
    """Server core and load-generator cores: the first allowed core, and the others."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None, set(allowed)
    return allowed[0], set(allowed[1:])


def find_wrk() -> tuple[str, str]:
    """Path and version of wrk, the load generator (a C client, so the floor is not client-bound)."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed (Debian/Ubuntu: apt-get install wrk)")
    out = subprocess.run([wrk, "--version"], capture_output=True, text=True, check=False).stdout
    return wrk, re.sub(r"\s+Copyright.*", "", (out.splitlines() or ["wrk"])[0])


async def run(scale_name: str, scale: ReportsScale) -> tuple[str, bool]:
    """Floor, endpoint and limiter runs; returns (tables, accepted == reflected)."""
    wrk, wrk_version = find_wrk()
    load_before = loadavg()
    if scale.connections > scale.namespaces * scale.per_namespace:
        raise ValueError("need at least one identity per connection")
    server_cpu, client_cpus = _cpus()
    os.sched_setaffinity(0, client_cpus)  # keep this process off the server's core
    ids = fleet(scale.namespaces, scale.per_namespace)
    parts = templates()
    key = secrets.token_bytes(32)
    credentials = {i.namespace: derive_credential(key, i.namespace) for i in ids}
    total, per_vmi = count_bound(scale.duration, len(ids))
    base = clock_base(int(time.time()), per_vmi)
    sizes = [len(fill(p, [ids[0].uuid, ids[0].vmi, str(base), ids[0].token_sha256])) for p in parts]
    with tempfile.TemporaryDirectory(prefix="licensectl-bench-reports-") as tmp:
        script = Path(tmp) / "load.lua"
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # holds credentials
        with os.fdopen(fd, "w") as f:
            f.write(lua_script(ids, parts, credentials, base_clock=base,
                               per_thread_cap=-(-total // scale.connections)))
        floor = await run_load("floor", scale, key, script, ids, server_cpu, client_cpus, wrk)
        endpoint = await run_load("endpoint", scale, key, script, ids, server_cpu, client_cpus, wrk)
    progress("limiter: default limits")
    limiter = await run_limiter(scale, key, ids, credentials, parts, server_cpu)
    ok = accepted_matches(endpoint)
    tables = [load_table(scale_name, scale, floor, endpoint, sizes), reflection_table(endpoint),
              limiter_table(limiter), machine_table(wrk_version, load_before, loadavg())]
    return "\n\n".join(tables), ok


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks reports",
                                description="Guest-report endpoint throughput, latency and RSS on one core.")
    p.add_argument("--scale", default="small", choices=tuple(SCALES),
                   help="small: 10 s per server (quick); full: 60 s per server")
    p.add_argument("--duration", type=float, help="seconds of load per server (overrides the scale)")
    p.add_argument("--connections", type=int, help="concurrent keep-alive connections (one wrk thread each)")
    p.add_argument("--namespaces", type=int)
    p.add_argument("--per-namespace", type=int)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchmarks reports ...`; exits 1 when an accepted report is not reflected."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        sp = argparse.ArgumentParser(prog="python -m benchmarks.reports serve")
        sp.add_argument("--mode", required=True, choices=("endpoint", "floor", "limited"))
        sp.add_argument("--namespaces", type=int, required=True)
        sp.add_argument("--per-namespace", type=int, required=True)
        sp.add_argument("--cpu", type=int)
        a = sp.parse_args(args[1:])
        asyncio.run(serve(a.mode, a.namespaces, a.per_namespace, a.cpu))
        return 0
    from licensectl import logs

    a = _parser().parse_args(args)
    base = SCALES[a.scale]
    scale = ReportsScale(
        duration=a.duration if a.duration is not None else base.duration,
        connections=a.connections or base.connections,
        namespaces=a.namespaces or base.namespaces,
        per_namespace=a.per_namespace or base.per_namespace,
    )
    logs.configure("console", "warning", stream=sys.stderr)
    tables, ok = asyncio.run(run(a.scale, scale))
    print(tables, flush=True)
    if not ok:
        progress("accepted reports and reflected guest state differ")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
