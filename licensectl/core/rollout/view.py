"""Rollout and rotation progress as plain data and text: shared by the controller's /v1/status and the CLI.

One source's progress is told per wave of its rotation (docs/design.md#safe-rotation): "wave 2/3:
12/40" counts the VMIs of the running wave settled on the candidate, which only grows while the
wave runs, where the fleet-wide current/affected count drops each time a wave hands the candidate
to more namespaces. Revisions follow core/revision_text.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from enum import IntEnum
from typing import Any

from licensectl.core.revision_text import replica_revision, short, source_revision
from licensectl.core.rollout import PauseReason, Phase, RolloutPlan, RolloutStatus
from licensectl.core.rotation import RotationRecord


class RolloutExit(IntEnum):
    """`licensectl rollout status` exit codes (its --help and docs/operations.md#cli-exit-codes)."""

    COMPLETE = 0  # every selected source complete, no rotation running
    ERROR = 1  # could not tell: no cluster, no controller and no offline view, unknown source
    TIMEOUT = 2  # --timeout passed while still in progress
    PROGRESSING = 3  # without --watch: still in progress
    PAUSED = 4  # a selected source's rollout is paused (by hand, or its failure budget is spent)
    ABORTED = 5  # a selected source's rotation was aborted or undone: back on stable, waiting for the hoster
    UNKNOWN = 6  # without --watch: only a standby or a starting (unsynced) replica answered; ask again


def rollout_json(st: RolloutStatus, source_rev: str | None = None) -> dict[str, Any]:
    """One source's rollout. `source_revision` when known (the replicas say which source revision
    their newest replica revision renders); `replica_revision` is that rendered hash, labelled."""
    counts = Counter({k.value: v for k, v in st.counts.items()})
    return {"phase": st.phase.value, "source_revision": short(source_rev) if source_rev else None,
            "replica_revision": short(st.revisions[-1]) if st.revisions else None,
            "affected": st.affected, "current": counts["current"] + counts["done"], "stale": counts["stale"],
            "restarting": counts["restarting"], "draining": counts["draining"], "failed": counts["failed"],
            "blocked": counts["blocked"],
            "manual": counts["manual"], "overdue": st.overdue, "unavailable": st.unavailable,
            "max_unavailable": st.max_unavailable, "pause_reason": st.pause_reason.value if st.pause_reason else None,
            "message": st.message}


def rotation_json(rec: RotationRecord, *, steps: Sequence[float], canary: bool,
                  progress: tuple[int, int] | None = None) -> dict[str, Any]:
    """One source's rotation record for status: the same from the controller and offline.

    `waves` counts the canary (when one is configured) and every step; `wave_number` is the running
    wave's 1-based position among them; `wave_progress` [settled, in the wave] comes from the
    controller's analysis (None offline or when no wave runs)."""
    waves = len(steps) + (1 if canary else 0)
    number = rec.wave + (1 if canary else 0)
    return {"phase": rec.phase.value, "wave": rec.wave, "wave_number": min(max(number, 1), max(waves, 1)),
            "waves": waves, "stable": short(rec.stable), "candidate": short(rec.candidate) if rec.candidate else None,
            "canary": list(rec.canary), "evidence": rec.evidence, "reason": rec.reason,
            "wave_started_at": rec.wave_started_at.isoformat() if rec.wave_started_at else None,
            "wave_progress": list(progress) if progress is not None else None}


def _active(rot: Mapping[str, Any]) -> bool:
    return rot.get("phase") in ("canary", "promoting")


def undecided(rot: Mapping[str, Any]) -> str | None:
    """The source revision the source Secret holds when the record names it neither stable nor candidate:
    written by the hoster, not yet decided on by the leader (the record's phase is the previous token's)."""
    live = rot.get("live_source_revision")
    return str(live) if live and live not in (rot.get("stable"), rot.get("candidate")) else None


def wave_label(rot: Mapping[str, Any]) -> str:
    """The running wave of a rotation; "-" when none runs (stable, promoted, aborted, undone)."""
    if not _active(rot) or rot.get("wave") is None:
        return "-"
    return "canary" if rot["wave"] == 0 else f"step {rot['wave']}"


def progress(r: Mapping[str, Any]) -> tuple[int, int]:
    """(done, total) for the bar and the line: the running wave's VMIs while a rotation runs, else
    the source's affected VMIs that are current."""
    rot = r.get("rotation") or {}
    wp = rot.get("wave_progress")
    if _active(rot) and isinstance(wp, list) and len(wp) == 2:
        return int(wp[0]), int(wp[1])
    return int(r["current"]), int(r["affected"])


def shown_phase(r: Mapping[str, Any]) -> str:
    """The rollout's phase, but a running rotation's while one runs (restarts may all be done between
    two waves: that is no "complete")."""
    rot = r.get("rotation") or {}
    if rot.get("phase") in ("canary", "promoting", "aborted", "undone") and r["phase"] != Phase.PAUSED.value:
        return str(rot["phase"])
    return str(r["phase"])


def progress_line(src: str, r: Mapping[str, Any], tty: bool) -> str:
    rot = r.get("rotation") or {}
    done, total = progress(r)
    if _active(rot):
        cand = rot.get("candidate")
        head = (f"{src} {shown_phase(r)} wave {rot.get('wave_number', '?')}/{rot.get('waves', '?')} "
                f"({wave_label(rot)}): {done}/{total}" if rot.get("wave_progress") is not None else
                f"{src} {shown_phase(r)} wave {rot.get('wave_number', '?')}/{rot.get('waves', '?')} "
                f"({wave_label(rot)})")
        head += f", candidate {source_revision(cand)}"
    else:
        rev = (source_revision(r["source_revision"]) if r.get("source_revision")
               else replica_revision(r["replica_revision"]) if r.get("replica_revision") else "no revision")
        head = f"{src} {shown_phase(r)} {rev}: {r['current']}/{r['affected']} current"
    if undecided(rot):
        head += f"; {source_revision(undecided(rot))} written, not yet taken up by the controller"
    draining = f"{r['draining']} draining (tenant workers), " if r.get("draining") else ""
    tail = (f"; {r['restarting']} restarting, {draining}{r['stale']} stale, {r['failed']} failed, "
            f"{r['blocked']} blocked, {r['manual']} manual")
    if rot.get("phase") in ("aborted", "undone"):
        tail += f"; rotation {rot['phase']}, back on stable {source_revision(rot.get('stable'))}"
        if rot.get("reason"):
            tail += f": {rot['reason']}"
        behind = r.get("not_on_stable") or []
        if behind:
            shown = ", ".join(f"{v['namespace']}/{v['vmi']} ({v['state']}: {v['reason']})" if v.get("reason")
                              else f"{v['namespace']}/{v['vmi']} ({v['state']})" for v in behind[:NAMED_VMIS])
            more = len(behind) - NAMED_VMIS
            tail += (f"; {len(behind)} VMI(s) not back on stable: {shown}"
                     + (f" and {more} more (--vms)" if more > 0 else ""))
    if tty:
        width = 24
        filled = int(width * done / max(total, 1))
        return f"[{'#' * filled}{'.' * (width - filled)}] {head}{tail}"
    return head + tail


def not_on_stable(vmis: Sequence[Mapping[str, Any]], source: str) -> list[dict[str, Any]]:
    """The VMIs of an aborted or undone rotation's source not (yet) back on stable: every state but
    current and done (restarting onto stable, or unable to come back: failed, blocked, manual, ...)."""
    return [{"namespace": v["namespace"], "vmi": v["vmi"], "state": v["state"], "reason": v.get("reason") or ""}
            for v in vmis if v.get("source") == source and v.get("state") not in BACK_ON_STABLE]


def rollout_exit(rollouts: Mapping[str, Mapping[str, Any]]) -> RolloutExit | None:
    """What `rollout status` exits with for these sources; None while still going (kubectl-like).

    Nothing is final while the source holds a token the leader has not decided on yet (`undecided`).
    Terminal states come from the rotation's decision, not from every VM having arrived: aborted or
    undone wins (the rotation needs the hoster) as soon as the record says so, whether or not its VMIs
    are back on stable -- one that cannot come back would otherwise hold the exit forever; the lines
    name those not back (`not_on_stable`). Then paused (nothing moves until resumed), then complete
    only when every source is complete or idle and no rotation runs. A pause for the admission webhook
    is not a stop: it lifts by itself once the delivery probe succeeds."""
    if any(undecided(r.get("rotation") or {}) for r in rollouts.values()):
        return None  # a new token the leader has not decided on: nothing the record says is about it
    rotations = [str((r.get("rotation") or {}).get("phase") or "") for r in rollouts.values()]
    phases = [str(r["phase"]) for r in rollouts.values()]
    if any(rot in ("aborted", "undone") for rot in rotations):
        return RolloutExit.ABORTED
    if any(str(r["phase"]) == Phase.PAUSED.value and r.get("pause_reason") != PauseReason.WEBHOOK.value
           for r in rollouts.values()):
        return RolloutExit.PAUSED
    if any(p in ("canary", "promoting") for p in rotations):
        return None
    if all(p in (Phase.COMPLETE.value, Phase.IDLE.value) for p in phases):
        return RolloutExit.COMPLETE
    return None


def vmis_json(plan: RolloutPlan) -> list[dict[str, Any]]:
    """Every affected VMI's rollout state, the source it follows and why (for `rollout status --vms`)."""
    return [{"namespace": ns, "vmi": vmi, "source": str(st.source), "state": st.state.value,
             "replica_revision": short(st.revision), "overdue": st.overdue, "reason": st.reason,
             "missing_volume": st.missing_volume}
            for (ns, vmi), st in sorted(plan.vmi_states.items())]


# A VMI in these states runs its replica's revision: after an abort or undo, the stable one.
BACK_ON_STABLE = frozenset({"current", "done"})
# How many VMIs not back on stable a progress line names (the JSON names them all).
NAMED_VMIS = 5

# The states `rollout status --vms` lists: where a hoster has to look (docs/operations.md#rollout-status).
ATTENTION_STATES = ("failed", "blocked", "undeliverable", "manual", "restarting", "draining", "awaiting-evidence")
