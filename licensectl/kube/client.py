"""Build the Kubernetes client a process shares, with request tracing on its aiohttp session.

Config precedence: an explicit kubeconfig (and context) from Settings, else the in-cluster service
account, else the default kubeconfig (~/.kube/config or $KUBECONFIG).

Counting requests and reading the apiserver's `Date` header go through an `aiohttp.TraceConfig`
on the client's session (`request_tracing`): the owner of the client (the App) passes its own
counter and ServerClock in, so nothing here is global and no library method is replaced.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import aiohttp
import structlog
from yarl import URL

from licensectl import config
from licensectl.kube import kubeconfig
from licensectl.kube.api import KubeClient, library_auth
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

    async def on_request_start(_session: aiohttp.ClientSession, ctx: SimpleNamespace,
                               _params: aiohttp.TraceRequestStartParams) -> None:
        ctx.licensectl_sent = local_time()  # the Date header was stamped after this: bounds the clock offset

    async def on_request_end(_session: aiohttp.ClientSession, ctx: SimpleNamespace,
                             params: aiohttp.TraceRequestEndParams) -> None:
        notify(request_verb(params.method, params.url), int(params.response.status or 0))
        if clock is not None:
            clock.observe(params.response.headers.get("Date"), local_time(), getattr(ctx, "licensectl_sent", None))

    async def on_request_exception(_session: aiohttp.ClientSession, _ctx: SimpleNamespace,
                                   params: aiohttp.TraceRequestExceptionParams) -> None:
        if isinstance(params.exception, asyncio.CancelledError):
            return
        notify(request_verb(params.method, params.url), 0)

    trace = aiohttp.TraceConfig()
    if clock is not None:
        trace.on_request_start.append(on_request_start)
    trace.on_request_end.append(on_request_end)
    trace.on_request_exception.append(on_request_exception)
    return trace


def _session(ssl_ctx: ssl.SSLContext | bool, trace_configs: Sequence[aiohttp.TraceConfig]) -> aiohttp.ClientSession:
    """The process's one session. `trust_env=False`: with it aiohttp reads ~/.netrc and the proxy
    environment in a thread on *every* request (measured: ~13% of controller CPU), while the
    apiserver address and any proxy come from the kubeconfig."""
    connector = aiohttp.TCPConnector(limit=POOL_MAXSIZE, ssl=ssl_ctx)
    return aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=READ_BUFSIZE,
                                 trace_configs=list(trace_configs) or None)


def _in_cluster_available() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and bool(os.environ.get("KUBERNETES_SERVICE_PORT"))


def client_for(endpoint: kubeconfig.Endpoint, trace_configs: Sequence[aiohttp.TraceConfig] = ()) -> KubeClient:
    tokens = kubeconfig.TokenSource(token=endpoint.token, token_file=endpoint.token_file)
    return KubeClient(host=endpoint.host, session=_session(endpoint.ssl_context, trace_configs),
                      auth=tokens.headers, server_hostname=endpoint.server_hostname, proxy=endpoint.proxy)


async def _library_client(settings: config.Settings, trace_configs: Sequence[aiohttp.TraceConfig]) -> KubeClient:
    """kubernetes-asyncio's kubeconfig loader, for what `kubeconfig` does not cover (exec and
    auth-provider users, merged $KUBECONFIG files). Imported here only: it loads the whole library."""
    from kubernetes_asyncio import config as kconfig
    from kubernetes_asyncio.client import Configuration

    cfg = Configuration()
    await kconfig.load_kube_config(config_file=settings.kubeconfig or None, context=settings.context or None,
                                   client_configuration=cfg, persist_config=False)
    ctx = kubeconfig.ssl_context(ca_file=cfg.ssl_ca_cert, cert=(cfg.cert_file, None), key=(cfg.key_file, None),
                                 insecure=not cfg.verify_ssl)
    return KubeClient(host=str(cfg.host), session=_session(ctx, trace_configs), auth=library_auth(cfg),
                      server_hostname=cfg.tls_server_name, proxy=cfg.proxy)


async def make_api_client(settings: config.Settings, *,
                          trace_configs: Sequence[aiohttp.TraceConfig] = ()) -> KubeClient:
    """A client whose requests run through `trace_configs`; the caller closes it (`await client.close()`)."""
    if settings.kubeconfig:
        source = "kubeconfig"
        endpoint = kubeconfig.endpoint_from_kubeconfig(settings.kubeconfig, settings.context or None)
    elif _in_cluster_available() and not settings.context:
        source = "in-cluster"
        endpoint = kubeconfig.in_cluster_endpoint()
    else:
        source = "default-kubeconfig"
        endpoint = kubeconfig.endpoint_from_kubeconfig(None, settings.context or None)
    api = client_for(endpoint, trace_configs) if endpoint else await _library_client(settings, trace_configs)
    log.info("client.configured", source=source, host=api.host, context=settings.context or None,
             loader="licensectl" if endpoint else "kubernetes-asyncio")
    return api
