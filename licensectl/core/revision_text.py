"""One vocabulary for revisions in every table, Event message and metric label (docs/operations.md#revisions).

Two hashes exist and a hoster must never have to guess which one a line shows:

* the **source revision**: SHA-256 of what the hoster supplies in the source Secret (token and
  optional gridd.conf, ``core.rotation.content_revision``). It is what the hoster rotates, what the
  rotation record calls stable and candidate, and what a replica's ``licensectl.io/source-revision``
  holds. Shown as ``source revision <12 hex>``.
* the **replica revision**: SHA-256 of what one class's replica renders from it (token plus the
  class's gridd.conf with its FeatureType, a replica's ``licensectl.io/revision``): it differs per
  class for one source revision. Shown only where it must be, as ``replica revision <12 hex>``.

The short form is the first 12 hex digits of the full value, so it is a prefix of the annotation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from licensectl.core.model import ANN_REVISION, ANN_SOURCE_REVISION

SHORT = 12
SOURCE = "source revision"
REPLICA = "replica revision"
# Table column headers: a cell under them is the short form, labelled by the header.
SOURCE_COLUMN = "SOURCE REVISION"
REPLICA_COLUMN = "REPLICA REVISION"
NONE = "-"

# A word of 12 to 64 hex digits on its own (not inside a name, a UID or a longer word).
_HEX = re.compile(r"(?<![\w.-])[0-9a-f]{12,64}(?![\w-])")
_LABELS = (SOURCE, REPLICA)


def short(revision: str | None) -> str:
    """The 12-hex short form; "-" for none."""
    return revision[:SHORT] if revision else NONE


def source_revision(revision: str | None) -> str:
    """``source revision 0123456789ab``: what the hoster rotates."""
    return f"{SOURCE} {short(revision)}"


def replica_revision(revision: str | None) -> str:
    """``replica revision 0123456789ab``: one class's rendered replica, labelled as such."""
    return f"{REPLICA} {short(revision)}"


def unlabeled_hashes(text: str) -> list[str]:
    """The hex hashes (12 to 64 digits) in ``text`` not directly preceded by a revision label.

    A hash counts as labelled when ``source revision`` or ``replica revision`` (any case, so a
    message may open with it) stands right before it. Used by the tests that grep every output
    surface.
    """
    out: list[str] = []
    for m in _HEX.finditer(text):
        before = text[max(0, m.start() - 40):m.start()]
        if not any(before.rstrip(" :=").lower().endswith(label) for label in _LABELS):
            out.append(m.group(0))
    return out


def source_revision_of(replica_annotations: Iterable[Mapping[str, str]], replica_rev: str) -> str | None:
    """The source revision a replica revision was rendered from, read from the replicas that carry it
    (``licensectl.io/source-revision`` beside ``licensectl.io/revision``); None when none says."""
    for ann in replica_annotations:
        if ann.get(ANN_REVISION) == replica_rev and ann.get(ANN_SOURCE_REVISION):
            return ann[ANN_SOURCE_REVISION]
    return None
