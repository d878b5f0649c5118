"""The tier markers tests/conftest.py sets: what `-m "not cluster"` and `-m "not tools"` leave out."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.conftest import pytest_collection_modifyitems


@dataclass
class FakeItem:
    """The part of a pytest.Item the hook reads and writes."""

    fixturenames: tuple[str, ...]
    given: tuple[str, ...] = ()
    added: list[str] = field(default_factory=list)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.given or name in self.added else None

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.added.append(marker.name)


def tiers(fixturenames: tuple[str, ...], given: tuple[str, ...] = ()) -> list[str]:
    item = FakeItem(fixturenames, given)
    pytest_collection_modifyitems([item])  # type: ignore[list-item]
    return item.added


def test_control_plane_anywhere_in_the_closure_makes_a_cluster_test() -> None:
    assert tiers(("namespace", "api_client", "kubeconfig_path", "control_plane")) == ["cluster"]


def test_tool_fixtures_make_a_slow_tier_tools_test() -> None:
    assert tiers(("promtool", "tmp_path")) == ["cluster", "tools"]
    assert tiers(("helm", "kube", "cluster", "control_plane")) == ["cluster", "tools"]


def test_the_former_integration_marker_still_means_cluster() -> None:
    assert tiers(("tmp_path",), given=("integration",)) == ["cluster"]


def test_plain_tests_stay_in_the_fast_tier() -> None:
    assert tiers(("tmp_path", "monkeypatch")) == []
    assert tiers(()) == []
