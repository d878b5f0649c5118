"""Rollout progress as plain data and text: shared by the controller's /v1/status and the CLI."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from licensectl.core.rollout import Phase, RolloutStatus


def rollout_json(st: RolloutStatus) -> dict[str, Any]:
    counts = Counter({k.value: v for k, v in st.counts.items()})
    return {"phase": st.phase.value, "revision": st.revisions[-1][:12] if st.revisions else None,
            "affected": st.affected, "current": counts["current"] + counts["done"], "stale": counts["stale"],
            "restarting": counts["restarting"], "failed": counts["failed"], "blocked": counts["blocked"],
            "manual": counts["manual"], "overdue": st.overdue, "unavailable": st.unavailable,
            "max_unavailable": st.max_unavailable, "pause_reason": st.pause_reason.value if st.pause_reason else None,
            "message": st.message}


def progress_line(src: str, r: Mapping[str, Any], tty: bool) -> str:
    done, total = r["current"], max(r["affected"], 1)
    head = f"{src} {r['phase']} rev {r['revision'] or '-'}: {done}/{r['affected']} current"
    tail = (f", {r['restarting']} restarting, {r['stale']} stale, {r['failed']} failed, {r['blocked']} blocked, "
            f"{r['manual']} manual")
    rot = r.get("rotation") or {}
    if rot.get("phase"):  # safe rotation (docs/design.md#safe-rotation): where the candidate stands
        wave = "canary" if rot.get("wave") == 0 else f"step {rot.get('wave')}"
        tail += f"; rotation {rot['phase']}" + (f" ({wave})" if rot["phase"] in ("canary", "promoting") else "")
    if tty:
        width = 24
        filled = int(width * done / total)
        return f"[{'#' * filled}{'.' * (width - filled)}] {head}{tail}"
    return head + tail


def rollout_exit(rollouts: Mapping[str, Mapping[str, Any]]) -> int | None:
    """0 complete, 1 paused, failed, aborted or undone, None still going (like kubectl rollout status).

    With safe rotation a source is complete only once its candidate is promoted (or there is none):
    between two waves the restarts are all done while the rotation still goes on."""
    rotations = [str((r.get("rotation") or {}).get("phase") or "") for r in rollouts.values()]
    if any(p in ("canary", "promoting") for p in rotations):
        return None
    phases = [r["phase"] for r in rollouts.values()]
    if any(p in ("aborted", "undone") for p in rotations) and all(
            p in (Phase.PAUSED.value, Phase.COMPLETE.value, Phase.IDLE.value) for p in phases):
        return 1
    if any(p == Phase.PAUSED.value for p in phases) or any(r["failed"] for r in rollouts.values()):
        return 1 if all(p in (Phase.PAUSED.value, Phase.COMPLETE.value, Phase.IDLE.value) for p in phases) else None
    if all(p in (Phase.COMPLETE.value, Phase.IDLE.value) for p in phases):
        return 0
    return None
