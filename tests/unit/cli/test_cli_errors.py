"""Every cluster command fails in one line (docs/operations.md#cli-exit-codes): no kubeconfig, an API
server that cannot be reached, an answer it refuses. Real `python -m licensectl` processes; the
traceback only with --debug."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
from pathlib import Path

import pytest

from licensectl.cli.errors import CliError, api_error, describe
from licensectl.kube.api import ApiException
from licensectl.kube.kubeconfig import KubeconfigError
from licensectl_dev.devcluster.controlplane import render_kubeconfig

CLI = Path(__file__).resolve().parents[3] / "licensectl" / "cli"
COMMANDS = [["status"], ["rollout", "status"], ["rollout", "history", "ns/src"], ["rollout", "pause", "ns/src"],
            ["rollout", "undo", "ns/src"],
            ["keys", "rotate"]]


async def licensectl(*argv: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "licensectl", *argv, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bare_env(tmp_path: Path) -> dict[str, str]:
    """No kubeconfig anywhere: an empty HOME, no KUBECONFIG, not in a cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "LICENSECTL_"))}
    return {**env, "HOME": str(tmp_path)}


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a))
async def test_no_kubeconfig_is_one_line(tmp_path: Path, argv: list[str]) -> None:
    code, out, err = await licensectl(*argv, env=bare_env(tmp_path))
    assert code == 1 and out == ""
    assert err.strip().count("\n") == 0, err
    assert err.startswith(f"licensectl {' '.join(a for a in argv if '/' not in a)}: no usable kubeconfig: cannot "
                          f"read kubeconfig {tmp_path}/.kube/config: FileNotFoundError; pass --kubeconfig, set "
                          "KUBECONFIG, or run inside a cluster"), err


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a))
async def test_an_unreachable_api_server_is_one_line(tmp_path: Path, argv: list[str]) -> None:
    port = closed_port()
    kc = tmp_path / "kc"
    kc.write_text(render_kubeconfig(f"https://127.0.0.1:{port}", b"", token="x", user="u"))
    code, _, err = await licensectl(*argv, "--kubeconfig", str(kc), env=bare_env(tmp_path))
    assert code == 1
    assert "Traceback" not in err and f"cannot reach the API server at 127.0.0.1:{port}" in err, err
    assert err.strip().splitlines()[-1].startswith("licensectl "), err
    assert len(err.strip().splitlines()) == 1, err


async def test_debug_adds_the_traceback(tmp_path: Path) -> None:
    code, _, err = await licensectl("status", "--debug", env=bare_env(tmp_path))
    assert code == 1 and "Traceback" in err and "no usable kubeconfig" in err.splitlines()[-1]
    code, _, err = await licensectl("--debug", "rollout", "resume", "a/b", env=bare_env(tmp_path))
    assert code == 1 and "Traceback" in err


def test_the_messages() -> None:
    assert describe(CliError("source a/b is already paused")) == "source a/b is already paused"
    assert describe(KubeconfigError("kubeconfig x has no current-context")).startswith(
        "no usable kubeconfig: kubeconfig x has no current-context; pass --kubeconfig")
    assert api_error(ApiException(403, "Forbidden"), "reading Secret a/b") == (
        "forbidden (HTTP 403) reading Secret a/b: the kubeconfig's user lacks a permission this command needs "
        "(docs/operations.md#permissions)")
    assert api_error(ApiException(404, "Not Found"), "reading Secret a/b") == "not found (HTTP 404) reading Secret a/b"
    assert describe(ApiException(401, "Unauthorized")).startswith("unauthorized (HTTP 401)")
    assert describe(TimeoutError()) == "the API server did not answer in time"


async def test_usage_errors_exit_2_and_help_documents_the_codes(tmp_path: Path) -> None:
    code, _, err = await licensectl("rollout", "pause", "not-a-ref", env=bare_env(tmp_path))
    # The SOURCE shape is checked before any cluster is needed.
    assert code == 2 and "SOURCE must be NAMESPACE/NAME" in err
    code, out, _ = await licensectl("rollout", "status", "--help", env=bare_env(tmp_path))
    assert code == 0
    for line in ("0  complete", "2  --timeout passed", "3  still in progress", "4  paused", "5  the rotation was "
                 "aborted or undone"):
        assert line in out, out
    code, out, _ = await licensectl("rollout", "undo", "--help", env=bare_env(tmp_path))
    assert code == 0 and "no rollout history found" in out and "is already paused" in out


def test_commands_name_api_answers_by_type_not_by_number() -> None:
    """What an HTTP status means is written once (kube/errors.py): the commands catch `Forbidden`,
    `NotFound`, `Conflict` ... and never compare `e.status` with a 4xx/5xx number."""
    number = re.compile(r"status\s*(?:==|!=|in\s*[(\[{])\s*[45]\d\d")
    found = [f"{p.name}:{i}" for p in sorted(CLI.glob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if number.search(line)]
    assert found == []
    assert number.search("if e.status in (403, 404):") and number.search("e.status != 403")
