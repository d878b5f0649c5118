"""`python -m benchmarks [replication|rollout|admission|peer|all] [--scale small|full|xl] [--controller-from REV]`,
`python -m benchmarks reports ...`.

Each benchmark gets a fresh local control plane (etcd + kube-apiserver + kube-controller-manager),
so one cannot skew the other; everything is torn down at the end, also on errors and Ctrl-C.
`--controller-from REV` runs the controller processes from another git revision's package (same
fleet, floors and benchmark code): the "before" half of a before/after table.
`all` also runs the guest-report load (no control plane; `xl` runs it at `full`), so one command
prints every figure with its same-run baseline. Tables go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from benchmarks import admission, memory, peer, replication, reports, rollout
from benchmarks.common import THIS_TREE, ControllerBuild, format_table, machine_rows, progress
from licensectl import logs
from licensectl_dev.devcluster.controlplane import ETCD_VERSION, ControlPlane
from licensectl_dev.testkit.process import extract_package

Runner = Callable[[ControlPlane, str, ControllerBuild], Coroutine[Any, Any, str]]
BENCHMARKS: dict[str, Runner] = {"replication": replication.run, "rollout": rollout.run, "admission": admission.run,
                                  "peer": peer.run}
# Named only, never part of `all`: the Go peer comparison builds a Go program and runs N=3,000 at every scale.
OPT_IN = frozenset({"peer"})


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("which", nargs="?", default="all", choices=(*BENCHMARKS, "all"))
    p.add_argument("--scale", default="small", choices=("small", "full", "xl"),
                   help="xl (20,000 tenants / 50,000 VMIs) is opt-in: ~10 min for replication, hours for the "
                        "rollout on 2 cores")
    p.add_argument("--controller-from", metavar="REV", default=None,
                   help="run the controller from this git revision's licensectl package (a before/after "
                        "comparison: same fleet, floors and benchmark code); the guest-report load of `all` "
                        "always measures this tree")
    p.add_argument("--tracemalloc", action="store_true",
                   help="replication: run the controller with PYTHONTRACEMALLOC=1 and print its /debug/memory "
                        "(allocation sites) after the steady state; tracing slows it, so its timings are not "
                        "comparable")
    p.add_argument("--profile", action="store_true",
                   help="replication and peer: sample the controller with py-spy during the cold start and the "
                        "rotation and print its top functions by CPU (the sampler runs in its own process)")
    return p


def run_one(name: str, scale: str, build: ControllerBuild = THIS_TREE) -> tuple[str, str]:
    """Run one benchmark on its own control plane; returns (apiserver version, table)."""
    started = time.monotonic()
    with ControlPlane(log=progress) as cp:
        table = asyncio.run(BENCHMARKS[name](cp, scale, build))
        version = cp.version
    progress(f"{name}[{scale}] finished in {time.monotonic() - started:.0f}s (control plane stopped)")
    return version, table


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["reports"]:
        return reports.main(argv[1:])  # no control plane: a loopback load on the report endpoint
    if argv[:1] == ["memory"]:
        return memory.main(argv[1:])  # no control plane: tracemalloc over the informer caches
    args = _parser().parse_args(argv)
    logs.configure("console", "warning", stream=sys.stderr)  # library logs must not mix with the tables
    names = [n for n in BENCHMARKS if n not in OPT_IN] if args.which == "all" else [args.which]
    version = "unknown"
    with tempfile.TemporaryDirectory(prefix="licensectl-bench-build-") as scratch:
        build = THIS_TREE
        if args.controller_from:
            tree = extract_package(args.controller_from, Path(scratch))
            build = ControllerBuild(label=f"git revision {args.controller_from}", tree=tree)
            progress(f"controller processes run {build.label} from {tree}")
        if args.tracemalloc:
            build = dataclasses.replace(build, tracemalloc=True, label=f"{build.label}, allocation tracing on")
        if args.profile:
            build = dataclasses.replace(build, profile=True)
        for name in names:
            version, table = run_one(name, args.scale, build)
            print(table + "\n", flush=True)
        print(format_table("Machine", ["item", "value"], machine_rows(version, ETCD_VERSION, build)), flush=True)
    if args.which == "all":
        report_scale = "full" if args.scale == "xl" else args.scale
        tables, ok = asyncio.run(reports.run(report_scale, reports.SCALES[report_scale]))
        print("\n" + tables, flush=True)
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
