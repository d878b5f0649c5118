"""The rotation loop's `core.ports.RevisionStores`: kube/revision_store.py's layout bound to one deployment.

The store's Secret layout (its name, slots and record annotations) and its guarded write stay in
kube/revision_store.py, which the CLI's offline view reads too; this binds them to licensectl's namespace,
the source token key and the API client, so the controller sees records and decisions only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from licensectl.core.model import ObjectRef, RevisionStore, SourceSecret
from licensectl.core.replication import SourceRevisions
from licensectl.core.rotation import Decision
from licensectl.kube import revision_store as rs
from licensectl.kube.api import CoreV1Api


class ApiRevisionStores:
    def __init__(self, api: CoreV1Api, *, namespace: str, token_key: str) -> None:
        self._api = api
        self._namespace = namespace
        self._token_key = token_key

    def by_source(self, stores: Iterable[RevisionStore]) -> dict[ObjectRef, RevisionStore]:
        return rs.stores_by_source(stores)

    def live_revision(self, source: SourceSecret | None) -> str | None:
        return rs.live_revision(source, self._token_key)

    def rotations(self, stores: Mapping[ObjectRef, RevisionStore],
                  live: Mapping[ObjectRef, SourceSecret | None]) -> Mapping[ObjectRef, SourceRevisions]:
        return rs.source_rotations(stores, live, token_key=self._token_key)

    async def write(self, *, source: ObjectRef, existing: RevisionStore | None, decision: Decision,
                    live: SourceSecret | None) -> bool | None:
        body = rs.store_body(namespace=self._namespace, source=source, existing=existing, decision=decision,
                             live=live, token_key=self._token_key)
        if body is None:
            return None
        return await rs.write_store(self._api, body, source)
