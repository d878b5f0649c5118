"""The pure core depends downward only: on model, the time codec, the stdlib and lower core modules.

No `config`, no `kube`, no I/O libraries: the core is tested with plain values and reused by the CLI
and the controller alike. Settings reach it through licensectl.core_settings (the shell).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import licensectl

PACKAGE = Path(licensectl.__file__).parent

# Core module -> the licensectl modules it may import (everything lower in the stack).
ALLOWED: dict[str, frozenset[str]] = {
    "timecodec": frozenset(),
    "model": frozenset({"timecodec"}),  # VMI times are kept as epoch floats (timecodec.to_epoch_us)
    "tokeninfo": frozenset(),
    "credentials": frozenset({"timecodec"}),
    "entitlement": frozenset({"model"}),
    "render": frozenset({"model", "timecodec"}),
    "rollout": frozenset({"model", "timecodec"}),
    "rollout_view": frozenset({"rollout"}),
    "replication": frozenset({"entitlement", "model", "render", "rotation"}),
    "rotation": frozenset({"model", "timecodec"}),
    "delivery": frozenset({"model", "render"}),
    "certs": frozenset(),
    "guest_report": frozenset({"timecodec"}),
}
# Non-stdlib distributions a core module may use, and why.
THIRD_PARTY = {"defusedxml": "guest reports are untrusted XML; parsing only, no I/O",
               "cryptography": "X.509 and key material for the serving certificate; computation only, no I/O"}


def imports_of(module: str) -> set[str]:
    """Every module name `module` imports, at top level or inside functions."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "licensectl":  # `from licensectl import model`
                names.update(f"licensectl.{a.name}" for a in node.names)
            else:
                names.add(node.module)
    return names


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_core_imports_only_downward(module: str) -> None:
    bad = []
    for name in sorted(imports_of(module)):
        top, _, rest = name.partition(".")
        if top == "licensectl":
            if rest not in ALLOWED[module]:
                bad.append(name)
        elif top not in sys.stdlib_module_names and top not in THIRD_PARTY and top != "__future__":
            bad.append(name)
    assert bad == []

