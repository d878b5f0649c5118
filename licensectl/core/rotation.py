"""Safe rotation: which revision each namespace gets, and when a candidate moves on or is aborted.

Pure: the decision record, the live source content, the namespaces and their VMIs come in as plain
data, the clock as ``now``; out come the record to write and the Events to emit
(docs/design.md#safe-rotation).

The words:
  * *stable*: the last revision that passed analysis (or the first one licensectl ever saw); its bytes
    live in the revision store, a Secret licensectl owns in its own namespace;
  * *candidate*: a newer source revision; it goes to a *canary* set of namespaces first, then to
    growing *steps* (a fixed share of namespaces each, chosen by a hash of candidate and namespace,
    so the same namespaces stay promoted when others come and go);
  * *wave*: the canary (wave 0) or one step (wave i); a wave passes when every VMI in it runs the
    candidate (restarted and done) and every guest there that can give evidence reports licensed
    with the candidate token; it fails when guests report an acquisition failure with it, or when
    the analysis deadline passes first;
  * *aborted* / *undone*: every namespace back on stable; nothing moves until the hoster acts
    (a new source revision, or ``licensectl rollout retry``).

Every decision is one write of the record (``RotationRecord.annotations``); replicas follow the
record, never the live source, so a controller killed between any two writes finds the cluster
consistent with some decision and re-derives the next one (level-based). The record and its annotations live in
core/rotation_record.py; this module holds the settings, the observations and the decisions over
them, and re-exports the record's names so callers import one module.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from licensectl.core import defaults
from licensectl.core.reasons import EventType, Reason
from licensectl.core.revision_text import source_revision
from licensectl.core.rotation_record import (
    ACTIVE,
    ANN_ACTED_AT,
    ANN_CANARY,
    ANN_CANDIDATE,
    ANN_EVIDENCE,
    ANN_HISTORY,
    ANN_PHASE,
    ANN_REASON,
    ANN_RETRY_AT,
    ANN_STABLE,
    ANN_UNDO_AT,
    ANN_WAVE,
    ANN_WAVE_STARTED_AT,
    MAX_REASON_CHARS,
    REJECTED,
    HistoryEntry,
    HosterControl,
    Outcome,
    RotationPhase,
    RotationRecord,
    bucket,
    content_revision,
)

# The record's names (core/rotation_record.py) are re-exported: callers import this one module.
__all__ = [
    "ACTIVE",
    "ANN_ACTED_AT",
    "ANN_CANARY",
    "ANN_CANDIDATE",
    "ANN_EVIDENCE",
    "ANN_HISTORY",
    "ANN_PHASE",
    "ANN_REASON",
    "ANN_RETRY_AT",
    "ANN_STABLE",
    "ANN_UNDO_AT",
    "ANN_WAVE",
    "ANN_WAVE_STARTED_AT",
    "FAILED_GRIDD_EVENTS",
    "FAILURE_REASONS",
    "MAX_REASON_CHARS",
    "REJECTED",
    "CanarySpec",
    "Decision",
    "HistoryEntry",
    "HosterControl",
    "Outcome",
    "RotationEvent",
    "RotationPhase",
    "RotationRecord",
    "RotationSettings",
    "SourceView",
    "WaveStatus",
    "WaveVmi",
    "bucket",
    "can_change",
    "content_revision",
    "decide",
    "guest_evidence",
    "parse_steps",
    "select_canary",
    "wave_members",
    "wave_status",
]

# Guest reasons (licensectl.core.guest_report.UNLICENSED_REASONS) that blame the token or its server, not
# a missing disk or an old lease: the evidence that fails an analysis.
FAILURE_REASONS = frozenset({"acquire_failed", "token_corrupt", "not_found"})


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CanarySpec:
    """``3`` (VMs), ``5%`` (of the VMs), ``namespaces:a,b`` (named tenant namespaces), or ``0``: no
    canary, the candidate goes straight to the first step (with ``--rollout-steps 100%``: the
    one-step rollout of earlier releases)."""

    count: int = 3
    percent: float | None = None
    namespaces: tuple[str, ...] = ()

    @classmethod
    def parse(cls, raw: str) -> CanarySpec:
        s = raw.strip()
        if s.startswith("namespaces:"):
            names = tuple(sorted({n.strip() for n in s.removeprefix("namespaces:").split(",") if n.strip()}))
            if not names:
                raise ValueError("canary namespaces: list at least one namespace")
            return cls(count=0, namespaces=names)
        if s.endswith("%"):
            try:
                p = float(s[:-1])
            except ValueError:
                raise ValueError(f"canary percentage must be a number in (0, 100], got {raw!r}") from None
            if not 0 < p <= 100:
                raise ValueError(f"canary percentage must be in (0, 100], got {raw!r}")
            return cls(count=0, percent=p)
        if not s.isdigit():
            raise ValueError(f"canary must be a VM count (0: none), a percentage or namespaces:a,b; got {raw!r}")
        return cls(count=int(s))

    @property
    def none(self) -> bool:
        return self.count == 0 and self.percent is None and not self.namespaces


def parse_steps(raw: str) -> tuple[float, ...]:
    """``10%,50%,100%``: increasing percentages of namespaces; a final 100% is added if missing."""
    out: list[float] = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        if not part.endswith("%"):
            raise ValueError(f"rollout steps are percentages like 10%,50%,100%; got {part!r}")
        try:
            v = float(part[:-1])
        except ValueError:
            raise ValueError(f"rollout steps are percentages like 10%,50%,100%; got {part!r}") from None
        if not 0 < v <= 100 or (out and v <= out[-1]):
            raise ValueError(f"rollout steps must increase within (0, 100]; got {raw!r}")
        out.append(v)
    if not out or out[-1] < 100:
        out.append(100.0)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RotationSettings:
    canary: CanarySpec = field(default_factory=lambda: CanarySpec.parse(defaults.CANARY))
    steps: tuple[float, ...] = parse_steps(defaults.ROLLOUT_STEPS)
    analysis_deadline_seconds: float = defaults.ANALYSIS_DEADLINE_SECONDS
    max_unlicensed: int = defaults.ANALYSIS_MAX_UNLICENSED  # guests failing with the candidate that abort it


# ---------------------------------------------------------------------------------------------
# Observations
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WaveVmi:
    """One VMI of a namespace this source licenses, as the analysis needs it."""

    namespace: str
    name: str
    on_candidate: bool  # its replica carries the candidate, and the rollout judged it against that
    settled: bool  # the rollout says current or done (restarted, Ready, done gate passed)
    hoster_only: bool = False  # blocked or manual: licensectl cannot restart it
    reported: bool = False  # its guest reports at all: it can give evidence
    licensed: bool = False  # a report since its start: licensed, holding the current token
    failure: str | None = None  # a report since its start: current token, unlicensed for this reason


# gridd log events (licensectl.core.guest_report.GriddEventKind values) that are no proof of a license.
FAILED_GRIDD_EVENTS = frozenset({"failed", "not_found", "token_corrupt"})


def guest_evidence(*, licensed: bool, reason: str | None, last_event: str | None, holds_candidate: bool,
                   since_start: bool) -> tuple[bool, str | None]:
    """(proves licensed, failure reason) from one guest's newest report.

    Only a report made since the VMI started, by a guest holding the candidate's token, says anything
    about the candidate. Licensed counts as proof only while gridd's newest log line is no acquisition
    failure (a lease that could not be renewed with this token is no proof of it); unlicensed gives
    gridd's reason, which fails the wave when it blames the token or its server (FAILURE_REASONS)."""
    if not (since_start and holds_candidate):
        return False, None
    if licensed:
        return last_event not in FAILED_GRIDD_EVENTS, None
    return False, reason


@dataclass(frozen=True, slots=True)
class SourceView:
    """Everything the decision for one source reads."""

    live: str | None  # content revision of the source as it is now; None: absent or invalid
    control: HosterControl
    namespaces: Mapping[str, str]  # entitled namespace -> the source revision its replicas carry ("" mixed/none)
    vmis: Sequence[WaveVmi]
    evidence_ready: bool = True  # the guest store has listened long enough to judge silence


@dataclass(frozen=True, slots=True)
class RotationEvent:
    type: EventType
    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class Decision:
    record: RotationRecord | None  # the record to write; None: nothing changes
    events: tuple[RotationEvent, ...] = ()
    # Which slot of the store takes the live source's bytes with this write ("stable" on first sight,
    # "candidate" for a new candidate); `promote` first moves the candidate bytes to stable.
    snapshot: str | None = None
    promote: bool = False
    next_check: dt.datetime | None = None  # the analysis deadline, when one is running


@dataclass(frozen=True, slots=True)
class WaveStatus:
    members: int
    pending: int
    proven: int
    capable: int
    failures: tuple[str, ...]  # "namespace/vmi: reason"


# ---------------------------------------------------------------------------------------------
# Decisions
# ---------------------------------------------------------------------------------------------


def wave_members(record: RotationRecord, namespaces: Iterable[str], steps: Sequence[float]) -> list[str]:
    """The namespaces on the candidate under ``record`` (those the current wave is judged on)."""
    return sorted(ns for ns in namespaces if record.on_candidate(ns, steps))


def select_canary(candidate: str, vmis: Sequence[WaveVmi], *, namespaces: Iterable[str],
                  spec: CanarySpec) -> tuple[tuple[str, ...], bool]:
    """The canary namespaces and whether they hold evidence-capable guests.

    Whole namespaces (a replica is per namespace), taken one at a time in the candidate's hash
    order -- a different set of tenants each rotation -- until the canary holds ``spec`` VMs.
    Only guests that report count (the others cannot show the token works); with none anywhere
    the canary counts VMs and is judged on readiness alone (the caller says so in an Event)."""
    entitled = set(namespaces)
    # Blocked/manual VMIs never take the candidate on licensectl's say and wave_status never judges them:
    # a canary held by them alone would pass on nothing.
    judged = [v for v in vmis if v.namespace in entitled and not v.hoster_only]
    if spec.namespaces:
        named = tuple(n for n in spec.namespaces if n in entitled)
        return named, any(v.reported for v in judged if v.namespace in named)
    evidence = any(v.reported for v in judged)
    weight: dict[str, int] = {}
    for v in judged:
        if v.reported or not evidence:
            weight[v.namespace] = weight.get(v.namespace, 0) + 1
    total = sum(weight.values())
    want = spec.count if spec.percent is None else max(1, math.ceil(total * spec.percent / 100))
    chosen: list[str] = []
    held = 0
    for ns in sorted(weight, key=lambda n: bucket(candidate, n)):
        if held >= want:
            break
        chosen.append(ns)
        held += weight[ns]
    return tuple(sorted(chosen)), evidence


def wave_status(record: RotationRecord, view: SourceView, steps: Sequence[float]) -> WaveStatus:
    members = set(wave_members(record, view.namespaces, steps))
    vmis = [v for v in view.vmis if v.namespace in members]
    capable = [v for v in vmis if v.reported and not v.hoster_only]
    failures = tuple(sorted(f"{v.namespace}/{v.name}: {v.failure}" for v in capable
                            if v.on_candidate and v.failure in FAILURE_REASONS))
    pending = sum(1 for v in vmis if not v.hoster_only and not (v.on_candidate and v.settled))
    pending += sum(1 for ns in members if view.namespaces.get(ns) != record.candidate)
    proven = sum(1 for v in capable if v.on_candidate and v.licensed)
    return WaveStatus(len(vmis), pending, proven, len(capable), failures)


def _fresh(record: RotationRecord, candidate: str, view: SourceView, st: RotationSettings,
           now: dt.datetime, how: str, carried: tuple[str, ...] = ()) -> Decision:
    """A new candidate's canary. ``carried``: namespaces on a superseded candidate, which go straight to
    the new one (docs/design.md#supersede): back to stable first would cost their VMs a restart."""
    canary, evidence = select_canary(candidate, view.vmis, namespaces=view.namespaces, spec=st.canary)
    canary = tuple(sorted(set(canary) | set(carried)))
    if st.canary.none:  # no canary configured: straight to the first step
        rec = replace(record, candidate=candidate, phase=RotationPhase.PROMOTING, wave=1, wave_started_at=now,
                      canary=tuple(sorted(carried)), evidence=evidence, reason="", acted_at=now)
        return Decision(rec, (RotationEvent(EventType.NORMAL, Reason.ROTATION_STARTED,
                                            f"Candidate {source_revision(candidate)} ({how}): no canary, step 1 of "
                                            f"{len(st.steps)} ({st.steps[0]:g}% of namespaces); stable "
                                            f"{source_revision(record.stable)}"),))
    rec = replace(record, candidate=candidate, phase=RotationPhase.CANARY, wave=0, wave_started_at=now,
                  canary=canary, evidence=evidence, reason="", acted_at=now)
    events = [RotationEvent(EventType.NORMAL, Reason.ROTATION_STARTED,
                            f"Candidate {source_revision(candidate)} ({how}): canary in {len(canary)} namespace(s) "
                            f"{', '.join(canary[:5])}{' ...' if len(canary) > 5 else ''}; stable "
                            f"{source_revision(record.stable)}")]
    if not canary:
        events.append(RotationEvent(EventType.WARNING, Reason.CANARY_EMPTY,
                                    "No VM fits the canary (--canary names no entitled namespace with VMs, "
                                    "or there are no VMs): the candidate goes on to step 1 unanalysed"))
    elif not evidence:
        events.append(RotationEvent(EventType.WARNING, Reason.NO_GUEST_EVIDENCE,
                                    "No guest of this source has ever reported: the canary is judged on "
                                    "VMI readiness alone"))
    return Decision(rec, tuple(events))


def can_change(record: RotationRecord | None, live: str | None, control: HosterControl) -> bool:
    """Whether `decide` could return a new record, judged without the per-VMI observations: the
    shell skips building them in the common idle case. Mirrors the branches of `decide`."""
    if record is None:
        return live is not None
    if live is not None and live not in (record.stable, record.candidate):
        return True
    if live is not None and live == record.stable and record.phase is not RotationPhase.STABLE:
        return True
    acted = record.acted_at
    if any(t is not None and (acted is None or t > acted) for t in (control.undo_at, control.retry_at)):
        return True
    return record.phase in ACTIVE


def decide(record: RotationRecord | None, view: SourceView, *, st: RotationSettings, now: dt.datetime) -> Decision:
    """The next decision for one source (``Decision.record`` None: keep the current one)."""
    live = view.live
    if record is None:
        if live is None:
            return Decision(None)  # nothing valid to call stable yet
        return Decision(RotationRecord(stable=live, acted_at=now), snapshot="stable")

    # 1. A new source revision supersedes whatever ran: the hoster acted.
    if live is not None and live not in (record.stable, record.candidate):
        base = record
        promote = False
        carried: tuple[str, ...] = ()
        if record.phase is RotationPhase.PROMOTED:  # it passed everywhere: now it is stable
            base, promote = replace(record, stable=record.candidate), True
        elif record.phase in ACTIVE:
            carried = tuple(wave_members(record, view.namespaces, st.steps))
            base = record.ended(Outcome.SUPERSEDED, now)
        d = _fresh(base, live, view, st, now, "new source revision", carried)
        if record.candidate and record.phase is not RotationPhase.PROMOTED:
            d = replace(d, events=(_superseded(record, live, carried), *d.events))
        return replace(d, snapshot="candidate", promote=promote)
    if live is not None and live == record.stable and record.phase is not RotationPhase.STABLE:
        # An aborted or undone candidate has its outcome already; one still running or promoted is withdrawn.
        base = record if record.phase in REJECTED else record.ended(Outcome.WITHDRAWN, now)
        return Decision(replace(base, phase=RotationPhase.STABLE, candidate="", wave=0, canary=(),
                                wave_started_at=None, reason="", acted_at=now),
                        (RotationEvent(EventType.NORMAL, Reason.CANDIDATE_WITHDRAWN,
                                       f"The source is back on stable {source_revision(record.stable)}: "
                                       f"candidate {source_revision(record.candidate)} withdrawn"),))

    # 2. The hoster's explicit actions, each handled once.
    ctl = view.control
    acted = record.acted_at
    if ctl.undo_at is not None and (acted is None or ctl.undo_at > acted) and record.phase in (
            RotationPhase.CANARY, RotationPhase.PROMOTING, RotationPhase.PROMOTED):
        return Decision(replace(record.ended(Outcome.UNDONE, ctl.undo_at), phase=RotationPhase.UNDONE,
                                reason="undone by the hoster", acted_at=ctl.undo_at),
                        (RotationEvent(EventType.WARNING, Reason.ROLLOUT_UNDONE,
                                       f"Candidate {source_revision(record.candidate)} undone: every namespace "
                                       f"returns to stable {source_revision(record.stable)}"),))
    if ctl.retry_at is not None and (acted is None or ctl.retry_at > acted) and record.phase in REJECTED:
        return _fresh(record, record.candidate, view, st, max(now, ctl.retry_at), "retried by the hoster")

    # 3. Analysis of the running wave.
    if record.phase not in ACTIVE:
        return Decision(None)
    ws = wave_status(record, view, st.steps)
    deadline = (record.wave_started_at or now) + dt.timedelta(seconds=st.analysis_deadline_seconds)
    wave_name = "canary" if record.wave == 0 else f"step {record.wave} of {len(st.steps)}"
    if st.max_unlicensed >= 1 and len(ws.failures) >= st.max_unlicensed:
        why = (f"{wave_name}: {len(ws.failures)} guest(s) failed to license with candidate "
               f"{source_revision(record.candidate)} ({'; '.join(ws.failures[:3])})")
        return _abort(record, why, now)
    if ws.pending == 0 and ws.proven == ws.capable and view.evidence_ready:
        if record.wave >= len(st.steps):
            return Decision(replace(record.ended(Outcome.PROMOTED, now), phase=RotationPhase.PROMOTED, reason=""),
                            (RotationEvent(EventType.NORMAL, Reason.ROTATION_PROMOTED,
                                           f"Candidate {source_revision(record.candidate)} runs everywhere "
                                           f"({ws.proven} guest(s) proved licensed in the last step)"),))
        nxt = record.wave + 1
        return Decision(replace(record, phase=RotationPhase.PROMOTING, wave=nxt, wave_started_at=now),
                        (RotationEvent(EventType.NORMAL, Reason.ROTATION_STEP_STARTED,
                                       f"{wave_name} passed ({ws.proven} of {ws.capable} reporting guest(s) "
                                       f"licensed); step {nxt} of {len(st.steps)}: {st.steps[nxt - 1]:g}% of "
                                       f"namespaces get candidate {source_revision(record.candidate)}"),))
    if now >= deadline and not ctl.paused:
        return _abort(record, now=now, why=f"{wave_name}: analysis deadline passed with {ws.pending} VMI(s) not "
                                           f"done and {ws.proven} of {ws.capable} reporting guest(s) proved licensed")
    return Decision(None, next_check=None if ctl.paused else deadline)


def _superseded(record: RotationRecord, new: str, carried: tuple[str, ...]) -> RotationEvent:
    """Names both revisions: the hoster wrote a new token before the last one finished."""
    where = (f"its {len(carried)} namespace(s) on it ({', '.join(carried[:5])}{' ...' if len(carried) > 5 else ''}) "
             "move straight to the new candidate" if carried else "no namespace was on it")
    return RotationEvent(EventType.NORMAL, Reason.ROTATION_SUPERSEDED,
                         f"Candidate {source_revision(record.candidate)} ({record.phase.value}) superseded by "
                         f"candidate {source_revision(new)}: {where}; stable {source_revision(record.stable)}")


def _abort(record: RotationRecord, why: str, now: dt.datetime) -> Decision:
    """Aborted; hoster actions issued before now are spent (a retry typed during the canary must not
    restart the candidate the moment it is aborted)."""
    return Decision(replace(record.ended(Outcome.ABORTED, now), phase=RotationPhase.ABORTED, reason=why, acted_at=now),
                    (RotationEvent(EventType.WARNING, Reason.ROLLOUT_ABORTED,
                                   f"Candidate {source_revision(record.candidate)} aborted, every namespace returns "
                                   f"to stable {source_revision(record.stable)}: {why}"),))
