"""Build the ApiClient a process shares, with request tracing on its aiohttp session.

Config precedence: an explicit kubeconfig (and context) from Settings, else the in-cluster service
account, else the default kubeconfig (~/.kube/config or $KUBECONFIG).

Counting requests and reading the apiserver's `Date` header go through an `aiohttp.TraceConfig`
on the client's session (`request_tracing`): the owner of the client (the App) passes its own
counter and ServerClock in, so nothing here is global and no library method is replaced.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import aiohttp
import structlog
from kubernetes_asyncio import config as kconfig
from kubernetes_asyncio.client import ApiClient, Configuration
from yarl import URL

from licensectl import config
from licensectl.kube.server_clock import ServerClock

log = structlog.get_logger(__name__)

# Long-lived watches hold one connection each (about ten informers plus one per license source);
# writes burst to ~50 in parallel. Requests beyond the limit queue in aiohttp instead of failing.
POOL_MAXSIZE = 128
# kubernetes-asyncio's own value: watch events with large objects exceed aiohttp's default buffer.
READ_BUFSIZE = 2**21

RequestObserver = Callable[[str, int], None]


def request_verb(method: str, url: URL) -> str:
    """The HTTP method, or WATCH for a watch request (`watch=true`, or `True` as urlencode writes a bool)."""
    if url.query.get("watch", "").lower() == "true":
        return "WATCH"
    return method.upper()


def request_tracing(*, on_request: RequestObserver | None = None, clock: ServerClock | None = None,
                    local_time: Callable[[], float] = time.time) -> aiohttp.TraceConfig:
    """Trace hooks telling `on_request(verb, code)` after every request and feeding `clock` the `Date` header.

    verb is the HTTP method, or WATCH for watch requests; code is the response status, 0 when no
    response arrived. A request cancelled by its caller (a stopping informer, an outer timeout)
    is not counted: it neither failed nor got an answer. The hooks run inline on the event loop
    and must stay cheap (a counter increment); a failing observer is logged, never raised into the
    request it observes.
    """

    def notify(verb: str, code: int) -> None:
        if on_request is None:
            return
        try:
            on_request(verb, code)
        except Exception as e:  # a metrics bug must never fail an API call
            log.warning("client.observer_failed", error=type(e).__name__)

    async def on_request_end(_session: aiohttp.ClientSession, _ctx: SimpleNamespace,
                             params: aiohttp.TraceRequestEndParams) -> None:
        notify(request_verb(params.method, params.url), int(params.response.status or 0))
        if clock is not None:
            clock.observe(params.response.headers.get("Date"), local_time())

    async def on_request_exception(_session: aiohttp.ClientSession, _ctx: SimpleNamespace,
                                   params: aiohttp.TraceRequestExceptionParams) -> None:
        if isinstance(params.exception, asyncio.CancelledError):
            return
        notify(request_verb(params.method, params.url), 0)

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_request_end)
    trace.on_request_exception.append(on_request_exception)
    return trace


def _open_session(api: ApiClient, trace_configs: Sequence[aiohttp.TraceConfig]) -> None:
    """Give the REST client a session with `trust_env=False` and our trace configs.

    kubernetes-asyncio (v36) opens its session inside `ApiClient.__init__` with `trust_env=True` and
    takes no session options: neither `Configuration` nor `ApiClient` accepts any, and `ApiClient`
    constructs its `RESTClientObject` itself, so no subclass can be passed in. trust_env=True makes
    aiohttp read ~/.netrc and the proxy environment in a thread on *every* request (measured: ~13% of
    controller CPU), while the apiserver address and any proxy come from the kubeconfig. The REST
    client's `pool_manager` is a public, typed attribute (rest.pyi): this one function replaces it,
    before any request, by a session on the same connector (pool limit, TLS context); the original
    session is detached from the connector, so it owns nothing that needs closing.
    """
    rest = api.rest_client
    old = rest.pool_manager
    connector = old.connector
    old.detach()
    rest.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=READ_BUFSIZE,
                                              trace_configs=list(trace_configs) or None)


def _in_cluster_available() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and bool(os.environ.get("KUBERNETES_SERVICE_PORT"))


async def make_api_client(settings: config.Settings, *,
                          trace_configs: Sequence[aiohttp.TraceConfig] = ()) -> ApiClient:
    """An ApiClient whose requests run through `trace_configs`; the caller closes it (`await client.close()`)."""
    cfg = Configuration()
    if settings.kubeconfig:
        await kconfig.load_kube_config(config_file=settings.kubeconfig, context=settings.context or None,
                                       client_configuration=cfg, persist_config=False)
        source = "kubeconfig"
    elif _in_cluster_available() and not settings.context:
        # The loader installs a hook that re-reads the projected (rotating) service account token.
        kconfig.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        source = "in-cluster"
    else:
        await kconfig.load_kube_config(context=settings.context or None, client_configuration=cfg,
                                       persist_config=False)
        source = "default-kubeconfig"
    cfg.connection_pool_maxsize = POOL_MAXSIZE
    api = ApiClient(configuration=cfg)
    _open_session(api, trace_configs)
    log.info("client.configured", source=source, host=cfg.host, context=settings.context or None)
    return api
