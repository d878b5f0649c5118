"""Informer: a cache of slim projections kept current by LIST + WATCH.

Modelled on client-go's Reflector (kubernetes/kubernetes
staging/src/k8s.io/client-go/tools/cache/reflector.go): a paged LIST builds a snapshot and yields a
resourceVersion; a WATCH resumes from the last seen resourceVersion (bookmarks advance it without
objects); "410 Gone" / "too old resource version" means the history is compacted and only a
full relist can restore a correct cache; other failures reconnect with jittered backoff
(`licensectl.kube.watch.backoff`).

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
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import structlog

from licensectl.kube.watch import wire
from licensectl.kube.watch.backoff import (
    RECOVERY_CAP,
    THROTTLED_CAP,
    is_throttled,
    parse_retry_after,
    retry_after_of,
    retry_delay,
    watch_timeout_seconds,
)

log = structlog.get_logger(__name__)

T = TypeVar("T")

# A kubernetes-asyncio list method (bound with functools.partial to group/version/plural or a
# namespace as needed). Called with list/watch keyword arguments and `_preload_content=False`; returns
# the raw aiohttp response.
ListFunc = Callable[..., Awaitable[Any]]

# Watch-restart reasons (metric label values).
REASON_GONE = "gone"          # 410: history compacted, full relist
REASON_TIMEOUT = "timeout"    # the server ended the watch (timeoutSeconds): resume from last RV
REASON_ERROR = "error"        # connection error, non-200 response, ERROR event other than 410
REASON_TOO_LONG = "line_too_long"

# The label selector of the watch-cache probe (`Informer._await_watch_cache`): "this label is absent",
# true of every object, so a filled cache answers at its first object.
CACHE_PROBE_SELECTOR = "!licensectl.io/watch-cache-probe"
CACHE_PROBE_CAP = 2.0  # seconds between two probes at most


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
    `on_synced()` runs once, after the first complete LIST: an empty result changes nothing, yet
    "confirmed absent" is news to whoever waited for the cache (a missing source Secret).
    """

    def __init__(
        self,
        name: str,
        list_func: ListFunc,
        projection: Callable[[Mapping[str, Any]], T | None],
        *,
        key: Callable[[Mapping[str, Any]], wire.Key] = wire.object_key,
        label_selector: str | None = None,
        field_selector: str | None = None,
        on_change: Callable[[wire.Key, T | None, T | None], None] | None = None,
        on_synced: Callable[[], None] | None = None,
        page_size: int = 500,
        hooks: InformerHooks | None = None,
        watch_timeout: float = 300.0,
        request_timeout: float = 60.0,
        unhealthy_after: float = 30.0,
        backoff_base: float = 0.5,
        backoff_cap: float = RECOVERY_CAP,
        throttled_cap: float = THROTTLED_CAP,
        max_line_bytes: int = 16 * 1024 * 1024,
        keep: Callable[[Mapping[str, Any]], bool] | None = None,
    ) -> None:
        self.name = name
        self._list_func = list_func
        self._project = projection
        self._keep = keep
        self._key = key
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._on_synced = on_synced
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

        self._cache: dict[wire.Key, T] = {}
        self._generation = 0
        self._rv = ""
        self._synced = False
        self._synced_event = asyncio.Event()
        self._list_failed = False
        self._watch_down_since: float | None = time.monotonic()
        self._running = False
        self._last_sync_at: dt.datetime | None = None
        self._heard_at: float | None = None  # monotonic: last complete LIST, watch opened or watch line read
        self._counters: dict[str, int] = dict.fromkeys(
            ("lists", "list_failures", "relists", "events", "watch_restarts", "invalid_objects", "ignored_objects"),
            0)

    # -- read side ------------------------------------------------------------------------------
    @property
    def cache(self) -> Mapping[wire.Key, T]:
        """Read-only live view. Take `snapshot()` if you await while iterating it."""
        return MappingProxyType(self._cache)

    def snapshot(self) -> dict[wire.Key, T]:
        return dict(self._cache)

    @property
    def generation(self) -> int:
        """Grows with every effective change (the changes `on_change` is told of, relists included)."""
        return self._generation

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
    def stale_seconds(self) -> float | None:
        """Seconds since this cache last heard from the apiserver (a LIST, a watch opening, any watch line,
        bookmarks included); None before the first LIST. A quiet healthy watch reaches at most its server
        timeout (up to 2 x watch_timeout); more means the apiserver has gone silent (docs/operations.md#readiness)."""
        return None if self._heard_at is None else time.monotonic() - self._heard_at

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
        await self._await_watch_cache()
        try:
            for restart in range(3):
                try:
                    new, rv, pages = await self._list_all()
                    break
                except wire.Gone:
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
        self._heard_at = time.monotonic()
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
        if first and self._on_synced is not None:
            self._on_synced()

    async def _await_watch_cache(self) -> None:
        """Wait until the apiserver's watch cache of this resource is filled, when our LIST would not.

        A restarted apiserver fills a resource's watch cache from etcd (a custom resource's on its first
        request after the restart). Meanwhile it answers a paged LIST without selectors from etcd, page by
        page, decoding every object a second time beside the cache's own fill, and a selected LIST or a
        WATCH with 429 and a Retry-After. A LIST of 20,000 VMIs read that way took four times what the same
        LIST takes from the cache. So a selector-less informer first asks a LIST with a selector (limit
        1, a label no object carries, so its answer is any object): 429 means wait as told, 200 means
        the cache is filled and the paged LIST is served from it. Other answers are left to the LIST.
        The wait between probes is capped at `CACHE_PROBE_CAP`: the Retry-After of an unfilled cache
        grows with how long it has been filling (up to 30 s), and a refused probe costs the apiserver
        next to nothing."""
        if self._label_selector or self._field_selector:
            return  # such a LIST is never sent to etcd for an unfilled cache: it gets the 429 itself
        attempt = 0
        while True:
            try:
                await self._request_json({"label_selector": CACHE_PROBE_SELECTOR, "limit": 1})
            except asyncio.CancelledError:
                raise
            except wire.ApiError as e:
                if e.code != 429:
                    return
                delay = min(CACHE_PROBE_CAP, self._delay(attempt, throttled=True, retry_after=e.retry_after))
            except Exception:
                return  # a connection error, a 410: the LIST meets it too, and reports it
            else:
                return
            attempt += 1
            self._list_failed = True  # the cache is as stale as after a failed LIST until the LIST is done
            log.info("informer.awaiting_watch_cache", informer=self.name, retry_in=round(delay, 2))
            await asyncio.sleep(delay)

    async def _list_all(self) -> tuple[dict[wire.Key, T], str, int]:
        new: dict[wire.Key, T] = {}
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
                proj = self._kept_projection(item, key)
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
            raise wire.ApiError(0, "ListWithoutResourceVersion")
        return new, rv, pages

    async def _call(self, **kw: Any) -> Any:
        """Call the list function; an exception carrying HTTP 410 (e.g. ApiException) becomes wire.Gone."""
        try:
            return await self._list_func(**kw)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if getattr(e, "status", None) == 410:
                raise wire.Gone() from None
            raise

    async def _request_json(self, kw: dict[str, Any]) -> dict[str, Any]:
        resp = await self._call(**kw, _preload_content=False, _request_timeout=self._request_timeout)
        try:
            status = int(getattr(resp, "status", 0) or 0)
            doc = _loads(await resp.read())
            if status == 410 or (status >= 400 and doc is not None and wire.is_gone(doc)):
                raise wire.Gone()
            if not 200 <= status <= 299:
                raise wire.ApiError(status, wire.status_reason(doc or {}), _retry_after_header(resp))
            if doc is None:
                raise wire.ApiError(status, "UndecodableListBody")
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
            except wire.Gone:
                self._watch_ended(REASON_GONE, None)
                self._counters["relists"] += 1
                return
            except wire.LineTooLong as e:
                reason = REASON_TOO_LONG
                self._watch_ended(reason, e)
            except wire.ApiError as e:
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
                if status == 410 or wire.is_gone(doc):
                    raise wire.Gone()
                raise wire.ApiError(status, wire.status_reason(doc), _retry_after_header(resp))
            self._watch_down_since = None
            self._heard_at = time.monotonic()
            seen = 0
            async for line in self._lines(resp):
                self._heard_at = time.monotonic()
                ev = wire.parse_event_line(line)
                if ev is None:
                    log.warning("informer.bad_event_line", informer=self.name, length=len(line))
                    continue
                seen += 1
                self._apply(ev)
            return seen
        finally:
            _close(resp)

    async def _lines(self, resp: Any) -> AsyncIterator[bytes]:
        splitter = wire.LineSplitter(self._max_line)
        while True:
            chunk = await resp.content.readany()
            if not chunk:
                tail = splitter.finish()
                if tail is not None:
                    yield tail
                return
            for line in splitter.feed(chunk):
                yield line

    def _apply(self, ev: wire.WatchEvent) -> None:
        """Apply one event to the cache (raises wire.Gone/wire.ApiError for ERROR events)."""
        self._counters["events"] += 1
        obj = ev.object
        if ev.type == "ERROR":
            if wire.is_gone(obj):
                raise wire.Gone()
            raise wire.ApiError(wire.status_code(obj), wire.status_reason(obj))
        rv = wire.resource_version_of(obj)
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
            new = self._kept_projection(obj, key)
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

    def _kept_projection(self, obj: Mapping[str, Any], key: wire.Key) -> T | None:
        """The projection to hold, or None: for an object `keep` refuses (never projected nor held; one held
        before leaves the cache as if deleted) and for one that cannot be projected."""
        if self._keep is not None:
            try:
                kept = self._keep(obj)
            except Exception as e:  # a predicate that fails holds the object: memory over a missed VMI
                log.warning("informer.keep_failed", informer=self.name, namespace=key[0], name=key[1],
                            error=type(e).__name__)
                kept = True
            if not kept:
                self._counters["ignored_objects"] += 1
                return None
        return self._safe_project(obj, key)

    def _safe_project(self, obj: Mapping[str, Any], key: wire.Key) -> T | None:
        try:
            proj = self._project(obj)
        except Exception as e:  # projections are meant to be total; one bad object must not stop us
            log.warning("informer.projection_failed", informer=self.name, namespace=key[0], name=key[1],
                        error=type(e).__name__)
            proj = None
        if proj is None:
            self._counters["invalid_objects"] += 1
        return proj

    def _notify(self, key: wire.Key, old: T | None, new: T | None) -> None:
        self._generation += 1
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
    if isinstance(e, wire.ApiError):
        return f"ApiError({e.code} {e.reason})"
    status = getattr(e, "status", None)
    if isinstance(status, int):
        return f"{type(e).__name__}({status})"
    return type(e).__name__
