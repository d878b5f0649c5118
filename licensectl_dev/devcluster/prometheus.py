"""A real Prometheus (Debian's `prometheus` package) on loopback, loaded with the shipped alert rules.

The rules have one source of truth, the PrometheusRule in manifests/components/monitoring; its
`.spec` is a plain Prometheus rule file, extracted here.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from licensectl_dev.devcluster.controlplane import free_port

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_RULE = REPO / "manifests" / "components" / "monitoring" / "prometheusrule.yaml"


def rule_file_text() -> str:
    doc = yaml.safe_load(PROMETHEUS_RULE.read_text())
    return yaml.safe_dump(doc["spec"], sort_keys=False)


class Prometheus:
    def __init__(self, targets: list[str], *, scrape_interval: str = "2s", evaluation_interval: str = "2s",
                 binary: str | None = None) -> None:
        exe = binary or shutil.which("prometheus")
        if exe is None:
            raise RuntimeError("prometheus is not installed (Debian package `prometheus`; scripts/install-system-deps)")
        self.binary = exe
        self.targets = targets
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.dir = Path(tempfile.mkdtemp(prefix="licensectl-prom-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        (self.dir / "rules.yaml").write_text(rule_file_text())
        config = {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.evaluation_interval},
            "rule_files": [str(self.dir / "rules.yaml")],
            "scrape_configs": [{"job_name": "licensectl", "honor_labels": True,
                                "static_configs": [{"targets": self.targets}]}],
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        log = (self.dir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:  # noqa: S310 - loopback
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready in {timeout}s: {self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        p = self.dir / "prometheus.log"
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:]) if p.exists() else ""

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as r:  # noqa: S310 - loopback only
            return json.loads(r.read())["data"]

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending or firing) with their labels."""
        data = self.api("/api/v1/alerts")
        alerts: list[dict[str, Any]] = data.get("alerts", [])
        return alerts

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)
