"""`licensectl status` and `licensectl rollout status`: read-only views of what the controller decided.

The source of truth is the running controller's own `GET /v1/status`: it holds the deployed settings,
the guest reports and the rollout's guest evidence, none of which a workstation can reconstruct. The
CLI reaches it through the Kubernetes API service proxy (`services/proxy` on the metrics Service in
licensectl's namespace; the caller needs `get` on `services/proxy` there) or a direct `--url` (e.g. a
`kubectl port-forward`). The apiserver picks a random ready endpoint per proxied request, so with
two replicas the CLI asks again until the leader answers (only it holds guest states).

Only when the controller cannot be reached does the CLI recompute the state offline (one paged
LIST per resource, the same pure planners and the same rotation records from the revision stores, but
this workstation's settings and no guest states), and it says plainly that this is a partial view and
how to reach the controller. The commands that write live in `licensectl.cli.actions` and
`licensectl.cli.keys`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from licensectl import config
from licensectl.cli.errors import api_error
from licensectl.controllers.replication_loop import class_status
from licensectl.controllers.settings import rollout_settings, rotation_settings, tenant_settings
from licensectl.core import tokeninfo
from licensectl.core.credentials import keyring_from_secret_data
from licensectl.core.delivery import DeliveryView, wanted_volumes
from licensectl.core.model import (
    ANN_REVISION,
    ANN_SOURCE_REVISION,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    REVISION_STORE_LABEL,
    ObjectRef,
    RevisionStore,
    SourceSecret,
)
from licensectl.core.render import ReplicaState
from licensectl.core.replication import ReplicationInputs, ReplicationPlan, plan_replication
from licensectl.core.revision_text import REPLICA_COLUMN, SOURCE_COLUMN, short
from licensectl.core.rollout import (
    ReplicaRevision,
    RolloutPlan,
    SourceControl,
    plan_rollout,
)
from licensectl.core.rollout.view import (
    ATTENTION_STATES,
    RolloutExit,
    progress_line,
    rollout_exit,
    rollout_json,
    rotation_json,
    shown_phase,
    vmis_json,
    wave_label,
)
from licensectl.core.rotation import RotationRecord
from licensectl.kube import contract, projections
from licensectl.kube import revision_store as rs
from licensectl.kube.api import AnyClient, ApiException, CoreV1Api, CustomObjectsApi, as_kube
from licensectl.kube.caches import Caches
from licensectl.kube.client import make_api_client, request_tracing
from licensectl.kube.raw import RawApi, checked
from licensectl.kube.server_clock import ServerClock
from licensectl.kube.signing_key import SECRET_NAME

Projection = Callable[[Mapping[str, Any]], Any]

# The Service (manifests/base/services.yaml, the chart's templates/services.yaml) in front of every
# replica's internal listener, and its port name.
STATUS_SERVICE = "licensectl-metrics"
STATUS_SERVICE_PORT = "metrics"
STATUS_PATH = "/v1/status"
# Proxied requests land on a random ready endpoint: ask this often before settling for a standby.
LEADER_ATTEMPTS = 8
HTTP_TIMEOUT = 10.0
# `rollout status --watch` polls one small document (or an in-memory watch cache) this often.
WATCH_INTERVAL = 1.0
SYNC_TIMEOUT = 60.0


class ControllerUnreachable(Exception):
    """The controller's /v1/status could not be read; the message says why (never a credential)."""


@dataclass(frozen=True, slots=True)
class ControllerTarget:
    """Where the controller's internal listener is: a direct URL, or a Service behind the API proxy."""

    url: str | None = None
    namespace: str = "licensectl-system"
    service: str = STATUS_SERVICE
    port: str = STATUS_SERVICE_PORT

    def proxy_path(self, path: str = STATUS_PATH) -> str:
        """The apiserver path that proxies `path` to the Service (`services/proxy` subresource)."""
        return (f"/api/v1/namespaces/{quote(self.namespace, safe='')}/services/"
                f"{quote(self.service, safe='')}:{quote(self.port, safe='')}/proxy{path}")

    def describe(self) -> str:
        return self.url or f"service {self.namespace}/{self.service}:{self.port} via the API server proxy"


async def list_all(call: Callable[..., Any], projection: Projection, **kw: Any) -> list[Any]:
    """Every object of a paged LIST, projected; raises on any failed page (never a partial view)."""
    out: list[Any] = []
    token: str | None = None
    while True:
        args = dict(kw, limit=500)
        if token:
            args["_continue"] = token
        doc = await checked(call(**args, _preload_content=False))
        for item in doc.get("items") or []:
            p = projection(item)
            if p is not None:
                out.append(p)
        token = (doc.get("metadata") or {}).get("continue") or None
        if not token:
            return out


@dataclass
class ClusterView:
    replication: ReplicationPlan
    rollout: RolloutPlan
    sources: dict[ObjectRef, SourceSecret | None]
    now: dt.datetime
    # The rotation records (None: the revision stores could not be read, so replicas of rotated
    # sources are judged against the live source, as before safe rotation).
    records: dict[ObjectRef, RotationRecord | None] | None = None
    settings: config.Settings | None = None


def offline_rotations(records: Mapping[ObjectRef, RotationRecord | None] | None,
                      settings: config.Settings | None) -> dict[str, Any]:
    """`rotations` as the controller's status has them, from the records the offline read found
    (no wave progress: that needs the guest reports only the controller holds)."""
    if records is None or settings is None:
        return {}
    st = rotation_settings(settings)
    return {str(ref): ({"phase": "invalid"} if rec is None else
                       rotation_json(rec, steps=st.steps, canary=not st.canary.none))
            for ref, rec in sorted(records.items(), key=lambda kv: str(kv[0]))}


async def read_stores(core: CoreV1Api, settings: config.Settings) -> dict[ObjectRef, RevisionStore] | None:
    """The revision stores in licensectl's namespace by source; None when this user may not list them."""
    try:
        found = await list_all(lambda **kw: core.list_namespaced_secret(settings.namespace, **kw),
                               projections.revision_store_from, label_selector=f"{REVISION_STORE_LABEL}=true")
    except ApiException as e:
        if e.status == 403:
            return None
        raise
    return rs.stores_by_source(found)


async def read_cluster(api: AnyClient, settings: config.Settings, now: dt.datetime | None = None) -> ClusterView:
    core, custom = CoreV1Api(api), CustomObjectsApi(api)
    now = now or dt.datetime.now(dt.UTC)
    namespaces = await list_all(core.list_namespace, projections.namespace_from)
    classes = await list_all(contract.gpu_class_lister(custom, settings), projections.gpu_class_from)
    claims = await list_all(contract.gpu_claim_lister(custom, settings), projections.gpu_claim_from)
    replicas = await list_all(core.list_secret_for_all_namespaces, projections.replica_secret_from,
                              label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")
    vms = await list_all(contract.vm_lister(custom), projections.vm_from)
    vmis = await list_all(contract.vmi_lister(custom), projections.vmi_from)
    sources: dict[ObjectRef, SourceSecret | None] = {}
    for c in classes:
        ref = c.secret_ref
        if c.mode != "vgpu" or ref is None or ref in sources:
            continue
        found = await list_all(lambda ns=ref.namespace, **kw: core.list_namespaced_secret(ns, **kw),
                               projections.source_secret_from, field_selector=f"metadata.name={ref.name}")
        sources[ref] = found[0] if found else None
    ring = None
    try:
        key = await RawApi(core).read_namespaced_secret(SECRET_NAME, settings.namespace)
        ring = keyring_from_secret_data({k: base64.b64decode(v) for k, v in (key.get("data") or {}).items()})
    except (ApiException, ValueError):
        ring = None
    # The same rotation records the controller renders replicas from, so a rotated namespace is not "drifted".
    stores = await read_stores(core, settings)
    rotations = None if stores is None else rs.source_rotations(stores, sources, token_key=settings.token_key)
    records = None if stores is None else {ref: RotationRecord.from_annotations(s.annotations)
                                           for ref, s in stores.items()}
    # The CA bundle replicas carry (kube/serving_tls.py), so replicas written with it compare in sync.
    report_ca = b""
    if not settings.reports_plain_http:
        try:
            tls = await RawApi(core).read_namespaced_secret(settings.tls_secret, settings.namespace)
            report_ca = base64.b64decode((tls.get("data") or {}).get("ca.crt") or "")
        except (ApiException, ValueError):
            report_ca = b""
    replication = plan_replication(ReplicationInputs(
        namespaces={n.name: n for n in namespaces}, classes={c.name: c for c in classes}, claims=claims,
        sources=sources, replicas={(r.namespace, r.name): r for r in replicas}, conflicts=frozenset(),
        credential_for=(lambda ns: ring.credential(ns)) if ring else (lambda ns: ""),
        report_url=config.report_url_for(settings), token_key=settings.token_key,
        tenant=tenant_settings(settings), now=now, report_ca=report_ca, rotations=rotations,
        steps=rotation_settings(settings).steps,
        credential_key=ring.current_id if ring else "", credential_epoch=ring.revocation if ring else ""))
    view = DeliveryView(claims={(c.namespace, c.name): c for c in claims}, classes={("", c.name): c for c in classes},
                        entitled=replication.entitlement.entitled if replication.entitlement else {},
                        replicas={(r.namespace, r.name): r for r in replicas})
    wanted = wanted_volumes(vmis, view)
    rollout = plan_rollout(
        replicas=[r for r in (ReplicaRevision.from_secret(s) for s in replicas) if r], vmis=vmis, vms=vms,
        guests={}, sources={ref: SourceControl.from_annotations(s.annotations) for ref, s in sources.items() if s},
        settings=rollout_settings(settings), now=now, wanted=wanted)
    return ClusterView(replication, rollout, sources, now, records, settings)

# -- the controller's view ---------------------------------------------------------------------------
def _proxy_error(e: ApiException, target: ControllerTarget) -> str:
    if e.status == 403:
        return (f"HTTP 403 from the API server: this user may not get services/proxy in {target.namespace} "
                f"(see docs/operations.md#status-from-the-controller)")
    if e.status == 404:
        return f"HTTP 404: no Service {target.namespace}/{target.service} with port {target.port}"
    if e.status == 503:
        return (f"HTTP 503: no ready endpoint of Service {target.namespace}/{target.service} answered (where "
                f"NetworkPolicies are enforced, the shipped policy blocks the API server's proxy route)")
    return f"HTTP {e.status} {e.reason} from {target.describe()}"


async def _get_once(api: AnyClient | None, target: ControllerTarget) -> dict[str, Any]:
    """One GET of /v1/status. An API server that cannot be reached at all is raised as is (no offline
    view can be computed either); a proxy that cannot reach the controller is ControllerUnreachable."""
    if target.url:
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT)) as http, \
                    http.get(target.url.rstrip("/") + STATUS_PATH) as resp:
                if resp.status != 200:
                    raise ControllerUnreachable(f"HTTP {resp.status} from {target.url}")
                doc = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise ControllerUnreachable(f"{type(e).__name__} from {target.url}") from None
    else:
        if api is None:
            raise ControllerUnreachable("no API client for the service proxy")
        try:
            doc = await checked(as_kube(api).request("GET", target.proxy_path(), request_timeout=HTTP_TIMEOUT))
        except ApiException as e:
            raise ControllerUnreachable(_proxy_error(e, target)) from None
        except TimeoutError:
            raise ControllerUnreachable("the API server's proxy to the controller timed out (where "
                                        "NetworkPolicies are enforced, the shipped policy blocks this route)") from None
    if not isinstance(doc, dict) or "replication" not in doc:
        raise ControllerUnreachable(f"{target.describe()} did not answer with a licensectl status document")
    return doc


async def fetch_controller_status(api: AnyClient | None, target: ControllerTarget, *,
                                  attempts: int = LEADER_ATTEMPTS) -> dict[str, Any]:
    """The controller's own /v1/status, from the leader when one answers within `attempts` tries.

    A direct URL names one process: its answer is taken as is. Through the Service, a standby's
    answer (it has no guest reports) is only kept if no leader answers at all.
    """
    doc = await _get_once(api, target)
    tries = 1
    while not target.url and not doc.get("leader") and tries < attempts:
        again = await _get_once(api, target)
        tries += 1
        if again.get("leader"):
            return again
    return doc


def status_from_controller(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`licensectl status` JSON from the controller's /v1/status (pure): the same keys as the offline
    view, plus where it came from."""
    repl = doc.get("replication") or {}
    entitled = repl.get("entitled") or []
    per_class: dict[str, str] = {}
    counts: dict[str, int] = {}
    for e in entitled:
        per_class.setdefault(e["class"], e["source"])
        counts[e["class"]] = counts.get(e["class"], 0) + 1
    srcs = repl.get("sources") or {}
    classes = repl.get("classes") or {}  # absent from a controller of an older release
    guests = doc.get("guests")
    return {
        "from": "controller",
        "controller": {"identity": doc.get("identity"), "leader": bool(doc.get("leader")),
                       "version": doc.get("version"), "ready": bool(doc.get("ready"))},
        "sources": [{
            "class": cls, "source": src, "valid": bool((srcs.get(cls) or {}).get("valid")),
            # An older controller sent the replica revision as "revision": not shown as a source revision.
            "source_revision": (srcs.get(cls) or {}).get("source_revision"),
            "token": (srcs.get(cls) or {}).get("token"),
            "problem": (srcs.get(cls) or {}).get("message"),
            "entitled_namespaces": counts[cls],
            **_class_fields(classes.get(cls)),
        } for cls, src in sorted(per_class.items())],
        "replicas": dict(repl.get("replica_counts") or {}),
        "tenant_problems": list(repl.get("tenant_problems") or []),
        "rollouts": dict((doc.get("rollout") or {}).get("sources") or {}),
        "rotations": dict(doc.get("rotation") or {}),
        "guests": guests if doc.get("leader") else None,
        # Delivery readiness (docs/operations.md#delivery-readiness); None from a release without it.
        "delivery": doc.get("delivery"),
    }


def _class_fields(cls: Mapping[str, Any] | None) -> dict[str, Any]:
    """A source line's class fields: the FeatureType check and a held license change, if any."""
    c = cls or {}
    return {"feature_type_check": c.get("feature_type_check"), "feature_type_message": c.get("feature_type_message"),
            "license_change": c.get("license_change")}


# -- rendering ------------------------------------------------------------------------------------
def offline_note(reason: str) -> str:
    """What an offline view is and is not, and how to reach the controller
    (docs/operations.md#status-from-the-controller)."""
    return (f"OFFLINE, PARTIAL VIEW: recomputed from the cluster with the same planners and rotation records "
            f"as the controller, but this workstation's settings (not the deployed ones) and no guest reports, so "
            f"done gates and wave progress are unknown. Controller unreachable: {reason}. For the controller's "
            f"view: `get` on services/proxy in licensectl's namespace, and where NetworkPolicies are enforced "
            f"an ingress rule for the API server on the metrics port (the shipped policy blocks that route); or "
            f"`kubectl port-forward` and --url (docs/operations.md#status-from-the-controller).")


def status_json(view: ClusterView, guests: Mapping[str, Any] | None) -> dict[str, Any]:
    """`licensectl status` JSON recomputed from a cluster read: the offline fallback."""
    rep = view.replication
    ent = rep.entitlement.entitled if rep.entitlement else {}
    classes = class_status(rep)
    records = view.records or {}
    return {
        "sources": [{
            "class": cls, "source": str(lic_src), "valid": cls in rep.licenses,
            "source_revision": short(rep.licenses[cls].source_revision) if cls in rep.licenses else None,
            "token": _readability(view, lic_src, rep.licenses[cls].token) if cls in rep.licenses else None,
            "problem": rep.source_problems[cls].message if cls in rep.source_problems else None,
            "entitled_namespaces": sum(1 for (_, c) in ent if c == cls),
            **_class_fields(classes.get(cls)),
        } for cls, lic_src in sorted({c: r for (_, c), r in ent.items()}.items())],
        "replicas": offline_replica_counts(rep),
        "tenant_problems": [{"kind": p.kind.value, "object": str(p.ref), "message": p.message}
                            for p in rep.tenant_problems],
        "rollouts": {str(ref): rollout_json(st, _offline_source_revision(records.get(ref)))
                     for ref, st in sorted(view.rollout.sources.items(), key=lambda kv: str(kv[0]))},
        "rotations": offline_rotations(view.records, view.settings),
        "rotation_records_read": view.records is not None,
        "guests": guests,
    }


def offline_replica_counts(rep: ReplicationPlan) -> dict[str, int]:
    """Replica states as the controller counts them, except that a replica carrying the revision and
    source revision its namespace should have counts as in sync: its report URL, credential and CA
    follow the deployed settings, which a workstation does not have (docs/operations.md#status-from-the-controller)."""
    counts = dict(rep.state_counts())
    for existing, desired in rep.updates:
        ann = existing.annotations
        if ann.get(ANN_REVISION) == desired.revision and \
                ann.get(ANN_SOURCE_REVISION) == desired.annotations.get(ANN_SOURCE_REVISION):
            counts[ReplicaState.DRIFTED.value] -= 1
            counts[ReplicaState.IN_SYNC.value] += 1
    return counts


def _readability(view: ClusterView, ref: ObjectRef, token: bytes) -> str:
    """Readable, unreadable or opaque (core/tokeninfo.py), as the controller's status says it."""
    src = view.sources.get(ref)
    return tokeninfo.readability(tokeninfo.token_info(token).format, src.annotations if src else {}).value


def _valid_cell(s: Mapping[str, Any]) -> str:
    """VALID: "NO" for a source problem, "unreadable" for a token that is no JWT (unless marked opaque)."""
    if not s["valid"]:
        return "NO"
    return "unreadable" if s.get("token") == tokeninfo.Readability.UNREADABLE.value else "yes"


def _offline_source_revision(rec: RotationRecord | None) -> str | None:
    """Offline, the rollout's source revision is the record's: the candidate while one is out, else stable."""
    if rec is None:
        return None
    return rec.candidate if rec.candidate and rec.phase.value in ("canary", "promoting", "promoted") else rec.stable


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _origin(doc: Mapping[str, Any]) -> list[str]:
    if doc.get("from") == "controller":
        c = doc.get("controller") or {}
        role = "leader" if c.get("leader") else "STANDBY (no guest states; the leader did not answer)"
        return [f"FROM CONTROLLER {c.get('identity') or '?'} ({role}, licensectl {c.get('version') or '?'})", ""]
    if doc.get("from") == "offline":
        out = [offline_note(doc.get("offline_reason") or "not asked")]
        if not doc.get("rotation_records_read", True):
            out.append("The revision stores could not be read (no permission on Secrets in licensectl's namespace): "
                       "replicas of a source in rotation may show as drifted.")
        return [*out, ""]
    return []


def _feature_type_cell(s: Mapping[str, Any]) -> str:
    """`ok`, `MISMATCH`, or why nothing was checked; "-" from a controller that does not say."""
    check = s.get("feature_type_check")
    return {None: "-", "ok": "ok", "mismatch": "MISMATCH", "no_profile": "no profile",
            "unknown_profile": "unknown profile"}.get(check, str(check))


def _held_cell(s: Mapping[str, Any]) -> str:
    change = s.get("license_change")
    return f"HELD {change['held']}" if change else "-"


def _class_problem_lines(sources: list[Mapping[str, Any]]) -> list[str]:
    out: list[str] = []
    for s in sources:
        change = s.get("license_change")
        if change:
            out.append(f"  {s['class']}: license changed in place from {', '.join(change['from'])} to "
                       f"{change['to']}; {change['held']} replicas held. Accept with: kubectl annotate gpuclass "
                       f"{s['class']} {change['accept']}")
        if s.get("feature_type_check") == "mismatch" and s.get("feature_type_message"):
            out.append(f"  {s['class']}: {s['feature_type_message']}")
    return out


def _wrong_product_cell(x: Mapping[str, Any]) -> str:
    return {True: "YES", False: "no", None: "-"}.get(x.get("wrong_product"), "-")


def _seconds(x: float) -> str:
    return f"{x:g}s"


def delivery_lines(doc: Mapping[str, Any]) -> list[str]:
    """DELIVERY: the controller's evidence that VMI admission adds the license volume (the delivery probe),
    and any unusable webhook configuration. Empty for the offline view and a controller that does not say."""
    d = doc.get("delivery")
    if doc.get("from") != "controller" or not isinstance(d, Mapping):
        return []
    age = d.get("last_success_seconds_ago")
    if "prober" not in d:  # no admission webhook in this deployment: nothing to probe
        line = "ready (no admission webhook: nothing to probe)" if d.get("ready") else "NOT READY"
    elif d.get("ready"):
        line = "ready" + (f" (last successful probe {_seconds(age)} ago)" if age is not None else "")
    elif not d.get("prober"):
        line = "not probed here (a standby: only the leader probes)"
    else:
        why = d.get("error") or ("no fresh probe answer" + (f", last success {_seconds(age)} ago"
                                                            if age is not None else ""))
        n = d.get("consecutive_failures") or 0
        line = f"NOT READY: {why}" + (f" ({n} failure{'s' if n != 1 else ''})" if n else "")
    out = [f"DELIVERY  {line}"]
    out += [f"  {c.get('kind')} {c.get('name')}: {c['problem']}"
            for c in d.get("webhook_configurations") or [] if c.get("problem")]
    return out


def status_table(doc: Mapping[str, Any]) -> str:
    out = [*_origin(doc), "SOURCES"]
    rows = [["CLASS", "SOURCE", "VALID", SOURCE_COLUMN, "ENTITLED NAMESPACES", "FEATURETYPE", "LICENSE CHANGE",
             "PROBLEM"]]
    rows += [[s["class"], s["source"], _valid_cell(s), s.get("source_revision") or "-",
              str(s["entitled_namespaces"]), _feature_type_cell(s), _held_cell(s), s["problem"] or ""]
             for s in doc["sources"]]
    out += [table(rows)]
    class_lines = _class_problem_lines(doc["sources"])
    if class_lines:
        out += ["", "CLASS PROBLEMS", *class_lines]
    out += ["", "REPLICAS  " + "  ".join(f"{k}={v}" for k, v in doc["replicas"].items()), ""]
    delivery = delivery_lines(doc)
    if delivery:
        out += [*delivery, ""]
    rotations = doc.get("rotations") or {}
    rows = [["SOURCE", "PHASE", SOURCE_COLUMN, "CURRENT", "STALE", "RESTARTING", "FAILED", "BLOCKED", "MANUAL"]]
    rows += [[src, shown_phase({**r, "rotation": rotations.get(src)}), r.get("source_revision") or "-",
              f"{r['current']}/{r['affected']}", str(r["stale"]),
              str(r["restarting"]), str(r["failed"]), str(r["blocked"]),
              f"{r['manual']}" + (f" ({r['overdue']} overdue)" if r["overdue"] else "")]
             for src, r in doc["rollouts"].items()]
    out += ["ROLLOUTS", table(rows), ""]
    if rotations:  # safe rotation (docs/design.md#safe-rotation)
        rows = [["SOURCE", "ROTATION", "WAVE", f"STABLE {SOURCE_COLUMN}", f"CANDIDATE {SOURCE_COLUMN}", "CANARY",
                 "REASON"]]
        rows += [[src, r["phase"], _wave_cell(r), r.get("stable") or "-", r.get("candidate") or "-",
                  ",".join(r.get("canary") or []) or "-", r.get("reason") or ""]
                 for src, r in sorted(rotations.items())]
        out += ["ROTATIONS", table(rows), ""]
    g = doc.get("guests")
    if g is None:
        out.append("GUESTS  (only the controller's leader knows guest license states)")
    else:
        out.append("GUESTS  " + "  ".join(f"{k}={v}" for k, v in g.get("counts", {}).items()))
        rows = [["NAMESPACE", "VMI", "STATE", "REASON", "PRODUCT", "WRONG PRODUCT", "EXPIRY", "TOKEN CURRENT"]]
        rows += [[x["namespace"], x["vmi"], x["state"], x.get("reason") or "-", x.get("product") or "-",
                  _wrong_product_cell(x), x.get("expiry") or "-",
                  {True: "yes", False: "NO", None: "-"}[x.get("token_current")]] for x in g.get("list", [])]
        out.append(table(rows))
    if doc["tenant_problems"]:
        out += ["", "TENANT PROBLEMS"] + [f"  {p['kind']}: {p['message']}" for p in doc["tenant_problems"]]
    return "\n".join(out) + "\n"


def _wave_cell(r: Mapping[str, Any]) -> str:
    label = wave_label(r)
    if label == "-" or not r.get("waves"):
        return label
    return f"{r.get('wave_number')}/{r['waves']} ({label})"


def target_from(args: Any, settings: config.Settings) -> ControllerTarget:
    return ControllerTarget(url=getattr(args, "url", None) or None,
                            namespace=getattr(args, "namespace", None) or settings.namespace,
                            service=getattr(args, "service", None) or STATUS_SERVICE,
                            port=getattr(args, "service_port", None) or STATUS_SERVICE_PORT)


async def status_main(args: Any, settings: config.Settings) -> int:
    target = target_from(args, settings)
    direct = bool(target.url)
    clock = ServerClock()
    api = None if direct and not args.offline else await make_api_client(
        settings, trace_configs=[request_tracing(clock=clock)])
    try:
        doc: dict[str, Any] | None = None
        reason = "--offline given"
        if not args.offline:
            try:
                doc = status_from_controller(await fetch_controller_status(api, target))
            except ControllerUnreachable as e:
                reason = str(e)
                if direct:
                    print(f"licensectl status: {reason}", file=sys.stderr)
                    return 1
        if doc is None:
            assert api is not None
            try:
                doc = status_json(await read_cluster(api, settings, now=clock.now()), None)
            except ApiException as e:
                why = f"HTTP {e.status} {e.reason}" if e.status != 403 else api_error(e)
                print("licensectl status: " + (f"the offline recomputation failed: {why}" if args.offline else
                      f"controller unreachable ({reason}), and the offline recomputation failed too: {why}"),
                      file=sys.stderr)
                return 1
            doc["from"], doc["offline_reason"], doc["partial"] = "offline", reason, True
    finally:
        if api is not None:
            await api.close()
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if args.output == "json" else status_table(doc))
    return 0


# -- rollout --------------------------------------------------------------------------------------
class WatchedCluster:
    """The offline fallback of `rollout status --watch`: one LIST per resource, then watches.

    Re-listing the whole cluster every second would load the apiserver like a controller per
    hoster terminal; informers keep the view current from watch events instead.
    """

    def __init__(self, api: AnyClient, settings: config.Settings, clock: Callable[[], dt.datetime]) -> None:
        self.settings = settings
        self.clock = clock
        self.caches = Caches(api, settings, on_change=lambda _kind: None)
        self.plan: RolloutPlan | None = None

    async def start(self) -> None:
        c = self.caches
        c.start()
        try:
            async with asyncio.timeout(SYNC_TIMEOUT):
                while True:
                    if c.core_synced() and c.kubevirt_healthy():
                        c.ensure_sources(self._wanted_sources())
                        if len(c.source_states()) == len(c.sources):
                            return
                    await asyncio.sleep(0.1)
        except TimeoutError:
            raise ControllerUnreachable(f"the cluster's caches did not sync within {SYNC_TIMEOUT:g} s") from None

    def _wanted_sources(self) -> set[ObjectRef]:
        return {gc.secret_ref for gc in self.caches.classes.snapshot().values()
                if gc.mode == "vgpu" and gc.secret_ref is not None}

    def records(self) -> dict[ObjectRef, RotationRecord | None]:
        stores = rs.stores_by_source(self.caches.revision_stores.cache.values())
        return {ref: RotationRecord.from_annotations(s.annotations) for ref, s in stores.items()}

    def rollouts(self) -> dict[str, Any]:
        c = self.caches
        c.ensure_sources(self._wanted_sources())
        assert c.vms is not None and c.vmis is not None
        replicas = [r for r in (ReplicaRevision.from_secret(s) for s in c.replicas.cache.values()) if r]
        plan = plan_rollout(
            replicas=replicas, vmis=list(c.vmis.snapshot().values()), vms=list(c.vms.snapshot().values()),
            guests={}, sources={ref: SourceControl.from_annotations(s.annotations)
                                for ref, s in c.source_states().items() if s is not None},
            settings=rollout_settings(self.settings), now=self.clock())
        self.plan = plan
        records = self.records()
        return {str(ref): rollout_json(st, _offline_source_revision(records.get(ref)))
                for ref, st in plan.sources.items()}

    async def stop(self) -> None:
        await self.caches.stop()


@dataclass
class RolloutSnapshot:
    """One look at the selected sources: per source the rollout with its `rotation`, and the VMIs."""

    rollouts: dict[str, Any]
    vmis: list[dict[str, Any]]


def _with_rotations(rollouts: Mapping[str, Any], rotations: Mapping[str, Any]) -> dict[str, Any]:
    return {src: {**r, "rotation": rotations.get(src)} for src, r in rollouts.items()}


async def rollout_status_main(args: Any, settings: config.Settings) -> int:
    target = target_from(args, settings)
    clock = ServerClock()
    api = None if target.url else await make_api_client(settings, trace_configs=[request_tracing(clock=clock)])
    watched: WatchedCluster | None = None
    try:
        reason = "--offline given" if args.offline else ""
        controller = not args.offline
        if controller:
            try:
                await fetch_controller_status(api, target)
            except ControllerUnreachable as e:
                if target.url:
                    print(f"licensectl rollout status: {e}", file=sys.stderr)
                    return RolloutExit.ERROR
                controller, reason = False, str(e)
        if not controller:
            assert api is not None
            print(offline_note(reason), file=sys.stderr)
            if args.watch:
                watched = WatchedCluster(api, settings, clock.now)
                await watched.start()

        async def snapshot() -> RolloutSnapshot:
            if controller:  # the controller's own view, including guest evidence for the done gate
                doc = await fetch_controller_status(api, target)
                rollout = doc.get("rollout") or {}
                return RolloutSnapshot(_with_rotations(rollout.get("sources") or {}, doc.get("rotation") or {}),
                                       list(rollout.get("vmis") or []))
            if watched is not None:
                got = watched.rollouts()
                rotations = offline_rotations(watched.records(), settings)
                return RolloutSnapshot(_with_rotations(got, rotations),
                                       vmis_json(watched.plan) if watched.plan else [])
            assert api is not None
            view = await read_cluster(api, settings, now=clock.now())
            return RolloutSnapshot(_with_rotations(
                {str(ref): rollout_json(st, _offline_source_revision((view.records or {}).get(ref)))
                 for ref, st in view.rollout.sources.items()}, offline_rotations(view.records, settings)),
                vmis_json(view.rollout))

        return await _rollout_status(args, snapshot)
    finally:
        if watched is not None:
            await watched.stop()
        if api is not None:
            await api.close()


def attention_vmis(vmis: Sequence[Mapping[str, Any]], sources: set[str]) -> list[Mapping[str, Any]]:
    """The VMIs `--vms` lists (ATTENTION_STATES) of the selected sources."""
    return [v for v in vmis if v.get("state") in ATTENTION_STATES and (not v.get("source") or v["source"] in sources)]


def vms_table(vmis: list[Mapping[str, Any]]) -> str:
    if not vmis:
        return "no failed, blocked, manual or restarting VMIs"
    rows = [["NAMESPACE", "VMI", "SOURCE", "STATE", REPLICA_COLUMN, "REASON"]]
    rows += [[v["namespace"], v["vmi"], v.get("source") or "-",
              v["state"] + (" (overdue)" if v.get("overdue") else ""), v.get("replica_revision") or "-",
              v.get("reason") or ""] for v in vmis]
    return table(rows)


def _document(found: Mapping[str, Any], vmis: list[Mapping[str, Any]] | None, code: RolloutExit | None) -> str:
    """`-o json|yaml`: the sources with their rotation, the listed VMIs, the exit code (null: going on)."""
    return json.dumps({"sources": dict(sorted(found.items())), **({"vmis": vmis} if vmis is not None else {}),
                       "exit_code": None if code is None else int(code)}, indent=2, sort_keys=False)


async def _rollout_status(args: Any, snapshot: Callable[[], Awaitable[RolloutSnapshot]]) -> int:
    output = getattr(args, "output", "text")
    tty = sys.stdout.isatty() and output == "text"
    deadline = time.monotonic() + args.timeout if args.timeout else None
    last = ""
    while True:
        snap: RolloutSnapshot | None
        try:
            snap = await snapshot()
        except (ControllerUnreachable, aiohttp.ClientError, TimeoutError) as e:
            # e.g. the leader is being replaced: try again next tick
            print(f"controller unreachable: {e}", file=sys.stderr)
            snap = None
        if snap is not None:
            found = {src: r for src, r in snap.rollouts.items() if not args.source or src == args.source}
            if args.source and not found:
                print(f"licensectl rollout status: no rollout found for source {args.source} (no GPUClass names "
                      f"it, or it licenses no VMI)", file=sys.stderr)
                return RolloutExit.ERROR
            code = rollout_exit(found)
            vmis = attention_vmis(snap.vmis, set(found)) if args.vms else None
            if output == "text":
                text = "\n".join(progress_line(src, r, tty) for src, r in sorted(found.items()))
                if vmis is not None:
                    text += "\n" + vms_table(vmis)
            else:
                text = _document(found, vmis, code)
                if output == "yaml":
                    import yaml

                    text = "---\n" + yaml.safe_dump(json.loads(text), sort_keys=False).rstrip("\n")
            if text != last:
                print(("\r" if tty and "\n" not in text else "") + text, flush=True)
                last = text
            if code is not None:
                if output == "text":
                    for src, r in sorted(found.items()):
                        if r["message"]:
                            print(f"{src}: {r['message']}")
                return code
        if not args.watch:
            return RolloutExit.PROGRESSING if snap is not None else RolloutExit.ERROR
        if deadline is not None and time.monotonic() > deadline:
            print("licensectl rollout status: timed out waiting for the rollout", file=sys.stderr)
            return RolloutExit.TIMEOUT
        await asyncio.sleep(WATCH_INTERVAL)
