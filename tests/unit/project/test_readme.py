"""The README is the contract for the quick start and the configuration reference."""

from __future__ import annotations

import re
from pathlib import Path

from licensectl import config

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()


def test_config_reference_matches_code() -> None:
    start, end = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"
    table = README[README.index(start) + len(start):README.index(end)]
    assert table == config.reference_markdown(), "run `licensectl config-reference` and paste it into README.md"


def test_ci_runs_the_readme_test_command() -> None:
    block = re.search(r"## Quick start.*?```sh\n(.*?)```", README, re.S)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert len(commands) == 2, "the quick start is two commands"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in [line.strip() for line in ci], f"{commands[1]!r} must be run by .ci/run"
