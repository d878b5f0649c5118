"""Every pointer into docs/design.md resolves, and nothing cites design notes that are not in the repo.

Code comments explain *why* by pointing at `docs/design.md#<anchor>`; a renamed section would silently
strand them, and a pointer to a document outside the repository cannot be followed at all.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DESIGN = ROOT / "docs" / "design.md"
# The former, out-of-tree notes the design doc replaced; spelled apart because this file is scanned too.
FORBIDDEN = "domain" + ".md"

_REF = re.compile(r"design\.md#([A-Za-z0-9_-]+)")
_ANCHOR_TAG = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_LOCAL_LINK = re.compile(r"\]\(#([A-Za-z0-9_-]+)\)")
_SKIP_DIRS = frozenset({".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache",
                        ".pytest_cache", ".hypothesis", "build", "dist"})


def github_slug(heading: str) -> str:
    """The anchor GitHub generates for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Explicit `<a id=...>` anchors plus the anchors GitHub derives from headings."""
    return set(_ANCHOR_TAG.findall(markdown)) | {github_slug(h) for h in _HEADING.findall(markdown)}


def repo_text_files(root: Path) -> list[Path]:
    """Files the project ships: tracked or new and not ignored (falls back to a walk outside git)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, capture_output=True, check=True, timeout=60).stdout
        names = [n for n in out.decode().split("\0") if n]
        paths = [root / n for n in names]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in root.rglob("*") if not _SKIP_DIRS.intersection(p.relative_to(root).parts)]
    return sorted(p for p in paths if p.is_file())


def bad_refs(root: Path, files: Iterable[Path], design: Path) -> list[str]:
    """`path:line: why` for every forbidden citation and every design pointer without its anchor."""
    known = anchors(design.read_text(encoding="utf-8")) if design.is_file() else set()
    problems: list[str] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files carry no prose
        rel = path.relative_to(root)
        for lineno, line in enumerate(text.splitlines(), 1):
            if FORBIDDEN in line:
                problems.append(f"{rel}:{lineno}: cites {FORBIDDEN}, which is not in the repository; "
                                "point into docs/design.md instead")
            missing = [a for a in _REF.findall(line) if a not in known]
            if path == design:
                missing += [a for a in _LOCAL_LINK.findall(line) if a not in known]
            problems.extend(f"{rel}:{lineno}: docs/design.md has no anchor #{a}" for a in missing)
    return problems


def test_every_design_pointer_resolves_and_nothing_cites_outside_notes() -> None:
    files = repo_text_files(ROOT)
    assert DESIGN in files, "docs/design.md is missing or ignored"
    assert len(files) > 100, f"only {len(files)} files found: the scan did not see the repository"
    assert bad_refs(ROOT, files, DESIGN) == []


def test_the_design_doc_keeps_the_sections_code_points_to() -> None:
    known = anchors(DESIGN.read_text(encoding="utf-8"))
    for anchor in ("tenants", "vgpu-flag", "gpu-contract", "kubevirt-secret-disks", "kubevirt-restart",
                   "feature-type", "token-expiry", "gridd-log", "time-formats", "decisions"):
        assert anchor in known, anchor


def test_checker_reports_forbidden_citations_and_dangling_anchors(tmp_path: Path) -> None:
    design = tmp_path / "docs" / "design.md"
    design.parent.mkdir()
    design.write_text('# Design\n\n<a id="kept"></a>\n### Kept\n\n## Two words\n\nSee [gone](#gone).\n')
    code = tmp_path / "code.py"
    ref = "docs/design" + ".md#"  # spelled apart: this file is scanned too
    code.write_text(f"# see {ref}kept and {ref}two-words\n# see {FORBIDDEN} §1\n# see {ref}renamed\n")
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe " + ref.encode() + b"nowhere")

    problems = bad_refs(tmp_path, [design, code, tmp_path / "blob.bin"], design)

    assert problems == [
        "docs/design.md:8: docs/design.md has no anchor #gone",
        f"code.py:2: cites {FORBIDDEN}, which is not in the repository; point into docs/design.md instead",
        "code.py:3: docs/design.md has no anchor #renamed",
    ]


def test_heading_anchors_follow_github() -> None:
    assert github_slug("Level-based reconcile") == "level-based-reconcile"
    assert github_slug("Revision = SHA-256 of the token") == "revision--sha-256-of-the-token"
    assert github_slug("NVIDIA: the token is a JWT") == "nvidia-the-token-is-a-jwt"
    assert github_slug("`GPUClass` and GPUClaim") == "gpuclass-and-gpuclaim"
