"""Every setting of `licensectl run`, declared once.

The same table builds the argparse flags, reads the LICENSECTL_* environment variables and renders
the configuration reference in the README (`licensectl config-reference`), so the three cannot drift.
Precedence: flag > environment > default.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from licensectl.core import defaults


def _bool(v: str) -> bool:
    s = v.strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {v!r}")


@dataclass(frozen=True)
class _Choice:
    """A parser accepting one of `allowed`; the list is kept so the Helm values schema can name it."""

    allowed: tuple[str, ...]

    def __call__(self, v: str) -> str:
        if v not in self.allowed:
            raise ValueError(f"must be one of {', '.join(self.allowed)}, got {v!r}")
        return v


def _choice(*allowed: str) -> Callable[[str], str]:
    return _Choice(allowed)


def _max_unavailable(v: str) -> str:
    """An absolute count ("5") or a percentage of affected VMIs ("10%")."""
    s = v.strip()
    num = s[:-1] if s.endswith("%") else s
    if not num.isdigit() or int(num) < 1 or (s.endswith("%") and int(num) > 100):
        raise ValueError(f"maxUnavailable must be a positive integer or 1%..100%, got {v!r}")
    return s


def _canary(v: str) -> str:
    from licensectl.core.rotation import CanarySpec

    CanarySpec.parse(v)
    return v.strip()


def _rollout_steps(v: str) -> str:
    from licensectl.core.rotation import parse_steps

    parse_steps(v)
    return v.strip()


def _image_patterns(v: str) -> str:
    """Comma-separated image prefixes or globs, normalized (no blanks, no duplicates)."""
    from licensectl.core.boot_image import parse_image_patterns

    return ",".join(parse_image_patterns(v))


@dataclass(frozen=True)
class Settings:
    """Every setting, at its shipped default; those the core also takes come from core/defaults.py."""

    kubeconfig: str = ""
    context: str = ""
    namespace: str = "licensectl-system"
    # Tenant model (docs/design.md#tenants, docs/design.md#vgpu-flag).
    vgpu_label: str = "gpu.cozystack.io/vgpu"
    tenant_label_prefix: str = "tenant.cozystack.io/"
    root_tenant: str = "tenant-root"
    # GPU contract (docs/design.md#gpu-contract, assumed): resource names behind one adapter.
    gpu_group: str = "gpu.cozystack.io"
    gpu_version: str = "v1alpha1"
    gpu_class_plural: str = "gpuclasses"
    gpu_claim_plural: str = "gpuclaims"
    token_key: str = "client_configuration_token.tok"
    # Replication.
    resync_seconds: float = 300.0
    deletions_per_minute: int = 100
    # Rollout.
    settle_seconds: float = defaults.SETTLE_SECONDS
    max_unavailable: str = defaults.MAX_UNAVAILABLE
    max_per_namespace: int = defaults.MAX_PER_NAMESPACE
    max_failures: int = defaults.MAX_FAILURES
    restart_timeout_seconds: float = defaults.RESTART_TIMEOUT_SECONDS
    manual_deadline_seconds: float = defaults.MANUAL_DEADLINE_SECONDS
    done_gate: str = defaults.DONE_GATE
    restart_fallback_delete: bool = False
    restart_reissue_seconds: float = defaults.RESTART_REISSUE_SECONDS
    max_restarts_per_minute: int = defaults.MAX_RESTARTS_PER_MINUTE
    # Tenant cluster workers (docs/design.md#tenant-worker-drain).
    max_disrupted_workers: int = defaults.MAX_DISRUPTED_WORKERS
    drain_timeout_seconds: float = defaults.DRAIN_TIMEOUT_SECONDS
    drain_retry_seconds: float = defaults.DRAIN_RETRY_SECONDS
    worker_boot_timeout_seconds: float = defaults.WORKER_BOOT_TIMEOUT_SECONDS
    # Safe rotation (docs/design.md#safe-rotation).
    canary: str = defaults.CANARY
    rollout_steps: str = defaults.ROLLOUT_STEPS
    analysis_deadline_seconds: float = defaults.ANALYSIS_DEADLINE_SECONDS
    analysis_max_unlicensed: int = defaults.ANALYSIS_MAX_UNLICENSED
    # Guest reports.
    report_url: str = ""
    report_interval_seconds: float = 60.0
    guest_boot_allowance_seconds: float = defaults.GUEST_BOOT_ALLOWANCE_SECONDS
    key_grace_seconds: float = 7 * 24 * 3600.0
    guest_metrics: str = "per-vmi"
    # HTTP listeners.
    metrics_address: str = "127.0.0.1:8080"
    reports_address: str = "127.0.0.1:8443"
    webhook_address: str = "127.0.0.1:9443"
    # Serving TLS (webhook and guest reports): docs/operations.md#serving-tls.
    tls_mode: str = "self-managed"
    tls_secret: str = "licensectl-tls"
    tls_hosts: str = ""
    webhook_configuration: str = "licensectl"
    reports_plain_http: bool = False
    # vGPU guest driver marks of boot images (docs/operations.md#vgpu-driver-marks).
    vgpu_driver_check: str = "warn"
    vgpu_driver_images: str = ""
    # Leader election.
    leader_elect: bool = False
    lease_name: str = "licensectl"
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0
    pod_name: str = ""
    # Logging / safety.
    log_format: str = "console"
    log_level: str = "info"
    dry_run: bool = False


def report_url_for(s: Settings) -> str:
    """The URL written into replicas: the configured one, else the in-cluster reports Service."""
    scheme = "http" if s.reports_plain_http else "https"
    return s.report_url or f"{scheme}://licensectl-reports.{s.namespace}.svc:8443/v1/reports"


# JSON-schema patterns (RE2 syntax, as Helm's validator reads them) of the string settings: the chart's
# schema refuses at install time what the parser would refuse at start (tests/chart/test_schema_patterns.py
# runs both over the same good and bad values). Surrounding blanks are allowed where the parser strips.
_PERCENT = r"0*([1-9][0-9]?(\.[0-9]*)?|100(\.0*)?|\.[0-9]*[1-9][0-9]*)%"
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_DNS_SUBDOMAIN = rf"{_DNS_LABEL}(\.{_DNS_LABEL})*"
_HOST_PORT = r"(\[[0-9A-Fa-f:.]+\]|[^\s:\[\]]*):[0-9]{1,5}"
PATTERNS: Mapping[str, str] = {
    "canary": rf"^\s*([0-9]+|{_PERCENT}|namespaces:[\s,]*{_DNS_LABEL}(\s*,[\s,]*{_DNS_LABEL})*[\s,]*)\s*$",
    "rollout_steps": rf"^[\s,]*({_PERCENT}([\s,]*,[\s,]*{_PERCENT})*)?[\s,]*$",
    "namespace": rf"^{_DNS_LABEL}$",
    "root_tenant": rf"^{_DNS_LABEL}$",
    "vgpu_label": rf"^({_DNS_SUBDOMAIN}/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$",
    "tenant_label_prefix": rf"^{_DNS_SUBDOMAIN}/$",
    "gpu_group": rf"^{_DNS_SUBDOMAIN}$",
    "gpu_version": r"^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$",
    "gpu_class_plural": rf"^{_DNS_LABEL}$",
    "gpu_claim_plural": rf"^{_DNS_LABEL}$",
    "token_key": r"^[-._a-zA-Z0-9]+$",
    "report_url": r"^(https?://[^\s]+)?$",
    "metrics_address": rf"^{_HOST_PORT}$",
    "reports_address": rf"^{_HOST_PORT}$",
    "webhook_address": rf"^({_HOST_PORT})?$",
    "tls_secret": rf"^{_DNS_SUBDOMAIN}$",
    "tls_hosts": r"^[^\s,]*(\s*,\s*[^\s,]*)*$",
    "webhook_configuration": rf"^{_DNS_SUBDOMAIN}$",
    "vgpu_driver_images": r"^\s*[^\s,]*(\s*,\s*[^\s,]*)*\s*$",
    "lease_name": rf"^{_DNS_SUBDOMAIN}$",
}


@dataclass(frozen=True)
class Option:
    field: str
    help: str
    parse: Callable[[str], Any] = str

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    @property
    def env(self) -> str:
        return "LICENSECTL_" + self.field.upper()


OPTIONS: tuple[Option, ...] = (
    Option("kubeconfig", "Path to a kubeconfig; empty means in-cluster config, then ~/.kube/config."),
    Option("context", "kubeconfig context to use (empty: current context)."),
    Option("namespace", "Namespace licensectl runs in (signing key Secret, Lease, Events)."),
    Option("vgpu_label", "Namespace label holding a tenant's vgpu flag (\"true\" grants)."),
    Option("tenant_label_prefix", "Prefix of Cozystack's per-ancestor tenant labels."),
    Option("root_tenant", "Name of the root tenant namespace."),
    Option("gpu_group", "API group of the GPUClass/GPUClaim contract."),
    Option("gpu_version", "API version of the GPUClass/GPUClaim contract."),
    Option("gpu_class_plural", "Plural resource name of GPU classes (cluster-scoped)."),
    Option("gpu_claim_plural", "Plural resource name of GPU claims (namespaced)."),
    Option("token_key", "Key of the client configuration token in the source Secret."),
    Option("resync_seconds", "Full re-reconcile period even without events.", float),
    Option("deletions_per_minute", "Cap on replica deletions per minute (Event + metric when hit).", int),
    Option("settle_seconds", "A rollout starts only after the source was stable this long.", float),
    Option("max_unavailable", "VMIs restarting at once: a count or a percentage of affected VMIs.",
           _max_unavailable),
    Option("max_per_namespace", "VMIs restarting at once within one namespace.", int),
    Option("max_failures", "Failed restarts in one namespace after which that namespace's rollout pauses; "
           "the whole source pauses when failures span max(2, this) namespaces.", int),
    Option("restart_timeout_seconds", "A restarted VMI must be done within this time or counts as failed.",
           float),
    Option("manual_deadline_seconds", "A manual-restart VM still stale after this is reported overdue.", float),
    Option("done_gate", "When a restarted VMI counts as done: ready, or ready-licensed (a guest that has "
           "reported before must report licensed with the new token; one that never did is done when Ready).",
           _choice("ready", "ready-licensed")),
    Option("max_restarts_per_minute", "Restarts issued per minute across the fleet (0: no limit beyond "
           "maxUnavailable).", int),
    Option("max_disrupted_workers", "Workers of one tenant Kubernetes cluster drained or restarting at once "
           "(the Cluster's licensectl.io/max-disrupted-workers annotation overrides it per cluster).", int),
    Option("drain_timeout_seconds", "A worker's drain (cordon and evictions) that has not finished in this time is "
           "blocked; the Machine's nodeDrainTimeout overrides it when set.", float),
    Option("drain_retry_seconds", "Evictions refused by a PodDisruptionBudget are retried after this.", float),
    Option("worker_boot_timeout_seconds", "A restarted worker's Node must be Ready with a new boot ID within "
           "this time, or its cycle is blocked (and the Node uncordoned).", float),
    Option("canary", "Canary of a new token revision: a VM count (\"3\"), a percentage of VMs (\"5%\"), or "
           "named tenant namespaces (\"namespaces:a,b\"). Only guests that report count.", _canary),
    Option("rollout_steps", "Shares of namespaces promoted after the canary passes, e.g. 10%,50%,100%.",
           _rollout_steps),
    Option("analysis_deadline_seconds", "A canary or step whose guests have not proved licensed this long "
           "after it started aborts the rotation.", float),
    Option("analysis_max_unlicensed", "Guests failing to license with the new token (gridd reports an "
           "acquisition failure) that abort the rotation; 0 disables.", int),
    Option("restart_reissue_seconds",
           "A restart whose VMI is still running unchanged this long after the call is issued again.", float),
    Option("restart_fallback_delete",
           "Without the restart subresource, delete the VMI of a runStrategy Always VM instead.", _bool),
    Option("report_url", "URL guests POST reports to (written into each replica)."),
    Option("report_interval_seconds", "Expected guest report interval; 3 missed make a guest unknown.", float),
    Option("guest_boot_allowance_seconds", "Time a new VMI has from its start to its first guest report (boot, "
           "license unit, the probe's first timer run), on top of 3 report intervals, before it counts as not "
           "reporting.", float),
    Option("key_grace_seconds", "An older signing key no running VMI holds is still accepted this long after "
           "its rotation (held keys stay regardless; docs/design.md#key-ring).",
           float),
    Option("guest_metrics", "Guest series: per-vmi (one set per VMI), or per-tenant (only the per-tenant "
           "counts, for very large fleets; per-VMI alerts then stay silent).", _choice("per-vmi", "per-tenant")),
    Option("metrics_address", "host:port of the internal listener (/metrics, /livez, /readyz, /v1/status)."),
    Option("reports_address", "host:port of the tenant-facing listener (POST /v1/reports)."),
    Option("webhook_address", "host:port of the VMI admission webhook listener (HTTPS); empty disables it."),
    Option("tls_mode", "Serving certificate: self-managed (licensectl keeps its own CA and certificate in "
           "the TLS Secret), or secret (read the Secret an issuer such as cert-manager writes).",
           _choice("self-managed", "secret")),
    Option("tls_secret", "Secret (in --namespace) holding tls.crt, tls.key and ca.crt for both HTTPS listeners."),
    Option("tls_hosts", "Extra DNS names or IPs for the self-managed certificate, comma-separated (the "
           "webhook and reports Service names are always included)."),
    Option("webhook_configuration", "Name of the Mutating (and Validating) WebhookConfiguration: licensectl "
           "checks it exists and carries a caBundle (a Warning Event and metric if not) and keeps that caBundle "
           "current in self-managed mode. The chart names its objects with this same value."),
    Option("reports_plain_http", "Serve guest reports over plain HTTP (opt-out of TLS; not recommended).", _bool),
    Option("vgpu_driver_check", "Boot images of vGPU VMIs without the vGPU guest driver mark: warn (the client "
           "sees a warning, the VMI an Event), enforce (also deny them, through the ValidatingWebhookConfiguration "
           "named --webhook-configuration), or off.", _choice("warn", "enforce", "off")),
    Option("vgpu_driver_images", "containerDisk images that carry the vGPU guest driver: comma-separated "
           "prefixes (ending at /, : or @) or globs.", _image_patterns),
    Option("leader_elect", "Use a coordination.k8s.io Lease so only one replica writes.", _bool),
    Option("lease_name", "Name of the leader-election Lease."),
    Option("lease_duration_seconds", "Lease duration.", float),
    Option("renew_deadline_seconds", "The leader gives up if it cannot renew within this time.", float),
    Option("retry_period_seconds", "Interval between lease acquire/renew attempts.", float),
    Option("pod_name", "This replica's identity in the Lease (defaults to the hostname)."),
    Option("log_format", "Log format.", _choice("json", "console")),
    Option("log_level", "Log level.", _choice("debug", "info", "warning", "error")),
    Option("dry_run", "Log the plan, write nothing.", _bool),
)

_DEFAULTS = Settings()
assert {o.field for o in OPTIONS} == {f.name for f in fields(Settings)}, "OPTIONS and Settings disagree"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per option; defaults stay None so the environment can fill the gap."""
    for o in OPTIONS:
        # argparse %-formats help texts: a literal "10%" must reach it as "10%%".
        parser.add_argument(o.flag, dest=o.field, default=None, help=f"{o.help} [env {o.env}]".replace("%", "%%"),
                            metavar=o.field.upper() if o.parse is not _bool else "BOOL")


def settings_from(args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
                  ) -> Settings:
    """Resolve flag > environment > default; a bad value raises ValueError naming the flag."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for o in OPTIONS:
        raw = getattr(args, o.field, None) if args is not None else None
        source = o.flag
        if raw is None and o.env in env:
            raw, source = env[o.env], o.env
        if raw is None:
            continue
        try:
            values[o.field] = o.parse(raw) if isinstance(raw, str) else raw
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None
    return Settings(**values)


def reference_markdown(options: Sequence[Option] = OPTIONS) -> str:
    """The configuration reference table for the README."""
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for o in options:
        default = getattr(_DEFAULTS, o.field)
        shown = "(empty)" if default == "" else f"`{str(default).lower() if isinstance(default, bool) else default}`"
        rows.append(f"| `{o.flag}` | `{o.env}` | {shown} | {o.help} |")
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------------------------------
# Helm chart values (charts/licensectl): the same table, as the chart's `config:` block and schema.
# --------------------------------------------------------------------------------------------------
# What a pod sets differently from the CLI defaults, in the chart and in manifests/ alike: it listens
# on all interfaces (Services and probes reach it), logs JSON, and elects a leader among replicas.
IN_CLUSTER: Mapping[str, Any] = {
    "metrics_address": "0.0.0.0:8080",
    "reports_address": "0.0.0.0:8443",
    "webhook_address": "0.0.0.0:9443",
    "leader_elect": True,
    "log_format": "json",
}
# Settings a pod takes from the downward API unless set explicitly.
DOWNWARD_API: Mapping[str, str] = {"namespace": "metadata.namespace", "pod_name": "metadata.name"}

HELM_VALUES_START = "# config-reference:start"
HELM_VALUES_END = "# config-reference:end"


def helm_key(field_name: str) -> str:
    """Settings field -> the chart's camelCase value name (max_unavailable -> maxUnavailable)."""
    head, *rest = field_name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def _yaml_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, str):
        return '""' if v == "" else f'"{v}"'
    return str(v)


def reference_helm_values(options: Sequence[Option] = OPTIONS) -> str:
    """The chart's `config:` block of values.yaml: one documented value per `licensectl run` flag.

    null leaves the setting unset in the pod, so licensectl's own default applies (and a changed
    default in a new release is picked up); IN_CLUSTER settings and DOWNWARD_API ones are the
    exceptions a pod needs.
    """
    lines = [HELM_VALUES_START + " (generated: `licensectl config-reference --format helm-values`)",
             "# -- Every flag of `licensectl run`, set as its LICENSECTL_* environment variable in the pod.",
             "# null: not set, so licensectl's built-in default (shown) applies.",
             "config:"]
    for o in options:
        default = getattr(_DEFAULTS, o.field)
        shown = "empty" if default == "" else _yaml_scalar(default).strip('"')
        note = f"licensectl default: {shown}"
        if o.field in DOWNWARD_API:
            note = f"null: the pod's {DOWNWARD_API[o.field]} (downward API)"
        elif o.field in IN_CLUSTER:
            note += "; a pod needs the value set here"
        lines.append(f"  # -- {o.help} ({o.flag}; {note})")
        lines.append(f"  {helm_key(o.field)}: {_yaml_scalar(IN_CLUSTER.get(o.field))}")
    lines.append(HELM_VALUES_END)
    return "\n".join(lines) + "\n"


MAX_UNAVAILABLE_PATTERN = r"^([1-9][0-9]*|([1-9]|[1-9][0-9]|100)%)$"


def helm_values_schema(options: Sequence[Option] = OPTIONS) -> dict[str, Any]:
    """JSON schema of the chart's `config:` block: `helm install` rejects a bad value up front."""
    props: dict[str, Any] = {}
    for o in options:
        schema: dict[str, Any]
        if isinstance(o.parse, _Choice):
            schema = {"enum": [*o.parse.allowed, None]}
        elif o.parse is _bool:
            schema = {"type": ["boolean", "null"]}
        elif o.parse is int:
            schema = {"type": ["integer", "null"], "minimum": 0}
        elif o.parse is float:
            schema = {"type": ["number", "null"], "minimum": 0}
        elif o.parse is _max_unavailable:
            schema = {"type": ["string", "integer", "null"], "pattern": MAX_UNAVAILABLE_PATTERN, "minimum": 1}
        else:
            schema = {"type": ["string", "null"]}
        if o.field in PATTERNS:
            schema["pattern"] = PATTERNS[o.field]
        props[helm_key(o.field)] = {"description": o.help, **schema}
    return {"type": "object", "additionalProperties": False, "properties": props}
