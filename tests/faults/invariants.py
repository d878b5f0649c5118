"""Invariants checked after every scenario, by reading the cluster (never the controller's memory).

- every entitled namespace holds a correct replica: token bytes equal the source's, and the revision
  annotation equals the revision recomputed from the source and class with licensectl.core.render;
- no replica of the scenario's source exists outside the entitled namespaces (after convergence);
- no foreign Secret changed (resourceVersions before/after);
- every stale VMI was restarted exactly once per revision and none was missed (simulator record),
  and unavailability stayed within maxUnavailable / maxPerNamespace;
- no token bytes and no report credential in any captured log line, Event message, /metrics or
  HTTP response body.

Violation messages name objects and places, never secret content.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, CustomObjectsApi

from licensectl.core.model import (
    ANN_CLASS,
    ANN_RESTART_RESULT,
    ANN_RESTART_REVISION,
    ANN_REVISION,
    ANN_SOURCE_NAME,
    ANN_SOURCE_NAMESPACE,
    KEY_REPORT_CREDENTIAL,
    KEY_TOKEN,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
)
from licensectl.core.render import RenderedLicense, SourceProblem, render_license, replica_name
from licensectl.kube import projections
from licensectl.kube.raw import RawApi
from licensectl_dev.devcluster.ledger import SimulatorRecord

TOKEN_KEY = "client_configuration_token.tok"
Key = tuple[str, str]


@dataclass
class Verdict:
    """Violations of one scenario run, and how many checks each invariant made."""

    violations: list[str] = field(default_factory=list)
    checks: Counter[str] = field(default_factory=Counter)

    def check(self, invariant: str, ok: bool, detail: str) -> bool:
        self.checks[invariant] += 1
        if not ok:
            self.violations.append(f"{invariant}: {detail}")
        return ok

    @property
    def ok(self) -> bool:
        return not self.violations


def _b64(raw: Any) -> bytes:
    return base64.b64decode(raw or "")


async def expected_license(api: ApiClient, source: Key, class_name: str,
                           token_key: str = TOKEN_KEY) -> RenderedLicense | SourceProblem | None:
    """What the class should deliver, recomputed from the objects as they are now."""
    try:
        raw_class = await RawApi(CustomObjectsApi(api)).get_cluster_custom_object(
            "gpu.cozystack.io", "v1alpha1", "gpuclasses", class_name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    gc = projections.gpu_class_from(raw_class)
    if gc is None:
        return None
    try:
        raw_src = await RawApi(CoreV1Api(api)).read_namespaced_secret(source[1], source[0])
        src = projections.source_secret_from(raw_src)
    except ApiException as e:
        if e.status != 404:
            raise
        src = None
    return render_license(src, gc, token_key)


async def owned_replicas(api: ApiClient, source: Key) -> dict[Key, dict[str, Any]]:
    """Every licensectl-managed Secret whose source annotations name `source`."""
    doc = await RawApi(CoreV1Api(api)).list_secret_for_all_namespaces(
        label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")
    out: dict[Key, dict[str, Any]] = {}
    for item in doc.get("items") or []:
        meta = item.get("metadata") or {}
        ann = meta.get("annotations") or {}
        if (ann.get(ANN_SOURCE_NAMESPACE), ann.get(ANN_SOURCE_NAME)) == source:
            out[(meta["namespace"], meta["name"])] = item
    return out


async def check_replicas(api: ApiClient, verdict: Verdict, *, source: Key, classes: Sequence[str],
                         entitled: Iterable[str], token_key: str = TOKEN_KEY) -> dict[Key, dict[str, Any]]:
    """Entitled namespaces hold correct replicas; nothing of this source exists anywhere else."""
    replicas = await owned_replicas(api, source)
    expected: set[Key] = set()
    for cls in classes:
        lic = await expected_license(api, source, cls, token_key)
        if not verdict.check("source_renders", isinstance(lic, RenderedLicense),
                             f"class {cls}: source {source[0]}/{source[1]} does not render "
                             f"({getattr(lic, 'reason', 'class missing')})"):
            continue
        assert isinstance(lic, RenderedLicense)
        for ns in sorted(entitled):
            key = (ns, replica_name(cls))
            expected.add(key)
            r = replicas.get(key)
            if not verdict.check("replica_present", r is not None, f"{ns}/{key[1]} missing"):
                continue
            assert r is not None
            ann = (r.get("metadata") or {}).get("annotations") or {}
            data = r.get("data") or {}
            verdict.check("replica_token", _b64(data.get(KEY_TOKEN)) == lic.token,
                          f"{ns}/{key[1]}: token bytes differ from the source")
            verdict.check("replica_revision", ann.get(ANN_REVISION) == lic.revision,
                          f"{ns}/{key[1]}: revision annotation is not the recomputed revision")
            verdict.check("replica_class", ann.get(ANN_CLASS) == cls, f"{ns}/{key[1]}: class annotation")
    for key in sorted(set(replicas) - expected):
        verdict.check("no_replica_outside_entitled", False, f"{key[0]}/{key[1]} exists but is not entitled")
    verdict.check("no_replica_outside_entitled", True, "")
    return replicas


async def check_replica_uids(api: ApiClient, verdict: Verdict, before: Mapping[Key, str], *,
                             invariant: str = "replica_not_recreated") -> None:
    """Replicas that existed before a fault still exist with the same UID (never deleted+recreated)."""
    for (ns, name), uid in sorted(before.items()):
        try:
            doc = await RawApi(CoreV1Api(api)).read_namespaced_secret(name, ns)
            now_uid = (doc.get("metadata") or {}).get("uid")
        except ApiException as e:
            if e.status != 404:
                raise
            now_uid = None
        verdict.check(invariant, now_uid == uid, f"{ns}/{name} was deleted or recreated")


async def list_per_namespace(api: ApiClient, kind: str, namespaces: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
    """(namespace, object) for every `kind` ("secret", "event") in `namespaces`; a namespace that is
    already gone counts as empty."""
    core: Any = RawApi(CoreV1Api(api))
    out: list[tuple[str, dict[str, Any]]] = []
    for ns in sorted(set(namespaces)):
        try:
            doc = await getattr(core, f"list_namespaced_{kind}")(ns)
        except ApiException as e:
            if e.status == 404:
                continue
            raise
        out.extend((ns, item) for item in doc.get("items") or [])
    return out


async def foreign_secrets(api: ApiClient, namespaces: Iterable[str], *,
                          exclude: Iterable[Key] = ()) -> dict[Key, str]:
    """(namespace, name) -> resourceVersion of every Secret licensectl does not manage there."""
    skip = set(exclude)
    out: dict[Key, str] = {}
    for ns, item in await list_per_namespace(api, "secret", namespaces):
        meta = item.get("metadata") or {}
        if (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE:
            continue
        key = (ns, meta.get("name", ""))
        if key not in skip:
            out[key] = meta.get("resourceVersion", "")
    return out


def check_foreign(verdict: Verdict, before: Mapping[Key, str], after: Mapping[Key, str]) -> None:
    for key, rv in sorted(before.items()):
        verdict.check("foreign_untouched", after.get(key) == rv,
                      f"foreign Secret {key[0]}/{key[1]} was changed or deleted")


def check_restarts(verdict: Verdict, record: SimulatorRecord, vms: Iterable[Key], *, since: float,
                   expected: int = 1) -> None:
    """Each VM got exactly `expected` accepted restarts after `since` (monotonic)."""
    for ns, vm in vms:
        n = len([r for r in record.restarts_for(ns, vm) if r.at >= since])
        verdict.check("restarted_exactly_once", n == expected,
                      f"{ns}/{vm} restarted {n}x (expected {expected})")


def check_unavailability(verdict: Verdict, record: SimulatorRecord, namespaces: Iterable[str], *,
                         max_unavailable: int, max_per_namespace: int) -> None:
    ns_list = sorted(set(namespaces))
    for ns in ns_list:
        got = record.max_concurrent_unavailable(ns)
        verdict.check("max_per_namespace", got <= max_per_namespace,
                      f"{ns}: {got} VMs unavailable at once (limit {max_per_namespace})")
    # Cluster-wide figure restricted to this scenario's namespaces.
    points: list[tuple[float, int]] = []
    for iv in record.unavailable:
        if iv.namespace in ns_list:
            points.append((iv.start, 1))
            points.append((iv.end if iv.end is not None else float("inf"), -1))
    cur = best = 0
    for _, d in sorted(points):
        cur += d
        best = max(best, cur)
    verdict.check("max_unavailable", best <= max_unavailable,
                  f"{best} VMs unavailable at once (limit {max_unavailable})")


async def check_vms_done(api: ApiClient, verdict: Verdict, vms: Iterable[Key], revision: str) -> None:
    """The VM carries the done record for `revision` and its VMI is Ready."""
    co = CustomObjectsApi(api)
    for ns, name in vms:
        vm = await RawApi(co).get_namespaced_custom_object("kubevirt.io", "v1", ns, "virtualmachines", name)
        ann = (vm.get("metadata") or {}).get("annotations") or {}
        verdict.check("vm_done_for_revision",
                      ann.get(ANN_RESTART_REVISION) == revision and ann.get(ANN_RESTART_RESULT) == "done",
                      f"{ns}/{name}: restart record is {ann.get(ANN_RESTART_RESULT)!r} for "
                      f"{(ann.get(ANN_RESTART_REVISION) or '')[:12]!r}, want done for {revision[:12]}")


# ---------------------------------------------------------------------------------------------
# Secrecy
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Needle:
    label: str  # what it is (e.g. "token of ns/name"), safe to print
    text: str = field(repr=False)


def token_needles(label: str, token: bytes) -> list[Needle]:
    """Forms a leaked token could take: raw text, base64, and its JWT payload/signature segments."""
    out = [Needle(f"{label} (base64)", base64.b64encode(token).decode())]
    try:
        text = token.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    stripped = text.strip()
    if len(stripped) >= 16:
        out.append(Needle(label, stripped))
        parts = stripped.split(".")
        if len(parts) == 3:
            # The header segment is the same for every RS256 JWT: not secret. The filler signature of
            # test tokens is all "A"s: too common to search for.
            for i, part in ((1, parts[1]), (2, parts[2])):
                if len(part) >= 16 and set(part) != {"A"}:
                    out.append(Needle(f"{label} (segment {i})", part))
    return out


def credential_needles(replicas: Mapping[Key, Mapping[str, Any]]) -> list[Needle]:
    out = []
    for (ns, _), r in sorted(replicas.items()):
        cred = _b64((r.get("data") or {}).get(KEY_REPORT_CREDENTIAL)).decode(errors="replace")
        if len(cred) >= 16:
            out.append(Needle(f"report credential of {ns}", cred))
    return out


def scan(verdict: Verdict, texts: Iterable[tuple[str, str]], needles: Sequence[Needle]) -> int:
    """Search every captured text for every needle; returns how many texts were scanned."""
    n = 0
    uniq = {nd.text: nd for nd in needles}.values()
    for where, text in texts:
        n += 1
        for nd in uniq:
            if nd.text in text:
                verdict.check("no_secret_leak", False, f"{nd.label} found in {where}")
    verdict.check("no_secret_leak", True, "")
    verdict.checks["texts_scanned"] += n
    return n


async def event_texts(api: ApiClient, namespaces: Iterable[str]) -> list[tuple[str, str]]:
    """Every Event (reason, message, whole object) in the given namespaces, for the secrecy scan."""
    return [(f"Event {ns}/{(ev.get('metadata') or {}).get('name', '')}", json.dumps(ev))
            for ns, ev in await list_per_namespace(api, "event", namespaces)]
