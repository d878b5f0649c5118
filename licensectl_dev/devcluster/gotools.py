"""Cached builds of the Go command-line tools the tests run for real (helm, helm-unittest, vmalert-tool),
of the benchmarks' Go replicator peer (built on demand), and of the Windows guest agent (guest/windows,
cross-built for windows/amd64) with its Wine test's fakes (on demand).

Like the control plane, each tool is built once from a pinned wrapper module in go/<name>/ (its
go.mod/go.sum fix every dependency) and cached under the licensectl cache dir, so a fresh clone
needs only a Go toolchain and the module proxy, and CI builds each tool once per pin.

The cache directory name carries the tool version *and* a digest of the wrapper's go.mod/go.sum,
so changing a pin (or a transitive dependency) can never silently reuse a stale binary.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from licensectl_dev.devcluster.controlplane import GO_DIR, BuildError, built_into, cache_root, file_lock, run_go_build

_log = structlog.get_logger(__name__)

Logger = Callable[[str], None]


def _stderr(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


@dataclass(frozen=True)
class GoTool:
    """One Go command built from the wrapper module go/<name>/ (the module pins `module`@`version`)."""

    name: str
    module: str
    version: str
    package: str
    binary: str
    # -X flags stamp the release version, as the upstream Makefiles do, so `version` output is real.
    ldflags: tuple[str, ...] = ()
    # Extra files written next to the binary after a build (name -> text), e.g. a plugin manifest.
    extra_files: Mapping[str, str] = field(default_factory=dict)
    # Built only when asked for by name (a benchmark's own program), never by `build-tools` / `make setup`.
    on_demand: bool = False
    # A module of this repository outside go/ (the Windows agent's guest/windows), and a cross-build target.
    source_dir: Path | None = None
    goos: str | None = None
    goarch: str | None = None

    @property
    def module_dir(self) -> Path:
        return self.source_dir if self.source_dir is not None else GO_DIR / self.name


# helm-unittest is a helm plugin: `helm plugin install <dir>` needs a plugin.yaml beside the binary.
# Upstream's manifest downloads a prebuilt binary in an install hook; this one points at ours and
# has no hooks (nothing is fetched at install time).
HELM_UNITTEST_PLUGIN_YAML = """\
name: "unittest"
version: "1.1.2"
usage: "unittest for helm charts"
description: "Unit test for helm chart in YAML (built from source by licensectl's tool builder)."
ignoreFlags: false
command: "$HELM_PLUGIN_DIR/helm-unittest"
"""

# The Windows guest agent's module (docs/guest.md, "Windows guests"): the agent, and two programs the Wine
# end-to-end test runs in its place of nvidia-smi.exe and the NVIDIA display container service.
WINDOWS_AGENT_DIR = Path(__file__).resolve().parents[2] / "guest" / "windows"
WINDOWS_AGENT_MODULE = "licensectl.dev/guest/windows"


def _windows_program(name: str, package: str, *, on_demand: bool) -> GoTool:
    return GoTool(name=name, module=WINDOWS_AGENT_MODULE, version="local", package=package, binary=f"{name}.exe",
                  on_demand=on_demand, source_dir=WINDOWS_AGENT_DIR, goos="windows", goarch="amd64")


TOOLS: Mapping[str, GoTool] = {
    t.name: t
    for t in (
        GoTool(
            name="helm",
            module="helm.sh/helm/v4",
            version="v4.3.2",
            package="helm.sh/helm/v4/cmd/helm",
            binary="helm",
            ldflags=("-X helm.sh/helm/v4/internal/version.version=v4.3.2",
                     "-X helm.sh/helm/v4/internal/version.gitTreeState=clean"),
        ),
        GoTool(
            name="helm-unittest",
            module="github.com/helm-unittest/helm-unittest",
            version="v1.1.2",
            package="github.com/helm-unittest/helm-unittest/cmd/helm-unittest",
            binary="helm-unittest",
            ldflags=("-X github.com/helm-unittest/helm-unittest/internal/build.version=1.1.2",),
            extra_files={"plugin.yaml": HELM_UNITTEST_PLUGIN_YAML},
        ),
        GoTool(
            name="vmalert-tool",
            module="github.com/VictoriaMetrics/VictoriaMetrics",
            version="v1.151.0",
            package="github.com/VictoriaMetrics/VictoriaMetrics/app/vmalert-tool",
            binary="vmalert-tool",
            ldflags=("-X github.com/VictoriaMetrics/VictoriaMetrics/lib/buildinfo.Version="
                     "vmalert-tool-v1.151.0",),
        ),
        # Not an upstream tool: the benchmarks' minimal Go replicator (go/replicator-peer/cmd/), whose
        # wrapper pins client-go; `python -m benchmarks peer` compares licensectl's CPU with it.
        GoTool(
            name="replicator-peer",
            module="k8s.io/client-go",
            version="v0.35.4",
            package="licensectl.dev/gotools/replicator-peer/cmd/replicator-peer",
            binary="replicator-peer",
            ldflags=("-X main.clientGoVersion=v0.35.4",),
            on_demand=True,
        ),
        _windows_program("licensectl-agent", "./cmd/licensectl-agent", on_demand=False),
        _windows_program("fake-nvidia-smi", "./testtools/fake-nvidia-smi", on_demand=True),
        _windows_program("fake-display-container", "./testtools/fake-display-container", on_demand=True),
    )
}


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------
def get_tool(name: str) -> GoTool:
    try:
        return TOOLS[name]
    except KeyError:
        raise BuildError(f"unknown Go tool {name!r}; known: {', '.join(sorted(TOOLS))}") from None


def pin_digest(tool: GoTool) -> str:
    """Short digest of the wrapper module's go.mod + go.sum, and of the sources of a program of its own
    (every .go file but tools.go, which only pins imports): part of the cache key, so an edited program
    is never served from a stale build."""
    h = hashlib.sha256()
    for fname in ("go.mod", "go.sum"):
        p = tool.module_dir / fname
        h.update(fname.encode() + b"\0")
        h.update(p.read_bytes() if p.exists() else b"")
        h.update(b"\0")
    for p in sorted(tool.module_dir.rglob("*.go")):
        if p.name != "tools.go":
            h.update(p.relative_to(tool.module_dir).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def tool_dir(tool: GoTool, env: Mapping[str, str] | None = None) -> Path:
    """The cache directory of one pinned build of `tool` (holds the binary and any extra files)."""
    return cache_root(env) / "tools" / f"{tool.name}-{tool.version}-{pin_digest(tool)}"


def tool_path(name: str, env: Mapping[str, str] | None = None) -> Path:
    """Where the binary of `name` lives once built (it may not exist yet)."""
    tool = get_tool(name)
    return tool_dir(tool, env) / tool.binary


def build_command(tool: GoTool, out_dir: Path) -> list[str]:
    """The `go build` argv (run in the wrapper module dir) that writes the binary into `out_dir`."""
    ldflags = " ".join(("-s -w", *tool.ldflags))
    return ["go", "build", "-v", "-trimpath", "-ldflags", ldflags, "-o", str(out_dir / tool.binary), tool.package]


def build_env(env: Mapping[str, str], tool: GoTool | None = None) -> dict[str, str]:
    """Pure-Go static builds: no C toolchain needed, and the binary runs on any Linux of the arch (or, for a
    cross-built tool, on any system of its GOOS/GOARCH)."""
    e = dict(env)
    e["CGO_ENABLED"] = "0"
    if tool is not None and tool.goos is not None:
        e["GOOS"] = tool.goos
    if tool is not None and tool.goarch is not None:
        e["GOARCH"] = tool.goarch
    return e


def _complete(tool: GoTool, d: Path) -> bool:
    return os.access(d / tool.binary, os.X_OK) and all((d / f).is_file() for f in tool.extra_files)


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------
def ensure_tool(name: str, log: Logger = _stderr, env: Mapping[str, str] | None = None) -> Path:
    """Return the path of the built binary `name` (see TOOLS), building it on a cache miss.

    The build goes into a temporary sibling directory that is renamed into place under a file
    lock, so concurrent callers (pytest workers, two make targets) never see a half-written tool
    and never build the same pin twice.
    """
    tool = get_tool(name)
    e = dict(os.environ if env is None else env)
    d = tool_dir(tool, e)
    if _complete(tool, d):
        log(f"go tools: cache hit {d / tool.binary}")
        return d / tool.binary
    with file_lock(d.parent / f".{tool.name}.build.lock"):
        if _complete(tool, d):  # another process built it while we waited
            log(f"go tools: cache hit {d / tool.binary}")
            return d / tool.binary
        if shutil.which("go", path=e.get("PATH")) is None:
            raise BuildError(
                f"the Go toolchain (`go`) is not on PATH; it is needed once to build {tool.name} "
                f"{tool.version} into {d}"
            )
        log(f"go tools: cache miss, building {tool.name} {tool.version} into {d} (first time only)")
        started = time.monotonic()
        with built_into(d, prefix=tool.name) as tmp:
            run_go_build(build_command(tool, tmp), cwd=tool.module_dir, log_fn=log, env=build_env(e, tool),
                         prefix="go tools")
            for fname, text in tool.extra_files.items():
                (tmp / fname).write_text(text)
            if not _complete(tool, tmp):
                raise BuildError(f"go build finished but {tmp} lacks {tool.binary}")
        seconds = time.monotonic() - started
        log(f"go tools: built {tool.name} {tool.version} in {seconds:.0f}s -> {d / tool.binary}")
        _log.info("go tool built", tool=tool.name, version=tool.version, seconds=round(seconds, 1))
    return d / tool.binary


def ensure_tools(
    names: Iterable[str] | None = None, log: Logger = _stderr, env: Mapping[str, str] | None = None
) -> dict[str, Path]:
    """Build (or find cached) several tools, one after another (a 2-core machine gains nothing from
    parallel Go builds); every tool the tests run (all of TOOLS but the on-demand ones) when `names` is None."""
    wanted = [n for n, t in TOOLS.items() if not t.on_demand] if names is None else list(names)
    return {n: ensure_tool(n, log=log, env=env) for n in wanted}
