"""The model's compact forms behave like the plain values they replace (the caches hold tens of thousands)."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from licensectl.core import model
from licensectl.core.model import EMPTY, FrozenMap, frozen_map
from licensectl.core.timecodec import to_epoch_us

UTC = dt.UTC
str_maps = st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=6)

MUTATIONS: list[Callable[[Any], object]] = [
    lambda m: m.__setitem__("k", "v"),
    lambda m: m.__delitem__("a"),
    lambda m: m.update({"k": "v"}),
    lambda m: m.update(k="v"),
    lambda m: m.setdefault("k", "v"),
    lambda m: m.pop("a"),
    lambda m: m.popitem(),
    lambda m: m.clear(),
    lambda m: m.__ior__({"k": "v"}),
]


@pytest.mark.parametrize("mutate", MUTATIONS)
def test_frozen_map_refuses_every_mutation(mutate: Callable[[Any], object]) -> None:
    m = frozen_map({"a": "1"})
    with pytest.raises(TypeError):
        mutate(m)
    assert m == {"a": "1"}


def test_frozen_map_refuses_the_augmented_merge() -> None:
    m = frozen_map({"a": "1"})
    with pytest.raises(TypeError):
        m |= {"b": "2"}
    assert m == {"a": "1"}


def test_frozen_map_is_a_copy() -> None:
    src = {"a": "1"}
    m = frozen_map(src)
    src["a"] = "2"
    assert m["a"] == "1"


def test_empty_maps_are_the_one_empty_value() -> None:
    assert frozen_map({}) is EMPTY and frozen_map(None) is EMPTY
    assert len(EMPTY) == 0 and EMPTY.get("x") is None and "x" not in EMPTY and dict(EMPTY) == {}
    assert repr(EMPTY) == "{}"


@given(str_maps)
def test_frozen_map_reads_like_the_dict_it_copies(d: dict[str, str]) -> None:
    m = frozen_map(d)
    assert m == d and dict(m) == d and len(m) == len(d) and list(m) == list(d)
    assert all(m[k] == v and m.get(k) == v and k in m for k, v in d.items())
    absent = "a key longer than any generated"
    assert m.get(absent, "dflt") == "dflt" and absent not in m
    assert repr(m) == repr(d)


@given(str_maps)
def test_equal_frozen_maps_hash_alike_whatever_their_order(d: dict[str, str]) -> None:
    a, b = FrozenMap(d), FrozenMap(dict(reversed(list(d.items()))))
    assert a == b and hash(a) == hash(b)


@given(str_maps)
def test_frozen_map_survives_copy_and_pickle(d: dict[str, str]) -> None:
    m = FrozenMap(d)
    for twin in (copy.copy(m), copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert twin == m and type(twin) is FrozenMap


def test_projections_with_maps_are_hashable_values() -> None:
    """Python 3.11's mappingproxy is not hashable; a frozen dataclass holding one could not be hashed."""
    a = model.Vm("ns", "vm", "Always", frozen_map({model.ANN_RESTART_REVISION: "r1"}), "7")
    b = model.Vm("ns", "vm", "Always", frozen_map({model.ANN_RESTART_REVISION: "r1"}), "7")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != dataclasses.replace(b, annotations=frozen_map({model.ANN_RESTART_REVISION: "r2"}))


def _vmi(created: dt.datetime, running: dt.datetime | None) -> model.Vmi:
    return model.Vmi("ns", "vm", "u", to_epoch_us(created), "vm", "Running", True,
                     None if running is None else to_epoch_us(running), (), None)


@given(st.datetimes(min_value=dt.datetime(1971, 1, 1), max_value=dt.datetime(2200, 1, 1), timezones=st.just(UTC)),
       st.one_of(st.none(), st.integers(min_value=0, max_value=10**12)))
def test_vmi_gives_its_times_back_as_the_datetimes_it_was_made_from(created: dt.datetime, after_us: int | None) -> None:
    running = None if after_us is None else created + dt.timedelta(microseconds=after_us)
    v = _vmi(created, running)
    assert v.created == created and v.created.tzinfo is UTC
    assert v.running_since == running


def test_vmi_equality_follows_its_times() -> None:
    t = dt.datetime(2026, 1, 1, tzinfo=UTC)
    assert _vmi(t, None) == _vmi(t, None)
    assert _vmi(t, None) != _vmi(t + dt.timedelta(microseconds=1), None)
    assert _vmi(t, t) != _vmi(t, None)


def test_data_digest_is_the_raw_sha256() -> None:
    d = model.data_digest({"a": b"1"})
    assert isinstance(d, bytes) and len(d) == 32
    assert d == model.data_digest({"a": b"1"}) != model.data_digest({"a": b"2"})
