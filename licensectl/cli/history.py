"""`licensectl rollout history SOURCE`: the source revisions of one source and how each ended.

Read from what the cluster records: the rotation record on the source's revision store in licensectl's
namespace keeps the last outcomes (core/rotation_record.py, `licensectl.io/rotation-history`), written
by the leader with the decision that ends a candidate. Read only; needs `get` on Secrets there.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from typing import Any

from licensectl import config
from licensectl.cli.errors import CliError, api_error
from licensectl.cli.status_render import table
from licensectl.core.model import ObjectRef
from licensectl.core.revision_text import SOURCE_COLUMN, short, source_revision
from licensectl.core.rotation import RotationRecord
from licensectl.core.timecodec import format_time
from licensectl.kube import revision_store as rs
from licensectl.kube.api import ApiException, CoreV1Api
from licensectl.kube.client import make_api_client
from licensectl.kube.errors import NotFound
from licensectl.kube.raw import RawApi


def history_document(source: str, record: RotationRecord) -> dict[str, Any]:
    """`rollout history -o json` (pure): the recorded outcomes oldest first, and where the source is now."""
    return {"source": source, "phase": record.phase.value, "stable": short(record.stable),
            "candidate": short(record.candidate) if record.candidate else None,
            "history": [{"source_revision": short(e.source_revision), "outcome": e.outcome.value,
                         "at": format_time(e.at)} for e in record.history]}


def history_text(doc: Mapping[str, Any]) -> str:
    """The table: one row per recorded outcome, then the current state in words (pure)."""
    rows = [[SOURCE_COLUMN, "OUTCOME", "AT"]]
    rows += [[e["source_revision"], e["outcome"], e["at"]] for e in doc["history"]]
    now = f"now: {doc['phase']}, stable {source_revision(doc['stable'])}"
    if doc["candidate"]:
        now += f", candidate {source_revision(doc['candidate'])}"
    if len(rows) == 1:
        return f"no candidate has ended yet for {doc['source']}\n{now}\n"
    return f"{table(rows)}\n\n{now}\n"


async def rollout_history_main(args: Any, settings: config.Settings) -> int:
    if getattr(args, "namespace", None):
        settings = dataclasses.replace(settings, namespace=args.namespace)
    ns, _, name = args.source.partition("/")
    ref = ObjectRef(ns, name)
    api = await make_api_client(settings)
    try:
        try:
            store = await RawApi(CoreV1Api(api)).read_namespaced_secret(rs.store_name(ref), settings.namespace)
        except NotFound:
            raise CliError(f"no rollout history found for source {args.source}: licensectl holds no rotation "
                           f"record for it in {settings.namespace} (no GPUClass names it, or the controller has "
                           f"not seen it yet)") from None
        except ApiException as e:
            raise CliError(api_error(e, f"reading the revision store of {args.source} in {settings.namespace}")
                           ) from None
    finally:
        await api.close()
    record = RotationRecord.from_annotations((store.get("metadata") or {}).get("annotations") or {})
    if record is None:
        raise CliError(f"the revision store of {args.source} in {settings.namespace} holds no readable rotation "
                       f"record")
    doc = history_document(args.source, record)
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if args.output == "json" else history_text(doc))
    return 0
