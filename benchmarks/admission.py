"""Admission latency the webhook adds to VMI creation, at a fixed creation rate, on the real apiserver.

Rounds alternate three phases on one control plane and one running controller (a real process, HTTPS
webhook, its own CA): the same VMI creations with no webhook registered (the baseline), with a no-op
HTTPS webhook (aiohttp, its own process: what any webhook costs on this machine), then with
licensectl's webhook registered. Figures per phase: the client-side create latency (p50/p99) and,
with the webhook, the apiserver's own `apiserver_admission_webhook_admission_duration_seconds` for
licensectl's webhook and the controller's in-process answer time. The added latency is the
difference of the two phases' create latencies. Ratios and differences only: nothing is asserted.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi

from benchmarks.common import THIS_TREE, ControllerBuild, fmt_num, format_table, make_client, progress
from licensectl.core import certs
from licensectl_dev.devcluster import webhook as registration
from licensectl_dev.devcluster.controlplane import ControlPlane, free_port
from licensectl_dev.devcluster.kubeapi import install_crds
from licensectl_dev.testkit.controller import ControllerProcess
from licensectl_dev.testkit.metrics_text import Scrape
from licensectl_dev.testkit.poll import eventually
from licensectl_dev.testkit.process import ManagedProcess
from licensectl_dev.testkit.world import World, build_world

RATE = 50.0  # VMI creations per second (the goal is stated at this rate)
SCALES: dict[str, dict[str, int]] = {
    "small": {"seconds": 4, "rounds": 2},
    "full": {"seconds": 20, "rounds": 3},
    "xl": {"seconds": 20, "rounds": 3},
}
GOAL_P99_ADDED_MS = 10.0


def vmi(name: str) -> dict[str, Any]:
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": name},
            "spec": {"domain": {"devices": {"gpus": [{"name": "g0", "claimName": "c0", "requestName": "gpu"}],
                                            "disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                                "resources": {"requests": {"memory": "1Gi"}}},
                     "resourceClaims": [{"name": "c0", "resourceClaimName": "gpu"}],
                     "volumes": [{"name": "root", "containerDisk": {"image": "example/os:1"}}]}}


async def create_at_rate(api: ApiClient, ns: str, prefix: str, *, count: int) -> tuple[list[float], int]:
    """`count` creations started every 1/RATE s (open loop: a slow answer does not slow the rate).
    Returns the latencies (s) and how many VMIs came back with a license volume."""
    co = CustomObjectsApi(api)
    latencies: list[float] = []
    delivered = 0

    async def one(i: int) -> None:
        nonlocal delivered
        t = time.perf_counter()
        obj = await co.create_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachineinstances",
                                                       vmi(f"{prefix}-{i}"))
        latencies.append(time.perf_counter() - t)
        if any("secret" in v for v in obj["spec"].get("volumes", [])):
            delivered += 1

    start = time.perf_counter()
    tasks = []
    for i in range(count):
        delay = start + i / RATE - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return latencies, delivered


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile over cumulative (le, count) buckets, linear within a bucket."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_count) / (count - prev_count) if count > prev_count else 0)
        prev_le, prev_count = le, count
    return prev_le


def buckets_of(scrape: Scrape, metric: str, **labels: str) -> list[tuple[float, float]]:
    """Cumulative (le, count) buckets of histogram `metric`, summed over the series matching `labels`."""
    bucket = f"{metric}_bucket"
    return sorted((float(le), scrape.value(bucket, le=le, **labels)) for le in scrape.by_label(bucket, "le"))


async def apiserver_webhook_buckets(api: ApiClient, name: str) -> list[tuple[float, float]]:
    return buckets_of(await registration.apiserver_metrics(api),
                      "apiserver_admission_webhook_admission_duration_seconds", name=registration.webhook_name(name))


def diff_buckets(after: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[tuple[float, float]]:
    b = dict(before)
    return [(le, c - b.get(le, 0.0)) for le, c in after]


async def controller_buckets(ctl: ControllerProcess) -> list[tuple[float, float]]:
    return buckets_of(await ctl.must_scrape(), "licensectl_webhook_duration_seconds")


async def run(cp: ControlPlane, scale: str, build: ControllerBuild = THIS_TREE) -> str:
    sc = SCALES[scale]
    count = int(sc["seconds"] * RATE)
    api = await make_client(cp.kubeconfig_path, pool=64)
    logs = tempfile.TemporaryDirectory(prefix="licensectl-bench-admission-")
    ctl: ControllerProcess | None = None
    try:
        await install_crds(api)
        w = await build_world(api, world_type=World, token_days=90)
        tenant = (await w.tenant(claim=True))["metadata"]["name"]
        ctl = ControllerProcess(cp.kubeconfig_path, w.controller_ns, log_dir=Path(logs.name), name="admission",
                                settings={"log_level": "warning", "root_tenant": w.root_name}, webhook_api=api,
                                tree=build.tree)
        await ctl.start()
        await ctl.wait_ready()
        await ctl.webhook_registered()
        await registration.wait_delivery(api, namespace=tenant, claim="gpu")
        name = ctl.webhook_configuration
        base: list[float] = []
        noop: list[float] = []
        hooked: list[float] = []
        null_name = f"{name}-noop"
        null = await _start_null_webhook(api, w.controller_ns, Path(logs.name))
        delivered = 0
        hooked_total = 0
        api_buckets: list[tuple[float, float]] = []
        ctl_buckets: list[tuple[float, float]] = []
        before_posts = (await ctl.must_scrape()).value("licensectl_api_requests_total", verb="POST") or 0.0
        for r in range(sc["rounds"]):
            await registration.unregister(api, name)
            await asyncio.sleep(2.0)  # the apiserver drops the configuration through its own watch
            lat, _ = await create_at_rate(api, tenant, f"b{r}", count=count)
            base += lat
            progress(f"admission round {r + 1}: baseline p50 {pct(lat, 0.5) * 1000:.1f} ms")
            await registration.register(api, name=null_name, port=null[1], ca_bundle=await _ca(api, w.controller_ns))
            lat, _ = await create_at_rate(api, tenant, f"n{r}", count=count)
            noop += lat
            await registration.unregister(api, null_name)
            progress(f"admission round {r + 1}: no-op webhook p50 {pct(lat, 0.5) * 1000:.1f} ms")
            await registration.register(api, name=name, port=ctl.webhook_port,
                                        ca_bundle=await _ca(api, w.controller_ns))
            await registration.wait_delivery(api, namespace=tenant, claim="gpu")
            a0 = await apiserver_webhook_buckets(api, name)
            c0 = await controller_buckets(ctl)
            lat, ok = await create_at_rate(api, tenant, f"w{r}", count=count)
            api_buckets = _add(api_buckets, diff_buckets(await apiserver_webhook_buckets(api, name), a0))
            ctl_buckets = _add(ctl_buckets, diff_buckets(await controller_buckets(ctl), c0))
            hooked += lat
            delivered += ok
            hooked_total += count
            progress(f"admission round {r + 1}: webhook p50 {pct(lat, 0.5) * 1000:.1f} ms, {ok}/{count} delivered")
        posts = ((await ctl.must_scrape()).value("licensectl_api_requests_total", verb="POST") or 0.0) - before_posts
        await null[0].stop()
        return _table(scale, count=count, rounds=sc["rounds"], base=base, noop=noop, hooked=hooked,
                      delivered=delivered,
                      hooked_total=hooked_total, api_buckets=api_buckets, ctl_buckets=ctl_buckets, posts=posts)
    finally:
        if ctl is not None:
            await ctl.close()
        logs.cleanup()
        await api.close()


async def _ca(api: ApiClient, namespace: str) -> bytes:
    s = await CoreV1Api(api).read_namespaced_secret("licensectl-tls", namespace)
    return base64.b64decode((s.data or {})["ca.crt"])


def _add(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    d = dict(a)
    for le, c in b:
        d[le] = d.get(le, 0.0) + c
    return sorted(d.items())


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 1000:.1f} ms"


def _table(scale: str, *, count: int, rounds: int, base: list[float], noop: list[float], hooked: list[float],
           delivered: int,
           hooked_total: int, api_buckets: list[tuple[float, float]], ctl_buckets: list[tuple[float, float]],
           posts: float) -> str:
    added50 = pct(hooked, 0.5) - pct(base, 0.5)
    added99 = pct(hooked, 0.99) - pct(base, 0.99)
    rows = [
        ["creates per phase", f"{count} x {rounds} rounds at {RATE:.0f}/s", ""],
        ["create latency, no webhook (baseline)", f"p50 {_ms(pct(base, 0.5))}, p99 {_ms(pct(base, 0.99))}",
         f"mean {_ms(statistics.fmean(base))}"],
        ["create latency, webhook registered", f"p50 {_ms(pct(hooked, 0.5))}, p99 {_ms(pct(hooked, 0.99))}",
         f"mean {_ms(statistics.fmean(hooked))}"],
        ["create latency, no-op HTTPS webhook", f"p50 {_ms(pct(noop, 0.5))}, p99 {_ms(pct(noop, 0.99))}",
         "any webhook's floor on this machine"],
        ["added latency (webhook - baseline)", f"p50 {_ms(added50)}, p99 {_ms(added99)}",
         f"goal p99 <= {GOAL_P99_ADDED_MS:.0f} ms: {'met' if added99 * 1000 <= GOAL_P99_ADDED_MS else 'NOT met'}"],
        ["licensectl's own share (webhook - no-op)",
         f"p50 {_ms(pct(hooked, 0.5) - pct(noop, 0.5))}, p99 {_ms(pct(hooked, 0.99) - pct(noop, 0.99))}", ""],
        ["apiserver webhook admission duration", f"p50 {_ms(histogram_quantile(api_buckets, 0.5))}, "
         f"p99 {_ms(histogram_quantile(api_buckets, 0.99))}", "apiserver buckets: 5/25/100 ms, interpolated"],
        ["controller answer time (in-process)", f"p50 {_ms(histogram_quantile(ctl_buckets, 0.5))}, "
         f"p99 {_ms(histogram_quantile(ctl_buckets, 0.99))}", "licensectl_webhook_duration_seconds"],
        ["VMIs given the license volume", f"{delivered}/{hooked_total}", ""],
        ["controller POSTs during the run", fmt_num(posts, 0), "Events/writes on the admission path"],
    ]
    return format_table(f"Admission webhook [{scale}]", ["measure", "value", "note"], rows)


async def _start_null_webhook(api: ApiClient, namespace: str, workdir: Path) -> tuple[ManagedProcess, int]:
    """The no-op webhook as its own process, with a leaf from licensectl's own CA (same trust path)."""
    s = await CoreV1Api(api).read_namespaced_secret("licensectl-tls", namespace)
    data = {k: base64.b64decode(v) for k, v in (s.data or {}).items()}
    leaf = certs.new_leaf(certs.KeyPair(cert_pem=data["ca.crt"], key_pem=data["ca.key"]), ["127.0.0.1"],
                          now=dt.datetime.now(dt.UTC))
    cert, key = workdir / "noop.crt", workdir / "noop.key"
    cert.write_bytes(leaf.cert_pem)
    key.write_bytes(leaf.key_pem)
    key.chmod(0o600)
    port = free_port()
    proc = ManagedProcess([sys.executable, "-m", "benchmarks.null_webhook", str(port), str(cert), str(key)],
                          log_path=workdir / "noop.log", name="noop-webhook")
    proc.start()
    await wait_port(port)
    return proc, port


async def wait_port(port: int, timeout: float = 30.0) -> None:  # noqa: ASYNC109
    async def listening() -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        writer.close()
        return True

    await eventually(listening, timeout=timeout, what=f"no-op webhook listening on {port}")
