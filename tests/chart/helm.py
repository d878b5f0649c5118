"""The real helm (built from helm.sh/helm/v4) and the helm-unittest plugin, for the chart tests.

Both come from the cached Go tool builder (licensectl_dev/devcluster/gotools.py). Every helm call gets
its own config, cache and data directories, and a plugins directory that holds only helm-unittest,
so nothing from the machine's own helm setup leaks in.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "licensectl"
VALUES = Path(__file__).resolve().parent / "values"
NAMESPACE = "licensectl-system"
# image.repository, which the chart requires: the first values file of every render (`bare` leaves it out).
REQUIRED = VALUES / "image.yaml"
# libyaml's parser: a render with every toggle on is ~190 kB (CRDs, dashboard), and the chart tests parse
# hundreds of them; the pure-Python parser made that the tests' largest cost. Same objects either way.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def documents(text: str) -> list[dict[str, Any]]:
    """The non-empty YAML documents of a manifest stream (helm's output)."""
    return [d for d in yaml.load_all(text, Loader=_LOADER) if d]


@dataclass(frozen=True)
class Helm:
    """A helm binary with an isolated home and the helm-unittest plugin installed."""

    binary: Path
    home: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.home),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_DATA_HOME": str(self.home / "data"),
            "HELM_PLUGINS": str(self.home / "plugins"),
        }

    def run(self, *args: str, input: str | None = None, timeout: float = 300,
            kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binary), *args]
        if kubeconfig is not None:
            argv += ["--kubeconfig", str(kubeconfig)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                              env=self.env, input=input)

    def template(self, values: Mapping[str, Any] | None = None, *, files: Sequence[Path] = (),
                 namespace: str = NAMESPACE, release: str = "licensectl",
                 chart: Path = CHART, bare: bool = False) -> subprocess.CompletedProcess[str]:
        """`helm template` with value files and a values document (applied last) on stdin; the required
        image.repository comes first unless `bare`."""
        args = ["template", release, str(chart), "--namespace", namespace]
        for f in ([] if bare else [REQUIRED]) + list(files):
            args += ["--values", str(f)]
        if values is not None:
            args += ["--values", "-"]
        return self.run(*args, input=None if values is None else yaml.safe_dump(dict(values)))

    def render(self, values: Mapping[str, Any] | None = None, *, files: Sequence[Path] = (),
               namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        res = self.template(values, files=files, namespace=namespace)
        assert res.returncode == 0, res.stderr
        return documents(res.stdout)


    def template_many(self, values: Sequence[Mapping[str, Any]]) -> list[subprocess.CompletedProcess[str]]:
        """`helm template` for each values document, a few at a time (helm mostly waits on I/O)."""
        with ThreadPoolExecutor(max_workers=4) as pool:
            return list(pool.map(self.template, values))


def install_unittest_plugin(plugin_dir: Path, plugins: Path) -> None:
    """Make helm see the built helm-unittest as the `unittest` plugin (a plugins dir entry)."""
    plugins.mkdir(parents=True, exist_ok=True)
    link = plugins / "unittest"
    if not link.exists():
        link.symlink_to(plugin_dir, target_is_directory=True)


def objects_by_key(objs: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objs}
