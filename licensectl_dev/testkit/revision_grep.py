"""Find revision hashes a hoster would have to guess about, on every output surface.

The vocabulary (licensectl/core/revision_text.py): a hash is shown as `source revision <hex>` or
`replica revision <hex>` in text, under a `SOURCE REVISION` / `REPLICA REVISION` column header in a
table, under a key that says which one in JSON, and only as the `revision` label of
`licensectl_source_revision_info` among metric labels.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml

from licensectl.core.revision_text import REPLICA_COLUMN, SOURCE_COLUMN, unlabeled_hashes
from licensectl_dev.testkit.metrics_text import parse_metrics

HEX = re.compile(r"^[0-9a-f]{12,64}$")
# JSON keys whose hex values are revisions and say which: the rotation record's stable and
# candidate are source revisions by definition (docs/operations.md#revisions); any key ending in
# `_source_revision` or `_replica_revision` names its kind too.
JSON_KEYS = frozenset({"source_revision", "replica_revision", "stable", "candidate"})
METRIC_LABELS = frozenset({("licensectl_source_revision_info", "revision")})
_HEADER = re.compile(r"^[A-Z][A-Z0-9 ()/_-]*$")


def _column_label(lines: list[str], i: int, pos: int) -> str | None:
    """The header of the table column that starts at `pos` in line `i` (None if no table above)."""
    for j in range(i - 1, -1, -1):
        line = lines[j]
        if not line.strip():
            return None
        if _HEADER.match(line.rstrip()) and len(line) > pos and (pos == 0 or line[pos - 1] == " "):
            return re.split(r"\s{2,}", line[pos:].strip())[0]
    return None


def text_unlabeled(text: str) -> list[str]:
    """Hashes in CLI text output or an Event message not labelled inline nor by their column header."""
    lines = text.splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        for h in unlabeled_hashes(line):
            pos = line.index(h)
            header = _column_label(lines, i, pos)
            if header is None or not (SOURCE_COLUMN in header or REPLICA_COLUMN in header):
                out.append(f"{h} in {line.strip()!r}")
    return out


def _walk(doc: Any, key: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _walk(v, str(k))
    elif isinstance(doc, list):
        for v in doc:
            yield from _walk(v, key)
    elif isinstance(doc, str):
        yield key, doc


def yaml_unlabeled(text: str) -> list[str]:
    """`json_unlabeled` for a stream of YAML documents (`-o yaml`)."""
    return [h for doc in yaml.safe_load_all(text) for h in _doc_unlabeled(doc)]


def json_unlabeled(text: str) -> list[str]:
    """Hashes in a JSON document under a key that does not say which revision (and in its strings)."""
    return _doc_unlabeled(json.loads(text))


def _doc_unlabeled(doc: Any) -> list[str]:
    out: list[str] = []
    for key, value in _walk(doc):
        if HEX.match(value):
            if key not in JSON_KEYS and not key.endswith(("_source_revision", "_replica_revision")):
                out.append(f"{key}={value}")
        else:
            out += [f"{h} in {key}={value!r}" for h in text_unlabeled(value)]
    return out


def metrics_unlabeled(text: str) -> list[str]:
    """Hex label values of a /metrics scrape outside the one label that is a source revision."""
    out: list[str] = []
    for (name, labels), _v in parse_metrics(text).samples.items():
        for label, value in labels:
            if unlabeled_hashes(value) and (name, label) not in METRIC_LABELS:
                out.append(f"{name}{{{label}={value}}}")
    return out
