"""Watch caches: each `Informer` keeps a dict of slim projections current by LIST + WATCH.

The controller decides from these caches instead of reading the apiserver on every pass; the
informer says when a cache may be trusted (`synced`, `healthy`) so nothing is deleted from a partial
view. One concern per module:

    wire.py      the watch protocol's format: event lines, LineSplitter, LIST pages, Status codes and
                 what a failed answer means (Gone or ApiError), object keys, resourceVersions (pure)
    backoff.py   when to try again: jittered backoff, throttling, Retry-After, watch timeouts (pure)
    options.py   how an informer is tuned (InformerOptions) and what it reports (InformerHooks)
    answers.py   reading one LIST or WATCH answer: status, JSON body, stream lines, release
    cache.py     the read side (WatchCache): the cache and when it may be trusted
    informer.py  the Informer: the LIST/WATCH loop, the on_change notifications

Concurrency model (asyncio, after kopf's: say who may touch what):
- One task per informer. `Informer.run()` is the only writer and refuses to run twice at once;
  `Caches.start` and `Caches.ensure_sources` (and `ServingTLS.start` for its Secret) start each run as
  its own task on the loop that calls them, the App's loop.
- The cache is mutated only by that task, and never across an await: a WATCH event changes one key
  synchronously in `_apply`, and a LIST builds its dict aside and swaps it in with one assignment.
  `on_change` runs inline in that task at each change, so it must be cheap and synchronous (enqueue).
- Readers on the same loop see a consistent cache between their awaits. `cache` is a live read-only
  view; a reader that awaits while iterating must iterate `snapshot()` (a copy) instead. A view taken
  before a relist keeps showing the replaced dict, so take it again after an await.
- The admission webhook answers from its own thread (docs/design.md#webhook-thread) and reads the
  live views there with keyed lookups only (`get`, `in`): each sees the dict before or after one
  mutation. Nothing on that thread may iterate a live view.
"""

from licensectl.kube.watch.backoff import (
    MIN_RETRY_AFTER,
    RECOVERY_CAP,
    THROTTLED_CAP,
    backoff_delay,
    is_throttled,
    parse_retry_after,
    retry_after_of,
    retry_delay,
    watch_timeout_seconds,
)
from licensectl.kube.watch.informer import (
    CACHE_PROBE_SELECTOR,
    REASON_ERROR,
    REASON_GONE,
    REASON_TIMEOUT,
    REASON_TOO_LONG,
    Informer,
    ListFunc,
)
from licensectl.kube.watch.options import InformerHooks, InformerOptions
from licensectl.kube.watch.wire import (
    EVENT_TYPES,
    ApiError,
    Gone,
    Key,
    LineSplitter,
    LineTooLong,
    ListPage,
    WatchEvent,
    failure,
    is_gone,
    list_page,
    object_key,
    parse_event_line,
    resource_version_of,
    shared_name_key,
    status_code,
    status_reason,
)

__all__ = [
    "CACHE_PROBE_SELECTOR",
    "EVENT_TYPES",
    "MIN_RETRY_AFTER",
    "REASON_ERROR",
    "REASON_GONE",
    "REASON_TIMEOUT",
    "REASON_TOO_LONG",
    "RECOVERY_CAP",
    "THROTTLED_CAP",
    "ApiError",
    "Gone",
    "Informer",
    "InformerHooks",
    "InformerOptions",
    "Key",
    "LineSplitter",
    "LineTooLong",
    "ListFunc",
    "ListPage",
    "WatchEvent",
    "backoff_delay",
    "failure",
    "is_gone",
    "is_throttled",
    "list_page",
    "object_key",
    "parse_event_line",
    "parse_retry_after",
    "resource_version_of",
    "retry_after_of",
    "retry_delay",
    "shared_name_key",
    "status_code",
    "status_reason",
    "watch_timeout_seconds",
]
