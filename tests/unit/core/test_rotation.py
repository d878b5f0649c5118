"""Safe rotation core: settings parsing, the record codec, who runs the candidate, the canary choice,
each decision rule, then whole rotations driven through a small simulated world."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import itertools
import json
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as hst

from licensectl.core.guest_report import UNLICENSED_REASONS, GriddEventKind
from licensectl.core.rotation import (
    ANN_ACTED_AT,
    ANN_CANARY,
    ANN_CANDIDATE,
    ANN_EVIDENCE,
    ANN_PHASE,
    ANN_REASON,
    ANN_RETRY_AT,
    ANN_STABLE,
    ANN_UNDO_AT,
    ANN_WAVE,
    ANN_WAVE_STARTED_AT,
    FAILED_GRIDD_EVENTS,
    FAILURE_REASONS,
    MAX_REASON_CHARS,
    REJECTED,
    CanarySpec,
    Decision,
    HistoryEntry,
    HosterControl,
    Outcome,
    RotationPhase,
    RotationRecord,
    RotationSettings,
    SourceView,
    WaveVmi,
    bucket,
    can_change,
    content_revision,
    decide,
    guest_evidence,
    parse_steps,
    select_canary,
    wave_members,
    wave_status,
)
from licensectl.core.timecodec import format_micro_time

T0 = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
S = content_revision(b"token-stable", None)
C = content_revision(b"token-candidate", None)
N = content_revision(b"token-next", b"ServerAddress=gridd\n")
STEPS = (10.0, 50.0, 100.0)
ST = RotationSettings(canary=CanarySpec(count=2), steps=STEPS, analysis_deadline_seconds=600, max_unlicensed=1)
NAMESPACES = tuple(f"tenant-{i:02d}" for i in range(30))
ALL_PHASES = tuple(RotationPhase)


def sec(n: float) -> dt.timedelta:
    return dt.timedelta(seconds=n)


def vmi(ns: str, name: str = "vm", *, on: bool = True, settled: bool = True, hoster_only: bool = False,
        reported: bool = True, licensed: bool = True, failure: str | None = None) -> WaveVmi:
    return WaveVmi(ns, name, on_candidate=on, settled=settled, hoster_only=hoster_only, reported=reported,
                   licensed=licensed, failure=failure)


def view(live: str | None, namespaces: Mapping[str, str], vmis: Sequence[WaveVmi] = (), *,
         control: HosterControl | None = None, evidence_ready: bool = True) -> SourceView:
    return SourceView(live=live, control=control or HosterControl(), namespaces=dict(namespaces), vmis=tuple(vmis),
                      evidence_ready=evidence_ready)


def record(phase: RotationPhase = RotationPhase.CANARY, *, wave: int = 0, canary: tuple[str, ...] = ("a",),
           started: dt.datetime = T0, acted: dt.datetime | None = T0, evidence: bool = True) -> RotationRecord:
    if phase is RotationPhase.STABLE:
        return RotationRecord(stable=S, acted_at=acted)
    return RotationRecord(stable=S, phase=phase, candidate=C, wave=wave, wave_started_at=started, canary=canary,
                          evidence=evidence, acted_at=acted)


def carrying(rec: RotationRecord, namespaces: Sequence[str], steps: Sequence[float] = STEPS) -> dict[str, str]:
    """Every namespace's replicas already follow ``rec``."""
    return {ns: rec.revision_for(ns, steps) for ns in namespaces}


def reasons(d: Decision) -> list[str]:
    return [e.reason for e in d.events]


# ---------------------------------------------------------------------------------------------
# content_revision
# ---------------------------------------------------------------------------------------------


def test_content_revision_is_a_stable_hash_of_token_and_conf() -> None:
    assert content_revision(b"tok", None) == content_revision(b"tok", None)
    assert len(content_revision(b"tok", None)) == 64
    assert content_revision(b"tok", None) != content_revision(b"tok2", None)
    assert content_revision(b"tok", b"a") != content_revision(b"tok", b"b")
    # An empty gridd.conf is not the same source as none at all.
    assert content_revision(b"tok", None) != content_revision(b"tok", b"")
    # Length-prefixed: bytes cannot move between token and conf without changing the revision.
    assert content_revision(b"ab", b"c") != content_revision(b"a", b"bc")


# ---------------------------------------------------------------------------------------------
# CanarySpec.parse and parse_steps
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "want"), [
    ("3", CanarySpec(count=3)),
    (" 1 ", CanarySpec(count=1)),
    ("120", CanarySpec(count=120)),
    ("5%", CanarySpec(count=0, percent=5.0)),
    ("0.5%", CanarySpec(count=0, percent=0.5)),
    ("100%", CanarySpec(count=0, percent=100.0)),
    ("namespaces:b,a", CanarySpec(count=0, namespaces=("a", "b"))),
    ("namespaces: a , a,,b ", CanarySpec(count=0, namespaces=("a", "b"))),
    ("namespaces:solo", CanarySpec(count=0, namespaces=("solo",))),
])
def test_canary_spec_parses_count_percent_and_namespaces(raw: str, want: CanarySpec) -> None:
    assert CanarySpec.parse(raw) == want


def test_canary_spec_default_is_three_vms() -> None:
    assert CanarySpec() == CanarySpec(count=3, percent=None, namespaces=())


def test_no_canary_goes_straight_to_the_first_step() -> None:
    st = dataclasses.replace(ST, canary=CanarySpec.parse("0"))
    assert st.canary.none and not CanarySpec().none
    rec = record(RotationPhase.STABLE)
    d = decide(dataclasses.replace(rec, candidate=""), view(C, {"a": S}, [vmi("a", "x")]), st=st, now=T0)
    assert d.record is not None and d.record.phase is RotationPhase.PROMOTING and d.record.wave == 1
    assert d.record.canary == () and reasons(d) == ["RotationStarted"]


@pytest.mark.parametrize(("raw", "message"), [
    ("-2", "VM count (0: none)"),
    ("", "VM count (0: none)"),
    ("three", "VM count (0: none)"),
    ("1.5", "VM count (0: none)"),
    ("0%", "percentage must be in (0, 100]"),
    ("-5%", "percentage must be in (0, 100]"),
    ("101%", "percentage must be in (0, 100]"),
    ("nan%", "must be in (0, 100]"),
    ("many%", "percentage must be a number in (0, 100]"),
    ("namespaces:", "list at least one namespace"),
    ("namespaces: , ,", "list at least one namespace"),
])
def test_canary_spec_rejects_with_a_message_naming_the_forms(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match="canary") as err:
        CanarySpec.parse(raw)
    assert message in str(err.value)


@pytest.mark.parametrize(("raw", "want"), [
    ("10%,50%,100%", (10.0, 50.0, 100.0)),
    ("10%,50%", (10.0, 50.0, 100.0)),
    (" 25% , 75% ", (25.0, 75.0, 100.0)),
    ("100%", (100.0,)),
    ("", (100.0,)),
    ("5%,,20%,", (5.0, 20.0, 100.0)),
    ("0.5%,99.5%", (0.5, 99.5, 100.0)),
])
def test_parse_steps_appends_a_final_100_percent(raw: str, want: tuple[float, ...]) -> None:
    assert parse_steps(raw) == want


@pytest.mark.parametrize(("raw", "message"), [
    ("10,50", "percentages like 10%,50%,100%"),
    ("10%,50", "percentages like 10%,50%,100%"),
    ("50%,10%", "must increase within (0, 100]"),
    ("10%,10%", "must increase within (0, 100]"),
    ("0%,50%", "must increase within (0, 100]"),
    ("-10%", "must increase within (0, 100]"),
    ("50%,150%", "must increase within (0, 100]"),
    ("100%,100%", "must increase within (0, 100]"),
    ("half%", "percentages like 10%,50%,100%; got 'half%'"),
])
def test_parse_steps_rejects_with_a_message(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match="rollout steps") as err:
        parse_steps(raw)
    assert message in str(err.value)


def test_default_settings_steps_match_their_parsed_form() -> None:
    assert RotationSettings().steps == parse_steps("10%,50%,100%")
    assert RotationSettings().canary == CanarySpec.parse("3")


# ---------------------------------------------------------------------------------------------
# The record codec
# ---------------------------------------------------------------------------------------------


ROUND_TRIP = [
    RotationRecord(stable=S),
    RotationRecord(stable=S, acted_at=T0),
    RotationRecord(stable=S, phase=RotationPhase.CANARY, candidate=C, wave=0, wave_started_at=T0 + sec(0.123456),
                   canary=("a", "b"), evidence=False, acted_at=T0),
    RotationRecord(stable=S, phase=RotationPhase.PROMOTING, candidate=C, wave=2, wave_started_at=T0,
                   canary=("ns-ü",), acted_at=T0 - sec(5)),
    RotationRecord(stable=S, phase=RotationPhase.PROMOTED, candidate=C, wave=3, canary=()),
    RotationRecord(stable=S, phase=RotationPhase.ABORTED, candidate=C, reason="canary: 1 guest(s) failed",
                   canary=("a",), acted_at=T0),
    RotationRecord(stable=S, phase=RotationPhase.UNDONE, candidate=C, reason="undone by the hoster",
                   acted_at=T0 + sec(1)),
]


@pytest.mark.parametrize("rec", ROUND_TRIP, ids=[r.phase.value + str(i) for i, r in enumerate(ROUND_TRIP)])
def test_record_round_trips_through_annotations(rec: RotationRecord) -> None:
    ann = rec.annotations()
    assert all(isinstance(v, str) for v in ann.values())
    assert RotationRecord.from_annotations(ann) == rec


def test_record_annotations_use_the_documented_keys_and_forms() -> None:
    rec = ROUND_TRIP[2]
    ann = rec.annotations()
    assert ann[ANN_STABLE] == S and ann[ANN_CANDIDATE] == C and ann[ANN_PHASE] == "canary"
    assert ann[ANN_WAVE] == "0" and ann[ANN_EVIDENCE] == "false"
    assert json.loads(ann[ANN_CANARY]) == ["a", "b"]
    assert ann[ANN_WAVE_STARTED_AT] == "2024-05-01T12:00:00.123456Z"
    assert ann[ANN_ACTED_AT] == format_micro_time(T0)
    # Times absent: the keys are absent (not empty strings a later parse would have to forgive).
    bare = RotationRecord(stable=S).annotations()
    assert ANN_WAVE_STARTED_AT not in bare and ANN_ACTED_AT not in bare


def test_record_reason_is_cut_to_the_annotation_budget() -> None:
    rec = RotationRecord(stable=S, phase=RotationPhase.ABORTED, candidate=C, reason="x" * (MAX_REASON_CHARS + 50))
    ann = rec.annotations()
    assert len(ann[ANN_REASON]) == MAX_REASON_CHARS
    back = RotationRecord.from_annotations(ann)
    assert back is not None and back.reason == "x" * MAX_REASON_CHARS


def test_record_defaults_when_only_stable_is_present() -> None:
    assert RotationRecord.from_annotations({ANN_STABLE: S}) == RotationRecord(stable=S)
    # Empty wave/canary values read as their defaults; a negative wave as 0; hand-edit whitespace is forgiven.
    rec = RotationRecord.from_annotations({ANN_STABLE: S, ANN_WAVE: "", ANN_CANARY: "",
                                           ANN_ACTED_AT: f" {format_micro_time(T0)} "})
    assert rec == RotationRecord(stable=S, acted_at=T0)
    neg = RotationRecord.from_annotations({ANN_STABLE: S, ANN_PHASE: "promoting", ANN_CANDIDATE: C, ANN_WAVE: "-4"})
    assert neg is not None and neg.wave == 0
    # Only the literal "false" turns evidence off; a missing value means evidence (the safe reading).
    assert RotationRecord.from_annotations({ANN_STABLE: S, ANN_EVIDENCE: "false"}) == RotationRecord(
        stable=S, evidence=False)


@pytest.mark.parametrize("ann", [
    {},
    {ANN_STABLE: ""},
    {ANN_CANDIDATE: C, ANN_PHASE: "canary"},
    {ANN_STABLE: S, ANN_PHASE: "exploded"},
    {ANN_STABLE: S, ANN_PHASE: "Canary", ANN_CANDIDATE: C},
    {ANN_STABLE: S, ANN_WAVE: "two"},
    {ANN_STABLE: S, ANN_WAVE: "1.5"},
    {ANN_STABLE: S, ANN_CANARY: "a,b"},
    {ANN_STABLE: S, ANN_CANARY: "{\"a\": 1}"},
    {ANN_STABLE: S, ANN_CANARY: "\"a\""},
    {ANN_STABLE: S, ANN_CANARY: "null"},
    {ANN_STABLE: S, ANN_CANARY: "[\"a\", 1]"},
    {ANN_STABLE: S, ANN_CANARY: "[[\"a\"]]"},
    {ANN_STABLE: S, ANN_CANARY: "[\"a\""},
    {ANN_STABLE: S, ANN_PHASE: "canary"},
    {ANN_STABLE: S, ANN_PHASE: "promoted", ANN_CANDIDATE: ""},
    {ANN_STABLE: S, ANN_PHASE: "aborted"},
    {ANN_STABLE: S, ANN_PHASE: "undone"},
    {ANN_STABLE: S, ANN_PHASE: "promoting", ANN_CANDIDATE: ""},
], ids=lambda a: ",".join(f"{k.rsplit('/', 1)[1]}={v}" for k, v in a.items()) or "empty")
def test_unreadable_record_is_none(ann: dict[str, str]) -> None:
    assert RotationRecord.from_annotations(ann) is None


def test_unreadable_times_read_as_absent() -> None:
    rec = RotationRecord.from_annotations({ANN_STABLE: S, ANN_ACTED_AT: "yesterday", ANN_WAVE_STARTED_AT: "12:00"})
    assert rec == RotationRecord(stable=S)


def test_hoster_control_reads_retry_and_undo() -> None:
    ctl = HosterControl.from_annotations({ANN_RETRY_AT: format_micro_time(T0), ANN_UNDO_AT: "garbage"}, True)
    assert ctl == HosterControl(paused=True, retry_at=T0, undo_at=None)
    assert HosterControl.from_annotations({}) == HosterControl()


# ---------------------------------------------------------------------------------------------
# bucket, on_candidate, revision_for
# ---------------------------------------------------------------------------------------------


def test_bucket_is_stable_and_within_0_to_100() -> None:
    values = [bucket(C, ns) for ns in NAMESPACES]
    assert values == [bucket(C, ns) for ns in NAMESPACES]
    assert all(0 <= b < 100 for b in values)
    assert len(set(values)) == len(values)
    # Spread over the range, not bunched: 30 namespaces reach both ends.
    assert min(values) < 25 and max(values) > 75


def test_bucket_orders_namespaces_differently_per_candidate() -> None:
    by_c = sorted(NAMESPACES, key=lambda ns: bucket(C, ns))
    by_n = sorted(NAMESPACES, key=lambda ns: bucket(N, ns))
    assert by_c != by_n
    assert all(bucket(C, ns) != bucket(N, ns) for ns in NAMESPACES)
    # The separator keeps (candidate, namespace) pairs apart: no concatenation collision.
    assert bucket("ab", "c") != bucket("a", "bc")


def test_bucket_is_the_hash_of_candidate_and_namespace_however_many_candidates_are_asked_in_turn() -> None:
    """Remembered or not, a bucket is the SHA-256 rule's: a new leader (or version) derives the same waves."""

    def by_hash(candidate: str, ns: str) -> float:
        digest = hashlib.sha256(f"{candidate}\0{ns}".encode()).digest()
        return int.from_bytes(digest[:8], "big") * 100.0 / 2**64

    candidates = [f"{i:064x}" for i in range(20)]  # more than are remembered at once
    for _ in range(2):
        for candidate, ns in itertools.product(candidates, NAMESPACES[:5]):
            assert bucket(candidate, ns) == by_hash(candidate, ns)


@pytest.mark.parametrize("phase", [RotationPhase.STABLE, RotationPhase.ABORTED, RotationPhase.UNDONE])
def test_rejected_or_stable_phases_put_every_namespace_on_stable(phase: RotationPhase) -> None:
    rec = dataclasses.replace(record(phase, wave=2, canary=NAMESPACES[:3]), candidate=C)
    for ns in NAMESPACES:
        assert not rec.on_candidate(ns, STEPS)
        assert rec.revision_for(ns, STEPS) == S


def test_canary_phase_puts_only_canary_namespaces_on_candidate() -> None:
    rec = record(RotationPhase.CANARY, canary=("tenant-03", "tenant-17", "gone"))
    on = [ns for ns in NAMESPACES if rec.on_candidate(ns, STEPS)]
    assert on == ["tenant-03", "tenant-17"]
    assert rec.revision_for("tenant-03", STEPS) == C and rec.revision_for("tenant-04", STEPS) == S
    assert wave_members(rec, NAMESPACES, STEPS) == ["tenant-03", "tenant-17"]


@pytest.mark.parametrize("wave", [1, 2, 3])
def test_promoting_wave_puts_canary_and_bucket_share_on_candidate(wave: int) -> None:
    canary = ("tenant-05",)
    rec = record(RotationPhase.PROMOTING, wave=wave, canary=canary)
    for ns in NAMESPACES:
        want = ns in canary or bucket(C, ns) < STEPS[wave - 1]
        assert rec.on_candidate(ns, STEPS) is want, ns
        assert rec.revision_for(ns, STEPS) == (C if want else S)


def test_promoting_beyond_the_configured_steps_uses_the_last_step() -> None:
    rec = record(RotationPhase.PROMOTING, wave=9, canary=())
    assert all(rec.on_candidate(ns, STEPS) for ns in NAMESPACES)
    assert all(rec.on_candidate(ns, (20.0, 100.0)) for ns in NAMESPACES)


def test_promoted_puts_every_namespace_on_candidate() -> None:
    rec = record(RotationPhase.PROMOTED, wave=3, canary=())
    assert all(rec.revision_for(ns, STEPS) == C for ns in [*NAMESPACES, "new-tenant"])


def test_promoting_wave_0_is_the_canary_only() -> None:
    rec = record(RotationPhase.PROMOTING, wave=0, canary=("tenant-01",))
    assert wave_members(rec, NAMESPACES, STEPS) == ["tenant-01"]


def test_first_step_share_is_roughly_its_percentage() -> None:
    many = [f"ns-{i}" for i in range(2000)]
    rec = record(RotationPhase.PROMOTING, wave=1, canary=())
    share = len(wave_members(rec, many, STEPS)) / len(many)
    assert 0.07 < share < 0.13


@given(cand=hst.text(min_size=1, max_size=20), names=hst.lists(hst.text(min_size=1, max_size=12), max_size=25),
       steps=hst.lists(hst.floats(min_value=0.5, max_value=99.5), max_size=5))
@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_promotion_is_monotone_in_the_wave(cand: str, names: list[str], steps: list[float]) -> None:
    """A namespace on the candidate at wave i stays on it at wave i+1, and the last wave holds all."""
    st = (*sorted(set(steps)), 100.0)
    canary = tuple(names[:1])
    prev: set[str] = set(canary)
    for wave in range(0, len(st) + 1):
        rec = RotationRecord(stable=S, phase=RotationPhase.CANARY if wave == 0 else RotationPhase.PROMOTING,
                             candidate=cand, wave=wave, canary=canary)
        now_on = {ns for ns in names if rec.on_candidate(ns, st)}
        assert prev <= now_on | (set(canary) - set(names))
        prev = now_on
    assert prev == set(names)


def test_membership_ignores_other_namespaces() -> None:
    """A namespace's revision depends on itself and the candidate only: others coming or going never flip it."""
    rec = record(RotationPhase.PROMOTING, wave=2, canary=())
    full = set(wave_members(rec, NAMESPACES, STEPS))
    half = set(wave_members(rec, NAMESPACES[::2], STEPS))
    assert half == full & set(NAMESPACES[::2])


# ---------------------------------------------------------------------------------------------
# select_canary
# ---------------------------------------------------------------------------------------------


def fleet(spec: Mapping[str, int], *, reported: bool = True) -> list[WaveVmi]:
    return [vmi(ns, f"vm-{i}", on=False, settled=True, reported=reported, licensed=reported)
            for ns, n in spec.items() for i in range(n)]


def test_canary_count_takes_namespaces_in_hash_order_until_it_holds_enough_vms() -> None:
    sizes = {ns: 1 + i % 3 for i, ns in enumerate(NAMESPACES)}
    vmis = fleet(sizes)
    for want in (1, 2, 3, 5, 10):
        canary, evidence = select_canary(C, vmis, namespaces=NAMESPACES, spec=CanarySpec(count=want))
        assert evidence
        order = sorted(sizes, key=lambda ns: bucket(C, ns))
        prefix = order[:len(canary)]
        assert sorted(prefix) == list(canary)  # a prefix of the candidate's hash order ...
        held = sum(sizes[ns] for ns in canary)
        assert held >= want  # ... holding enough VMs ...
        assert held - sizes[prefix[-1]] < want  # ... and one namespace at a time: no more than needed


def test_canary_count_larger_than_the_fleet_takes_every_namespace() -> None:
    vmis = fleet({"a": 1, "b": 2})
    assert select_canary(C, vmis, namespaces=["a", "b"], spec=CanarySpec(count=50)) == (("a", "b"), True)


def test_canary_percent_is_of_the_counted_vms_rounded_up_at_least_one() -> None:
    sizes = dict.fromkeys(NAMESPACES[:10], 1)
    vmis = fleet(sizes)
    canary, _ = select_canary(C, vmis, namespaces=sizes, spec=CanarySpec(count=0, percent=25))
    assert len(canary) == 3  # ceil(10 * 25%)
    canary, _ = select_canary(C, vmis, namespaces=sizes, spec=CanarySpec(count=0, percent=0.1))
    assert len(canary) == 1
    canary, _ = select_canary(C, vmis, namespaces=sizes, spec=CanarySpec(count=0, percent=100))
    assert len(canary) == 10


def test_canary_differs_per_candidate_and_is_deterministic() -> None:
    vmis = fleet(dict.fromkeys(NAMESPACES, 1))
    spec = CanarySpec(count=3)
    a = select_canary(C, vmis, namespaces=NAMESPACES, spec=spec)
    assert a == select_canary(C, list(reversed(vmis)), namespaces=list(reversed(NAMESPACES)), spec=spec)
    assert a != select_canary(N, vmis, namespaces=NAMESPACES, spec=spec)


def test_canary_counts_only_reporting_guests_when_any_exists() -> None:
    quiet = {ns: 5 for ns in NAMESPACES[:20]}
    vmis = [*fleet(quiet, reported=False), vmi("tenant-25", on=False), vmi("tenant-27", on=False)]
    canary, evidence = select_canary(C, vmis, namespaces=NAMESPACES, spec=CanarySpec(count=2))
    assert evidence
    assert canary == ("tenant-25", "tenant-27")  # silent namespaces cannot show the token works


def test_canary_without_any_reporting_guest_counts_all_vms() -> None:
    sizes = {ns: 2 for ns in NAMESPACES[:8]}
    vmis = fleet(sizes, reported=False)
    canary, evidence = select_canary(C, vmis, namespaces=NAMESPACES, spec=CanarySpec(count=3))
    assert not evidence
    assert len(canary) == 2  # two VMs each: two namespaces hold three VMs
    assert set(canary) <= set(sizes)


def test_canary_only_from_entitled_namespaces() -> None:
    vmis = fleet({"a": 1, "outsider": 10})
    canary, evidence = select_canary(C, vmis, namespaces=["a", "b"], spec=CanarySpec(count=5))
    assert canary == ("a",) and evidence
    # A reporting guest outside the entitled namespaces is no evidence for them.
    vmis = fleet({"a": 1}, reported=False) + fleet({"outsider": 1})
    assert select_canary(C, vmis, namespaces=["a"], spec=CanarySpec(count=1)) == (("a",), False)


def test_canary_named_namespaces_drop_unknown_names() -> None:
    vmis = fleet({"a": 1, "b": 1, "c": 1})
    spec = CanarySpec.parse("namespaces:c,a,ghost")
    assert select_canary(C, vmis, namespaces=["a", "b", "c"], spec=spec) == (("a", "c"), True)
    # Evidence is about the named namespaces only.
    vmis = fleet({"a": 1}, reported=False) + fleet({"b": 1})
    assert select_canary(C, vmis, namespaces=["a", "b"], spec=CanarySpec.parse("namespaces:a")) == (("a",), False)


def test_canary_of_an_empty_fleet_is_empty() -> None:
    assert select_canary(C, [], namespaces=NAMESPACES, spec=CanarySpec(count=3)) == ((), False)
    assert select_canary(C, [], namespaces=[], spec=CanarySpec(count=0, percent=10)) == ((), False)


def test_canary_ignores_guests_licensectl_cannot_restart() -> None:
    """Blocked/manual VMIs never take the candidate on licensectl's say and are not judged: a canary made of
    them alone would pass on nothing, so they neither weigh in the choice nor count as evidence."""
    vmis = [vmi(ns, on=False, hoster_only=True) for ns in NAMESPACES[:10]] + fleet({"tenant-20": 1, "tenant-21": 1})
    canary, evidence = select_canary(C, vmis, namespaces=NAMESPACES, spec=CanarySpec(count=2))
    assert canary == ("tenant-20", "tenant-21") and evidence
    only_manual = [vmi(ns, on=False, hoster_only=True) for ns in NAMESPACES[:10]] + fleet({"tenant-20": 1},
                                                                                          reported=False)
    canary, evidence = select_canary(C, only_manual, namespaces=NAMESPACES, spec=CanarySpec(count=1))
    assert canary == ("tenant-20",) and not evidence
    named = select_canary(C, only_manual, namespaces=NAMESPACES, spec=CanarySpec.parse("namespaces:tenant-00"))
    assert named == (("tenant-00",), False)


# ---------------------------------------------------------------------------------------------
# wave_status
# ---------------------------------------------------------------------------------------------


def test_wave_status_counts_members_pending_proven_and_failures() -> None:
    rec = record(RotationPhase.CANARY, canary=("a", "b"))
    vmis = [vmi("a", "ok"), vmi("a", "slow", settled=False, licensed=False),
            vmi("b", "bad", licensed=False, failure="not_found"),
            vmi("b", "quiet", reported=False, licensed=False), vmi("b", "manual", hoster_only=True, on=False),
            vmi("c", "outside", settled=False, failure="acquire_failed")]
    ws = wave_status(rec, view(C, {"a": C, "b": C, "c": S}, vmis), STEPS)
    assert ws.members == 5 and ws.pending == 1 and ws.proven == 1 and ws.capable == 3
    assert ws.failures == ("b/bad: not_found",)
    ws = wave_status(rec, view(C, {"a": C, "b": "", "c": S}, vmis), STEPS)
    assert ws.pending == 2  # namespace b's replicas do not all carry the candidate yet


# ---------------------------------------------------------------------------------------------
# decide: bootstrap and new source revisions
# ---------------------------------------------------------------------------------------------


def test_bootstrap_takes_the_live_source_as_stable() -> None:
    d = decide(None, view(S, {"a": ""}), st=ST, now=T0)
    assert d.record == RotationRecord(stable=S, acted_at=T0)
    assert d.snapshot == "stable" and not d.promote and d.events == () and d.next_check is None


def test_bootstrap_without_a_valid_source_decides_nothing() -> None:
    assert decide(None, view(None, {"a": ""}), st=ST, now=T0) == Decision(None)


@pytest.mark.parametrize("live", [S, None])
def test_stable_with_nothing_new_decides_nothing(live: str | None) -> None:
    rec = record(RotationPhase.STABLE)
    ctl = HosterControl(retry_at=T0 + sec(5), undo_at=T0 + sec(5))
    assert decide(rec, view(live, {"a": S}, control=ctl), st=ST, now=T0 + sec(10)) == Decision(None)


def test_new_candidate_starts_a_canary() -> None:
    rec = record(RotationPhase.STABLE)
    vmis = fleet({ns: 1 for ns in NAMESPACES[:6]})
    v = view(C, dict.fromkeys(NAMESPACES[:6], S), vmis)
    now = T0 + sec(100)
    d = decide(rec, v, st=ST, now=now)
    canary, evidence = select_canary(C, vmis, namespaces=v.namespaces, spec=ST.canary)
    assert d.record == RotationRecord(stable=S, phase=RotationPhase.CANARY, candidate=C, wave=0,
                                      wave_started_at=now, canary=canary, evidence=True, acted_at=now)
    assert len(canary) == 2 and evidence
    assert d.snapshot == "candidate" and not d.promote
    assert reasons(d) == ["RotationStarted"]
    assert d.events[0].type == "Normal"
    assert C[:12] in d.events[0].message and S[:12] in d.events[0].message
    assert all(ns in d.events[0].message for ns in canary)
    assert C not in d.events[0].message  # short revisions only


def test_new_candidate_without_guest_evidence_warns() -> None:
    d = decide(record(RotationPhase.STABLE), view(C, {"a": S}, fleet({"a": 2}, reported=False)), st=ST, now=T0)
    assert d.record is not None and d.record.phase is RotationPhase.CANARY
    assert d.record.canary == ("a",) and not d.record.evidence
    assert reasons(d) == ["RotationStarted", "NoGuestEvidence"]
    assert d.events[1].type == "Warning"


def test_rotation_started_message_lists_at_most_five_namespaces() -> None:
    spec = RotationSettings(canary=CanarySpec(count=8), steps=STEPS)
    d = decide(record(RotationPhase.STABLE), view(C, dict.fromkeys(NAMESPACES, S), fleet(dict.fromkeys(NAMESPACES, 1))),
               st=spec, now=T0)
    assert d.record is not None and len(d.record.canary) == 8
    msg = d.events[0].message
    assert "8 namespace(s)" in msg and msg.count("tenant-") == 5 and " ..." in msg


@pytest.mark.parametrize("phase", [RotationPhase.CANARY, RotationPhase.PROMOTING, RotationPhase.ABORTED,
                                   RotationPhase.UNDONE])
def test_new_candidate_supersedes_an_unpromoted_one(phase: RotationPhase) -> None:
    rec = record(phase, wave=2 if phase is RotationPhase.PROMOTING else 0)
    now = T0 + sec(30)
    d = decide(rec, view(N, {"a": C, "b": S}, fleet({"a": 1, "b": 1})), st=ST, now=now)
    assert d.record is not None
    assert d.record.stable == S and d.record.candidate == N
    assert d.record.phase is RotationPhase.CANARY and d.record.wave == 0 and d.record.wave_started_at == now
    assert d.record.acted_at == now and d.record.reason == ""
    assert d.snapshot == "candidate" and not d.promote
    assert reasons(d) == ["RotationSuperseded", "RotationStarted"]
    # Namespaces on the superseded candidate go straight to the new one (docs/design.md#supersede).
    assert "a" in d.record.canary or phase not in (RotationPhase.CANARY, RotationPhase.PROMOTING)


def test_new_candidate_while_promoted_promotes_the_old_candidate_to_stable() -> None:
    rec = record(RotationPhase.PROMOTED, wave=3)
    d = decide(rec, view(N, {"a": C}, fleet({"a": 1})), st=ST, now=T0 + sec(30))
    assert d.record is not None
    assert d.record.stable == C and d.record.candidate == N and d.record.phase is RotationPhase.CANARY
    assert d.promote and d.snapshot == "candidate"
    assert d.record.revision_for("zzz-not-canary", STEPS) == C


def test_promoted_with_the_candidate_still_live_stays() -> None:
    rec = record(RotationPhase.PROMOTED, wave=3)
    assert decide(rec, view(C, {"a": C}, fleet({"a": 1})), st=ST, now=T0 + sec(5000)) == Decision(None)


@pytest.mark.parametrize("phase", [RotationPhase.CANARY, RotationPhase.PROMOTING, RotationPhase.PROMOTED,
                                   RotationPhase.ABORTED, RotationPhase.UNDONE])
def test_source_back_on_stable_withdraws_the_candidate(phase: RotationPhase) -> None:
    rec = record(phase, wave=1 if phase is RotationPhase.PROMOTING else 0)
    now = T0 + sec(40)
    d = decide(rec, view(S, {"a": C}), st=ST, now=now)
    # An aborted or undone candidate has its outcome already; a running or promoted one is withdrawn.
    history = () if phase in REJECTED else (HistoryEntry(C, Outcome.WITHDRAWN, now),)
    assert d.record == RotationRecord(stable=S, phase=RotationPhase.STABLE, candidate="", wave=0,
                                      wave_started_at=None, canary=(), evidence=rec.evidence, reason="",
                                      acted_at=now, history=history)
    assert reasons(d) == ["CandidateWithdrawn"]
    assert d.snapshot is None and not d.promote
    assert all(d.record.revision_for(ns, STEPS) == S for ns in NAMESPACES)


@pytest.mark.parametrize("phase", [RotationPhase.ABORTED, RotationPhase.UNDONE])
def test_rejected_candidate_waits_for_the_hoster(phase: RotationPhase) -> None:
    rec = record(phase)
    for live in (C, None):
        assert decide(rec, view(live, {"a": S}, fleet({"a": 1})), st=ST, now=T0 + sec(10_000)) == Decision(None)


# ---------------------------------------------------------------------------------------------
# decide: undo and retry
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", [RotationPhase.CANARY, RotationPhase.PROMOTING, RotationPhase.PROMOTED])
def test_undo_returns_every_namespace_to_stable(phase: RotationPhase) -> None:
    rec = record(phase, wave={RotationPhase.PROMOTING: 2, RotationPhase.PROMOTED: 3}.get(phase, 0))
    undo = T0 + sec(60)
    d = decide(rec, view(C, {"a": C}, control=HosterControl(undo_at=undo)), st=ST, now=T0 + sec(61))
    assert d.record == dataclasses.replace(rec, phase=RotationPhase.UNDONE, reason="undone by the hoster",
                                           acted_at=undo, history=(HistoryEntry(C, Outcome.UNDONE, undo),))
    assert reasons(d) == ["RolloutUndone"] and d.events[0].type == "Warning"
    assert all(d.record.revision_for(ns, STEPS) == S for ns in NAMESPACES)
    # Handled once: the same annotation does nothing more.
    again = view(C, {"a": S}, control=HosterControl(undo_at=undo))
    assert decide(d.record, again, st=ST, now=T0 + sec(62)) == Decision(None)


@pytest.mark.parametrize("phase", [RotationPhase.STABLE, RotationPhase.ABORTED, RotationPhase.UNDONE])
def test_undo_outside_a_rollout_is_ignored(phase: RotationPhase) -> None:
    rec = record(phase)
    assert decide(rec, view(C if phase is not RotationPhase.STABLE else S, {"a": S},
                            control=HosterControl(undo_at=T0 + sec(5))), st=ST, now=T0 + sec(6)) == Decision(None)


@pytest.mark.parametrize("undo", [T0 - sec(1), T0])
def test_undo_not_newer_than_the_last_action_is_ignored(undo: dt.datetime) -> None:
    rec = record(RotationPhase.CANARY, canary=("a",))
    v = view(C, {"a": C}, [vmi("a", settled=False)], control=HosterControl(undo_at=undo))
    d = decide(rec, v, st=ST, now=T0 + sec(10))
    assert d.record is None and d.next_check == T0 + sec(600)


def test_undo_older_than_a_new_candidate_is_ignored() -> None:
    old_undo = HosterControl(undo_at=T0 - sec(3600))
    start = decide(record(RotationPhase.UNDONE, acted=T0 - sec(3600)), view(N, {"a": S}, fleet({"a": 1}),
                                                                           control=old_undo), st=ST, now=T0)
    assert start.record is not None and start.record.phase is RotationPhase.CANARY
    d = decide(start.record, view(N, {"a": N}, [vmi("a", settled=False)], control=old_undo), st=ST, now=T0 + sec(5))
    assert d.record is None


def test_undo_with_no_action_recorded_applies() -> None:
    rec = record(RotationPhase.CANARY, acted=None)
    d = decide(rec, view(C, {"a": C}, control=HosterControl(undo_at=T0 - sec(10**6))), st=ST, now=T0)
    assert d.record is not None and d.record.phase is RotationPhase.UNDONE


def test_undo_wins_over_failing_analysis() -> None:
    rec = record(RotationPhase.CANARY, canary=("a",))
    v = view(C, {"a": C}, [vmi("a", licensed=False, failure="acquire_failed")],
             control=HosterControl(undo_at=T0 + sec(1)))
    d = decide(rec, v, st=ST, now=T0 + sec(2))
    assert d.record is not None and d.record.phase is RotationPhase.UNDONE


@pytest.mark.parametrize("phase", [RotationPhase.ABORTED, RotationPhase.UNDONE])
def test_retry_starts_a_fresh_canary_for_the_same_candidate(phase: RotationPhase) -> None:
    rec = dataclasses.replace(record(phase, wave=2, canary=("old",)), reason="it failed")
    retry = T0 + sec(300)
    now = T0 + sec(301)
    vmis = fleet({"a": 1, "b": 1, "c": 1})
    d = decide(rec, view(C, dict.fromkeys("abc", S), vmis, control=HosterControl(retry_at=retry)), st=ST, now=now)
    canary, _ = select_canary(C, vmis, namespaces="abc", spec=ST.canary)
    assert d.record == RotationRecord(stable=S, phase=RotationPhase.CANARY, candidate=C, wave=0,
                                      wave_started_at=now, canary=canary, evidence=True, acted_at=now)
    assert reasons(d) == ["RotationStarted"] and "retried by the hoster" in d.events[0].message
    assert d.snapshot is None and not d.promote  # the candidate's bytes are already in the store
    # Handled once.
    assert decide(d.record, view(C, dict.fromkeys("abc", S), vmis, control=HosterControl(retry_at=retry)), st=ST,
                  now=now + sec(1)).record is None


def test_retry_from_a_clock_ahead_is_not_handled_twice() -> None:
    """The retry time can be ahead of the controller's clock; acted_at takes the later one."""
    retry = T0 + sec(120)
    d = decide(record(RotationPhase.ABORTED), view(C, {"a": S}, fleet({"a": 1}),
                                                   control=HosterControl(retry_at=retry)), st=ST, now=T0 + sec(10))
    assert d.record is not None and d.record.acted_at == retry and d.record.wave_started_at == retry
    again = decide(d.record, view(C, {"a": S}, [vmi("a", on=False, settled=False)],
                                  control=HosterControl(retry_at=retry)), st=ST, now=T0 + sec(20))
    assert again.record is None


@pytest.mark.parametrize("retry", [T0 - sec(1), T0])
def test_retry_not_newer_than_the_last_action_is_ignored(retry: dt.datetime) -> None:
    rec = record(RotationPhase.ABORTED)
    v = view(C, {"a": S}, control=HosterControl(retry_at=retry))
    assert decide(rec, v, st=ST, now=T0 + sec(5)) == Decision(None)


@pytest.mark.parametrize("phase", [RotationPhase.STABLE, RotationPhase.CANARY, RotationPhase.PROMOTED])
def test_retry_outside_a_rejected_candidate_is_ignored(phase: RotationPhase) -> None:
    rec = record(phase, wave=3 if phase is RotationPhase.PROMOTED else 0, canary=("a",))
    live = S if phase is RotationPhase.STABLE else C
    v = view(live, {"a": rec.revision_for("a", STEPS)}, [vmi("a", settled=False)],
             control=HosterControl(retry_at=T0 + sec(5)))
    d = decide(rec, v, st=ST, now=T0 + sec(6))
    assert d.record is None


def test_undo_then_retry_each_once() -> None:
    rec = record(RotationPhase.PROMOTING, wave=1, canary=("a",))
    ctl = HosterControl(undo_at=T0 + sec(10), retry_at=T0 + sec(20))
    v = view(C, {"a": C}, fleet({"a": 1}), control=ctl)
    d1 = decide(rec, v, st=ST, now=T0 + sec(30))
    assert d1.record is not None and d1.record.phase is RotationPhase.UNDONE
    d2 = decide(d1.record, v, st=ST, now=T0 + sec(31))
    assert d2.record is not None and d2.record.phase is RotationPhase.CANARY
    assert reasons(d2) == ["RotationStarted"]


def test_retry_older_than_the_undo_is_not_replayed() -> None:
    rec = record(RotationPhase.CANARY, canary=("a",))
    ctl = HosterControl(undo_at=T0 + sec(20), retry_at=T0 + sec(10))
    d1 = decide(rec, view(C, {"a": C}, control=ctl), st=ST, now=T0 + sec(30))
    assert d1.record is not None and d1.record.phase is RotationPhase.UNDONE
    assert decide(d1.record, view(C, {"a": S}, control=ctl), st=ST, now=T0 + sec(31)) == Decision(None)


# ---------------------------------------------------------------------------------------------
# decide: analysis
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reason", sorted(FAILURE_REASONS))
def test_failure_evidence_in_the_canary_aborts(reason: str) -> None:
    rec = record(RotationPhase.CANARY, canary=("a",))
    v = view(C, {"a": C, "b": S}, [vmi("a", "good"), vmi("a", "bad", licensed=False, failure=reason)])
    d = decide(rec, v, st=ST, now=T0 + sec(30))
    assert d.record is not None
    assert d.record == dataclasses.replace(rec, phase=RotationPhase.ABORTED, reason=d.record.reason,
                                           acted_at=T0 + sec(30),
                                           history=(HistoryEntry(C, Outcome.ABORTED, T0 + sec(30)),))
    assert "canary" in d.record.reason and f"a/bad: {reason}" in d.record.reason
    assert reasons(d) == ["RolloutAborted"] and d.events[0].type == "Warning"
    assert all(d.record.revision_for(ns, STEPS) == S for ns in ("a", "b"))


def test_failure_evidence_in_a_step_aborts_and_names_the_step() -> None:
    rec = record(RotationPhase.PROMOTING, wave=2, canary=())
    members = wave_members(rec, NAMESPACES, STEPS)
    victim = members[-1]
    v = view(C, carrying(rec, NAMESPACES), [vmi(victim, "x", licensed=False, failure="token_corrupt")])
    d = decide(rec, v, st=ST, now=T0 + sec(30))
    assert d.record is not None and d.record.phase is RotationPhase.ABORTED
    assert d.record.reason.startswith("step 2 of 3:")


@pytest.mark.parametrize("vm", [
    vmi("a", "token-missing", licensed=False, failure="token_missing"),
    vmi("a", "lease-expired", licensed=False, failure="lease_expired"),
    vmi("a", "silent", reported=False, licensed=False, failure="acquire_failed"),
    vmi("a", "still-on-stable", on=False, settled=False, licensed=False, failure="acquire_failed"),
    vmi("a", "manual", hoster_only=True, on=False, settled=False, licensed=False, failure="acquire_failed"),
    vmi("b", "not-in-the-wave", on=False, licensed=False, failure="acquire_failed"),
], ids=lambda v: v.name)
def test_evidence_that_does_not_blame_the_candidate_does_not_abort(vm: WaveVmi) -> None:
    rec = record(RotationPhase.CANARY, canary=("a",))
    d = decide(rec, view(C, {"a": C, "b": S}, [vmi("a", "ok"), vm]), st=ST, now=T0 + sec(30))
    assert d.record is None or d.record.phase is not RotationPhase.ABORTED
    assert "RolloutAborted" not in reasons(d)


def test_token_missing_blocks_the_wave_until_the_deadline() -> None:
    rec = record(RotationPhase.CANARY, canary=("a",))
    v = view(C, {"a": C}, [vmi("a", "ok"), vmi("a", "nodisk", licensed=False, failure="token_missing")])
    assert decide(rec, v, st=ST, now=T0 + sec(30)) == Decision(None, next_check=T0 + sec(600))
    late = decide(rec, v, st=ST, now=T0 + sec(600))
    assert late.record is not None and late.record.phase is RotationPhase.ABORTED
    assert "deadline" in late.record.reason


def test_max_unlicensed_is_a_threshold() -> None:
    st = dataclasses.replace(ST, max_unlicensed=2)
    rec = record(RotationPhase.CANARY, canary=("a",))
    one = [vmi("a", "x", licensed=False, failure="not_found"), vmi("a", "y")]
    assert decide(rec, view(C, {"a": C}, one), st=st, now=T0 + sec(1)).record is None
    two = [vmi("a", "x", licensed=False, failure="not_found"), vmi("a", "y", licensed=False, failure="not_found")]
    d = decide(rec, view(C, {"a": C}, two), st=st, now=T0 + sec(1))
    assert d.record is not None and d.record.phase is RotationPhase.ABORTED
    assert "2 guest(s)" in d.record.reason


def test_max_unlicensed_zero_never_aborts_on_evidence() -> None:
    st = dataclasses.replace(ST, max_unlicensed=0)
    rec = record(RotationPhase.CANARY, canary=("a",))
    v = view(C, {"a": C}, [vmi("a", "x", licensed=False, failure="acquire_failed")])
    assert decide(rec, v, st=st, now=T0 + sec(1)) == Decision(None, next_check=T0 + sec(600))


def test_failure_wins_over_a_pass() -> None:
    """Failures are not proofs, but a wave with both a failure and nothing pending must abort, not pass."""
    st = dataclasses.replace(ST, max_unlicensed=1)
    rec = record(RotationPhase.CANARY, canary=("a",))
    v = view(C, {"a": C}, [vmi("a", "x", licensed=True, failure="acquire_failed")])
    d = decide(rec, v, st=st, now=T0 + sec(1))
    assert d.record is not None and d.record.phase is RotationPhase.ABORTED


def test_canary_pass_starts_step_one() -> None:
    rec = record(RotationPhase.CANARY, canary=("a", "b"))
    v = view(C, {"a": C, "b": C, "c": S}, [vmi("a"), vmi("b"), vmi("b", "2"), vmi("c", on=False, settled=False)])
    now = T0 + sec(45)
    d = decide(rec, v, st=ST, now=now)
    assert d.record == dataclasses.replace(rec, phase=RotationPhase.PROMOTING, wave=1, wave_started_at=now)
    assert reasons(d) == ["RotationStepStarted"] and d.events[0].type == "Normal"
    msg = d.events[0].message
    assert "canary passed (3 of 3" in msg and "step 1 of 3: 10% of namespaces" in msg


@pytest.mark.parametrize("wave", [1, 2])
def test_step_pass_starts_the_next_step(wave: int) -> None:
    rec = record(RotationPhase.PROMOTING, wave=wave, canary=("tenant-00",))
    members = wave_members(rec, NAMESPACES, STEPS)
    v = view(C, carrying(rec, NAMESPACES), [vmi(ns) for ns in members])
    d = decide(rec, v, st=ST, now=T0 + sec(50))
    assert d.record is not None and d.record.phase is RotationPhase.PROMOTING and d.record.wave == wave + 1
    assert d.record.wave_started_at == T0 + sec(50)
    assert f"step {wave} of 3 passed" in d.events[0].message
    assert f"step {wave + 1} of 3: {STEPS[wave]:g}%" in d.events[0].message


def test_last_step_pass_promotes() -> None:
    rec = record(RotationPhase.PROMOTING, wave=3, canary=())
    v = view(C, dict.fromkeys(NAMESPACES, C), [vmi(ns) for ns in NAMESPACES])
    d = decide(rec, v, st=ST, now=T0 + sec(50))
    assert d.record == dataclasses.replace(rec, phase=RotationPhase.PROMOTED,
                                           history=(HistoryEntry(C, Outcome.PROMOTED, T0 + sec(50)),))
    assert reasons(d) == ["RotationPromoted"]
    assert "30 guest(s)" in d.events[0].message


def test_steps_shortened_under_a_running_rotation_promote_at_the_new_end() -> None:
    st = dataclasses.replace(ST, steps=(100.0,))
    rec = record(RotationPhase.PROMOTING, wave=2, canary=())
    v = view(C, dict.fromkeys(NAMESPACES, C), [vmi(ns) for ns in NAMESPACES])
    d = decide(rec, v, st=st, now=T0 + sec(50))
    assert d.record is not None and d.record.phase is RotationPhase.PROMOTED


@pytest.mark.parametrize(("case", "vmis", "namespaces"), [
    ("vmi not restarted yet", [vmi("a"), vmi("a", "2", on=False, settled=False, licensed=False)], {"a": C}),
    ("vmi on candidate, not settled", [vmi("a"), vmi("a", "2", settled=False, licensed=False)], {"a": C}),
    ("no proof yet", [vmi("a"), vmi("a", "2", licensed=False)], {"a": C}),
    ("replicas still on stable", [vmi("a")], {"a": S}),
    ("replicas mixed", [vmi("a")], {"a": ""}),
    ("namespace without vmis, replicas behind", [vmi("a"), vmi("b")], {"a": C, "b": C, "z": S}),
])
def test_wave_waits_until_the_deadline(case: str, vmis: list[WaveVmi], namespaces: dict[str, str]) -> None:
    rec = record(RotationPhase.CANARY, canary=("a", "b", "z"))
    d = decide(rec, view(C, namespaces, vmis), st=ST, now=T0 + sec(599))
    assert d == Decision(None, next_check=T0 + sec(600)), case


def test_wave_does_not_pass_before_the_guest_store_can_judge_silence() -> None:
    rec = record(RotationPhase.CANARY, canary=("a",))
    v = view(C, {"a": C}, [vmi("a")], evidence_ready=False)
    assert decide(rec, v, st=ST, now=T0 + sec(30)) == Decision(None, next_check=T0 + sec(600))
    # Failures still abort at once; they need no silence to be judged.
    bad = view(C, {"a": C}, [vmi("a", licensed=False, failure="acquire_failed")], evidence_ready=False)
    assert decide(rec, bad, st=ST, now=T0 + sec(30)).record is not None


def test_no_evidence_canary_passes_on_readiness_alone() -> None:
    rec = record(RotationPhase.CANARY, canary=("a",), evidence=False)
    v = view(C, {"a": C}, [vmi("a", reported=False, licensed=False), vmi("a", "2", reported=False, licensed=False)])
    d = decide(rec, v, st=ST, now=T0 + sec(30))
    assert d.record is not None and d.record.phase is RotationPhase.PROMOTING
    assert "0 of 0 reporting guest(s)" in d.events[0].message


def test_hoster_only_vmis_never_block_a_wave() -> None:
    rec = record(RotationPhase.CANARY, canary=("a",))
    v = view(C, {"a": C}, [vmi("a"), vmi("a", "blocked", hoster_only=True, on=False, settled=False, licensed=False),
                           vmi("a", "manual", hoster_only=True, on=True, settled=False, licensed=False)])
    d = decide(rec, v, st=ST, now=T0 + sec(30))
    assert d.record is not None and d.record.phase is RotationPhase.PROMOTING


def test_vmis_outside_the_wave_never_block_it() -> None:
    rec = record(RotationPhase.CANARY, canary=("a",))
    v = view(C, {"a": C, "b": S}, [vmi("a"), vmi("b", on=False, settled=False, licensed=False)])
    d = decide(rec, v, st=ST, now=T0 + sec(30))
    assert d.record is not None and d.record.wave == 1


@pytest.mark.parametrize("wave", [0, 1, 3])
def test_deadline_aborts_the_wave(wave: int) -> None:
    rec = record(RotationPhase.CANARY if wave == 0 else RotationPhase.PROMOTING, wave=wave, canary=("a",))
    v = view(C, carrying(rec, ["a", "b"]), [vmi("a", settled=False, licensed=False), vmi("a", "2")])
    assert decide(rec, v, st=ST, now=T0 + sec(599.999)).record is None
    d = decide(rec, v, st=ST, now=T0 + sec(600))
    assert d.record is not None and d.record.phase is RotationPhase.ABORTED
    name = "canary" if wave == 0 else f"step {wave} of 3"
    assert d.record.reason.startswith(f"{name}: analysis deadline passed with 1 VMI(s) not done")
    assert "1 of 2 reporting guest(s)" in d.record.reason
    assert reasons(d) == ["RolloutAborted"]


def test_deadline_counts_from_the_wave_start_not_the_rotation_start() -> None:
    rec = record(RotationPhase.PROMOTING, wave=1, canary=("a",), started=T0 + sec(500), acted=T0)
    v = view(C, carrying(rec, ["a"]), [vmi("a", settled=False, licensed=False)])
    d = decide(rec, v, st=ST, now=T0 + sec(700))
    assert d == Decision(None, next_check=T0 + sec(1100))


def test_paused_rollout_holds_the_deadline() -> None:
    rec = record(RotationPhase.CANARY, canary=("a",))
    v = view(C, {"a": C}, [vmi("a", settled=False, licensed=False)], control=HosterControl(paused=True))
    assert decide(rec, v, st=ST, now=T0 + sec(10**6)) == Decision(None, next_check=None)
    # Paused does not hold back evidence: failures still abort, and a finished wave still passes.
    bad = dataclasses.replace(v, vmis=(vmi("a", licensed=False, failure="acquire_failed"),))
    assert decide(rec, bad, st=ST, now=T0 + sec(1)).record is not None
    good = dataclasses.replace(v, vmis=(vmi("a"),))
    d = decide(rec, good, st=ST, now=T0 + sec(1))
    assert d.record is not None and d.record.wave == 1


def test_missing_wave_start_counts_from_now() -> None:
    rec = dataclasses.replace(record(RotationPhase.CANARY, canary=("a",)), wave_started_at=None)
    v = view(C, {"a": C}, [vmi("a", settled=False, licensed=False)])
    assert decide(rec, v, st=ST, now=T0 + sec(10**6)) == Decision(None, next_check=T0 + sec(10**6 + 600))


def test_analysis_runs_while_the_source_is_unreadable() -> None:
    rec = record(RotationPhase.CANARY, canary=("a",))
    d = decide(rec, view(None, {"a": C}, [vmi("a")]), st=ST, now=T0 + sec(1))
    assert d.record is not None and d.record.wave == 1


def test_namespaces_no_longer_entitled_leave_the_wave() -> None:
    rec = record(RotationPhase.CANARY, canary=("a", "gone"))
    d = decide(rec, view(C, {"a": C}, [vmi("a")]), st=ST, now=T0 + sec(1))
    assert d.record is not None and d.record.wave == 1


# ---------------------------------------------------------------------------------------------
# Whole rotations in a simulated world
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class World:
    """Namespaces whose replicas follow each decision at once and whose VMIs restart onto it after
    ``lag`` ticks; guests with the good token report licensed, with a bad one report ``failure``."""

    sizes: dict[str, int]
    quiet: frozenset[str] = frozenset()  # namespaces whose guests never report
    manual: frozenset[str] = frozenset()  # namespaces whose VMIs licensectl cannot restart
    bad: frozenset[str] = frozenset()  # revisions whose token fails
    failure: str = "acquire_failed"
    lag: int = 0
    carried: dict[str, str] = dataclasses.field(default_factory=dict)
    since: dict[str, int] = dataclasses.field(default_factory=dict)  # namespace -> tick its revision changed

    def follow(self, rec: RotationRecord, steps: Sequence[float], tick: int) -> None:
        for ns in self.sizes:
            rev = rec.revision_for(ns, steps)
            if self.carried.get(ns) != rev:
                self.carried[ns] = rev
                self.since[ns] = tick

    def view(self, live: str, rec: RotationRecord | None, tick: int, control: HosterControl) -> SourceView:
        vmis: list[WaveVmi] = []
        for ns, n in self.sizes.items():
            rev = self.carried.get(ns, "")
            cand = rec is not None and rec.candidate != "" and rev == rec.candidate
            manual = ns in self.manual
            restarted = not manual and tick - self.since.get(ns, 0) >= self.lag
            reported = ns not in self.quiet
            fails = rev in self.bad and restarted
            for i in range(n):
                vmis.append(WaveVmi(ns, f"vm-{i}", on_candidate=cand and restarted, settled=restarted,
                                    hoster_only=manual, reported=reported,
                                    licensed=reported and restarted and not fails,
                                    failure=self.failure if reported and fails else None))
        return SourceView(live=live, control=control, namespaces=dict(self.carried), vmis=vmis)


def drive(world: World, st: RotationSettings, *, live: str, rec: RotationRecord | None, ticks: int = 200,
          step_seconds: float = 10, control: HosterControl | None = None) -> tuple[RotationRecord | None,
                                                                                   list[Decision]]:
    """Decide, let the world follow, repeat; stop once nothing changes and nothing is pending."""
    ctl = control or HosterControl()
    decisions: list[Decision] = []
    if rec is not None:
        world.follow(rec, st.steps, 0)
    for tick in range(1, ticks):
        d = decide(rec, world.view(live, rec, tick, ctl), st=st, now=T0 + sec(tick * step_seconds))
        decisions.append(d)
        if d.record is not None:
            rec = d.record
            world.follow(rec, st.steps, tick)
        elif d.next_check is None:
            break
    return rec, decisions


def phases_and_waves(decisions: Sequence[Decision]) -> list[tuple[RotationPhase, int]]:
    return [(d.record.phase, d.record.wave) for d in decisions if d.record is not None]


def test_a_good_candidate_rolls_through_every_step_to_promoted() -> None:
    world = World(sizes={ns: 1 + i % 3 for i, ns in enumerate(NAMESPACES)})
    boot, _ = drive(world, ST, live=S, rec=None, ticks=3)
    assert boot == RotationRecord(stable=S, acted_at=T0 + sec(10))
    rec, decisions = drive(world, ST, live=C, rec=boot)
    assert rec is not None and rec.phase is RotationPhase.PROMOTED
    assert phases_and_waves(decisions) == [(RotationPhase.CANARY, 0), (RotationPhase.PROMOTING, 1),
                                           (RotationPhase.PROMOTING, 2), (RotationPhase.PROMOTING, 3),
                                           (RotationPhase.PROMOTED, 3)]
    assert world.carried == dict.fromkeys(NAMESPACES, C)
    assert [r for d in decisions for r in reasons(d)] == [
        "RotationStarted", "RotationStepStarted", "RotationStepStarted", "RotationStepStarted", "RotationPromoted"]
    # The next source revision promotes this one to stable and starts over.
    rec2, decisions2 = drive(world, ST, live=N, rec=rec)
    assert decisions2[0].promote and decisions2[0].snapshot == "candidate"
    assert rec2 is not None and rec2.stable == C and rec2.candidate == N and rec2.phase is RotationPhase.PROMOTED
    assert world.carried == dict.fromkeys(NAMESPACES, N)


def test_a_bad_token_aborts_in_the_canary_and_never_reaches_other_namespaces() -> None:
    world = World(sizes={ns: 2 for ns in NAMESPACES}, bad=frozenset({C}))
    boot, _ = drive(world, ST, live=S, rec=None, ticks=2)
    seen_on_candidate: set[str] = set()
    rec = boot
    canary: tuple[str, ...] = ()
    for tick in range(1, 50):
        d = decide(rec, world.view(C, rec, tick, HosterControl()), st=ST, now=T0 + sec(100 + tick))
        if d.record is None:
            break
        rec = d.record
        canary = canary or rec.canary
        world.follow(rec, ST.steps, tick)
        seen_on_candidate |= {ns for ns, rev in world.carried.items() if rev == C}
    assert rec is not None and rec.phase is RotationPhase.ABORTED
    assert canary and seen_on_candidate == set(canary)
    assert world.carried == dict.fromkeys(NAMESPACES, S)


@given(sizes=hst.lists(hst.integers(min_value=0, max_value=3), min_size=1, max_size=25),
       quiet_every=hst.integers(min_value=0, max_value=4), manual_every=hst.integers(min_value=0, max_value=5),
       steps=hst.lists(hst.integers(min_value=1, max_value=99), max_size=4),
       canary=hst.sampled_from(["1", "3", "20%", "namespaces:ns-00,ns-03"]),
       lag=hst.integers(min_value=0, max_value=3), bad=hst.booleans(),
       failure=hst.sampled_from(sorted(FAILURE_REASONS)))
@hsettings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_rotation_advances_one_wave_at_a_time_and_ends_all_or_nothing(
        sizes: list[int], quiet_every: int, manual_every: int, steps: list[int], canary: str, lag: int, bad: bool,
        failure: str) -> None:
    names = [f"ns-{i:02d}" for i in range(len(sizes))]
    st = RotationSettings(canary=CanarySpec.parse(canary), steps=parse_steps(",".join(f"{s}%" for s in
                                                                                       sorted(set(steps)))),
                          analysis_deadline_seconds=10_000, max_unlicensed=1)
    world = World(sizes=dict(zip(names, sizes, strict=True)),
                  quiet=frozenset(names[::quiet_every] if quiet_every else ()),
                  manual=frozenset(names[1::manual_every] if manual_every else ()),
                  bad=frozenset({C} if bad else ()), failure=failure, lag=lag)
    rec: RotationRecord | None = RotationRecord(stable=S, acted_at=T0)
    assert rec is not None
    world.follow(rec, st.steps, 0)
    waves: list[tuple[RotationPhase, int]] = []
    ever_on: set[str] = set()
    canary_set: set[str] = set()
    for tick in range(1, 400):
        d = decide(rec, world.view(C, rec, tick, HosterControl()), st=st, now=T0 + sec(tick))
        if d.record is None:
            assert d.next_check is not None or rec is None or rec.phase not in (RotationPhase.CANARY,
                                                                                RotationPhase.PROMOTING)
            if d.next_check is None:
                break
            continue
        rec = d.record
        if rec.phase is RotationPhase.CANARY:
            canary_set = set(rec.canary)
        waves.append((rec.phase, rec.wave))
        world.follow(rec, st.steps, tick)
        ever_on |= {ns for ns, rev in world.carried.items() if rev == C}
    assert rec is not None
    # Waves advance one at a time from the canary.
    assert waves[0] == (RotationPhase.CANARY, 0)
    for (p1, w1), (p2, w2) in itertools.pairwise(waves):
        if p2 is RotationPhase.PROMOTING:
            assert w2 == w1 + 1
        elif p2 is RotationPhase.PROMOTED:
            assert (p1, w1) == (RotationPhase.PROMOTING, len(st.steps))
    # All or nothing, and a token that fails where guests can say so never leaves the canary.
    failing_guests = bad and any(sizes[i] and names[i] not in world.quiet and names[i] not in world.manual
                                 for i, ns in enumerate(names) if ns in canary_set)
    if not bad:
        assert rec.phase is RotationPhase.PROMOTED
    if rec.phase is RotationPhase.PROMOTED:
        assert not failing_guests
        assert set(world.carried.values()) == {C}
    else:
        assert rec.phase is RotationPhase.ABORTED
        assert set(world.carried.values()) == {S}
        if failing_guests:
            assert ever_on <= canary_set
            assert waves[-2:] == [(RotationPhase.CANARY, 0), (RotationPhase.ABORTED, 0)]


def test_an_empty_canary_says_so_and_moves_on() -> None:
    st = dataclasses.replace(ST, canary=CanarySpec.parse("namespaces:nobody"))
    rec = dataclasses.replace(record(RotationPhase.STABLE), candidate="")
    d = decide(rec, view(C, {"a": S}, [vmi("a", "x")]), st=st, now=T0)
    assert d.record is not None and d.record.phase is RotationPhase.CANARY and d.record.canary == ()
    assert reasons(d) == ["RotationStarted", "CanaryEmpty"] and d.events[1].type == "Warning"
    # Nothing to judge: the next pass moves to step 1.
    d2 = decide(d.record, view(C, {"a": S}, [vmi("a", "x")]), st=st, now=T0 + sec(1))
    assert d2.record is not None and d2.record.phase is RotationPhase.PROMOTING and d2.record.wave == 1


def test_failed_gridd_events_are_gridd_event_kinds() -> None:
    """The core names gridd events and reasons as strings (it may not import the report parser)."""
    assert {k.value for k in GriddEventKind} >= FAILED_GRIDD_EVENTS
    assert FAILURE_REASONS <= UNLICENSED_REASONS


@pytest.mark.parametrize(("kw", "want"), [
    # Proof: licensed, holding the candidate, since the VMI started, gridd's newest line no failure.
    ({"licensed": True, "last_event": "acquired"}, (True, None)),
    ({"licensed": True, "last_event": "renewed"}, (True, None)),
    ({"licensed": True, "last_event": None}, (True, None)),
    # Licensed by nvidia-smi, but gridd just failed to get or renew a lease with this token: no proof.
    ({"licensed": True, "last_event": "failed"}, (False, None)),
    ({"licensed": True, "last_event": "token_corrupt"}, (False, None)),
    # Unlicensed: gridd's reason (decide() judges whether it blames the token).
    ({"licensed": False, "reason": "acquire_failed"}, (False, "acquire_failed")),
    ({"licensed": False, "reason": "token_missing"}, (False, "token_missing")),
    # Says nothing about the candidate: an old token, or a report from before the VMI started.
    ({"licensed": False, "reason": "acquire_failed", "holds_candidate": False}, (False, None)),
    ({"licensed": True, "last_event": "acquired", "since_start": False}, (False, None)),
])
def test_guest_evidence(kw: dict[str, object], want: tuple[bool, str | None]) -> None:
    args: dict[str, object] = {"reason": None, "last_event": None, "holds_candidate": True, "since_start": True, **kw}
    assert guest_evidence(**args) == want  # type: ignore[arg-type]


@pytest.mark.parametrize("phase", list(RotationPhase))
@pytest.mark.parametrize("live", [None, S, C, content_revision(b"token-new", None)])
@pytest.mark.parametrize("act", [None, "undo-old", "undo-new", "retry-old", "retry-new"])
def test_can_change_is_false_only_where_decide_keeps_the_record(phase: RotationPhase, live: str | None,
                                                                act: str | None) -> None:
    """The shell skips observing VMIs when `can_change` says no: `decide` must then keep the record,
    whatever the VMIs and namespaces say (here: everything passed, or a failure, long after the deadline)."""
    rec = record(phase, acted=T0)
    when = {"old": T0 - sec(5), "new": T0 + sec(5)}
    ctl = HosterControl()
    if act is not None:
        verb, age = act.split("-")
        ctl = HosterControl(undo_at=when[age]) if verb == "undo" else HosterControl(retry_at=when[age])
    for vmis in ([vmi("a", "x")], [vmi("a", "x", licensed=False, failure="acquire_failed")]):
        v = view(live, carrying(rec, ["a", "b"]), vmis, control=ctl)
        if not can_change(rec, live, ctl):
            assert decide(rec, v, st=ST, now=T0 + sec(10_000)).record is None
    assert can_change(None, live, ctl) == (live is not None)
