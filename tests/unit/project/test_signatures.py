"""Public functions with more than three parameters take the rest by keyword.

Long positional calls (`plan_rollout(replicas, vmis, vms, {}, {}, st, now)`) are easy to get
silently wrong when two arguments share a type. The rule is checked with `inspect` over the
whole package.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import licensectl

MAX_POSITIONAL = 3

def _all_modules() -> list[str]:
    """Every module of the package (entry points aside): the rule covers the whole tree."""
    return sorted(m.name for m in pkgutil.walk_packages(licensectl.__path__, "licensectl.")
                  if not m.name.endswith("__main__"))


MODULES = _all_modules()

GENERATED_ORDER = "the generated Kubernetes client argument order (kube/api.py keeps its call sites unchanged)"

# "module.qualname" -> why it may keep more positional parameters.
EXEMPT: dict[str, str] = {
    "licensectl.kube.events.EventRecorder.emit": (
        "client-go's Event(object, eventtype, reason, message) order; the ports.EventSink Protocol, "
        "its in-memory fake and every controller call site must change with it, in one step"),
    "licensectl.core.ports.EventSink.emit": "the Protocol of EventRecorder.emit, same order",
    "licensectl_dev.testkit.memory.MemoryEvents.emit": "the in-memory EventSink, same order",
    "licensectl.kube.api.CustomObjectsApi.list_namespaced_custom_object": GENERATED_ORDER,
    "licensectl.kube.api.CustomObjectsApi.get_namespaced_custom_object": GENERATED_ORDER,
    "licensectl.kube.api.CustomObjectsApi.create_namespaced_custom_object": GENERATED_ORDER,
    "licensectl.kube.api.CustomObjectsApi.patch_namespaced_custom_object": GENERATED_ORDER,
    "licensectl.kube.api.CustomObjectsApi.delete_namespaced_custom_object": GENERATED_ORDER,
}


def _is_generated(fn: Callable[..., Any]) -> bool:
    """Dataclass-generated methods (__init__, __eq__...): their parameters are the class's fields."""
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_filename == "<string>"


def public_callables(module: types.ModuleType) -> Iterator[tuple[str, Callable[..., Any], bool]]:
    """(qualified name, function, is_method) for the public functions and methods `module` defines."""
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj, False
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                is_method = not isinstance(member, staticmethod)
                fn = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if inspect.isfunction(fn) and not (dataclasses.is_dataclass(obj) and _is_generated(fn)):
                    yield f"{module.__name__}.{name}.{attr}", fn, is_method


def positional_count(fn: Callable[..., Any], *, is_method: bool) -> int:
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(params) - (1 if is_method and params else 0)


def violations(module: types.ModuleType) -> list[str]:
    return [f"{name}: {n} positional parameters"
            for name, fn, is_method in public_callables(module)
            if (n := positional_count(fn, is_method=is_method)) > MAX_POSITIONAL and name not in EXEMPT]


@pytest.mark.parametrize("module_name", MODULES)
def test_public_functions_take_extra_parameters_by_keyword(module_name: str) -> None:
    assert violations(importlib.import_module(module_name)) == []


def test_the_check_finds_long_positional_signatures() -> None:
    """The check itself: functions and methods over the limit are found, exempt shapes are not."""
    src = types.ModuleType("fake_module")

    def long(a: int, b: int, c: int, d: int) -> None: ...
    def fine(a: int, b: int, c: int, *, d: int) -> None: ...

    class Thing:
        def method(self, a: int, b: int, c: int, d: int) -> None: ...
        def ok(self, a: int, b: int, c: int) -> None: ...
        @classmethod
        def make(cls, a: int, b: int, c: int, d: int) -> None: ...
        @staticmethod
        def helper(a: int, b: int, c: int, d: int) -> None: ...
        def _private(self, a: int, b: int, c: int, d: int) -> None: ...

    @dataclasses.dataclass
    class Data:
        a: int
        b: int
        c: int
        d: int

    for obj in (long, fine, Thing, Data):
        obj.__module__ = src.__name__
        setattr(src, obj.__name__, obj)
    assert sorted(violations(src)) == [
        "fake_module.Thing.helper: 4 positional parameters",
        "fake_module.Thing.make: 4 positional parameters",
        "fake_module.Thing.method: 4 positional parameters",
        "fake_module.long: 4 positional parameters",
    ]
