"""What an informer cache of projections holds per object stays within its budget.

The caches are most of the controller's memory at scale (`python -m benchmarks memory`). Here the
same objects (the benchmark's builders), decoded one page at a time like a LIST, are projected and
keyed like the informers do; then every object reachable from the cache is counted once. A string
or map that many projections share counts once, so losing the sharing shows up as a breach.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import sys
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest

from benchmarks import memory as bench
from licensectl.kube import projections
from licensectl.kube.watch import Key, object_key, shared_name_key

COUNT = 1000
NAMESPACES = COUNT // 4  # four VMs per namespace, as in the benchmark
# Bytes per cached object, key and dict slot included; about 8 % above what the projections need now
# (in this order: 580 / 210 / 450 / 290 / 510). Before the caches were slimmed the same measure gave
# 880 / 310 / 1,440 / 590 / 830.
BUDGETS: dict[str, tuple[Callable[[int], dict[str, Any]], Callable[[Any], Any], Callable[[Any], Key], int]] = {
    "namespaces": (bench.namespace_obj, projections.namespace_from, object_key, 630),
    "gpuclaims": (bench.claim_obj, projections.gpu_claim_from, shared_name_key, 230),
    "replicas": (bench.replica_obj, projections.replica_secret_from, shared_name_key, 490),
    "virtualmachines": (lambda i: bench.vm_obj(i, NAMESPACES), projections.vm_from, object_key, 320),
    "virtualmachineinstances": (lambda i: bench.vmi_obj(i, NAMESPACES), projections.vmi_from, object_key, 550),
}
_SINGLETONS = (None, True, False, (), "")


def reachable_bytes(root: object) -> int:
    """`sys.getsizeof` of every object reachable from `root` through containers and dataclass fields,
    each counted once (ints, bools and None as the runtime shares them: not at all)."""
    seen: set[int] = set()
    total = 0
    stack = [root]
    while stack:
        o = stack.pop()
        if id(o) in seen or any(o is s for s in _SINGLETONS) or isinstance(o, (bool, int)):
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (tuple, list)):
            stack.extend(o)
        elif isinstance(o, MappingProxyType):  # its dict is not in its own size
            stack.extend(gc.get_referents(o))
        elif dataclasses.is_dataclass(o):
            stack.extend(getattr(o, f.name) for f in dataclasses.fields(o))
    return total


def cache_of(make: Callable[[int], dict[str, Any]], project: Callable[[Any], Any], key: Callable[[Any], Key]
             ) -> dict[Key, Any]:
    cache: dict[Key, Any] = {}
    for raw in bench.pages(make, COUNT):
        for item in json.loads(raw)["items"]:
            p = project(item)
            assert p is not None
            cache[key(item)] = p
    return cache


@pytest.mark.parametrize("resource", sorted(BUDGETS))
def test_cache_stays_within_its_budget(resource: str) -> None:
    make, project, key, budget = BUDGETS[resource]
    per_object = reachable_bytes(cache_of(make, project, key)) / COUNT
    assert per_object <= budget, f"{resource}: {per_object:.0f} B per cached object, budget {budget}"


def test_the_measure_counts_shared_objects_once() -> None:
    s = "x" * 100
    assert reachable_bytes([s, s]) == reachable_bytes([s]) + sys.getsizeof([s, s]) - sys.getsizeof([s])
    assert reachable_bytes({"a": s, "b": "y" * 100}) > reachable_bytes({"a": s, "b": s})
