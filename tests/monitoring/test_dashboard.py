"""dashboards/licensectl.json: valid against Grafana's schema, and every query reads real series.

The schema check runs tests/monitoring/grafana-schema/validate.mjs (Node): @grafana/schema's Dashboard
type turned into JSON Schema and checked with Ajv. Node/npm or promtool missing is a failure.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring.promql_names import TARGET_LABELS, expand_grafana, exported_series, problems

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "licensectl.json"
SCHEMA_DIR = Path(__file__).with_name("grafana-schema")

ROWS = ["Fleet license state", "By tenant", "Expiries", "Rollout progress", "Rotation", "Tenant cluster workers",
        "Replication health", "Controller health", "License delivery and serving TLS"]


@pytest.fixture(scope="session")
def validator() -> list[str]:
    """Command that validates dashboard files; installs the pinned npm packages on first use."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are required for the dashboard schema check (Debian: nodejs npm)")
    if not (SCHEMA_DIR / "node_modules" / "@grafana" / "schema").is_dir():
        res = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=SCHEMA_DIR, capture_output=True,
                             text=True, timeout=600, check=False)
        if res.returncode != 0:
            pytest.fail(f"npm ci in {SCHEMA_DIR} failed:\n{res.stdout}\n{res.stderr}")
    return [node, str(SCHEMA_DIR / "validate.mjs")]


def validate(cmd: list[str], *files: Path) -> tuple[int, list[dict[str, Any]]]:
    res = subprocess.run([*cmd, *map(str, files)], capture_output=True, text=True, timeout=300, check=False)
    assert res.stderr == "", res.stderr
    return res.returncode, [json.loads(line) for line in res.stdout.splitlines()]


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def all_panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])  # panels of collapsed rows


def queries(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for p in all_panels(dash):
        for t in p.get("targets", []):
            yield f"{p['title']}/{t['refId']}", t["expr"]


def test_dashboard_is_valid_against_grafana_schema(validator: list[str]) -> None:
    rc, reports = validate(validator, DASHBOARD)
    assert reports[0]["errors"] == []
    assert reports[0]["valid"] is True
    assert reports[0]["schema"].startswith("@grafana/schema@")
    assert rc == 0


@pytest.mark.parametrize(("mutate", "path"), [
    (lambda d: d.pop("schemaVersion"), ""),
    (lambda d: d.__setitem__("pannels", []), ""),
    (lambda d: d["panels"][1]["gridPos"].__setitem__("w", "wide"), "/panels/1/gridPos/w"),
    (lambda d: d["templating"]["list"][0].__setitem__("type", "dropdown"), "/templating/list/0/type"),
])
def test_schema_check_rejects_invalid_dashboards(validator: list[str], tmp_path: Path, mutate: Any,
                                                 path: str) -> None:
    broken = copy.deepcopy(load())
    mutate(broken)
    f = tmp_path / "broken.json"
    f.write_text(json.dumps(broken))
    rc, reports = validate(validator, f)
    assert rc == 1
    assert reports[0]["valid"] is False
    assert path in {e["path"] for e in reports[0]["errors"]}


def test_layout_rows_and_datasource_variable() -> None:
    dash = load()
    assert dash["schemaVersion"] >= 39
    assert [p["title"] for p in dash["panels"] if p["type"] == "row"] == ROWS
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in all_panels(dash)]
    assert len(ids) == len(set(ids))
    for p in all_panels(dash):
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"], p["title"]


def test_panels_do_not_overlap() -> None:
    taken: dict[tuple[int, int], str] = {}
    for p in all_panels(load()):
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{p['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = p["title"]


def test_every_query_uses_contract_metrics_and_labels() -> None:
    series = exported_series()
    found = dict(queries(load()))
    assert len(found) > 30
    bad = {where: problems(expand_grafana(expr), series) for where, expr in found.items()}
    assert {k: v for k, v in bad.items() if v} == {}


def test_variable_queries_use_contract_labels() -> None:
    series = exported_series()
    for v in load()["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((\w+), (\w+)\)", v["query"]["query"])
        assert m, v["query"]
        assert m.group(2) in series[m.group(1)] | TARGET_LABELS, v["name"]


def test_every_query_parses_with_promtool(tmp_path: Path) -> None:
    """Prometheus' own parser (promtool) accepts every panel query, wrapped as a recording rule."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found on PATH: install the Debian package `prometheus`")
    rules = [{"record": f"dashboard:query_{i}", "expr": expand_grafana(expr)}
             for i, (_, expr) in enumerate(queries(load()))]
    f = tmp_path / "dashboard.rules.yaml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    res = subprocess.run([promtool, "check", "rules", str(f)], capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules)} rules found" in res.stdout
