"""`licensectl status` and `licensectl rollout status`: read-only views of the cluster.

Status is read from the cluster with one paged LIST per resource and evaluated by the same pure
planners the controller runs, so the CLI and the controller cannot disagree about what is entitled,
in sync or stale. Guest license states live only in the controller (they come from reports), so they
are fetched from its HTTP API when `--url` is given. The commands that write (rollout pause/resume,
keys rotate) live in `licensectl.actions`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, CustomObjectsApi

from licensectl import config
from licensectl.core_settings import rollout_settings, tenant_settings
from licensectl.credentials import keyring_from_secret_data
from licensectl.kube import contract, projections
from licensectl.kube.client import make_api_client
from licensectl.kube.raw import RawApi, checked
from licensectl.kube.signing_key import SECRET_NAME
from licensectl.model import (
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    ObjectRef,
    SourceSecret,
)
from licensectl.replication import ReplicationInputs, ReplicationPlan, plan_replication
from licensectl.rollout import (
    ReplicaRevision,
    RolloutPlan,
    SourceControl,
    plan_rollout,
)
from licensectl.rollout_view import progress_line, rollout_exit, rollout_json

Projection = Callable[[Mapping[str, Any]], Any]


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


async def read_cluster(api: ApiClient, settings: config.Settings, now: dt.datetime | None = None) -> ClusterView:
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
    replication = plan_replication(ReplicationInputs(
        namespaces={n.name: n for n in namespaces}, classes={c.name: c for c in classes}, claims=claims,
        sources=sources, replicas={(r.namespace, r.name): r for r in replicas}, conflicts=frozenset(),
        credential_for=(lambda ns: ring.credential(ns)) if ring else (lambda ns: ""),
        report_url=config.report_url_for(settings), token_key=settings.token_key,
        tenant=tenant_settings(settings), now=now))
    rollout = plan_rollout(
        replicas=[r for r in (ReplicaRevision.from_secret(s) for s in replicas) if r], vmis=vmis, vms=vms,
        guests={}, sources={ref: SourceControl.from_annotations(s.annotations) for ref, s in sources.items() if s},
        settings=rollout_settings(settings), now=now)
    return ClusterView(replication, rollout, sources, now)


# -- rendering ------------------------------------------------------------------------------------
def status_json(view: ClusterView, guests: Mapping[str, Any] | None) -> dict[str, Any]:
    rep = view.replication
    ent = rep.entitlement.entitled if rep.entitlement else {}
    return {
        "sources": [{
            "class": cls, "source": str(lic_src), "valid": cls in rep.licenses,
            "revision": rep.licenses[cls].revision[:12] if cls in rep.licenses else None,
            "problem": rep.source_problems[cls].message if cls in rep.source_problems else None,
            "entitled_namespaces": sum(1 for (_, c) in ent if c == cls),
        } for cls, lic_src in sorted({c: r for (_, c), r in ent.items()}.items())],
        "replicas": dict(rep.state_counts()),
        "tenant_problems": [{"kind": p.kind.value, "object": str(p.ref), "message": p.message}
                            for p in rep.tenant_problems],
        "rollouts": {str(ref): rollout_json(st) for ref, st in sorted(view.rollout.sources.items(),
                                                                       key=lambda kv: str(kv[0]))},
        "guests": guests,
    }


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def status_table(doc: Mapping[str, Any]) -> str:
    out = ["SOURCES"]
    rows = [["CLASS", "SOURCE", "VALID", "REVISION", "ENTITLED NAMESPACES", "PROBLEM"]]
    rows += [[s["class"], s["source"], "yes" if s["valid"] else "NO", s["revision"] or "-",
              str(s["entitled_namespaces"]), s["problem"] or ""] for s in doc["sources"]]
    out += [table(rows), "", "REPLICAS  " + "  ".join(f"{k}={v}" for k, v in doc["replicas"].items()), ""]
    rows = [["SOURCE", "PHASE", "REVISION", "CURRENT", "STALE", "RESTARTING", "FAILED", "BLOCKED", "MANUAL"]]
    rows += [[src, r["phase"], r["revision"] or "-", f"{r['current']}/{r['affected']}", str(r["stale"]),
              str(r["restarting"]), str(r["failed"]), str(r["blocked"]),
              f"{r['manual']}" + (f" ({r['overdue']} overdue)" if r["overdue"] else "")]
             for src, r in doc["rollouts"].items()]
    out += ["ROLLOUTS", table(rows), ""]
    g = doc.get("guests")
    if g is None:
        out.append("GUESTS  (pass --url http://<controller>:8080 to include guest license states)")
    else:
        out.append("GUESTS  " + "  ".join(f"{k}={v}" for k, v in g.get("counts", {}).items()))
        rows = [["NAMESPACE", "VMI", "STATE", "PRODUCT", "EXPIRY", "TOKEN CURRENT"]]
        rows += [[x["namespace"], x["vmi"], x["state"], x.get("product") or "-", x.get("expiry") or "-",
                  {True: "yes", False: "NO", None: "-"}[x.get("token_current")]] for x in g.get("list", [])]
        out.append(table(rows))
    if doc["tenant_problems"]:
        out += ["", "TENANT PROBLEMS"] + [f"  {p['kind']}: {p['message']}" for p in doc["tenant_problems"]]
    return "\n".join(out) + "\n"


async def fetch_guests(url: str) -> dict[str, Any] | None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http, \
            http.get(url.rstrip("/") + "/v1/status") as resp:
        resp.raise_for_status()
        doc = await resp.json()
    guests: dict[str, Any] | None = doc.get("guests")
    return guests


async def status_main(args: Any, settings: config.Settings) -> int:
    api = await make_api_client(settings)
    try:
        view = await read_cluster(api, settings)
    finally:
        await api.close()
    guests = await fetch_guests(args.url) if args.url else None
    doc = status_json(view, guests)
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if args.output == "json" else status_table(doc))
    return 0


# -- rollout --------------------------------------------------------------------------------------
async def rollout_status_main(args: Any, settings: config.Settings) -> int:
    api = await make_api_client(settings)
    try:
        return await _rollout_status(api, settings, args)
    finally:
        await api.close()


async def _rollout_status(api: ApiClient, settings: config.Settings, args: Any) -> int:
    tty = sys.stdout.isatty()
    deadline = time.monotonic() + args.timeout if args.timeout else None
    last = ""
    while True:
        if args.url:  # the controller's own view, including guest evidence for the done gate
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http, \
                    http.get(args.url.rstrip("/") + "/v1/status") as resp:
                resp.raise_for_status()
                all_rollouts = ((await resp.json()).get("rollout") or {}).get("sources") or {}
        else:
            view = await read_cluster(api, settings)
            all_rollouts = {str(ref): rollout_json(st) for ref, st in view.rollout.sources.items()}
        rollouts = {src: r for src, r in all_rollouts.items() if not args.source or src == args.source}
        if args.source and not rollouts:
            print(f"no rollout found for source {args.source}", file=sys.stderr)
            return 1
        lines = "\n".join(progress_line(src, r, tty) for src, r in sorted(rollouts.items()))
        if lines != last:
            print(("\r" if tty and "\n" not in lines else "") + lines, flush=True)
            last = lines
        code = rollout_exit(rollouts)
        if code is not None:
            for src, r in sorted(rollouts.items()):
                if r["message"]:
                    print(f"{src}: {r['message']}")
            return code
        if not args.watch:
            return 3  # still in progress, like `kubectl rollout status --watch=false`
        if deadline is not None and time.monotonic() > deadline:
            print("timed out waiting for the rollout", file=sys.stderr)
            return 2
        await asyncio.sleep(1.0)
