"""Fixtures of the chart tests: the real helm and helm-unittest, built once and cached."""

from __future__ import annotations

import pytest

from licensectl_dev.devcluster.gotools import ensure_tool

from .helm import Helm, install_unittest_plugin


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm v4 with an isolated home; builds helm and helm-unittest on the first run (cached after)."""
    binary = ensure_tool("helm")
    plugin = ensure_tool("helm-unittest").parent
    home = tmp_path_factory.mktemp("helm-home")
    install_unittest_plugin(plugin, home / "plugins")
    return Helm(binary, home)

