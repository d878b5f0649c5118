"""What a PromQL expression reads: metric names, label matchers and aggregation labels.

Alert rules and dashboard panels must only use series licensectl exports, with labels that exist on
them. A real PromQL parser (promql-parser, a port of the Prometheus parser) walks each expression;
promtool separately checks that Prometheus itself parses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import promql_parser as pp

from licensectl.metrics import PREFIX, SNAPSHOT_GAUGES, Metrics

# The label contract of every licensectl series (docs/operations.md, "Metrics"). metrics.py owns the
# names; test_contract_covers_metrics_py proves this table names exactly the series it defines.
CONTRACT_LABELS: dict[str, frozenset[str]] = {
    name: frozenset(labels)
    for name, labels in {
        "entitled_namespaces": ("source_namespace", "source_name"),
        "replicas": ("state",),
        "source_valid": ("class", "source_namespace", "source_name"),
        "source_problem": ("class", "reason"),
        "class_feature_type_mismatch": ("class",),
        "class_license_changed": ("class",),
        "source_revision_info": ("class", "source_namespace", "source_name", "revision"),
        "token_expiry_timestamp_seconds": ("source_namespace", "source_name"),
        "token_expiry_known": ("source_namespace", "source_name"),
        "token_format": ("source_namespace", "source_name", "format"),
        "source_token_unreadable": ("source_namespace", "source_name"),
        "tenant_problems": ("kind",),
        "informer_synced": ("resource",),
        "watch_stale_seconds": ("resource",),
        "deletions_deferred": (),
        "rollout_vmis": ("source_namespace", "source_name", "state"),
        "rollout_in_progress": ("source_namespace", "source_name"),
        "rollout_paused": ("source_namespace", "source_name", "reason"),
        "rollout_last_progress_timestamp_seconds": ("source_namespace", "source_name"),
        "rollout_manual_restart_overdue": ("namespace", "vmi", "source_namespace", "source_name"),
        "rotation_phase": ("source_namespace", "source_name", "phase"),
        "rotation_wave": ("source_namespace", "source_name"),
        "rotation_namespaces": ("source_namespace", "source_name", "slot"),
        "guest_license_state": ("namespace", "vmi", "tenant", "state"),
        "guest_license_expiry_timestamp_seconds": ("namespace", "vmi", "tenant"),
        "guest_license_lease_seconds": ("namespace", "vmi", "tenant"),
        "guest_last_report_timestamp_seconds": ("namespace", "vmi", "tenant"),
        "guest_token_current": ("namespace", "vmi", "tenant"),
        "guest_clock_skew_seconds": ("namespace", "vmi", "tenant"),
        "guest_unlicensed_reason": ("namespace", "vmi", "tenant", "reason"),
        "guest_wrong_product": ("namespace", "vmi", "tenant"),
        "guests": ("state", "tenant"),
        "guests_reporting": ("tenant", "token"),
        "leader": (),
        "ready": (),
        "build_info": ("version",),
        "reconcile_total": ("controller", "result"),
        "watch_restarts_total": ("resource", "reason"),
        "api_requests_total": ("verb", "code"),
        "replica_writes_total": ("action", "result"),
        "replica_conflicts_total": (),
        "deletion_cap_hits_total": (),
        "restarts_total": ("result",),
        "reports_total": ("result",),
        "serving_cert_reloads_total": ("result",),
        "webhook_admissions_total": ("result",),
        "webhook_skipped_total": ("reason",),
        "webhook_boot_image_total": ("result",),
        "webhook_boot_image_denied_total": (),
        "webhook_duration_seconds": (),
        "vmis_missing_license_volume": ("namespace",),
        "vmis_delivery_blocked": ("namespace", "reason"),
        "vmis_backstop_retrying": ("namespace",),
        "vms_restart_held": ("namespace",),
        "restart_preflights_total": ("result",),
        "worker_drains": ("namespace", "cluster", "step"),
        "worker_drain_blocked": ("namespace", "vm", "cluster", "reason"),
        "worker_evictions_total": ("result",),
        "rollout_failed_restarts": ("source_namespace", "source_name"),
        "rollout_namespace_failed_restarts": ("source_namespace", "source_name", "namespace"),
        "rollout_namespace_paused": ("source_namespace", "source_name", "namespace"),
        "delivery_ready": (),
        "delivery_probes_total": ("result",),
        "webhook_configuration_problem": ("kind", "name", "problem"),
        "serving_cert_expiry_timestamp_seconds": (),
        "reconcile_duration_seconds": ("controller",),
        "event_loop_lag_seconds": (),
        "gc_pause_seconds": ("generation",),
        "informer_list_duration_seconds": ("resource", "result"),
        "rollout_duration_seconds": (),
    }.items()
}

# Labels Prometheus adds to every scraped series (prometheus-operator target labels). The
# ServiceMonitor sets honorLabels, so the guests' own `namespace` label wins over the target's.
TARGET_LABELS = frozenset({"job", "instance", "pod", "namespace", "service", "endpoint", "container"})

# Series Prometheus itself produces for every target.
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})

_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def exported_series() -> dict[str, frozenset[str]]:
    """Every series name licensectl exposes (as Prometheus stores it) -> its allowed labels.

    Derived from metrics.py: snapshot gauges from SNAPSHOT_GAUGES, the rest from the registry's
    own metric families, expanded the way the exposition format expands them.
    """
    out: dict[str, frozenset[str]] = {}
    for name in SNAPSHOT_GAUGES:
        out[f"{PREFIX}_{name}"] = CONTRACT_LABELS[name]
    for family in Metrics().registry.collect():
        if not family.name.startswith(PREFIX + "_") or family.type == "unknown":
            continue
        short = family.name.removeprefix(PREFIX + "_")
        if family.type == "counter":
            labels = CONTRACT_LABELS[short + "_total"]
            out[family.name + "_total"] = labels
        elif family.type == "histogram":
            labels = CONTRACT_LABELS[short]
            for suffix in _HISTOGRAM_SUFFIXES:
                out[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
        else:
            out[family.name] = CONTRACT_LABELS[short]
    return out


def registry_families() -> set[str]:
    """Short names (no prefix) of the metric families metrics.py registers, as the contract names them."""
    names: set[str] = set(SNAPSHOT_GAUGES)
    for family in Metrics().registry.collect():
        if family.name.startswith(PREFIX + "_") and family.type != "unknown":
            short = family.name.removeprefix(PREFIX + "_")
            names.add(short + "_total" if family.type == "counter" else short)
    return names


@dataclass
class Usage:
    """What one expression reads."""

    selectors: list[tuple[str, frozenset[str]]] = field(default_factory=list)  # (metric, matcher labels)
    grouping: list[tuple[frozenset[str], frozenset[str]]] = field(default_factory=list)  # (by-labels, metrics)


def _selector(vs: pp.VectorSelector) -> tuple[str, frozenset[str]]:
    labels = {m.name for m in vs.matchers.matchers}
    name = vs.name or next((m.value for m in vs.matchers.matchers if m.name == "__name__"), "")
    return name, frozenset(labels - {"__name__"})


def _walk(node: object, usage: Usage) -> set[str]:
    """Record selectors and by-clauses below node; return the metric names it reads."""
    if isinstance(node, pp.VectorSelector):
        usage.selectors.append(_selector(node))
        return {usage.selectors[-1][0]}
    if isinstance(node, pp.MatrixSelector):
        return _walk(node.vector_selector, usage)
    if isinstance(node, pp.AggregateExpr):
        names = _walk(node.expr, usage)
        if node.param is not None:
            _walk(node.param, usage)
        mod = node.modifier
        if mod is not None and str(mod.type).endswith("By"):
            usage.grouping.append((frozenset(mod.labels), frozenset(names)))
        return names
    if isinstance(node, pp.BinaryExpr):
        return _walk(node.lhs, usage) | _walk(node.rhs, usage)
    if isinstance(node, pp.Call):
        out: set[str] = set()
        for arg in node.args:
            out |= _walk(arg, usage)
        return out
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
        return _walk(node.expr, usage)
    return set()  # number and string literals


def usage_of(expr: str) -> Usage:
    """Parse expr (raises ValueError on a syntax error) and collect what it reads."""
    usage = Usage()
    _walk(pp.parse(expr), usage)
    return usage


def problems(expr: str, series: dict[str, frozenset[str]]) -> list[str]:
    """Why expr does not fit the metric contract (empty when it does)."""
    found: list[str] = []
    usage = usage_of(expr)
    for name, labels in usage.selectors:
        if name in PROMETHEUS_SERIES:
            continue
        if name not in series:
            found.append(f"unknown series {name!r}")
            continue
        extra = labels - series[name] - TARGET_LABELS
        if extra:
            found.append(f"{name} has no label(s) {sorted(extra)}")
    for by, names in usage.grouping:
        known = [series[n] for n in names if n in series]
        if not known:
            continue
        allowed = frozenset().union(*known) | TARGET_LABELS
        extra = by - allowed
        if extra:
            found.append(f"by {sorted(by)} over {sorted(names)}: no label(s) {sorted(extra)}")
    return found


# Grafana macros and template variables -> values that keep the PromQL valid for parsing.
_GRAFANA_SUBSTITUTIONS = (
    (re.compile(r"\$__(rate_interval|interval|range)\b"), "5m"),
    (re.compile(r"\$\{__(rate_interval|interval|range)\}"), "5m"),
    (re.compile(r"\$\{?__range_s\}?"), "300"),
    (re.compile(r"\$\{(\w+)(:\w+)?\}"), r"\1_value"),
    (re.compile(r"\$(\w+)"), r"\1_value"),
)


def expand_grafana(expr: str) -> str:
    """Replace Grafana macros/variables so the query parses as plain PromQL."""
    for pattern, repl in _GRAFANA_SUBSTITUTIONS:
        expr = pattern.sub(repl, expr)
    return expr
