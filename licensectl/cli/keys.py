"""`licensectl keys rotate [--revoke-older]`: the guest-report signing key ring (docs/design.md#key-ring).

A rotation keeps every older key a running VMI may still hold, and says which VMIs hold which: the
hoster sees exactly who keeps an older key alive. `--revoke-older` ends every key but a new one on
purpose (the current one too), names every VMI that stops reporting, and gives every replica a new
revision, so the rollout restarts them onto the new credential like a token rollout.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from collections.abc import Collection, Iterable
from typing import Any

from licensectl import config
from licensectl.core import credentials
from licensectl.core.model import MANAGED_BY_LABEL, MANAGED_BY_VALUE, Vm, Vmi
from licensectl.core.rollout import UNRESTARTABLE_RUN_STRATEGIES
from licensectl.kube import contract, projections
from licensectl.kube.api import ApiException, CoreV1Api, CustomObjectsApi
from licensectl.kube.client import make_api_client
from licensectl.kube.signing_key import SECRET_NAME, SigningKeyStore

# At most this many VMIs are named per key; the rest are counted (a fleet can be large).
MAX_NAMED = 20


def _names(refs: tuple[str, ...]) -> str:
    shown = ", ".join(refs[:MAX_NAMED])
    return shown + (f" and {len(refs) - MAX_NAMED} more" if len(refs) > MAX_NAMED else "")


def holders_report(ring: credentials.KeyRing, holders: credentials.Holders) -> list[str]:
    """One line per older key still in the ring, naming the running VMIs that may hold it."""
    lines: list[str] = []
    for older in ring.older:
        refs = holders.holding(older.id)
        if refs:
            lines.append(f"  older key {older.id} is kept: held by {len(refs)} running VMI(s): {_names(refs)}")
        else:
            lines.append(f"  older key {older.id} is kept: held by no running VMI; retired after the grace period")
    if holders.unknown:
        lines.append(f"  {len(holders.unknown)} VMI(s) carry no key stamp (admitted before it existed), so every "
                     f"older key is kept until they restart: {_names(holders.unknown)}")
    if not holders.complete:
        lines.append("  the VMI list is incomplete: every older key is kept")
    return lines


def by_hand(vmis: Iterable[Vmi], vms: Iterable[Vm]) -> frozenset[str]:
    """"namespace/name" of the VMIs the rollout cannot restart (standalone, or a run strategy without
    restart): the rollout reports them blocked, so a hoster restarts them by hand."""
    strategy = {(m.namespace, m.name): m.run_strategy for m in vms}
    return frozenset(f"{v.namespace}/{v.name}" for v in vmis
                     if v.owner_vm is None
                     or strategy.get((v.namespace, v.owner_vm)) in UNRESTARTABLE_RUN_STRATEGIES)


def revocation_report(after: credentials.KeyRing, holders: credentials.Holders,
                      manual: Collection[str] = ()) -> list[str]:
    """What `--revoke-older` did to running guests: every VMI holding (or maybe holding) any key but
    the new one stops reporting; the new revocation gives every replica a new revision, so the
    rollout restarts each one onto the new credential, except those in `manual` (it cannot)."""
    out = after.stale_holders(holders)
    lines: list[str] = []
    if out:
        auto = tuple(r for r in out if r not in manual)
        hand = tuple(r for r in out if r in manual)
        lines.append(f"{len(out)} running VMI(s) hold a revoked credential and get 401 on every report "
                     f"until they restart onto the new one: {_names(out)}")
        if auto:
            lines.append(f"  {len(auto)} of them are restarted automatically by the rollout (every replica "
                         f"gets a new replica revision; paced like a token rollout)")
        if hand:
            lines.append(f"  {len(hand)} of them cannot be restarted by the rollout (no owning VirtualMachine, "
                         f"or a run strategy without restart): restart them by hand: {_names(hand)}")
    else:
        lines.append("no running VMI holds a revoked credential")
    if not holders.complete:
        lines.append("  the VMI list is incomplete: running VMIs not listed here stop reporting too")
    return lines


@dataclasses.dataclass(frozen=True)
class Fleet:
    """What the key commands read from the cluster: the key holders and who needs a manual restart."""

    holders: credentials.Holders
    manual: frozenset[str]


async def read_holders(api: Any) -> Fleet:
    """Key holders from a full LIST of VMIs, VMs and replicas (a failed LIST raises: never "no holder")."""
    from licensectl.cli.status_offline import list_all  # the paged LIST the status view uses

    core, custom = CoreV1Api(api), CustomObjectsApi(api)
    replicas = await list_all(core.list_secret_for_all_namespaces, projections.replica_secret_from,
                              label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")
    vmis = await list_all(contract.vmi_lister(custom), projections.vmi_from)
    vms = await list_all(contract.vm_lister(custom), projections.vm_from)
    holders = credentials.holders_from(credentials.vmi_keys(vmis, {(r.namespace, r.name) for r in replicas}))
    return Fleet(holders, by_hand(vmis, vms))


async def keys_rotate_main(args: Any, settings: config.Settings) -> int:
    """Rotate the report signing key. The controller rewrites every replica's credential (no revision
    change, so no VM restart); running guests keep reporting with the key they booted with."""
    if args.namespace:
        settings = dataclasses.replace(settings, namespace=args.namespace)
    revoke = bool(getattr(args, "revoke_older", False))
    api = await make_api_client(settings)
    try:
        store = SigningKeyStore(api, settings.namespace, grace=dt.timedelta(seconds=settings.key_grace_seconds))
        where = f"{settings.namespace}/{SECRET_NAME}"
        try:
            fleet = await read_holders(api)
            holders = fleet.holders
            _before, ring = await (store.revoke_older() if revoke else store.rotate(holders))
        except credentials.RingFull as e:
            print(f"licensectl keys rotate: {e}: {_names(e.holders)}", file=sys.stderr)
            return 1
        except (RuntimeError, ApiException, ValueError) as e:
            msg = f"HTTP {e.status} {e.reason}" if isinstance(e, ApiException) else str(e)
            print(f"licensectl keys rotate: {msg}", file=sys.stderr)
            return 1
        when = f"{ring.rotated_at:%Y-%m-%dT%H:%M:%SZ}" if ring.rotated_at else "now"
        if revoke:
            print(f"signing key rotated in {where} at {when}; new key {ring.current_id}; every other key revoked")
            for line in revocation_report(ring, holders, fleet.manual):
                print(line)
            return 0
        print(f"signing key rotated in {where} at {when}; new key {ring.current_id}; "
              f"{len(ring.older)} older key(s) kept (at most {credentials.MAX_KEYS - 1})")
        for line in holders_report(ring, holders):
            print(line)
        return 0
    finally:
        await api.close()
