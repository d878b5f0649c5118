"""Every CLI verb misused (docs/operations.md#cli-exit-codes): an unknown flag after the verb, a dead
`--url`, a SOURCE without its namespace. Each ends with one sentence on stderr naming the verb, the
documented exit code, the verb's own usage for a usage error, and never a traceback."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from licensectl.cli.main import main

VERBS = [["status"], ["rollout", "status"], ["rollout", "history"], ["rollout", "pause"], ["rollout", "resume"],
         ["rollout", "retry"], ["rollout", "undo"], ["rollout", "retry-worker"], ["rollout", "skip-worker"],
         ["keys", "rotate"]]
TAKES_SOURCE = {"rollout status", "rollout history", "rollout pause", "rollout resume", "rollout retry", "rollout undo"}
TAKES_URL = {"status", "rollout status"}
TAKES_VM = {"rollout retry-worker", "rollout skip-worker"}
NEEDS_SOURCE = (TAKES_SOURCE | TAKES_VM) - {"rollout status"}


@pytest.fixture(autouse=True)
def _log_setup_restored() -> Iterator[None]:
    """`main` sets logging up on this test's captured stderr: later tests must not log into a closed file."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def misuse(verb: list[str], how: str) -> tuple[list[str], int, str]:
    """The command line, its documented exit code and what its last stderr line says."""
    name = " ".join(verb)
    source = ["ns/src"] if name in NEEDS_SOURCE else []
    if how == "unknown flag":
        return [*verb, *source, "--no-such-flag"], 2, "error: unrecognized arguments: --no-such-flag"
    if how == "dead --url":
        if name in TAKES_URL:
            url = dead_url()
            return [*verb, "--url", url], 1, f"nothing answers at {url} (Connection refused)"
        return [*verb, *source, "--url", "http://127.0.0.1:1"], 2, "error: unrecognized arguments: --url"
    if name in TAKES_VM:  # a worker VM without its namespace
        return [*verb, "vws-token"], 2, "error: argument worker: VM must be NAMESPACE/NAME"
    if name in TAKES_SOURCE:  # a SOURCE without its namespace
        return [*verb, "vws-token"], 2, "error: argument source: SOURCE must be NAMESPACE/NAME"
    return [*verb, "vws-token"], 2, "error: unrecognized arguments: vws-token"


@pytest.mark.parametrize("how", ["unknown flag", "dead --url", "source without namespace"])
@pytest.mark.parametrize("verb", VERBS, ids=lambda v: " ".join(v))
def test_every_verb_misused_is_one_sentence_and_its_documented_code(
        verb: list[str], how: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no kubeconfig: a dead --url must not need one
    monkeypatch.delenv("KUBECONFIG", raising=False)
    argv, want, says = misuse(verb, how)
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage error
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == want and out == "", (argv, code, err)
    assert "Traceback" not in err
    assert lines[-1].startswith(f"licensectl {' '.join(verb)}: ") and says in lines[-1], err
    if want == 2:  # the verb's usage, not the top level's
        assert lines[0].startswith(f"usage: licensectl {' '.join(verb)} "), err
        assert all(line.startswith(("usage:", " ")) for line in lines[:-1]), err
    else:
        assert len(lines) == 1, err
