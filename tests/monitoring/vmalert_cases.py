"""Turn the promtool rule unit tests (alerts.test.yaml) into vmalert-tool's format: one source of cases.

The file formats are nearly identical (rule_files, evaluation_interval, tests with input_series and
alert_rule_test); the differences this module bridges are:

* Clock origin. promtool evaluates a test from t=0 (1970-01-01); vmalert-tool from
  2000-01-01T00:00:00Z (its storage rejects samples near the epoch). Series whose *value* is a Unix
  timestamp (`*_timestamp_seconds`) are written relative to promtool's origin, so they are shifted by
  VMALERT_TOOL_EPOCH. The exception is a zero sample of an `*_expiry_timestamp_seconds` series: the
  exporter uses 0 for "no expiry known", which must stay 0 on both engines.
* Expression tests. promtool's `promql_expr_test` is vmalert-tool's `metricsql_expr_test`.
* The `alertgroup` label. vmalert adds the rule group name to every alert; the tests run with
  `--disableAlertgroupLabel`, so the expected labels stay the same as promtool's.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

VMALERT_TOOL_EPOCH = 946_684_800  # 2000-01-01T00:00:00Z, vmalert-tool's testStartTime
VMALERT_TOOL_FLAGS = ("--disableAlertgroupLabel",)

_NUM = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_TOKEN = re.compile(rf"^(?P<a>{_NUM})(?:(?P<op>[+-])(?P<b>{_NUM}))?(?:x(?P<n>\d+))?$")
_METRIC = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)")


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(v)


def shift_values(values: str, offset: int, *, keep_zero: bool) -> str:
    """Shift every sample of promtool's expanding notation (`a`, `axN`, `a+bxN`, `_`, `stale`) by offset.

    With keep_zero, a constant-zero token (`0`, `0xN`) is left alone: it is a sentinel, not a time.
    """
    out: list[str] = []
    for tok in values.split():
        if tok == "stale" or tok.startswith("_"):
            out.append(tok)
            continue
        m = _TOKEN.match(tok)
        if m is None:
            raise ValueError(f"unsupported series value token {tok!r} in {values!r}")
        a = float(m["a"])
        b = float(m["b"]) if m["b"] is not None else 0.0
        if keep_zero and a == 0 and b == 0:
            out.append(tok)
            continue
        new = _fmt(a + offset)
        if m["op"]:
            new += f"{m['op']}{m['b']}"
        if m["n"] is not None:
            new += f"x{m['n']}"
        out.append(new)
    return " ".join(out)


def metric_name(series: str) -> str:
    m = _METRIC.match(series)
    if m is None:
        raise ValueError(f"series without a metric name: {series!r}")
    return m.group(1)


def to_vmalert(doc: dict[str, Any], *, only_alert: str | None = None) -> dict[str, Any]:
    """The vmalert-tool form of a promtool unit test document (the input is not modified).

    only_alert keeps just the test groups that check that alert (a quicker targeted run).
    """
    out = copy.deepcopy(doc)
    tests = []
    for case in out["tests"]:
        if only_alert is not None and not any(
            c.get("alertname") == only_alert for c in case.get("alert_rule_test", [])
        ):
            continue
        for s in case.get("input_series", []):
            name = metric_name(s["series"])
            if name.endswith("_timestamp_seconds"):
                s["values"] = shift_values(
                    str(s["values"]), VMALERT_TOOL_EPOCH, keep_zero=name.endswith("_expiry_timestamp_seconds")
                )
        if "promql_expr_test" in case:
            case["metricsql_expr_test"] = case.pop("promql_expr_test")
        tests.append(case)
    out["tests"] = tests
    return out


def run_vmalert_tool(tool: Path, workdir: Path, name: str, doc: dict[str, Any]) -> tuple[int, str]:
    """Write `doc` (promtool format) as vmalert-tool's test file `name` beside the rules in `workdir`
    and run it; the exit code and the combined output."""
    test_file = workdir / name
    test_file.write_text(yaml.safe_dump(to_vmalert(doc), sort_keys=False))
    res = subprocess.run([str(tool), "unittest", f"--files={test_file}", *VMALERT_TOOL_FLAGS],
                         cwd=workdir, capture_output=True, text=True, timeout=600, check=False)
    return res.returncode, res.stdout + res.stderr
