"""The Go tool builder's cache logic, with a fake `go` on PATH (no real build here).

The fake writes an executable at the `-o` path and counts its invocations, so the tests see
exactly when the builder decides to build, and what it leaves in the cache on success or failure.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from licensectl_dev.devcluster import gotools
from licensectl_dev.devcluster.controlplane import BuildError

FAKE_GO = """#!/bin/sh
# Fake `go build`: counts calls, records the environment it saw, writes the -o target.
echo call >> "$FAKE_GO_CALLS"
echo "CGO_ENABLED=$CGO_ENABLED${GOOS:+ GOOS=$GOOS}${GOARCH:+ GOARCH=$GOARCH}" > "$FAKE_GO_CALLS.env"
echo "compiling example.com/pkg" >&2
[ -n "$FAKE_GO_SLEEP" ] && sleep "$FAKE_GO_SLEEP"
if [ -n "$FAKE_GO_FAIL" ]; then echo "undefined: Frobnicate" >&2; exit 2; fi
out=""
prev=""
for a in "$@"; do
  if [ "$prev" = "-o" ]; then out="$a"; fi
  prev="$a"
done
printf '#!/bin/sh\\necho fake\\n' > "$out"
chmod +x "$out"
"""


@pytest.fixture
def fake_env(tmp_path: Path) -> dict[str, str]:
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    go = bindir / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    return {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "HOME": str(tmp_path / "home"),
        "LICENSECTL_CACHE_DIR": str(tmp_path / "cache"),
        "FAKE_GO_CALLS": str(tmp_path / "calls"),
    }


def calls(env: dict[str, str]) -> int:
    p = Path(env["FAKE_GO_CALLS"])
    return len(p.read_text().splitlines()) if p.exists() else 0


def test_miss_builds_then_hit_reuses(fake_env: dict[str, str]) -> None:
    lines: list[str] = []
    path = gotools.ensure_tool("vmalert-tool", log=lines.append, env=fake_env)
    assert calls(fake_env) == 1
    assert path == gotools.tool_path("vmalert-tool", fake_env)
    assert path.is_relative_to(Path(fake_env["LICENSECTL_CACHE_DIR"]) / "tools")
    assert os.access(path, os.X_OK)
    assert any("cache miss" in line for line in lines)
    assert any(line.startswith("go tools: built vmalert-tool v1.151.0") for line in lines)
    assert Path(fake_env["FAKE_GO_CALLS"] + ".env").read_text().strip() == "CGO_ENABLED=0"

    lines.clear()
    assert gotools.ensure_tool("vmalert-tool", log=lines.append, env=fake_env) == path
    assert calls(fake_env) == 1, "a cache hit must not build again"
    assert lines == [f"go tools: cache hit {path}"]
    # Only the finished tool dir and the lock file remain: no temporary build dirs.
    leftovers = sorted(p.name for p in path.parent.parent.iterdir())
    assert leftovers == [".vmalert-tool.build.lock", path.parent.name]


def test_plugin_manifest_is_written_next_to_helm_unittest(fake_env: dict[str, str]) -> None:
    path = gotools.ensure_tool("helm-unittest", log=lambda _: None, env=fake_env)
    manifest = (path.parent / "plugin.yaml").read_text()
    assert 'command: "$HELM_PLUGIN_DIR/helm-unittest"' in manifest
    assert "hooks" not in manifest.lower(), "the plugin must not download anything at install time"
    assert f'version: "{gotools.TOOLS["helm-unittest"].version.lstrip("v")}"' in manifest


def test_missing_extra_file_is_a_cache_miss(fake_env: dict[str, str]) -> None:
    path = gotools.ensure_tool("helm-unittest", log=lambda _: None, env=fake_env)
    (path.parent / "plugin.yaml").unlink()
    gotools.ensure_tool("helm-unittest", log=lambda _: None, env=fake_env)
    assert calls(fake_env) == 2
    assert (path.parent / "plugin.yaml").is_file()


def test_failed_build_leaves_no_cache_entry(fake_env: dict[str, str]) -> None:
    env = {**fake_env, "FAKE_GO_FAIL": "1"}
    with pytest.raises(BuildError, match=r"exit code 2; stderr tail:\n(.|\n)*undefined: Frobnicate"):
        gotools.ensure_tool("helm", log=lambda _: None, env=env)
    tools_dir = Path(fake_env["LICENSECTL_CACHE_DIR"]) / "tools"
    assert [p.name for p in tools_dir.iterdir()] == [".helm.build.lock"]
    # The next (healthy) attempt builds normally.
    path = gotools.ensure_tool("helm", log=lambda _: None, env=fake_env)
    assert os.access(path, os.X_OK)


def test_go_missing_is_a_clear_error(fake_env: dict[str, str], tmp_path: Path) -> None:
    env = {**fake_env, "PATH": str(tmp_path / "empty")}
    with pytest.raises(BuildError, match=r"Go toolchain \(`go`\) is not on PATH.*helm v4\.3\.2"):
        gotools.ensure_tool("helm", log=lambda _: None, env=env)


def test_unknown_tool() -> None:
    known = ("fake-display-container, fake-nvidia-smi, helm, helm-unittest, licensectl-agent, replicator-peer, "
             "vmalert-tool")
    with pytest.raises(BuildError, match=f"unknown Go tool 'kubectx'; known: {known}"):
        gotools.ensure_tool("kubectx", log=lambda _: None)


def test_concurrent_callers_build_once(fake_env: dict[str, str]) -> None:
    env = {**fake_env, "FAKE_GO_SLEEP": "0.5"}
    results: list[Path] = []

    def worker() -> None:
        results.append(gotools.ensure_tool("helm", log=lambda _: None, env=env))

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 3 and len(set(results)) == 1
    assert calls(fake_env) == 1


def test_changing_a_pin_changes_the_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    go_dir = tmp_path / "go"
    (go_dir / "helm").mkdir(parents=True)
    monkeypatch.setattr(gotools, "GO_DIR", go_dir)
    env = {"LICENSECTL_CACHE_DIR": str(tmp_path / "cache")}
    tool = gotools.TOOLS["helm"]
    (go_dir / "helm" / "go.mod").write_text("module x\n")
    (go_dir / "helm" / "go.sum").write_text("a v1 h1:aaa\n")
    first = gotools.tool_dir(tool, env)
    assert first.name.startswith("helm-v4.3.2-")
    (go_dir / "helm" / "go.sum").write_text("a v1 h1:bbb\n")
    assert gotools.tool_dir(tool, env) != first


def test_editing_a_wrapper_program_changes_the_cache_dir_but_tools_go_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    go_dir = tmp_path / "go"
    wrapper = go_dir / "replicator-peer"
    (wrapper / "cmd" / "replicator-peer").mkdir(parents=True)
    monkeypatch.setattr(gotools, "GO_DIR", go_dir)
    env = {"LICENSECTL_CACHE_DIR": str(tmp_path / "cache")}
    tool = gotools.TOOLS["replicator-peer"]
    (wrapper / "go.mod").write_text("module x\n")
    (wrapper / "go.sum").write_text("a v1 h1:aaa\n")
    (wrapper / "tools.go").write_text("package tools\n")
    main = wrapper / "cmd" / "replicator-peer" / "main.go"
    main.write_text("package main\nfunc main() {}\n")
    first = gotools.tool_dir(tool, env)
    (wrapper / "tools.go").write_text("package tools // reworded\n")
    assert gotools.tool_dir(tool, env) == first  # tools.go only pins imports; go.mod/go.sum say what they pin
    main.write_text("package main\nfunc main() { println() }\n")
    assert gotools.tool_dir(tool, env) != first


def test_build_tools_without_names_skips_the_on_demand_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []
    monkeypatch.setattr(gotools, "ensure_tool", lambda name, **_: built.append(name) or Path(name))
    assert set(gotools.ensure_tools()) == {"helm", "helm-unittest", "vmalert-tool", "licensectl-agent"}
    assert gotools.ensure_tools(["replicator-peer"]) == {"replicator-peer": Path("replicator-peer")}
    assert built == ["helm", "helm-unittest", "vmalert-tool", "licensectl-agent", "replicator-peer"]


def test_build_command_stamps_version_and_targets_out_dir(tmp_path: Path) -> None:
    tool = gotools.TOOLS["helm"]
    argv = gotools.build_command(tool, tmp_path)
    assert argv[:2] == ["go", "build"]
    assert argv[argv.index("-o") + 1] == str(tmp_path / "helm")
    assert argv[-1] == "helm.sh/helm/v4/cmd/helm"
    assert "helm.sh/helm/v4/internal/version.version=v4.3.2" in argv[argv.index("-ldflags") + 1]


def test_the_windows_agent_is_cross_built_from_its_own_module(fake_env: dict[str, str]) -> None:
    path = gotools.ensure_tool("licensectl-agent", log=lambda _: None, env=fake_env)
    assert path.name == "licensectl-agent.exe"
    assert Path(fake_env["FAKE_GO_CALLS"] + ".env").read_text().split() == ["CGO_ENABLED=0", "GOOS=windows",
                                                                          "GOARCH=amd64"]
    tool = gotools.TOOLS["licensectl-agent"]
    assert tool.module_dir == gotools.WINDOWS_AGENT_DIR
    assert (tool.module_dir / tool.package / "main.go").is_file()
    assert f"module {tool.module}\n" in (tool.module_dir / "go.mod").read_text()
    assert gotools.build_env({"GOOS": "linux"}) == {"GOOS": "linux", "CGO_ENABLED": "0"}


@pytest.mark.parametrize("name", sorted(n for n, t in gotools.TOOLS.items() if t.source_dir is None))
def test_wrapper_module_pins_the_registered_version(name: str) -> None:
    """go.mod, tools.go and the registry agree, so the cache key names what is really built."""
    tool = gotools.TOOLS[name]
    gomod = (tool.module_dir / "go.mod").read_text()
    assert re.search(rf"^require {re.escape(tool.module)} {re.escape(tool.version)}$", gomod, re.M), gomod[:400]
    assert (tool.module_dir / "go.sum").stat().st_size > 0
    assert f'_ "{tool.package}"' in (tool.module_dir / "tools.go").read_text()
    stamps = [f for f in tool.ldflags if f.split("=", 1)[0].lower().endswith("version")]
    assert stamps and all(f.endswith(tool.version.lstrip("v")) for f in stamps), tool.ldflags
