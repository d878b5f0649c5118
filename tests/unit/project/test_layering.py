"""The package layers import downward only, and the pure core imports nothing of the shell.

The layout is the architecture (licensectl/__init__.py, docs/design.md#code-map): `core/` holds every
decision as pure functions over plain data, the shell packages around it may use the layers below
them and never the ones above. An import that points up is a design change, not a shortcut.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import licensectl

PACKAGE = Path(licensectl.__file__).parent

# Non-stdlib distributions a core module may use, and why.
THIRD_PARTY = {"defusedxml": "guest reports are untrusted XML; parsing only, no I/O",
               "cryptography": "X.509 and key material for the serving certificate; computation only, no I/O"}

# The ground every shell layer stands on.
SHELL_MODULES = frozenset({"config", "logs", "metrics", "malloc", "event_loop"})
# Layer -> the licensectl layers it may import (its own included). "" is the package itself (__version__).
ALLOWED_LAYERS: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "config": frozenset({"", "core", "config"}),
    "logs": frozenset({"logs"}),
    "metrics": frozenset({"", "metrics", "exposition"}),
    "exposition": frozenset({"exposition"}),  # the text writer behind metrics' render: prometheus-client only
    "malloc": frozenset({"malloc"}),
    "event_loop": frozenset({"event_loop"}),  # which asyncio loop runs: uvloop or the stdlib's
    "kube": frozenset({"", "core", "kube", *SHELL_MODULES}),
    "serve": frozenset({"", "core", "kube", "serve", *SHELL_MODULES}),
    "controllers": frozenset({"", "core", "kube", "controllers", *SHELL_MODULES}),
    "app": frozenset({"", "core", "kube", "serve", "controllers", "app", *SHELL_MODULES}),
    "cli": frozenset({"", "core", "kube", "serve", "controllers", "app", "cli", *SHELL_MODULES}),
    "__main__": frozenset({"cli"}),
    "__init__": frozenset(),  # the package's face: its version, nothing else
}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def layer_of_file(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def layer_of_module(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] != "__version__" else ""


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(module, at top level) for every import in `path`, at top level or inside functions."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, id(node) in top) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "licensectl":  # `from licensectl import config`
                out.extend((f"licensectl.{a.name}", id(node) in top) for a in node.names)
            else:
                out.append((node.module, id(node) in top))
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.append(("<relative>", id(node) in top))
    return out


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    layer = layer_of_file(path)
    assert layer in ALLOWED_LAYERS, f"{path.relative_to(PACKAGE)}: a new layer needs a row in ALLOWED_LAYERS"
    bad = []
    for name, _ in imports_of(path):
        if name == "<relative>":
            bad.append("relative import (spell the layer out)")
        elif name.split(".")[0] == "licensectl" and layer_of_module(name) not in ALLOWED_LAYERS[layer]:
            bad.append(name)
    assert bad == []


@pytest.mark.parametrize("path", sorted(p for p in modules() if layer_of_file(p) == "core"),
                         ids=lambda p: p.name)
def test_core_imports_no_io_library(path: Path) -> None:
    bad = [name for name, _ in imports_of(path)
           if name.split(".")[0] not in {"licensectl", "__future__", *THIRD_PARTY}
           and name.split(".")[0] not in sys.stdlib_module_names]
    assert bad == []


def test_the_controller_never_imports_dev_tooling() -> None:
    """No module of the controller imports licensectl_dev, not even lazily: the demo is dev tooling
    (`python -m licensectl_dev.demo`), so nothing shipped depends on a checkout."""
    seen = {(str(p.relative_to(PACKAGE)), top) for p in modules() for name, top in imports_of(p)
            if name.split(".")[0] == "licensectl_dev"}
    assert seen == set()


def test_check_sees_violations(tmp_path: Path) -> None:
    """The checks above can fail: an upward import in a core file is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("from licensectl.kube import api\nimport aiohttp\n\ndef f():\n    from licensectl_dev import demo\n")
    names = imports_of(bad)
    assert ("licensectl.kube", True) in names and ("aiohttp", True) in names and ("licensectl_dev", False) in names
    assert layer_of_module("licensectl.kube") not in ALLOWED_LAYERS["core"]
