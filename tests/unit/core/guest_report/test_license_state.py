"""The facts about each license state live on `LicenseState` (its severity, whether it holds no license),
and they are the ones the operator documentation states."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from licensectl.core.guest_report import LicenseState

ROOT = Path(__file__).resolve().parents[4]


def documented_order(doc: str, lead: str) -> list[LicenseState]:
    """The worst-first order a doc gives after `lead`, e.g. `(restricted > expired > ... > licensed)`."""
    text = " ".join((ROOT / "docs" / doc).read_text().split())
    m = re.search(re.escape(lead) + r" \(([a-z_ >]+)\)", text)
    assert m is not None, f"{doc}: no severity order after {lead!r}"
    return [LicenseState(name.strip()) for name in m.group(1).split(">")]


def test_every_state_has_its_own_severity() -> None:
    ranks = [s.severity for s in LicenseState]
    assert len(set(ranks)) == len(LicenseState), "two states share a rank: the worst GPU would be ambiguous"


@pytest.mark.parametrize(("doc", "lead"), [("operations.md", "takes its worst GPU's state"),
                                           ("guest.md", "else the worst GPU state")])
def test_the_severity_order_is_the_documented_one(doc: str, lead: str) -> None:
    """Worst first in the docs; driver_missing never mixes with GPU states and outranks them all."""
    worst_first = sorted(LicenseState, key=lambda s: s.severity, reverse=True)
    assert worst_first[0] is LicenseState.DRIVER_MISSING
    assert worst_first[1:] == documented_order(doc, lead)


def test_the_no_license_states_are_the_documented_ones() -> None:
    """docs/operations.md#guest-conditions: the unlicensed reason is set only while the guest holds no license."""
    text = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    m = re.search(r"`licensectl_guest_unlicensed_reason{reason}` \((?:1, )?only while (?:the state is )?([^)]*)\)",
                  text)
    assert m is not None
    documented = {LicenseState(name) for name in re.findall(r"`([a-z_]+)`", m.group(1))}
    assert {s for s in LicenseState if s.no_license} == documented
    assert not LicenseState.LICENSED.no_license and not LicenseState.UNKNOWN.no_license
