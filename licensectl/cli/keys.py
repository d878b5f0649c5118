"""`licensectl keys rotate [--revoke-older]`: the guest-report signing key ring (docs/design.md#key-ring).

A rotation keeps every older key a running VMI may still hold, and says which VMIs hold which: the
hoster sees exactly who keeps an older key alive. `--revoke-older` ends every older key on purpose,
names the VMIs that stop reporting, and gives every replica a new revision, so the rollout restarts
them onto the new credential like a token rollout.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from typing import Any

from licensectl import config
from licensectl.core import credentials
from licensectl.core.model import MANAGED_BY_LABEL, MANAGED_BY_VALUE
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


async def read_holders(api: Any) -> credentials.Holders:
    """Key holders from a full LIST of VMIs and replicas (a failed LIST raises: never "no holder")."""
    from licensectl.cli.status_offline import list_all  # the paged LIST the status view uses

    core, custom = CoreV1Api(api), CustomObjectsApi(api)
    replicas = await list_all(core.list_secret_for_all_namespaces, projections.replica_secret_from,
                              label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}")
    vmis = await list_all(contract.vmi_lister(custom), projections.vmi_from)
    return credentials.holders_from(credentials.vmi_keys(vmis, {(r.namespace, r.name) for r in replicas}))


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
            holders = await read_holders(api)
            before, ring = await (store.revoke_older() if revoke else store.rotate(holders))
        except credentials.RingFull as e:
            print(f"licensectl keys rotate: {e}: {_names(e.holders)}", file=sys.stderr)
            return 1
        except (RuntimeError, ApiException, ValueError) as e:
            msg = f"HTTP {e.status} {e.reason}" if isinstance(e, ApiException) else str(e)
            print(f"licensectl keys rotate: {msg}", file=sys.stderr)
            return 1
        when = f"{ring.rotated_at:%Y-%m-%dT%H:%M:%SZ}" if ring.rotated_at else "now"
        if revoke:
            stop = before.stale_holders(holders)
            print(f"signing key rotated in {where} at {when}; new key {ring.current_id}; every older key revoked")
            if stop:
                print(f"{len(stop)} running VMI(s) hold an older credential and stop reporting until the rollout "
                      f"restarts them onto the new one (a new revision for every replica, paced like a token "
                      f"rollout): {_names(stop)}")
            else:
                print("no running VMI holds an older credential")
            return 0
        print(f"signing key rotated in {where} at {when}; new key {ring.current_id}; "
              f"{len(ring.older)} older key(s) kept (at most {credentials.MAX_KEYS - 1})")
        for line in holders_report(ring, holders):
            print(line)
        return 0
    finally:
        await api.close()
