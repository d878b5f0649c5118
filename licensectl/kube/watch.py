"""Informer: a cache of slim projections kept current by LIST + WATCH.

Modelled on client-go's Reflector (kubernetes/kubernetes
staging/src/k8s.io/client-go/tools/cache/reflector.go): a paged LIST builds a snapshot and yields a
resourceVersion; a WATCH resumes from the last seen resourceVersion (bookmarks advance it without
objects); "410 Gone" / "too old resource version" means the history is compacted and only a
full relist can restore a correct cache; other failures reconnect with jittered backoff whose
ceiling is short (a few seconds), so a healed apiserver is seen within seconds, and long only when
the server itself asks to slow down (429) (docs/design.md#recovery-backoff).

Safety contract the controller relies on before deleting anything:
- `synced` is True only after a complete LIST (every page) of this run.
- A LIST that fails on any page leaves the cache untouched (the snapshot is built aside and swapped
  in one step) and makes `healthy` False until a LIST succeeds.
- `healthy` is also False while the watch has been down for longer than a short grace.

Responses are read raw (`_preload_content=False`) and parsed with json: typed model
deserialisation is far too slow for tens of thousands of objects. Logs carry the informer name,
object names, resourceVersions and reasons, never object content (Secrets!).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")

# A kubernetes-asyncio list method (bound with functools.partial to group/version/plural or a
# namespace as needed). Called with list/watch keyword arguments and `_preload_content=False`; returns
# the raw aiohttp response.
ListFunc = Callable[..., Awaitable[Any]]
Key = tuple[str, str]

EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})

# Watch-restart reasons (metric label values).
REASON_GONE = "gone"          # 410: history compacted, full relist
REASON_TIMEOUT = "timeout"    # the server ended the watch (timeoutSeconds): resume from last RV
REASON_ERROR = "error"        # connection error, non-200 response, ERROR event other than 410
REASON_TOO_LONG = "line_too_long"


class WatchEvent(NamedTuple):
    type: str
    object: Mapping[str, Any]


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


# ---------------------------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------------------------
def backoff_delay(attempt: int, rnd: float, *, base: float = 0.5, cap: float = 30.0) -> float:
    """Jittered exponential backoff: in [d/2, d] with d = min(cap, base * 2**attempt).

    `rnd` is a uniform draw in [0, 1) passed in, so the schedule is testable.
    """
    exp = min(max(attempt, 0), 62)
    d = min(cap, base * (2.0**exp))
    r = min(max(rnd, 0.0), 1.0)
    return d * (0.5 + 0.5 * r)


# Backoff ceilings: short for a server that is down or failing (an attempt costs it nothing or
# little, and a healed server must be seen within seconds), long for a server that throttles (429).
RECOVERY_CAP = 2.0
THROTTLED_CAP = 30.0
MIN_RETRY_AFTER = 0.2  # "Retry-After: 0" must not become a busy loop


def retry_delay(attempt: int, rnd: float, *, throttled: bool, base: float = 0.5, cap: float = RECOVERY_CAP,
                throttled_cap: float = THROTTLED_CAP, retry_after: float | None = None) -> float:
    """The informer's backoff schedule: jittered exponential up to `cap`, or up to `throttled_cap`
    when the last failure was a 429 (the apiserver's priority and fairness shedding load). A
    Retry-After the server sent wins (a restarted apiserver answers 429 "storage is initializing"
    with Retry-After: 1 until its watch cache is filled), jittered up by at most a quarter."""
    if retry_after is not None and retry_after >= 0:
        r = min(max(rnd, 0.0), 1.0)
        return min(throttled_cap, max(retry_after, MIN_RETRY_AFTER) * (1.0 + 0.25 * r))
    return backoff_delay(attempt, rnd, base=base, cap=throttled_cap if throttled else cap)


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the apiserver sends an integer); None when absent or an HTTP date."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds < 86400 else None


def retry_after_of(e: BaseException | None) -> float | None:
    return e.retry_after if isinstance(e, ApiError) else None


def is_throttled(e: BaseException | None) -> bool:
    """429 from a LIST or WATCH (our ApiError, or an ApiException raised by the client)."""
    if isinstance(e, ApiError):
        return e.code == 429
    return getattr(e, "status", None) == 429


def watch_timeout_seconds(minimum: float, rnd: float) -> int:
    """Server-side watch timeout in [minimum, 2*minimum), spread like client-go so that many
    watches do not all reconnect at once."""
    return max(1, int(minimum * (1.0 + min(max(rnd, 0.0), 0.999999))))


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


def parse_event_line(line: bytes | str) -> WatchEvent | None:
    """One line of a watch stream -> WatchEvent; None for anything that is not a well-formed event."""
    try:
        doc = json.loads(line)
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
    return status_code(status) == 410 or status.get("reason") in ("Expired", "Gone")


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


# ---------------------------------------------------------------------------------------------
# Informer
# ---------------------------------------------------------------------------------------------
def _noop_restart(informer: str, reason: str) -> None:
    return None


def _noop_list(informer: str, result: str, objects: int, seconds: float) -> None:
    return None


@dataclass(frozen=True, slots=True)
class InformerHooks:
    """Metric hooks; called inline, keep them cheap.

    on_watch_restart(informer, reason): reason in gone, timeout, error, line_too_long.
    on_list(informer, result, objects, seconds): result "ok" or "error".
    """

    on_watch_restart: Callable[[str, str], None] = _noop_restart
    on_list: Callable[[str, str, int, float], None] = _noop_list


class Informer(Generic[T]):
    """List+watch cache of projections `T`, keyed by (namespace, name).

    `on_change(key, old, new)` runs for every effective change (old/new None for add/delete),
    including those found by a relist; it must be cheap and synchronous (enqueue work).
    """

    def __init__(
        self,
        name: str,
        list_func: ListFunc,
        projection: Callable[[Mapping[str, Any]], T | None],
        *,
        key: Callable[[Mapping[str, Any]], Key] = object_key,
        label_selector: str | None = None,
        field_selector: str | None = None,
        on_change: Callable[[Key, T | None, T | None], None] | None = None,
        page_size: int = 500,
        hooks: InformerHooks | None = None,
        watch_timeout: float = 300.0,
        request_timeout: float = 60.0,
        unhealthy_after: float = 30.0,
        backoff_base: float = 0.5,
        backoff_cap: float = RECOVERY_CAP,
        throttled_cap: float = THROTTLED_CAP,
        max_line_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.name = name
        self._list_func = list_func
        self._project = projection
        self._key = key
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._on_change = on_change
        self._page_size = page_size
        self._hooks = hooks or InformerHooks()
        self._watch_timeout = watch_timeout
        self._request_timeout = request_timeout
        self._unhealthy_after = unhealthy_after
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._throttled_cap = max(throttled_cap, backoff_cap)
        self._max_line = max_line_bytes

        self._cache: dict[Key, T] = {}
        self._rv = ""
        self._synced = False
        self._synced_event = asyncio.Event()
        self._list_failed = False
        self._watch_down_since: float | None = time.monotonic()
        self._running = False
        self._last_sync_at: dt.datetime | None = None
        self._counters: dict[str, int] = dict.fromkeys(
            ("lists", "list_failures", "relists", "events", "watch_restarts", "invalid_objects"), 0)

    # -- read side ------------------------------------------------------------------------------
    @property
    def cache(self) -> Mapping[Key, T]:
        """Read-only live view. Take `snapshot()` if you await while iterating it."""
        return MappingProxyType(self._cache)

    def snapshot(self) -> dict[Key, T]:
        return dict(self._cache)

    @property
    def synced(self) -> bool:
        return self._synced

    @property
    def healthy(self) -> bool:
        """Running, synced, last LIST succeeded, and the watch is up (or down for less than the grace)."""
        if not self._running or not self._synced or self._list_failed:
            return False
        down = self._watch_down_since
        return down is None or time.monotonic() - down <= self._unhealthy_after

    @property
    def resource_version(self) -> str:
        return self._rv

    @property
    def last_sync_at(self) -> dt.datetime | None:
        """Wall-clock time of the last complete LIST."""
        return self._last_sync_at

    @property
    def running(self) -> bool:
        return self._running

    @property
    def counters(self) -> Mapping[str, int]:
        return MappingProxyType(dict(self._counters))

    async def wait_synced(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 (a bool, not a raise)
        """True once synced; False if `timeout` seconds pass first."""
        if self._synced:
            return True
        try:
            await asyncio.wait_for(self._synced_event.wait(), timeout)
        except TimeoutError:
            return False
        return self._synced

    # -- run loop -------------------------------------------------------------------------------
    async def run(self) -> None:
        """LIST, then WATCH, forever; returns only by cancellation. Restartable after cancel.

        `synced` is False outside a run: a restarted informer must complete a new LIST first.
        """
        if self._running:
            raise RuntimeError(f"informer {self.name} is already running")
        self._running = True
        # A restarted informer must prove itself again before the controller trusts it.
        self._synced = False
        self._synced_event.clear()
        self._watch_down_since = time.monotonic()
        attempt = 0
        log.info("informer.start", informer=self.name)
        try:
            while True:
                try:
                    await self._relist()
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    self._list_failed = True
                    delay = self._delay(attempt, throttled=is_throttled(e), retry_after=retry_after_of(e))
                    attempt += 1
                    log.warning("informer.list_failed", informer=self.name, error=_describe(e),
                                retry_in=round(delay, 2))
                    await asyncio.sleep(delay)
                    continue
                attempt = 0
                await self._watch_until_gone()
        finally:
            # A stopped informer keeps its last cache for reading but is no longer kept current.
            self._running = False
            self._synced = False
            self._synced_event.clear()
            self._watch_down_since = self._watch_down_since or time.monotonic()
            log.info("informer.stop", informer=self.name)

    def _delay(self, attempt: int, *, throttled: bool = False, retry_after: float | None = None) -> float:
        return retry_delay(attempt, random.random(), throttled=throttled, base=self._backoff_base,  # noqa: S311
                           cap=self._backoff_cap, throttled_cap=self._throttled_cap, retry_after=retry_after)

    def _selectors(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self._label_selector:
            kw["label_selector"] = self._label_selector
        if self._field_selector:
            kw["field_selector"] = self._field_selector
        return kw

    # -- LIST -----------------------------------------------------------------------------------
    async def _relist(self) -> None:
        """Build a complete snapshot aside; swap it in only when every page arrived."""
        started = time.monotonic()
        try:
            for restart in range(3):
                try:
                    new, rv, pages = await self._list_all()
                    break
                except Gone:
                    # The continue token expired mid-way (etcd compaction): start over, as client-go's
                    # pager does, with a fresh consistent snapshot.
                    if restart == 2:
                        raise
                    log.info("informer.list_restart", informer=self.name, reason=REASON_GONE)
        except asyncio.CancelledError:
            raise
        except Exception:
            self._counters["list_failures"] += 1
            self._hooks.on_list(self.name, "error", 0, time.monotonic() - started)
            raise
        old = self._cache
        self._cache = new
        self._rv = rv
        self._list_failed = False
        self._last_sync_at = dt.datetime.now(dt.UTC)
        self._counters["lists"] += 1
        first = not self._synced
        self._synced = True
        self._synced_event.set()
        seconds = time.monotonic() - started
        self._hooks.on_list(self.name, "ok", len(new), seconds)
        log.info("informer.listed", informer=self.name, objects=len(new), pages=pages,
                 resource_version=rv, seconds=round(seconds, 3), initial=first)
        for k, v in new.items():
            prev = old.get(k)
            if prev != v:
                self._notify(k, prev, v)
        for k, prev in old.items():
            if k not in new:
                self._notify(k, prev, None)

    async def _list_all(self) -> tuple[dict[Key, T], str, int]:
        new: dict[Key, T] = {}
        token: str | None = None
        rv = ""
        pages = 0
        while True:
            kw = self._selectors()
            if self._page_size > 0:
                kw["limit"] = self._page_size
            if token:
                kw["_continue"] = token
            body = await self._request_json(kw)
            pages += 1
            items = body.get("items")
            for item in items if isinstance(items, list) else []:
                if not isinstance(item, dict):
                    self._counters["invalid_objects"] += 1
                    continue
                key = self._key(item)
                proj = self._safe_project(item, key)
                if proj is not None:
                    new[key] = proj
            meta = body.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            page_rv = meta.get("resourceVersion")
            if isinstance(page_rv, str) and page_rv:
                rv = page_rv
            cont = meta.get("continue")
            token = cont if isinstance(cont, str) and cont else None
            if token is None:
                break
        if not rv:
            raise ApiError(0, "ListWithoutResourceVersion")
        return new, rv, pages

    async def _call(self, **kw: Any) -> Any:
        """Call the list function; an exception carrying HTTP 410 (e.g. ApiException) becomes Gone."""
        try:
            return await self._list_func(**kw)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if getattr(e, "status", None) == 410:
                raise Gone() from None
            raise

    async def _request_json(self, kw: dict[str, Any]) -> dict[str, Any]:
        resp = await self._call(**kw, _preload_content=False, _request_timeout=self._request_timeout)
        try:
            status = int(getattr(resp, "status", 0) or 0)
            doc = _loads(await resp.read())
            if status == 410 or (status >= 400 and doc is not None and is_gone(doc)):
                raise Gone()
            if not 200 <= status <= 299:
                raise ApiError(status, status_reason(doc or {}), _retry_after_header(resp))
            if doc is None:
                raise ApiError(status, "UndecodableListBody")
            return doc
        finally:
            _close(resp)

    # -- WATCH ----------------------------------------------------------------------------------
    async def _watch_until_gone(self) -> None:
        """Watch from the last RV; return when only a relist can go on.

        As client-go's Reflector does: 410 -> relist at once; connection failures and 429 -> rewatch
        from the last RV with backoff; a few consecutive 500s are retried, any other API error (or
        more 500s) -> relist after a backoff, because resuming may keep failing the same way.
        """
        attempt = 0
        api_errors = 0
        while True:
            opened = time.monotonic()
            relist = False
            throttled = False
            retry_after: float | None = None
            try:
                seen = await self._watch_once()
                reason = REASON_TIMEOUT
                if seen == 0 and time.monotonic() - opened < 1.0:
                    # Closed at once without events: back off rather than spin.
                    reason = REASON_ERROR
                self._watch_ended(reason, None)
            except asyncio.CancelledError:
                raise
            except Gone:
                self._watch_ended(REASON_GONE, None)
                self._counters["relists"] += 1
                return
            except LineTooLong as e:
                reason = REASON_TOO_LONG
                self._watch_ended(reason, e)
            except ApiError as e:
                reason = REASON_ERROR
                self._watch_ended(reason, e)
                throttled = e.code == 429
                retry_after = e.retry_after
                if e.code != 429:
                    api_errors += 1
                    relist = e.code != 500 or api_errors >= 3
            except Exception as e:
                reason = REASON_ERROR
                self._watch_ended(reason, e)
                throttled = is_throttled(e)
            else:
                api_errors = 0
            if reason == REASON_TIMEOUT:
                attempt = 0
                continue
            if time.monotonic() - opened > 10.0:
                attempt = 0
            delay = self._delay(attempt, throttled=throttled, retry_after=retry_after)
            attempt += 1
            await asyncio.sleep(delay)
            if relist:
                log.info("informer.relist_after_errors", informer=self.name, errors=api_errors)
                self._counters["relists"] += 1
                return

    def _watch_ended(self, reason: str, err: BaseException | None) -> None:
        if self._watch_down_since is None:
            self._watch_down_since = time.monotonic()
        self._counters["watch_restarts"] += 1
        self._hooks.on_watch_restart(self.name, reason)
        if reason == REASON_TIMEOUT:
            log.debug("informer.watch_closed", informer=self.name, reason=reason, resource_version=self._rv)
        else:
            log.info("informer.watch_restart", informer=self.name, reason=reason, resource_version=self._rv,
                     error=_describe(err) if err is not None else None)

    async def _watch_once(self) -> int:
        """One watch request; returns the number of events handled when the server ends it."""
        timeout = watch_timeout_seconds(self._watch_timeout, random.random())  # noqa: S311
        resp = await self._call(
            **self._selectors(), watch=True, allow_watch_bookmarks=True, resource_version=self._rv,
            timeout_seconds=timeout, _preload_content=False,
            # (connect, read): a silent connection beyond the server's own timeout is dead.
            _request_timeout=(self._request_timeout, timeout + 30),
        )
        try:
            status = int(getattr(resp, "status", 0) or 0)
            if status != 200:
                doc = _loads(await resp.content.read(64 * 1024)) or {}
                if status == 410 or is_gone(doc):
                    raise Gone()
                raise ApiError(status, status_reason(doc), _retry_after_header(resp))
            self._watch_down_since = None
            seen = 0
            async for line in self._lines(resp):
                ev = parse_event_line(line)
                if ev is None:
                    log.warning("informer.bad_event_line", informer=self.name, length=len(line))
                    continue
                seen += 1
                self._apply(ev)
            return seen
        finally:
            _close(resp)

    async def _lines(self, resp: Any) -> AsyncIterator[bytes]:
        splitter = LineSplitter(self._max_line)
        while True:
            chunk = await resp.content.readany()
            if not chunk:
                tail = splitter.finish()
                if tail is not None:
                    yield tail
                return
            for line in splitter.feed(chunk):
                yield line

    def _apply(self, ev: WatchEvent) -> None:
        """Apply one event to the cache (raises Gone/ApiError for ERROR events)."""
        self._counters["events"] += 1
        obj = ev.object
        if ev.type == "ERROR":
            if is_gone(obj):
                raise Gone()
            raise ApiError(status_code(obj), status_reason(obj))
        rv = resource_version_of(obj)
        if ev.type == "BOOKMARK":
            if rv:
                self._rv = rv
            return
        key = self._key(obj)
        old = self._cache.get(key)
        if ev.type == "DELETED":
            if old is not None:
                del self._cache[key]
                self._notify(key, old, None)
        else:
            new = self._safe_project(obj, key)
            if new is None:
                if old is not None:
                    del self._cache[key]
                    self._notify(key, old, None)
            else:
                self._cache[key] = new
                if new != old:
                    self._notify(key, old, new)
        if rv:
            self._rv = rv

    def _safe_project(self, obj: Mapping[str, Any], key: Key) -> T | None:
        try:
            proj = self._project(obj)
        except Exception as e:  # projections are meant to be total; one bad object must not stop us
            log.warning("informer.projection_failed", informer=self.name, namespace=key[0], name=key[1],
                        error=type(e).__name__)
            proj = None
        if proj is None:
            self._counters["invalid_objects"] += 1
        return proj

    def _notify(self, key: Key, old: T | None, new: T | None) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change(key, old, new)
        except Exception as e:
            log.warning("informer.on_change_failed", informer=self.name, namespace=key[0], name=key[1],
                        error=type(e).__name__)


def _loads(raw: bytes | None) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _retry_after_header(resp: Any) -> float | None:
    headers = getattr(resp, "headers", None)
    value = headers.get("Retry-After") if headers is not None else None
    return parse_retry_after(value if isinstance(value, str) else None)


def _close(resp: Any) -> None:
    close = getattr(resp, "close", None)
    if callable(close):
        try:
            close()
        except Exception as e:
            log.debug("informer.close_failed", error=type(e).__name__)


def _describe(e: BaseException | None) -> str:
    """Exception type and, for our own API errors, code + Status reason; never a response body."""
    if e is None:
        return ""
    if isinstance(e, ApiError):
        return f"ApiError({e.code} {e.reason})"
    status = getattr(e, "status", None)
    if isinstance(status, int):
        return f"{type(e).__name__}({status})"
    return type(e).__name__
