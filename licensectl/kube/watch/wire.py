"""The watch protocol's wire format: event lines, metav1.Status codes, object keys, resourceVersions.

Pure functions and a line splitter over bytes and decoded JSON; no I/O, no clock, no randomness, so
every rule here is tested with literal input. `object_key`, `parse_event_line`, `resource_version_of`
and `LineSplitter.feed` run once per watch event or per listed object: keep them lean. What a failed
answer means (`failure`: 410 and an Expired/Gone Status are `Gone`, the rest `ApiError`) is decided
here and nowhere else in the watch; the status numbers themselves are named in `licensectl.kube.errors`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

from licensectl.kube import errors, jsoncodec

Key = tuple[str, str]

EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


class WatchEvent(NamedTuple):
    type: str
    object: Mapping[str, Any]


class ListPage(NamedTuple):
    """One page of a LIST: its items (unchecked), its resourceVersion and continue token (None if absent)."""

    items: list[Any]
    resource_version: str | None
    continue_token: str | None


class LineTooLong(Exception):
    """A watch event exceeded the line bound: drop the connection rather than buffer without limit."""


class Gone(Exception):
    """410: the requested resourceVersion (or continue token) is no longer available."""


class ApiError(Exception):
    """Non-success HTTP status or ERROR event; carries code and the Status reason only."""

    def __init__(self, code: int, reason: str, retry_after: float | None = None) -> None:
        super().__init__(f"{code} {reason}")
        self.code = code
        self.reason = reason
        self.retry_after = retry_after  # the server's Retry-After (seconds), with a 429 or 503

    @property
    def status(self) -> int:
        """The code under the name `errors.is_status` reads, so one test covers this and ApiException."""
        return self.code


def object_key(obj: Mapping[str, Any]) -> Key:
    """(namespace, name); namespace "" for cluster-scoped objects.

    Namespaces are interned, as the projections intern theirs: thousands of cached objects share a
    few namespaces, and each key would otherwise keep its own copy. So is a cluster-scoped object's
    name, which is what a Namespace's name is.
    """
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return ("", "")
    ns, name = meta.get("namespace"), meta.get("name")
    if type(ns) is str:
        ns = sys.intern(ns)
    elif ns is None and type(name) is str:
        name = sys.intern(name)
    return (ns if isinstance(ns, str) else "", name if isinstance(name, str) else "")


def shared_name_key(obj: Mapping[str, Any]) -> Key:
    """`object_key` with the name interned as well, for kinds whose names recur in every namespace:
    licensectl's replicas are named after their class, GPU claims mostly alike. Their projections
    intern the name too, so key and projection hold one copy; unique names would only cost."""
    ns, name = object_key(obj)
    return (ns, sys.intern(name) if type(name) is str else name)


def resource_version_of(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        rv = meta.get("resourceVersion")
        if isinstance(rv, str) and rv:
            return rv
    return None


def list_page(body: Mapping[str, Any]) -> ListPage:
    """The parts of a decoded LIST body the informer reads; malformed parts read as absent."""
    items = body.get("items")
    meta = body.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    rv, cont = meta.get("resourceVersion"), meta.get("continue")
    return ListPage(items if isinstance(items, list) else [], rv if isinstance(rv, str) and rv else None,
                    cont if isinstance(cont, str) and cont else None)


def parse_event_line(line: bytes | str) -> WatchEvent | None:
    """One line of a watch stream -> WatchEvent; None for anything that is not a well-formed event."""
    try:
        doc = jsoncodec.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    typ, obj = doc.get("type"), doc.get("object")
    if typ not in EVENT_TYPES or not isinstance(obj, dict):
        return None
    return WatchEvent(typ, obj)


def status_code(status: Mapping[str, Any]) -> int:
    """HTTP code of a metav1.Status (ERROR event object), 0 if absent."""
    code = status.get("code")
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def status_reason(status: Mapping[str, Any]) -> str:
    """Status.reason (a CamelCase word like Expired/Forbidden): safe to log, unlike free text."""
    reason = status.get("reason")
    return reason if isinstance(reason, str) and reason.isalnum() else "Unknown"


def is_gone(status: Mapping[str, Any]) -> bool:
    """410 Gone / reason Expired or Gone (apimachinery pkg/api/errors IsResourceExpired, IsGone)."""
    return status_code(status) == errors.Gone.STATUS or status.get("reason") in ("Expired", "Gone")


def failure(code: int, status: Mapping[str, Any], retry_after: float | None = None) -> Gone | ApiError:
    """What a failed LIST or WATCH answer (HTTP `code`, its metav1.Status body) or an ERROR event means:
    Gone (410, or a Status saying Expired/Gone) when only a relist can go on, else an ApiError."""
    if code == errors.Gone.STATUS or is_gone(status):
        return Gone()
    return ApiError(code, status_reason(status), retry_after)


class LineSplitter:
    """Splits a byte stream into lines with a bound on line length."""

    def __init__(self, max_line: int) -> None:
        self._buf = bytearray()
        self._max = max_line

    def feed(self, chunk: bytes) -> list[bytes]:
        search = len(self._buf)
        self._buf += chunk
        out: list[bytes] = []
        start = 0
        while (i := self._buf.find(b"\n", search)) >= 0:
            if i - start > self._max:
                raise LineTooLong(i - start)
            line = bytes(self._buf[start:i])
            if line.strip():
                out.append(line)
            start = search = i + 1
        if start:
            del self._buf[:start]
        if len(self._buf) > self._max:
            raise LineTooLong(len(self._buf))
        return out

    def finish(self) -> bytes | None:
        """The unterminated tail at end of stream, if any."""
        tail = bytes(self._buf)
        self._buf.clear()
        return tail if tail.strip() else None
