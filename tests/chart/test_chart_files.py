"""charts/licensectl/files/: real copies of their single sources, no links (fast: no helm needed).

A vendored `cp -r charts/licensectl` must carry the content, so the chart holds copies written by
`make chart-files` (scripts/sync-chart-files); these tests fail, naming the file and the command,
while a copy differs from its source. test_chart.py renders the copied chart against the package.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shutil
from pathlib import Path
from typing import Any

from .helm import CHART, ROOT


def sync_script() -> Any:
    """scripts/sync-chart-files as a module: its SOURCES table and checks."""
    loader = importlib.machinery.SourceFileLoader("sync_chart_files", str(ROOT / "scripts" / "sync-chart-files"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_chart_files_are_copies_of_their_one_source() -> None:
    """files/ holds real copies (a vendored `cp -r` of the chart must work), each equal to its source."""
    files = CHART / "files"
    sources: dict[str, Path] = sync_script().SOURCES
    present = {str(p.relative_to(files)) for p in files.rglob("*") if p.is_symlink() or p.is_file()}
    assert present == set(sources), "run `make chart-files` (scripts/sync-chart-files)"
    for name, source in sources.items():
        copy_ = files / name
        assert not copy_.is_symlink(), f"charts/licensectl/files/{name} is a symlink: run `make chart-files`"
        assert copy_.read_bytes() == (ROOT / source).read_bytes(), (
            f"charts/licensectl/files/{name} differs from {source}: run `make chart-files`")
    assert not [p for p in CHART.rglob("*") if p.is_symlink()], "no symlinks anywhere in the chart"


def test_sync_check_names_a_stale_copy_and_the_fix(tmp_path: Path) -> None:
    """The check catches a stale copy, a link, and a file without a source; sync repairs all three."""
    script = sync_script()
    root = tmp_path / "repo"
    for source in script.SOURCES.values():
        (root / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / source, root / source)
    assert script.sync(root)  # every copy written
    files = root / "charts" / "licensectl" / "files"
    assert script.problems(root) == []
    (files / "prometheusrule.yaml").write_text("stale\n")
    (files / "dashboard.json").unlink()
    (files / "dashboard.json").symlink_to(root / "dashboards" / "licensectl.json")
    (files / "extra.yaml").write_text("{}\n")
    assert script.problems(root) == [
        "files/prometheusrule.yaml differs from manifests/components/monitoring/prometheusrule.yaml",
        "files/dashboard.json is a symlink; it must be a copy of dashboards/licensectl.json",
        "files/extra.yaml has no source (not in scripts/sync-chart-files)",
    ]
    script.sync(root)
    assert script.problems(root) == []
