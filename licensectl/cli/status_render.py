"""The text `licensectl status` and `rollout status --vms` print, from their JSON documents (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from licensectl.core import tokeninfo
from licensectl.core.revision_text import REPLICA_COLUMN, SOURCE_COLUMN
from licensectl.core.rollout.view import ATTENTION_STATES, RolloutExit, shown_phase, wave_label


def offline_note(reason: str) -> str:
    """What an offline view is and is not, and how to reach the controller
    (docs/operations.md#status-from-the-controller)."""
    return (f"OFFLINE, PARTIAL VIEW: recomputed from the cluster with the same planners and rotation records "
            f"as the controller, but this workstation's settings (not the deployed ones) and no guest reports, so "
            f"done gates and wave progress are unknown. Controller unreachable: {reason}. For the controller's "
            f"view: `get` on services/proxy in licensectl's namespace, and where NetworkPolicies are enforced "
            f"an ingress rule for the API server on the metrics port (the shipped policy blocks that route); or "
            f"`kubectl port-forward` and --url (docs/operations.md#status-from-the-controller).")


def _valid_cell(s: Mapping[str, Any]) -> str:
    """VALID: "NO" for a source problem; "yes, unreadable" for a token that is no JWT (unless marked
    opaque): usable and delivered, as `valid` and licensectl_source_valid say, with its problem beside it."""
    if not s["valid"]:
        return "NO"
    return "yes, unreadable" if s.get("token") == tokeninfo.Readability.UNREADABLE.value else "yes"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _origin(doc: Mapping[str, Any]) -> list[str]:
    if doc.get("from") == "controller":
        c = doc.get("controller") or {}
        view = str(doc.get("view") or ("leader" if c.get("leader") else "standby"))
        role = {"leader": "leader",
                "unsynced": "leader, UNSYNCED (starting: it has not read the cluster yet): not authoritative"
                }.get(view, "STANDBY (no guest states; the leader did not answer): not authoritative")
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


def consistent_rollout(r: Mapping[str, Any], rotation: Mapping[str, Any] | None) -> dict[str, Any]:
    """A source's rollout as every JSON output prints it: `phase` is what the progress line says (a
    running or ended rotation's phase wins over restarts that are all done between two waves), the
    planner's own in `rollout_phase`."""
    return {**r, "phase": shown_phase({**r, "rotation": rotation}), "rollout_phase": r["phase"]}


def status_document(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`licensectl status -o json` (docs/operations.md#json-output): where it came from and whether it
    is authoritative, and each rollout's phase consistent with its rotation's."""
    rotations = doc.get("rotations") or {}
    view = doc.get("view") or ("offline" if doc.get("from") == "offline" else "leader")
    rollouts = doc.get("rollouts") or {}
    # The same keys from the controller and offline: what one of them does not know is null or its default.
    return {"controller": None, "delivery": None, "partial": False, "offline_reason": None,
            "rotation_records_read": True, **doc, "view": view,
            "authoritative": bool(doc.get("authoritative", view == "leader")),
            "rollouts": {src: consistent_rollout(r, rotations.get(src)) for src, r in rollouts.items()}}


def rollout_document(found: Mapping[str, Any], vmis: list[Mapping[str, Any]] | None, code: RolloutExit, *,
                     view: str = "leader", final: bool = True) -> dict[str, Any]:
    """`rollout status -o json|yaml`: who answered (`view`, `authoritative`), the sources with their
    rotation, the listed VMIs, `exit_code`: the code this look exits with (on a --watch line before the
    last: the code it would exit with without --watch), and `final`: whether the command exits with it."""
    sources = {src: consistent_rollout(r, r.get("rotation")) for src, r in sorted(found.items())}
    return {"view": view, "authoritative": view == "leader", "sources": sources,
            **({"vmis": vmis} if vmis is not None else {}), "exit_code": int(code), "final": final}
