"""`licensectl keys rotate` output: which VMIs hold which older key (docs/design.md#key-ring)."""

from __future__ import annotations

import datetime as dt

from licensectl.cli.keys import MAX_NAMED, holders_report
from licensectl.core.credentials import Holders, KeyRing, key_id

K1, K2, K3 = bytes(range(32)), bytes(range(1, 33)), bytes(range(2, 34))
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_names_the_holders_of_each_older_key() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0, Holders()).rotate(K3, T0, Holders())
    lines = holders_report(ring, Holders(by_key={key_id(K1): ("a/vm1", "b/vm2")}))
    assert lines == [
        f"  older key {key_id(K2)} is kept: held by no running VMI; retired after the grace period",
        f"  older key {key_id(K1)} is kept: held by 2 running VMI(s): a/vm1, b/vm2",
    ]


def test_unstamped_vmis_and_incomplete_lists_are_said() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0, Holders())
    lines = holders_report(ring, Holders(unknown=("a/old",)))
    assert lines[0] == f"  older key {key_id(K1)} is kept: held by 1 running VMI(s): a/old"
    assert "1 VMI(s) carry no key stamp" in lines[1] and lines[1].endswith("a/old")
    assert holders_report(ring, Holders(complete=False))[-1] == "  the VMI list is incomplete: every older key is kept"


def test_long_lists_are_bounded() -> None:
    ring = KeyRing(current=K1).rotate(K2, T0, Holders())
    many = tuple(f"ns/vm{i:03}" for i in range(MAX_NAMED + 5))
    (line,) = holders_report(ring, Holders(by_key={key_id(K1): many}))
    assert line.endswith("and 5 more") and "ns/vm019" in line and "ns/vm020" not in line
