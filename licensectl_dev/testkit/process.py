"""The one subprocess launcher of the tests, fault scenarios and benchmarks.

Every process starts in its own session (so its own process group) and is ended as a group: a
wrapper such as `faketime` forks the real program, and ending only the wrapper's PID leaves that
program running, orphaned, long after the test. Every group started is kept in a registry until it
is seen empty, so a test session can check at its end that nothing it started is still alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]

# Variables that would configure a child behind the test's back: licensectl reads LICENSECTL_*,
# the in-cluster config reads KUBERNETES_SERVICE_*, kubeconfig loading reads KUBECONFIG.
_ENV_PREFIXES_DROPPED = ("LICENSECTL_", "KUBERNETES_SERVICE_")
_ENV_DROPPED = frozenset({"KUBECONFIG"})


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: this one minus what would configure it implicitly.

    Only flags configure a launched controller; the repository is importable whatever the cwd;
    output is unbuffered so a log read after a crash is complete.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(_ENV_PREFIXES_DROPPED) and k not in _ENV_DROPPED}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def extract_package(rev: str, dest: Path) -> Path:
    """The `licensectl` package of git revision `rev`, extracted into `dest` (a full clone is needed).

    Another version runs from it with this interpreter and virtualenv: PYTHONPATH=dest and dest as the
    working directory (`python -m` puts the cwd first on sys.path), as `ControllerProcess(tree=...)`
    does. Used by the upgrade test and by the benchmarks' before/after comparison."""
    res = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", rev, "licensectl"],
                         capture_output=True, check=False, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"`git archive {rev}` failed (is this a full clone with that commit?): "
                           + res.stderr.decode(errors="replace")[-500:])
    with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tar:
        tar.extractall(dest, filter="data")
    if not (dest / "licensectl" / "__main__.py").is_file():
        raise RuntimeError(f"revision {rev} has no runnable licensectl package")
    return dest.resolve()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """PR_SET_PDEATHSIG(SIGKILL): a test run that is itself killed does not leave the child behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def group_members(pgid: int) -> list[int]:
    """PIDs of the live (not zombie) processes in process group `pgid`."""
    out: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():  # pragma: no cover - Linux only in practice
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name, which may itself contain spaces and parentheses.
        rest = stat[stat.rindex(")") + 2:].split()
        if len(rest) > 2 and rest[0] != "Z" and int(rest[2]) == pgid:
            out.append(int(d.name))
    return sorted(out)


@dataclass(frozen=True)
class _Started:
    pgid: int
    name: str
    argv: tuple[str, ...]


_registry: dict[int, _Started] = {}


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def leaked_processes() -> list[str]:
    """Registered process groups that still have a live member, described for a failure message."""
    out: list[str] = []
    for pgid, started in sorted(_registry.items()):
        members = group_members(pgid)
        if members:
            out.append(f"{started.name} (process group {pgid}, live pids {members}): {' '.join(started.argv)[:200]}")
        else:
            del _registry[pgid]
    return out


def end_leaked_processes() -> list[str]:
    """SIGKILL every registered group that is still alive; returns their descriptions."""
    leaked = leaked_processes()
    for pgid in list(_registry):
        _signal_group(pgid, signal.SIGKILL)
        del _registry[pgid]
    return leaked


class ManagedProcess:
    """One subprocess in its own process group, with stdout+stderr appended to `log_path`.

    `stop()` (SIGTERM to the group, a grace period, then SIGKILL to the group) and `kill()` end the
    whole group, whatever wrappers sit between this process and the program they run.
    """

    def __init__(self, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None,
                 cwd: Path = REPO_ROOT, name: str = "process") -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else child_env()
        self.cwd = cwd
        self.name = name
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0  # time.monotonic() of the last start

    def __repr__(self) -> str:
        return f"ManagedProcess({self.name!r}, pid={self.pid})"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def group_alive(self) -> bool:
        """Whether the process or anything it started in its group is still running."""
        if self.proc is None:
            return False
        self.proc.poll()  # reap the leader if it exited, so it does not count as a member
        return bool(group_members(self.proc.pid))

    def start(self) -> None:
        if self.alive():
            raise RuntimeError(f"{self.name} is already running")
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                cwd=self.cwd, start_new_session=True, preexec_fn=_die_with_parent)
        self.started_at = time.monotonic()
        _registry[self.proc.pid] = _Started(self.proc.pid, self.name, tuple(self.argv))

    def signal(self, sig: int) -> None:
        """Send `sig` to the whole group."""
        if self.proc is not None:
            _signal_group(self.proc.pid, sig)

    async def wait(self, within: float | None = None) -> int | None:
        """Wait for the process itself to exit; its exit code, or None after `within` seconds."""
        deadline = None if within is None else time.monotonic() + within
        while self.proc is not None and self.proc.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.05)
        return self.returncode

    async def _wait_group(self, within: float) -> bool:
        deadline = time.monotonic() + within
        while self.group_alive():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def kill(self) -> int | None:
        """SIGKILL to the group (a crash: nothing graceful runs) and reap; returns the exit code."""
        if self.proc is None:
            return None
        self.signal(signal.SIGKILL)
        code = await self.wait()
        await self._wait_group(5.0)
        self._forget()
        return code

    async def stop(self, grace: float = 40.0) -> int | None:
        """SIGTERM to the group, SIGKILL to whatever is left after `grace` s; the process's exit code."""
        if self.proc is None:
            return None
        if self.group_alive():
            self.signal(signal.SIGTERM)
            if not await self._wait_group(grace):
                log.warning("process group ignored SIGTERM, killing it", process=self.name, grace=grace)
                self.signal(signal.SIGKILL)
        code = await self.wait()
        await self._wait_group(5.0)
        self._forget()
        return code

    def _forget(self) -> None:
        if self.proc is not None and not self.group_alive():
            _registry.pop(self.proc.pid, None)

    # -- the log -------------------------------------------------------------------------------
    def log_lines(self) -> list[str]:
        if not self.log_path.exists():
            return []
        return self.log_path.read_text(errors="replace").splitlines()

    def log_tail(self, lines: int = 40) -> str:
        """The last log lines, for failure messages (licensectl never logs token bytes)."""
        return "\n".join(self.log_lines()[-lines:])

    def log_records(self) -> list[dict[str, Any]]:
        """The JSON log records; a non-JSON line (e.g. a traceback) comes back as {"raw": line}."""
        out: list[dict[str, Any]] = []
        for line in self.log_lines():
            try:
                doc = json.loads(line)
            except ValueError:
                doc = {"raw": line}
            out.append(doc if isinstance(doc, dict) else {"raw": line})
        return out




@dataclass(frozen=True, slots=True)
class CliResult:
    """What one `licensectl` command printed, for tests that drive the CLI as a hoster would."""

    code: int
    out: str
    err: str


async def run_licensectl(*argv: str, kubeconfig: Path | str, env: Mapping[str, str] | None = None) -> CliResult:
    """Run `python -m licensectl ARGV --kubeconfig K` to completion (short-lived: no process group needed).

    `env` adds to the inherited environment (e.g. LICENSECTL_NAMESPACE); a Python traceback on stderr is
    a crash, never an answer, so it fails the caller at once.
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "licensectl", *argv, "--kubeconfig", str(kubeconfig), env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert b"Traceback" not in err, err.decode()
    return CliResult(proc.returncode or 0, out.decode(), err.decode())
