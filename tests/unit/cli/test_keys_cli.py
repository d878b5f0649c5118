"""`licensectl keys rotate` output: which VMIs hold which older key (docs/design.md#key-ring)."""

from __future__ import annotations

import datetime as dt

from licensectl.cli.keys import MAX_NAMED, by_hand, holders_report, revocation_report
from licensectl.core.credentials import Holders, KeyRing, key_id
from licensectl.core.model import Vm, Vmi

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


def _vmi(ref: str, owner: str | None) -> Vmi:
    ns, name = ref.split("/")
    return Vmi(namespace=ns, name=name, uid=name, created_us=0.0, owner_vm=owner, phase="Running", ready=True,
               running_since_us=None, secret_volumes=(), firmware_uuid=None)


def test_revoke_names_every_guest_it_locks_out_including_holders_of_the_key_being_revoked() -> None:
    """Every running VMI on the current key is locked out too: the revocation ends that key as well."""
    before = KeyRing(current=K1).rotate(K2, T0, Holders())  # current K2, older K1
    after = before.revoke_older(K3, T0)
    holders = Holders(by_key={key_id(K2): ("a/on-current", "b/on-current"), key_id(K1): ("a/on-older",)},
                      unknown=("c/unstamped",))
    lines = revocation_report(after, holders)
    locked = ("a/on-current", "a/on-older", "b/on-current", "c/unstamped")
    assert lines[0] == (f"4 running VMI(s) hold a revoked credential and get 401 on every report until they "
                        f"restart onto the new one: {', '.join(locked)}")
    assert lines[1].startswith("  4 of them are restarted automatically by the rollout")
    assert len(lines) == 2
    # Whoever already holds the new key (none can yet, but the rule is "every key but the new one") stays.
    assert revocation_report(after, Holders(by_key={key_id(K3): ("a/new",)})) == [
        "no running VMI holds a revoked credential"]


def test_revoke_says_which_guests_the_rollout_cannot_restart() -> None:
    after = KeyRing(current=K1).revoke_older(K2, T0)
    vmis = [_vmi("a/vm", "vm"), _vmi("a/bare", None), _vmi("a/once", "once")]
    vms = [Vm(namespace="a", name="vm", run_strategy="Always"),
           Vm(namespace="a", name="once", run_strategy="Once")]
    manual = by_hand(vmis, vms)
    assert manual == {"a/bare", "a/once"}
    lines = revocation_report(after, Holders(by_key={key_id(K1): ("a/bare", "a/once", "a/vm")}), manual)
    assert lines[1].startswith("  1 of them are restarted automatically")
    assert lines[2].endswith("restart them by hand: a/bare, a/once")
    incomplete = revocation_report(after, Holders(complete=False))
    assert incomplete[-1] == "  the VMI list is incomplete: running VMIs not listed here stop reporting too"
