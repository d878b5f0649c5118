"""`python -m tests.faults --mode short|long`: run every fault scenario, the bad-inputs catalogue and
the fuzzers on a fresh local control plane, then print the figures table.

Exit status 1 on any invariant violation, unhandled bad input or fuzz failure. Progress goes to
stderr, the table to stdout. `--only NAME` (repeatable) and `--seed N` re-run a single case.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from licensectl import logs
from licensectl_dev.devcluster.controlplane import ControlPlane
from licensectl_dev.testkit.process import REPO_ROOT, end_leaked_processes

from .scenarios import SCENARIOS, Env, Outcome, run_scenario
from .test_fuzz import FUZZERS, FuzzResult
from .toolkit import admin_client

LONG_FUZZ_EXAMPLES = 5000
SHORT_FUZZ_EXAMPLES = 300


def progress(msg: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [f"### {title}", "", line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def _notes(outcomes: Sequence[Outcome]) -> str:
    keys: dict[str, float] = {}
    for o in outcomes:
        for k, v in o.notes.items():
            if isinstance(v, bool):
                v = int(v)
            if isinstance(v, (int, float)) and k != "texts_scanned":
                keys[k] = keys.get(k, 0) + v
    return ", ".join(f"{k}={v:g}" for k, v in sorted(keys.items()))


def load_figure(mode: str) -> str:
    """The report-endpoint load benchmark (benchmarks/reports.py) for a short duration, if present."""
    if importlib.util.find_spec("benchmarks.reports") is None:
        return "n/a (benchmarks/reports.py not present)"
    duration = "60" if mode == "long" else "10"
    try:
        out = subprocess.run([sys.executable, "-m", "benchmarks", "reports", "--duration", duration],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"n/a ({type(e).__name__})"
    if out.returncode != 0:
        return f"n/a (benchmark exited {out.returncode})"
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    return "\n".join(lines[-60:]) if lines else "n/a (no output)"


async def run_all(cp: ControlPlane, args: argparse.Namespace, workdir: Path) -> tuple[list[Outcome],
                                                                                         list[tuple[str, bool, str]]]:
    from .test_bad_inputs import run_catalogue

    outcomes: list[Outcome] = []
    bad: list[tuple[str, bool, str]] = []
    async with admin_client(cp) as api:
        if not args.skip_bad_inputs and not args.only:
            progress("bad-inputs catalogue ...")
            bad = await run_catalogue(api, cp.kubeconfig_path)
            for name, ok, detail in bad:
                if not ok:
                    progress(f"  UNHANDLED {name}: {detail}")
        for name, spec in SCENARIOS.items():
            if args.only and name not in args.only:
                continue
            seeds = [args.seed] if args.seed is not None else list(
                spec.long_seeds if args.mode == "long" else spec.short_seeds)
            for seed in seeds:
                d = workdir / f"{name}-{seed}"
                d.mkdir(parents=True, exist_ok=True)
                progress(f"{name} seed {seed} ...")
                o = await run_scenario(Env(cp, api, d), spec, seed, args.mode)
                outcomes.append(o)
                progress(f"{name} seed {seed}: {len(o.verdict.violations)} violations in {o.seconds:.0f}s "
                         f"{o.notes}")
                for v in o.verdict.violations:
                    progress(f"  VIOLATION {v}")
    return outcomes, bad


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.faults", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--mode", choices=("short", "long"), default="short")
    p.add_argument("--only", action="append", choices=sorted(SCENARIOS), help="run only this scenario")
    p.add_argument("--seed", type=int, default=None, help="run only this seed")
    p.add_argument("--skip-bad-inputs", action="store_true")
    p.add_argument("--no-load", action="store_true", help="skip the report-endpoint load figure")
    p.add_argument("--keep", default=None, help="keep controller logs in this directory")
    args = p.parse_args(argv)
    logs.configure("console", "warning", stream=sys.stderr)
    started = time.monotonic()

    fuzz: list[FuzzResult] = []
    if not args.only:
        n = LONG_FUZZ_EXAMPLES if args.mode == "long" else SHORT_FUZZ_EXAMPLES
        for name, fn in FUZZERS.items():
            progress(f"fuzz {name} ({n} examples) ...")
            fuzz.append(fn(int(os.environ.get("LICENSECTL_FUZZ_EXAMPLES", n))))

    with tempfile.TemporaryDirectory(prefix="licensectl-faults-") as tmp:
        workdir = Path(args.keep) if args.keep else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        with ControlPlane(log=progress) as cp:
            outcomes, bad = asyncio.run(run_all(cp, args, workdir))

    rows = []
    for name in SCENARIOS:
        mine = [o for o in outcomes if o.scenario == name]
        if not mine:
            continue
        violations = sum(len(o.verdict.violations) for o in mine)
        checks = sum(sum(o.verdict.checks.values()) for o in mine)
        rows.append([name, str(len(mine)), str(checks), str(violations),
                     f"{sum(o.seconds for o in mine):.0f}s", _notes(mine)])
    print(table(f"Fault scenarios ({args.mode} mode)",
                ["scenario", "runs", "checks", "invariant violations", "time", "faults / figures"], rows))
    print()
    if bad:
        handled = sum(1 for _, ok, _ in bad if ok)
        print(table("Bad inputs", ["tried", "handled", "unhandled"],
                    [[str(len(bad)), str(handled), ", ".join(n for n, ok, _ in bad if not ok) or "-"]]))
        print()
    if fuzz:
        print(table("Fuzz", ["target", "examples", "failures"],
                    [[f.name, str(f.examples), str(f.failures)] for f in fuzz]))
        print()
    if not args.only and not args.no_load:
        progress("report-endpoint load ...")
        print("### Load held (report endpoint)\n")
        print(load_figure(args.mode))
        print()
    total_violations = sum(len(o.verdict.violations) for o in outcomes)
    leaked = end_leaked_processes()  # every scenario ends what it started; a survivor is a failure
    for line in leaked:
        progress(f"LEAKED PROCESS (killed now): {line}")
    failed = total_violations + sum(1 for _, ok, _ in bad if not ok) + sum(f.failures for f in fuzz) + len(leaked)
    print(f"total: {len(outcomes)} scenario runs, {total_violations} invariant violations, "
          f"{sum(1 for _, ok, _ in bad if not ok)} unhandled bad inputs, {sum(f.failures for f in fuzz)} fuzz "
          f"failures, {time.monotonic() - started:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
