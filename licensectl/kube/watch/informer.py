"""Informer: a cache of slim projections kept current by LIST + WATCH.

Modelled on client-go's Reflector (kubernetes/kubernetes
staging/src/k8s.io/client-go/tools/cache/reflector.go): a paged LIST builds a snapshot and yields a
resourceVersion; a WATCH resumes from the last seen resourceVersion (bookmarks advance it without
objects); "410 Gone" / "too old resource version" means the history is compacted and only a
full relist can restore a correct cache; other failures reconnect with jittered backoff
(`licensectl.kube.watch.backoff`). How it is tuned and what it reports: `licensectl.kube.watch.options`;
how one answer is read: `licensectl.kube.watch.answers`.

Safety contract the controller relies on before deleting anything:
- `synced` is True only after a complete LIST (every page) of this run.
- A LIST that fails on any page leaves the cache untouched (the snapshot is built aside and swapped
  in one step) and makes `healthy` False until a LIST succeeds.
- `healthy` is also False while the watch has been down for longer than a short grace.

Responses are read raw (`_preload_content=False`) and parsed with orjson (`kube/jsoncodec.py`): typed model
deserialisation is far too slow for tens of thousands of objects. Logs carry the informer name,
object names, resourceVersions and reasons, never object content (Secrets!).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any, TypeVar

import structlog

from licensectl.kube import errors
from licensectl.kube.watch import answers, wire
from licensectl.kube.watch.backoff import is_throttled, retry_after_of, retry_delay, watch_timeout_seconds
from licensectl.kube.watch.cache import WatchCache
from licensectl.kube.watch.options import InformerHooks, InformerOptions

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


class Informer(WatchCache[T]):
    """List+watch cache of projections `T`, keyed by (namespace, name); what readers see is `WatchCache`'s.

    `on_change(key, old, new)` runs for every effective change (old/new None for add/delete),
    including those found by a relist; it must be cheap and synchronous (enqueue work).
    `on_synced()` runs once, after the first complete LIST: an empty result changes nothing, yet
    "confirmed absent" is news to whoever waited for the cache (a missing source Secret).
    `keep(obj)` false: the object is neither projected nor held (`_kept_projection`). `hooks` report to
    the metrics; `options` tune paging, timeouts and backoff (`licensectl.kube.watch.options`).
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
        keep: Callable[[Mapping[str, Any]], bool] | None = None,
        on_change: Callable[[wire.Key, T | None, T | None], None] | None = None,
        on_synced: Callable[[], None] | None = None,
        hooks: InformerHooks | None = None,
        options: InformerOptions | None = None,
    ) -> None:
        o = options or InformerOptions()
        super().__init__(name, unhealthy_after=o.unhealthy_after)
        self._list_func = list_func
        self._project = projection
        self._keep = keep
        self._key = key
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._on_synced = on_synced
        self._on_change = on_change
        self._page_size = o.page_size
        self._hooks = hooks or InformerHooks()
        self._watch_timeout = o.watch_timeout
        self._request_timeout = o.request_timeout
        self._backoff_base = o.backoff_base
        self._backoff_cap = o.backoff_cap
        self._throttled_cap = max(o.throttled_cap, o.backoff_cap)
        self._max_line = o.max_line_bytes

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
                    log.warning("informer.list_failed", informer=self.name, error=answers.describe(e),
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
                if not is_throttled(e):
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
            page = wire.list_page(await self._request_json(kw))
            pages += 1
            for item in page.items:
                if not isinstance(item, dict):
                    self._counters["invalid_objects"] += 1
                    continue
                key = self._key(item)
                proj = self._kept_projection(item, key)
                if proj is not None:
                    new[key] = proj
            rv = page.resource_version or rv
            token = page.continue_token
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
            if errors.is_status(e, errors.Gone):
                raise wire.Gone() from None
            raise

    async def _request_json(self, kw: dict[str, Any]) -> dict[str, Any]:
        resp = await self._call(**kw, _preload_content=False, _request_timeout=self._request_timeout)
        return await answers.list_body(resp)

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
                throttled = is_throttled(e)
                retry_after = e.retry_after
                if not throttled:
                    api_errors += 1
                    relist = e.code != HTTPStatus.INTERNAL_SERVER_ERROR or api_errors >= 3
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
                     error=answers.describe(err) if err is not None else None)

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
            await answers.check_watch_opened(resp)
            self._watch_down_since = None
            self._heard_at = time.monotonic()
            seen = 0
            async for line in answers.lines(resp, self._max_line):
                self._heard_at = time.monotonic()
                ev = wire.parse_event_line(line)
                if ev is None:
                    log.warning("informer.bad_event_line", informer=self.name, length=len(line))
                    continue
                seen += 1
                self._apply(ev)
            return seen
        finally:
            answers.close(resp)

    def _apply(self, ev: wire.WatchEvent) -> None:
        """Apply one event to the cache (raises wire.Gone/wire.ApiError for ERROR events)."""
        self._counters["events"] += 1
        obj = ev.object
        if ev.type == "ERROR":
            raise wire.failure(wire.status_code(obj), obj)
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

