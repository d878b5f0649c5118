"""charts/licensectl against its own git history: the versioning rule and `--reuse-values` upgrades.

Versioning (docs/operations.md#chart-versions): the chart's `version` goes up with every change of
anything under charts/licensectl, so a chart version names exactly one chart. The test walks every
commit that touched the chart (plus the working tree, when it differs from HEAD) and requires each
revision's version to be greater than the one before, or the revision to be an exact return to an
earlier one (a revert: same files and version); no version may name two different charts. The chart
revisions from before the rule all said 0.1.0; they are the one exception.

Upgrades: the documented upgrade is `helm upgrade --reuse-values --set image.tag=NEW`. With
--reuse-values Helm (pkg/action/upgrade.go, reuseValues) renders the NEW templates with the OLD
release's computed values as the chart's values (the old chart's values.yaml coalesced with what
the hoster set) and merges none of the new chart's defaults; the new schema still validates them.
The test reproduces exactly that for every earlier chart version in git history: it computes the
old release's values with the old chart itself (a template that prints `.Values`), puts them in
place of values.yaml in a copy of the current chart, and renders with `--set image.tag`. The result
must equal a fresh install of the current chart with the same settings, so a key newer than the
release acts as its default. tests/chart/test_chart_cluster.py runs a real `helm upgrade
--reuse-values` from the oldest chart version against the apiserver.

Both need the full history: a shallow clone fails with the command that fixes it (never a skip).
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.version import Version

from .helm import CHART, NAMESPACE, ROOT, Helm, documents, objects_by_key

CHART_PATH = "charts/licensectl"
# Chart revisions committed before the versioning rule: all of them said 0.1.0.
BEFORE_THE_RULE = "0.1.0"
NEW_TAG = "9.9.9"


def git(*args: str, stdin: str | None = None) -> str:
    res = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60, check=False,
                         input=stdin)
    if res.returncode != 0:
        pytest.fail(f"git {' '.join(args)} failed: {res.stderr.strip()}")
    return res.stdout


def require_full_history() -> None:
    """The tests read the chart's whole history: refuse to run (fail, not skip) without it."""
    inside = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-inside-work-tree"], capture_output=True,
                            text=True, timeout=60, check=False)
    if inside.stdout.strip() != "true":
        pytest.fail("tests/chart/test_chart_history.py needs a git checkout of the repository (with full history)")
    if git("rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.fail("shallow clone: the chart tests compare every chart version in git history; run "
                    "`git fetch --unshallow` (CI: clone with full history, e.g. actions/checkout fetch-depth: 0)")


@dataclass(frozen=True)
class Revision:
    """One state of charts/licensectl: a commit, or the working tree."""

    name: str  # short commit hash, or "working tree"
    files: Mapping[str, str]  # path under the chart -> git blob hash of its content
    chart_yaml: Mapping[str, Any]

    @property
    def version(self) -> str:
        return str(self.chart_yaml["version"])


def committed(commit: str) -> Revision:
    files = {}
    for line in git("ls-tree", "-r", commit, "--", CHART_PATH).splitlines():
        meta, path = line.split("\t", 1)
        files[path.removeprefix(CHART_PATH + "/")] = meta.split()[2]
    return Revision(commit[:12], files, yaml.safe_load(git("show", f"{commit}:{CHART_PATH}/Chart.yaml")))


def working_tree() -> Revision:
    """The chart as it is on disk (tracked and new files; deleted ones left out), hashed like git does."""
    listed = git("ls-files", "--cached", "--others", "--exclude-standard", "--", CHART_PATH).splitlines()
    paths = sorted(p for p in set(listed) if (ROOT / p).is_file())
    hashes = git("hash-object", "--no-filters", "--stdin-paths", stdin="\n".join(paths) + "\n").split()
    files = {p.removeprefix(CHART_PATH + "/"): h for p, h in zip(paths, hashes, strict=True)}
    return Revision("working tree", files, yaml.safe_load((CHART / "Chart.yaml").read_text()))


def chart_commits() -> list[str]:
    """Every commit that touched the chart, newest first."""
    require_full_history()
    return git("log", "--format=%H", "--", CHART_PATH).split()


def revisions() -> list[Revision]:
    """The chart's revisions, newest first: the working tree if it differs from HEAD, then each commit."""
    commits = [committed(c) for c in chart_commits()]
    current = working_tree()
    head = committed(git("rev-parse", "HEAD").strip())
    if dict(current.files) != dict(head.files):
        return [current, *commits]
    return commits


def version_problems(revs: list[Revision]) -> list[str]:
    """Each chart revision (newest first) carries a greater version than the revision before it, unless
    it is a return to an earlier revision exactly (a revert: same files, same version); and no version
    ever names two different charts."""
    problems = []
    for newer, older in itertools.pairwise(revs):
        if dict(newer.files) == dict(older.files):
            continue
        if newer.version == older.version == BEFORE_THE_RULE:
            continue
        if Version(newer.version) <= Version(older.version):
            if newer.version != BEFORE_THE_RULE and _returns_to_earlier(newer, revs):
                continue
            changed = sorted(k for k in set(newer.files) | set(older.files)
                             if newer.files.get(k) != older.files.get(k))
            problems.append(f"{newer.name}: chart version {newer.version} but the chart changed since "
                            f"{older.name} (version {older.version}): {', '.join(changed[:5])}; bump `version` "
                            f"in {CHART_PATH}/Chart.yaml")
    charts: dict[str, Revision] = {}
    for rev in reversed(revs):  # oldest first: name the revision that reused a version
        if rev.version == BEFORE_THE_RULE:
            continue
        first = charts.setdefault(rev.version, rev)
        if dict(first.files) != dict(rev.files):
            problems.append(f"{rev.name}: chart version {rev.version} already names the different chart of "
                            f"{first.name}; bump `version` in {CHART_PATH}/Chart.yaml")
    return problems


def _returns_to_earlier(rev: Revision, revs: list[Revision]) -> bool:
    """Whether an older revision is this very chart under this very version (``revs`` newest first)."""
    older = revs[revs.index(rev) + 1:]
    return any(o.version == rev.version and dict(o.files) == dict(rev.files) for o in older)


def test_chart_version_goes_up_with_every_chart_change() -> None:
    revs = revisions()
    assert len(revs) >= 7, [r.name for r in revs]  # the chart's history since its first commit
    assert revs[-1].files.get("Chart.yaml"), "the oldest revision is the chart's first commit"
    assert version_problems(revs) == []


def test_version_rule_catches_an_unbumped_change() -> None:
    revs = revisions()
    newest = revs[0]
    edited = Revision("edited", {**newest.files, "values.yaml": "0" * 40}, newest.chart_yaml)
    assert version_problems([edited, newest]) == [
        f"edited: chart version {newest.version} but the chart changed since {newest.name} "
        f"(version {newest.version}): values.yaml; bump `version` in {CHART_PATH}/Chart.yaml",
        f"edited: chart version {newest.version} already names the different chart of {newest.name}; bump "
        f"`version` in {CHART_PATH}/Chart.yaml"]
    lowered = Revision("lowered", edited.files, {**newest.chart_yaml, "version": BEFORE_THE_RULE})
    assert len(version_problems([lowered, newest])) == 1
    bumped = Revision("bumped", edited.files, {**newest.chart_yaml, "version": "99.0.0"})
    assert version_problems([bumped, newest]) == []


def test_version_rule_accepts_a_revert_but_not_a_reused_version() -> None:
    base = revisions()[0]
    one = Revision("one", {**base.files, "values.yaml": "1" * 40}, {**base.chart_yaml, "version": "50.0.0"})
    two = Revision("two", {**base.files, "values.yaml": "2" * 40}, {**base.chart_yaml, "version": "51.0.0"})
    back = Revision("back", one.files, one.chart_yaml)  # `git revert` of two: chart and version of one
    assert version_problems([back, two, one]) == []
    again = Revision("again", two.files, two.chart_yaml)  # the revert reverted: two once more
    assert version_problems([again, back, two, one]) == []
    reused = Revision("reused", {**base.files, "values.yaml": "3" * 40}, one.chart_yaml)  # 50.0.0, new chart
    assert version_problems([reused, two, one]) == [
        f"reused: chart version 50.0.0 but the chart changed since two (version 51.0.0): values.yaml; bump "
        f"`version` in {CHART_PATH}/Chart.yaml",
        f"reused: chart version 50.0.0 already names the different chart of one; bump `version` in "
        f"{CHART_PATH}/Chart.yaml"]


# --------------------------------------------------------------------------------------------------
# appVersion (the default image tag) moves with the controller it ships
# --------------------------------------------------------------------------------------------------
# What the image is built from (Dockerfile): the controller's package and its pinned dependencies.
CONTROLLER_PATHS = ("licensectl", "Dockerfile", "requirements.lock")
# The appVersion of every chart revision before this rule: the package said 0.1.0 through all of them.
APP_BEFORE_THE_RULE = "0.1.0"


def controller_files(rev: Revision) -> dict[str, str]:
    """Path -> git blob hash of what the image is built from, in that chart revision's commit (or on disk)."""
    if rev.name == "working tree":
        listed = git("ls-files", "--cached", "--others", "--exclude-standard", "--", *CONTROLLER_PATHS).splitlines()
        paths = sorted(p for p in set(listed) if (ROOT / p).is_file())
        hashes = git("hash-object", "--no-filters", "--stdin-paths", stdin="\n".join(paths) + "\n").split()
        return dict(zip(paths, hashes, strict=True))
    out = {}
    for line in git("ls-tree", "-r", rev.name, "--", *CONTROLLER_PATHS).splitlines():
        meta, path = line.split("\t", 1)
        out[path] = meta.split()[2]
    return out


def app_version_problems(revs: list[Revision], code: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Chart revisions (newest first) never lower appVersion, and one appVersion never ships two different
    controllers (`code`: revision name -> controller_files): a default image tag names one build."""
    problems = []
    for newer, older in itertools.pairwise(revs):
        if Version(str(newer.chart_yaml["appVersion"])) < Version(str(older.chart_yaml["appVersion"])):
            problems.append(f"{newer.name}: appVersion {newer.chart_yaml['appVersion']} is lower than "
                            f"{older.chart_yaml['appVersion']} of {older.name}")
    shipped: dict[str, Revision] = {}
    for rev in reversed(revs):  # oldest first: name the revision that reused an appVersion
        app = str(rev.chart_yaml["appVersion"])
        if app == APP_BEFORE_THE_RULE:
            continue
        first = shipped.setdefault(app, rev)
        changed = sorted(p for p in set(code[rev.name]) | set(code[first.name])
                         if code[rev.name].get(p) != code[first.name].get(p))
        if changed:
            problems.append(f"{rev.name}: appVersion {app} already ships the different controller of {first.name} "
                            f"({', '.join(changed[:3])}); bump licensectl.__version__ and appVersion")
    return problems


def test_app_version_moves_with_every_controller_the_chart_ships() -> None:
    revs = revisions()
    assert app_version_problems(revs, {r.name: controller_files(r) for r in revs}) == []


def test_app_version_rule_catches_a_changed_controller_under_the_same_tag() -> None:
    newest = revisions()[0]
    same = {**newest.chart_yaml, "appVersion": "50.0.0"}
    one = Revision("one", newest.files, same)
    two = Revision("two", {**newest.files, "values.yaml": "2" * 40}, same)
    code = {"one": {"licensectl/app.py": "1" * 40}, "two": {"licensectl/app.py": "2" * 40}}
    assert app_version_problems([two, one], code) == [
        "two: appVersion 50.0.0 already ships the different controller of one (licensectl/app.py); bump "
        "licensectl.__version__ and appVersion"]
    assert app_version_problems([two, one], {"one": code["one"], "two": code["one"]}) == []
    bumped = Revision("bumped", two.files, {**same, "appVersion": "50.1.0"})
    assert app_version_problems([bumped, one], code | {"bumped": code["two"]}) == []
    lowered = Revision("lowered", two.files, {**same, "appVersion": "49.0.0"})
    assert len(app_version_problems([lowered, one], code | {"lowered": code["two"]})) == 1


# --------------------------------------------------------------------------------------------------
# helm upgrade --reuse-values from every earlier chart version
# --------------------------------------------------------------------------------------------------
VALUES_DUMP = """apiVersion: v1
kind: ConfigMap
metadata:
  name: values
data:
  values.json: {{ toJson .Values | quote }}
"""


def old_chart(commit: str, into: Path) -> Path:
    """The old chart's values machinery only (Chart.yaml, values.yaml, schema) plus a template that
    prints `.Values`: what its templates saw, i.e. the release's computed values."""
    chart = into / f"old-{commit[:12]}"
    (chart / "templates").mkdir(parents=True)
    for name in ("Chart.yaml", "values.yaml", "values.schema.json"):
        (chart / name).write_text(git("show", f"{commit}:{CHART_PATH}/{name}"))
    (chart / "templates" / "values.yaml").write_text(VALUES_DUMP)
    return chart


def release_values(helm: Helm, chart: Path, user: Mapping[str, Any]) -> dict[str, Any]:
    res = helm.run("template", "licensectl", str(chart), "--namespace", NAMESPACE, "--values", "-",
                   input=yaml.safe_dump(dict(user)))
    assert res.returncode == 0, f"{chart.name} with {dict(user)}: {res.stderr}"
    doc = yaml.safe_load(res.stdout)
    values: dict[str, Any] = json.loads(doc["data"]["values.json"])
    return values


def toggles_on(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every `enabled` switch of the old chart on, plus its GPU CRDs: the most of it a release used."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            sub = toggles_on(value)
            if "enabled" in value:
                sub["enabled"] = True
            if sub:
                out[key] = sub
    if "gpuCRDs" in values:
        out["gpuCRDs"] = True
    return out


def scenarios(commit: str, defaults: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """What a hoster may have set on that release: nothing, every switch, the example overlay's values."""
    out: dict[str, dict[str, Any]] = {"defaults": {}, "toggles-on": toggles_on(defaults)}
    listed = git("ls-tree", "--name-only", commit, "--", "tests/chart/values/kustomize-example.yaml").strip()
    if listed:
        out["example"] = yaml.safe_load(git("show", f"{commit}:{listed}"))
    return out


def required_values(chart: Path) -> dict[str, Any]:
    """What a release of this chart version could not have been installed without: from 0.2.0 on, an
    image repository (the schema has no default for it)."""
    defaults = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    repository = (defaults.get("image") or {}).get("repository")
    return {} if repository else {"image": {"repository": "registry.example/licensectl"}}


def with_required(user: Mapping[str, Any], required: Mapping[str, Any]) -> dict[str, Any]:
    """The hoster's settings, plus the required ones they must also have set (theirs win)."""
    out = dict(user)
    for key, value in required.items():
        mine = out.get(key)
        out[key] = {**value, **mine} if isinstance(value, dict) and isinstance(mine, dict) else out.get(key, value)
    return out


def render(helm: Helm, chart: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    args = ["template", "licensectl", str(chart), "--namespace", NAMESPACE, "--set", f"image.tag={NEW_TAG}"]
    for f in files:
        args += ["--values", str(f)]
    return helm.run(*args)


def check_upgrades_from(helm: Helm, commit: str, tmp_path: Path) -> list[str]:
    """Every scenario of one earlier chart version: what was checked, or an AssertionError."""
    checked = []
    old = old_chart(commit, tmp_path)
    version = yaml.safe_load((old / "Chart.yaml").read_text())["version"]
    required = required_values(old)
    defaults = release_values(helm, old, required)
    for scenario, user in scenarios(commit, defaults).items():
        user = with_required(user, required)
        reused = release_values(helm, old, user)
        # The upgrade: the current chart with the old release's values in place of values.yaml.
        upgraded = tmp_path / f"upgrade-{commit[:12]}-{scenario}"
        shutil.copytree(CHART, upgraded)
        (upgraded / "values.yaml").write_text(json.dumps(reused, indent=2))
        user_file = tmp_path / f"user-{commit[:12]}-{scenario}.yaml"
        user_file.write_text(yaml.safe_dump(user))
        res = render(helm, upgraded, user_file)
        what = f"upgrade from {commit[:12]} (chart {version}, {scenario})"
        assert res.returncode == 0, f"{what}: {res.stderr}"
        # A fresh install of the current chart with the same settings (new defaults underneath).
        settings = tmp_path / f"settings-{commit[:12]}-{scenario}.json"
        settings.write_text(json.dumps(reused))
        fresh = render(helm, CHART, settings)
        assert fresh.returncode == 0, f"{what}, fresh install: {fresh.stderr}"
        got = objects_by_key(documents(res.stdout))
        want = objects_by_key(documents(fresh.stdout))
        assert sorted(got) == sorted(want), what
        for key, obj in want.items():
            assert got[key] == obj, f"{what}: {key}"
        deployment = got[("Deployment", NAMESPACE, "licensectl")]
        image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == f"{reused['image']['repository']}:{NEW_TAG}", what
        checked.append(what)
    return checked


@pytest.mark.cluster
def test_reuse_values_upgrade_from_every_earlier_chart_version(helm: Helm, tmp_path: Path) -> None:
    """For each earlier chart version and what a hoster set on it, the current templates render with the
    old release's values (no new defaults) exactly what a fresh install with those settings renders."""
    commits = chart_commits()
    assert len(commits) >= 7
    # The versions are independent and helm mostly waits: a few at a time (an assertion re-raises here).
    with ThreadPoolExecutor(max_workers=4) as pool:
        checked = [what for done in pool.map(lambda c: check_upgrades_from(helm, c, tmp_path), commits)
                   for what in done]
    assert len(checked) >= 2 * len(commits), checked
