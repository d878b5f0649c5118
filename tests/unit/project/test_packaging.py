"""What a plain `pip install` and the image get: the controller, and none of the dev or test tooling.

The control plane builder, the KubeVirt simulator, the test kit and the demo live in licensectl_dev/,
which the wheel must not contain (pyproject.toml's package list); the guest scripts must be in it
(the controller serves them to nobody, but hosters install them from the package).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_wheel_holds_the_controller_only(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "bin")
    # licensectl_dev is copied too: the package list, not its absence, must keep it out.
    for name in ("licensectl", "licensectl_dev"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    out = tmp_path / "wheels"
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = out.glob("licensectl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"licensectl"}
    assert not [n for n in names if "devcluster" in n or "testkit" in n or n.endswith("demo.py")]
    for must in ("licensectl/core/rollout/__init__.py", "licensectl/app.py", "licensectl/cli/main.py",
                 "licensectl/guest/licensectl-probe.sh"):
        assert must in names or must.replace("/__init__.py", ".py") in names, must
