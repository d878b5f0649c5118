"""One revision vocabulary (docs/operations.md#revisions): the formatter, and the grep the tests run over
every output surface, checked against hand-made labelled and unlabelled output."""

from __future__ import annotations

import json

from licensectl.cli.status_fetch import status_from_controller
from licensectl.cli.status_render import status_table
from licensectl.core.model import ANN_REVISION, ANN_SOURCE_REVISION
from licensectl.core.revision_text import (
    replica_revision,
    short,
    source_revision,
    source_revision_of,
    unlabeled_hashes,
)
from licensectl_dev.testkit.revision_grep import json_unlabeled, metrics_unlabeled, text_unlabeled
from tests.unit.cli.test_status_client import CONTROLLER_DOC

SRC, REP = "4f2a9c1b7e3d" + "0" * 52, "9e8d7c6b5a41" + "1" * 52


def test_the_short_form_is_a_labelled_prefix_of_the_annotation() -> None:
    assert short(SRC) == SRC[:12] and short(None) == "-" and short("") == "-"
    assert source_revision(SRC) == "source revision 4f2a9c1b7e3d"
    assert replica_revision(REP) == "replica revision 9e8d7c6b5a41"


def test_the_replicas_say_which_source_revision_a_replica_revision_renders() -> None:
    anns = [{ANN_REVISION: "x"}, {ANN_REVISION: REP, ANN_SOURCE_REVISION: SRC}]
    assert source_revision_of(anns, REP) == SRC
    assert source_revision_of(anns, "x") is None and source_revision_of([], REP) is None


def test_unlabeled_hashes_in_text() -> None:
    assert unlabeled_hashes(f"Candidate {source_revision(SRC)} aborted, stable {source_revision(REP)}") == []
    assert unlabeled_hashes(f"restart for {replica_revision(REP)}") == []
    assert unlabeled_hashes(f"License revision {SRC[:12]} rolled out") == [SRC[:12]]
    assert unlabeled_hashes(f"full {SRC}") == [SRC]
    # Not a hash: inside a name, a UID's last group, a shorter word.
    assert unlabeled_hashes("vm licensectl-revisions-0123456789abcdef uid 1b4e28ba-2fa1-11d2-883f-0016d3cca427") == []
    assert unlabeled_hashes("deadbeef cafe") == []


def test_table_columns_label_their_cells() -> None:
    table = "\n".join(["SOURCE  SOURCE REVISION  OTHER", f"a/b     {SRC[:12]}      {REP[:12]}"])
    assert text_unlabeled(table) == [f"{REP[:12]} in {table.splitlines()[1].strip()!r}"]


def test_json_keys_must_say_which_revision() -> None:
    assert json_unlabeled(json.dumps({"x": {"source_revision": SRC[:12], "stable": SRC[:12]}})) == []
    assert json_unlabeled(json.dumps({"revision": SRC[:12]})) == [f"revision={SRC[:12]}"]
    assert json_unlabeled(json.dumps({"message": f"revision {SRC[:12]}"})) != []


def test_metric_labels_carry_a_hash_only_as_the_source_revision() -> None:
    ok = f'licensectl_source_revision_info{{class="c",revision="{SRC[:12]}"}} 1.0\n'
    bad = f'licensectl_rollout_vmis{{revision="{SRC[:12]}"}} 1.0\n'
    assert metrics_unlabeled(ok) == []
    assert metrics_unlabeled(bad) == [f"licensectl_rollout_vmis{{revision={SRC[:12]}}}"]


def test_the_status_table_labels_every_hash() -> None:
    rotation = {"licensectl-system/vws-token": {
        "phase": "aborted", "wave": 0, "wave_number": 1, "waves": 3, "stable": SRC[:12], "candidate": REP[:12],
        "canary": ["tenant-a"], "evidence": True, "wave_started_at": None, "wave_progress": None,
        "reason": f"canary: 1 guest(s) failed to license with candidate {source_revision(REP)} (t/vm: not_found)"}}
    doc = status_from_controller({**CONTROLLER_DOC, "rotation": rotation})
    table = status_table(doc)
    assert SRC[:12] in table and REP[:12] in table
    assert text_unlabeled(table) == []
    assert json_unlabeled(json.dumps(doc)) == []
