"""One TLS machinery for both HTTPS listeners (admission webhook, guest reports).

The certificate lives in one Secret in licensectl's namespace (docs/operations.md#serving-tls):

* `secret` mode: an issuer such as cert-manager writes it (tls.crt, tls.key, ca.crt); licensectl
  only watches it and never writes it.
* `self-managed` mode: licensectl keeps its own CA and leaf there. Any replica may create the Secret
  when it is absent (the apiserver picks one winner); only the leader renews the leaf and keeps the
  caBundle of the MutatingWebhookConfiguration equal to the CA, and that of the
  ValidatingWebhookConfiguration of the same name with --vgpu-driver-check=enforce.

In both modes the leader checks those configurations: a missing one, a webhook without a caBundle, or
one its RBAC forbids it to read or patch (a wrong --webhook-configuration, HTTP 403) is a Warning Event,
the `licensectl_webhook_configuration_problem` gauge and an alert
(docs/operations.md#webhook-configuration), never only a log line.

Every replica serves from one `ssl.SSLContext` that is reloaded in place, so listeners started
once present a renewed certificate on their next handshake without a restart. Failures are logged
and counted, never raised out of the watch loop.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import functools
import hashlib
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from licensectl import config, logs
from licensectl.core import certs
from licensectl.core.delivery import (
    CONFIGURATION_FORBIDDEN,
    CONFIGURATION_MISSING,
    CONFIGURATION_PROBLEMS,
    configuration_problem,
)
from licensectl.core.model import ANN_TLS, MODE_SELF_MANAGED, TLSSecret
from licensectl.core.ports import EventSink, InvolvedObject
from licensectl.core.reasons import EventType, Reason
from licensectl.kube.api import (
    AdmissionregistrationV1Api,
    AnyClient,
    ApiException,
    CoreV1Api,
    absent_on_404,
)
from licensectl.kube.errors import Conflict, Forbidden, is_status
from licensectl.kube.projections import tls_secret_from
from licensectl.kube.raw import RawApi
from licensectl.kube.tasks import cancel_and_wait
from licensectl.kube.watch import Informer
from licensectl.metrics import GaugeSample, Metrics

log = logs.get(__name__)

MODE_SECRET = "secret"
KEY_CERT = "tls.crt"
KEY_KEY = "tls.key"
KEY_CA = "ca.crt"
KEY_CA_KEY = "ca.key"
SECRET_TYPE_TLS = "kubernetes.io/tls"
WEBHOOK_SERVICE = "licensectl-webhook"
REPORTS_SERVICE = "licensectl-reports"
RECHECK_SECONDS = 60.0
RETRY_SECONDS = 5.0

# licensectl_serving_cert_reloads_total{result}
LOADED = "loaded"
INVALID = "invalid"
MISSING = "missing"
FOREIGN = "foreign"
ERROR = "error"
RESULTS = (LOADED, INVALID, MISSING, FOREIGN, ERROR)


# -- pure helpers -----------------------------------------------------------------------------------
def serving_hosts(namespace: str, extra: str) -> tuple[str, ...]:
    """SANs of the self-managed leaf: both Services' in-cluster names, then the configured extras."""
    base = [f"{svc}.{namespace}.svc{suffix}" for svc in (WEBHOOK_SERVICE, REPORTS_SERVICE)
            for suffix in ("", ".cluster.local")]
    return certs.parse_hosts(",".join([*base, extra]))


def self_managed_secret(*, namespace: str, name: str, ca: certs.KeyPair, leaf: certs.KeyPair) -> dict[str, Any]:
    """The Secret body of a fresh self-managed CA and leaf (cert-manager's layout plus ca.key)."""
    data = {KEY_CA: ca.cert_pem, KEY_CA_KEY: ca.key_pem, KEY_CERT: leaf.cert_pem, KEY_KEY: leaf.key_pem}
    return {"apiVersion": "v1", "kind": "Secret", "type": SECRET_TYPE_TLS,
            "metadata": {"name": name, "namespace": namespace, "annotations": {ANN_TLS: MODE_SELF_MANAGED}},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def ca_bundle_patch(webhook_configuration: Mapping[str, Any], ca_pem: bytes) -> list[dict[str, Any]]:
    """JSON patch setting every webhook's clientConfig.caBundle to `ca_pem`; [] when all already match.

    The patch first tests the resourceVersion, so indexes cannot shift under it.
    """
    want = base64.b64encode(ca_pem).decode()
    ops: list[dict[str, Any]] = []
    hooks = webhook_configuration.get("webhooks") or []
    for i, hook in enumerate(hooks if isinstance(hooks, list) else []):
        cc = hook.get("clientConfig") if isinstance(hook, Mapping) else None
        if not isinstance(cc, Mapping):
            ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig", "value": {"caBundle": want}})
        elif cc.get("caBundle") != want:
            ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": want})
    if not ops:
        return []
    rv = (webhook_configuration.get("metadata") or {}).get("resourceVersion")
    test = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}] if rv else []
    return test + ops


def _fingerprint(cert: bytes, key: bytes, ca: bytes) -> str:
    h = hashlib.sha256()
    for part in (cert, key, ca):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def server_context() -> ssl.SSLContext:
    """A server-side context as both HTTPS listeners use it (TLS 1.2 or newer), no certificate yet."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def load_pair(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """Load a PEM pair into `context` in place: new handshakes use it, open connections keep theirs.

    `load_cert_chain` wants files: they live 0600 in a fresh 0700 directory for the call only, so
    concurrent callers never share a path and no key material stays on disk."""
    with tempfile.TemporaryDirectory(prefix="licensectl-tls-") as tmp:
        paths = (os.path.join(tmp, KEY_CERT), os.path.join(tmp, KEY_KEY))
        for path, content in zip(paths, (cert, key), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(content)
        context.load_cert_chain(paths[0], paths[1])


# -- the shell --------------------------------------------------------------------------------------
class ServingTLS:
    """The serving certificate of this process: `context` for listeners, `ca_bundle` for clients."""

    def __init__(self, api: AnyClient, settings: config.Settings, *, is_leader: Callable[[], bool],
                 clock: Callable[[], dt.datetime], metrics: Metrics | None = None,
                 events: EventSink | None = None, on_ca_change: Callable[[], None] | None = None,
                 recheck_seconds: float = RECHECK_SECONDS,
                 start_timeout: float = 10.0) -> None:
        self.settings = settings
        self.namespace = settings.namespace
        self.secret_name = settings.tls_secret
        self.mode = settings.tls_mode
        if self.mode not in (MODE_SELF_MANAGED, MODE_SECRET):
            raise ValueError(f"tls_mode must be {MODE_SELF_MANAGED} or {MODE_SECRET}, not {self.mode!r}")
        self.hosts = serving_hosts(settings.namespace, settings.tls_hosts)
        self._core: Any = RawApi(CoreV1Api(api))
        self._admission: Any = RawApi(AdmissionregistrationV1Api(api))
        self._is_leader = is_leader
        self._clock = clock
        self._metrics = metrics
        self._events = events
        self._on_ca_change = on_ca_change
        self._recheck = recheck_seconds
        self._start_timeout = start_timeout
        self._dry_run = settings.dry_run
        self.context = server_context()
        self.ca_bundle: bytes = b""
        self.ready = False
        self.error: str | None = "not started"
        self.serial: int | None = None
        self.not_after: dt.datetime | None = None
        self._fingerprint = ""
        self._pair: tuple[bytes, bytes] | None = None  # the loaded cert + key, for subscribers
        self._subscribers: list[Callable[[bytes, bytes], None]] = []
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._logged: set[str] = set()  # one-time log lines (absent TLS Secret, ...)
        self._tracebacks = logs.TracebackLimit()
        # (kind, name) -> its problem (core.delivery.configuration_problem), as the leader last saw it.
        self.configurations: dict[tuple[str, str], str | None] = {}
        self.informer: Informer[TLSSecret] = Informer(
            f"tls-secret:{self.namespace}/{self.secret_name}",
            functools.partial(CoreV1Api(api).list_namespaced_secret, self.namespace), tls_secret_from,
            field_selector=f"metadata.name={self.secret_name}", on_change=lambda _k, _o, _n: self._wake.set())
        if metrics is not None:
            for r in RESULTS:
                metrics.serving_cert_reloads.labels(r)

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load what exists (creating it in self-managed mode), then keep watching. Never raises on
        cluster trouble and never waits longer than `start_timeout` for the Secret."""
        self._tasks.append(asyncio.create_task(self.informer.run(), name="informer-tls-secret"))
        if await self.informer.wait_synced(self._start_timeout):
            await self._step_guarded()
        else:
            self._set_error(f"could not list Secret {self.namespace}/{self.secret_name} yet")
        self._tasks.append(asyncio.create_task(self._run(), name="serving-tls"))
        if not self.ready:
            log.warning("serving TLS not ready yet", mode=self.mode, secret=f"{self.namespace}/{self.secret_name}",
                        reason=self.error)

    async def stop(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks.clear()

    async def on_leadership(self, leader: bool) -> None:
        """A new leader checks renewal and the caBundle at once."""
        self.wake()

    def subscribe(self, on_pair: Callable[[bytes, bytes], None]) -> None:
        """Call `on_pair(cert, key)` now (if loaded) and on every new certificate: for a listener
        that serves from another thread with its own SSLContext (an SSLContext must not be changed
        while another thread handshakes with it)."""
        self._subscribers.append(on_pair)
        if self._pair is not None:
            on_pair(*self._pair)

    def wake(self) -> None:
        """Re-check now instead of at the next periodic pass."""
        self._wake.set()

    # -- loop ---------------------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._next_check_seconds())
            self._wake.clear()
            await self._step_guarded()

    def _next_check_seconds(self) -> float:
        """RETRY_SECONDS while something is wrong, the periodic recheck otherwise: a missing or
        incomplete configuration is usually being installed at that moment (Helm applies webhook
        configurations after the Deployment; a hoster re-applies one), so its problem clears within
        seconds of the fix instead of staying reported until the next periodic pass."""
        troubled = self._is_leader() and any(p is not None for p in self.configurations.values())
        return min(self._recheck, RETRY_SECONDS) if troubled or not self.ready else self._recheck

    async def _step_guarded(self) -> None:
        try:
            await self._step()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self._count(ERROR)
            log.warning("serving TLS check failed", mode=self.mode,
                        **logs.failure_fields(e, traceback=self._tracebacks.due("serving-tls", e)),
                        status=getattr(e, "status", None))

    async def _step(self) -> None:
        if not self.informer.synced:
            return
        secret = self.informer.cache.get((self.namespace, self.secret_name))
        if self.mode == MODE_SECRET:
            if secret is None:
                self._absent()
            else:
                self._load(secret)
            if self._is_leader():
                await self._sync_ca_bundle(b"")  # the issuer's injector sets it: check only
            return
        if secret is None:
            secret = await self._create()
            if secret is None:
                return
        if not secret.self_managed:
            await self._foreign(secret)
            return
        self._load(secret)
        if self._is_leader():
            if await self._renew_if_needed(secret):
                return  # the watch delivers the renewed Secret; the caBundle follows on that pass
            await self._sync_ca_bundle(secret.data.get(KEY_CA, b""))

    # -- loading ------------------------------------------------------------------------------------
    def _load(self, secret: TLSSecret) -> None:
        cert, key = secret.data.get(KEY_CERT, b""), secret.data.get(KEY_KEY, b"")
        ca = secret.data.get(KEY_CA, b"")
        fp = _fingerprint(cert, key, ca)
        if fp == self._fingerprint:
            return
        if not cert or not key or not certs.key_matches(certs.KeyPair(cert_pem=cert, key_pem=key)):
            self._set_error(f"Secret {self.namespace}/{self.secret_name} has no usable {KEY_CERT}/{KEY_KEY} pair",
                            once_key=f"invalid:{fp}", result=INVALID)
            return
        try:
            self._load_chain(cert, key)
        except (ssl.SSLError, OSError) as e:
            self._set_error(f"loading the serving certificate failed: {type(e).__name__}",
                            once_key=f"error:{fp}", result=ERROR)
            return
        self._fingerprint = fp
        self._pair = (cert, key)
        for on_pair in self._subscribers:
            on_pair(cert, key)
        ca_changed = ca != self.ca_bundle
        self.ca_bundle = ca
        self.serial = certs.serial_of(cert)
        self.not_after = certs.not_after(cert)
        self.ready = True
        self.error = None
        self._count(LOADED)
        if self._metrics is not None and self.not_after is not None:
            self._metrics.serving_cert_expiry.set(self.not_after.timestamp())
        log.info("serving certificate loaded", secret=f"{self.namespace}/{self.secret_name}", mode=self.mode,
                 serial=f"{self.serial:x}" if self.serial is not None else None,
                 not_after=self.not_after.isoformat() if self.not_after else None, ca_bundle=bool(ca))
        if ca_changed and self._on_ca_change is not None:
            self._on_ca_change()  # replicas carry the CA to guests

    def _load_chain(self, cert: bytes, key: bytes) -> None:
        load_pair(self.context, cert, key)

    def _absent(self) -> None:
        what = f"Secret {self.namespace}/{self.secret_name} does not exist"
        if self.ready:
            if "absent-loaded" not in self._logged:
                self._logged.add("absent-loaded")
                log.warning("TLS secret deleted; keeping the loaded certificate", secret=f"{self.namespace}/"
                            f"{self.secret_name}")
            return
        self._set_error(f"{what}; waiting for the issuer to write it", once_key="absent", result=MISSING)

    async def _foreign(self, secret: TLSSecret) -> None:
        msg = (f"Secret {self.namespace}/{self.secret_name} exists but was not created by licensectl "
               f"(no {ANN_TLS}: {MODE_SELF_MANAGED} annotation); it is left untouched. Delete it, or use "
               f"--tls-mode=secret if an issuer writes it.")
        self.ready = False
        self._fingerprint = ""
        first = f"foreign:{secret.uid}" not in self._logged
        self._set_error(msg, once_key=f"foreign:{secret.uid}", result=FOREIGN)
        if first and self._events is not None:
            await self._events.emit(InvolvedObject("v1", "Secret", self.namespace, self.secret_name, secret.uid),
                                    EventType.WARNING, Reason.FOREIGN_TLS_SECRET, msg)

    def _set_error(self, message: str, *, once_key: str | None = None, result: str | None = None) -> None:
        self.error = message
        if once_key is not None and once_key in self._logged:
            return
        if once_key is not None:
            self._logged.add(once_key)
        if result is not None:
            self._count(result)
        log.error("serving TLS problem", mode=self.mode, error=message)

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.serving_cert_reloads.labels(result).inc()

    # -- self-managed writes ------------------------------------------------------------------------
    async def _create(self) -> TLSSecret | None:
        """Create CA + leaf; on 409 another replica won: read and use its Secret."""
        if self._dry_run:
            self._set_error("dry run: not creating the TLS Secret", once_key="dry-run")
            return None
        now = self._clock()
        ca = certs.new_ca(now=now)
        body = self_managed_secret(namespace=self.namespace, name=self.secret_name, ca=ca,
                                   leaf=certs.new_leaf(ca, self.hosts, now=now))
        try:
            obj = await self._core.create_namespaced_secret(self.namespace, body)
            log.info("self-managed TLS secret created", secret=f"{self.namespace}/{self.secret_name}")
        except Conflict:
            obj = await self._core.read_namespaced_secret(self.secret_name, self.namespace)
            log.info("self-managed TLS secret created by another replica", secret=f"{self.namespace}/"
                     f"{self.secret_name}")
        return tls_secret_from(obj)

    async def _renew_if_needed(self, secret: TLSSecret) -> bool:
        """Leader only: a new leaf (same CA) when the current one is due; a new CA only if it is unusable."""
        now = self._clock()
        ca = certs.KeyPair(cert_pem=secret.data.get(KEY_CA, b""), key_pem=secret.data.get(KEY_CA_KEY, b""))
        cert = secret.data.get(KEY_CERT, b"")
        ca_ok = certs.key_matches(ca) and not certs.needs_renewal_ca(ca.cert_pem, now)
        if ca_ok and certs.signed_by(cert, ca.cert_pem) and not certs.needs_renewal(cert, self.hosts, now):
            return False
        if self._dry_run:
            return False
        if not ca_ok:
            log.warning("self-managed CA unusable or expiring; issuing a new CA", secret=f"{self.namespace}/"
                        f"{self.secret_name}")
            ca = certs.new_ca(now=now)
        leaf = certs.new_leaf(ca, self.hosts, now=now)
        data = {KEY_CERT: leaf.cert_pem, KEY_KEY: leaf.key_pem, KEY_CA: ca.cert_pem, KEY_CA_KEY: ca.key_pem}
        # Replace (RBAC grants update, not patch) the exact version judged above: the resourceVersion
        # is the precondition, so a concurrent change yields 409 and a fresh look, never a lost write.
        obj = await self._core.read_namespaced_secret(self.secret_name, self.namespace)
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion") != secret.resource_version or (meta.get("annotations") or {}).get(
                ANN_TLS) != MODE_SELF_MANAGED:
            return True  # changed since the cache saw it: the watch brings the new version
        obj["data"] = {**(obj.get("data") or {}), **{k: base64.b64encode(v).decode() for k, v in data.items()}}
        try:
            await self._core.replace_namespaced_secret(self.secret_name, self.namespace, obj)
        except Conflict:
            log.info("TLS secret changed while renewing; re-checking", secret=f"{self.namespace}/"
                     f"{self.secret_name}")
            return True
        log.info("serving certificate renewed", secret=f"{self.namespace}/{self.secret_name}",
                 serial=f"{certs.serial_of(leaf.cert_pem):x}", not_after=str(certs.not_after(leaf.cert_pem)))
        return True

    async def _sync_ca_bundle(self, ca_pem: bytes) -> None:
        """Leader only: every webhook of the configurations trusts our CA (read, compare, patch if different)."""
        name = self.settings.webhook_configuration
        if not name or self._dry_run:
            return
        await self._sync_one("MutatingWebhookConfiguration", name, ca_pem,
                             self._admission.read_mutating_webhook_configuration,
                             self._admission.patch_mutating_webhook_configuration)
        if self.settings.vgpu_driver_check == "enforce":
            await self._sync_one("ValidatingWebhookConfiguration", name, ca_pem,
                                 self._admission.read_validating_webhook_configuration,
                                 self._admission.patch_validating_webhook_configuration)

    async def _sync_one(self, kind: str, name: str, ca_pem: bytes, read: Callable[[str], Awaitable[Any]],
                        patch_call: Callable[[str, Any], Awaitable[Any]]) -> None:
        try:
            obj = await absent_on_404(read(name))
        except ApiException as e:
            if not is_status(e, Forbidden):
                raise
            await self._configuration_state(kind, name, CONFIGURATION_FORBIDDEN, None, verb="get")
            return
        problem = configuration_problem(obj)
        patch = ca_bundle_patch(obj, ca_pem) if obj is not None and ca_pem else []
        if patch:
            try:
                await patch_call(name, patch)
            except ApiException as e:
                if is_status(e, Forbidden):  # a problem of its own, named, not a failed step
                    await self._configuration_state(kind, name, CONFIGURATION_FORBIDDEN, obj, verb="patch")
                    return
                await self._configuration_state(kind, name, problem, obj)  # a refused patch stays visible
                raise
            log.info("webhook caBundle updated", kind=kind, name=name, webhooks=len(patch) - 1)
            problem = None
        await self._configuration_state(kind, name, problem, obj)

    async def _configuration_state(self, kind: str, name: str, problem: str | None, obj: Any, *,
                                   verb: str = "") -> None:
        """Record a configuration's problem: a Warning Event on it (aggregated by the recorder) and a log
        line when it changes; a cleared problem is logged once."""
        before = self.configurations.get((kind, name), "unknown")
        self.configurations[(kind, name)] = problem
        if problem is None:
            if before not in (None, "unknown"):
                log.info("webhook configuration fixed", kind=kind, name=name, was=before)
            return
        if problem == CONFIGURATION_MISSING:
            msg = (f"{kind} {name} does not exist: the apiserver does not call licensectl when VMIs are created, "
                   f"so they start without their license volume. Install it under this name, or set "
                   f"--webhook-configuration (Helm: config.webhookConfiguration) to its name.")
        elif problem == CONFIGURATION_FORBIDDEN:
            msg = (f"licensectl may not {verb} {kind} {name} (HTTP 403): its RBAC grants get and patch on the "
                   f"configuration it was installed with only, so it cannot keep this one's caBundle. Set "
                   f"--webhook-configuration (Helm: config.webhookConfiguration) to the installed configuration's "
                   f"name, or grant get and patch on {name}.")
        else:
            fix = ("Check that the issuer's CA injector (cert-manager's cainjector) sets it."
                   if self.mode == MODE_SECRET
                   else "licensectl sets it itself: check its RBAC (get and patch on this name).")
            msg = (f"{kind} {name} has a webhook without a caBundle: the apiserver cannot verify licensectl's "
                   f"certificate and admits VMIs without their license volume (failurePolicy Ignore). {fix}")
        if before != problem:
            log.warning("webhook configuration problem", kind=kind, name=name, problem=problem)
        if self._events is not None:
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            raw_uid = meta.get("uid") if isinstance(meta, dict) else None
            uid = raw_uid if isinstance(raw_uid, str) else ""
            await self._events.emit(InvolvedObject("admissionregistration.k8s.io/v1", kind, "", name, uid),
                                    EventType.WARNING, Reason.WEBHOOK_CONFIGURATION_PROBLEM, msg)

    def samples(self) -> list[GaugeSample]:
        """The leader's view of the configurations it checks (a standby checks none)."""
        if not self._is_leader():
            return []
        return [GaugeSample("webhook_configuration_problem", (("kind", kind), ("name", name), ("problem", p)),
                            1.0 if problem == p else 0.0)
                for (kind, name), problem in sorted(self.configurations.items()) for p in CONFIGURATION_PROBLEMS]

    def configuration_status(self) -> list[dict[str, str | None]]:
        return [{"kind": kind, "name": name, "problem": problem}
                for (kind, name), problem in sorted(self.configurations.items())]
