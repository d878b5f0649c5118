"""The VMI admission webhooks: an AdmissionReview in, the license volumes to add (and warnings) out.

Thin shell around `licensectl.core.delivery` and `licensectl.core.boot_image`: parse and bound the
request, ask the controller's caches, answer. The mutating webhook refuses nothing
(docs/design.md#webhook-adds-only): every well-formed review is allowed, with a JSONPatch when a license
volume is due and a warning when a vGPU VMI boots from an image not marked as carrying the vGPU guest
driver; anything it cannot judge (caches not synced yet, a malformed object) is admitted unchanged,
and the backstop catches it later. A VMI it delivers to (or finds carrying its volume) also gets the
delivery stamp (docs/design.md#delivery-stamp). A dry-run probe VMI in licensectl's own namespace is
answered with one annotation, so the leader has evidence that the apiserver reaches a webhook that
mutates before it restarts anything (docs/design.md#delivery-readiness). Only the opt-in validating
webhook (`VALIDATE_PATH`, --vgpu-driver-check=enforce) denies, and only such a VMI
(docs/design.md#boot-image-mark). Every replica answers, leader or not, so admission never waits for
an election.

It is served from its own thread and event loop (`WebhookServer`): a VMI creation waits on this
answer, and must not queue behind a reconcile pass that holds the controller's loop for tens of
milliseconds at scale (docs/design.md#webhook-thread). Decisions only read the caches (dict lookups
and attribute reads, atomic under the GIL); everything with a side effect goes back to the
controller's loop through the `on_admission` callback's owner.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from licensectl import logs
from licensectl.core.boot_image import Judgement, Verdict, denial, warning
from licensectl.core.delivery import Delivery, is_probe, probe_patch
from licensectl.kube.serving_tls import load_pair, server_context
from licensectl.serve.http import start_site

log = logs.get(__name__)

PATH = "/mutate-virtualmachineinstances"
VALIDATE_PATH = "/validate-virtualmachineinstances"
# VirtualMachine CREATE and UPDATE: the boot image warning only, never a patch, never a denial.
VM_PATH = "/warn-virtualmachines"
# A VMI spec is rarely over a few tens of KiB; etcd's own object limit is 1.5 MiB. Anything larger
# is not a VMI the apiserver would store, and the body is read into memory.
MAX_BODY = 3 * 1024 * 1024
ADMISSION_VERSION = "admission.k8s.io/v1"
SWITCH_INTERVAL = 0.001


@dataclass(frozen=True, slots=True)
class Admission:
    """One answered review, for metrics and Events (names only, never object content)."""

    namespace: str
    name: str  # metadata.name; "" while the apiserver has not named it yet (generateName)
    result: str  # mutated | stamped | unchanged | not_ready | ignored | probe
    delivery: Delivery | None
    seconds: float
    dry_run: bool = False  # a dry run must cause no side effect (sideEffects: None): no Event
    boot: Judgement | None = None  # the boot image of a vGPU VMI; None: not checked


@dataclass(frozen=True, slots=True)
class Validation:
    """One answered review of the enforce webhook: denied when a vGPU VMI's boot image is unmarked."""

    namespace: str
    name: str
    denied: bool
    boot: Judgement | None
    seconds: float
    dry_run: bool = False


Decide = Callable[[str, Mapping[str, Any]], Delivery | None]
# The boot image of a VMI the webhook handles; None: not a vGPU VMI, the check is off, or no caches yet.
CheckBoot = Callable[[str, Mapping[str, Any]], Judgement | None]


@dataclass(frozen=True, slots=True)
class _Review:
    uid: str
    namespace: str
    obj: dict[str, Any] | None  # None: not a VMI CREATE (registered for those only; answered, left alone)
    dry_run: bool


def _name_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def admission_result(delivery: Delivery | None) -> str:
    """The `result` label: a volume added, only the stamp set, nothing to change, or no decision."""
    if delivery is None:
        return "not_ready"
    return "mutated" if delivery.mutated else ("stamped" if delivery.patch else "unchanged")


def review_response(uid: str, delivery: Delivery | None, *, warnings: tuple[str, ...] = (),
                    patch: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    ops = delivery.patch if delivery is not None else patch
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(ops)).encode()).decode()
    if warnings:
        response["warnings"] = list(warnings)
    return {"apiVersion": ADMISSION_VERSION, "kind": "AdmissionReview", "response": response}


def denied_response(uid: str, message: str) -> dict[str, Any]:
    """A refusal: the client reads `admission webhook "<name>" denied the request: <message>` (HTTP 403)."""
    return {"apiVersion": ADMISSION_VERSION, "kind": "AdmissionReview", "response": {
        "uid": uid, "allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": message}}}


async def _read_review(request: web.Request, *, kind_wanted: str = "VirtualMachineInstance",
                       operations: tuple[str, ...] = ("CREATE",)) -> _Review | web.Response:
    """The review's request, or the 400 answer to a body that is none."""
    try:
        review = await request.json(loads=json.loads)
    except (ValueError, UnicodeDecodeError):
        return web.json_response({"error": "body is not JSON"}, status=400)
    req = review.get("request") if isinstance(review, dict) else None
    uid = req.get("uid") if isinstance(req, dict) else None
    if not isinstance(req, dict) or not isinstance(uid, str) or not uid:
        return web.json_response({"error": "not an AdmissionReview request"}, status=400)
    obj = req.get("object")
    namespace = req.get("namespace")
    kind = (req.get("kind") or {}).get("kind") if isinstance(req.get("kind"), dict) else None
    if (req.get("operation") not in operations or kind != kind_wanted or not isinstance(obj, dict)
            or not isinstance(namespace, str)):
        return _Review(uid, namespace if isinstance(namespace, str) else "", None, False)
    return _Review(uid, namespace, obj, req.get("dryRun") is True)


def make_webhook_app(*, decide: Decide, on_admission: Callable[[Admission], None],
                     check_boot: CheckBoot | None = None, check_vm_boot: CheckBoot | None = None,
                     enforce: bool = False,
                     on_validation: Callable[[Validation], None] | None = None,
                     probe_namespace: str = "", probe_answer: Callable[[], str | None] | None = None,
                     ) -> web.Application:
    """The mutating webhook at PATH; at VALIDATE_PATH the enforce webhook, which denies a vGPU VMI whose
    boot image is unmarked when `enforce` is set and allows everything otherwise (a configuration
    registered without the setting must not start refusing). At VM_PATH a VirtualMachine's create or
    update gets the boot image warning of the VMI it will start (`check_vm_boot`), so a kubectl user
    sees it before any VMI exists; it is always allowed, unchanged.

    `probe_answer()` is what a delivery probe in `probe_namespace` is answered with (the replica's
    identity), or None while this replica could not deliver (caches not synced): then the probe comes
    back unchanged and the leader keeps waiting."""

    async def mutate(request: web.Request) -> web.Response:
        start = time.perf_counter()
        review = await _read_review(request)
        if isinstance(review, web.Response):
            return review
        if review.obj is None:
            on_admission(Admission(review.namespace, "", "ignored", None, time.perf_counter() - start))
            return web.json_response(review_response(review.uid, None))
        if probe_answer is not None and is_probe(review.obj, namespace=review.namespace,
                                                 own_namespace=probe_namespace, dry_run=review.dry_run):
            answer = probe_answer()
            # Counted apart from VMI reviews, answered or not: the probe's own metric says which.
            on_admission(Admission(review.namespace, "", "probe", None, time.perf_counter() - start, dry_run=True))
            return web.json_response(review_response(review.uid, None, patch=probe_patch(answer) if answer else ()))
        delivery = decide(review.namespace, review.obj)
        boot = check_boot(review.namespace, review.obj) if check_boot is not None else None
        text = warning(boot) if boot is not None else None
        result = admission_result(delivery)
        on_admission(Admission(review.namespace, _name_of(review.obj), result, delivery, time.perf_counter() - start,
                               dry_run=review.dry_run, boot=boot))
        return web.json_response(review_response(review.uid, delivery, warnings=(text,) if text else ()))

    async def validate(request: web.Request) -> web.Response:
        start = time.perf_counter()
        review = await _read_review(request)
        if isinstance(review, web.Response):
            return review
        if review.obj is None or not enforce or check_boot is None:
            return web.json_response(review_response(review.uid, None))
        # The object as stored: every mutating webhook has run, ours (which adds no boot disk) included.
        boot = check_boot(review.namespace, review.obj)
        denied = boot is not None and boot.verdict is Verdict.UNMARKED
        if on_validation is not None:
            on_validation(Validation(review.namespace, _name_of(review.obj), denied, boot,
                                     time.perf_counter() - start, dry_run=review.dry_run))
        if boot is not None and denied:
            return web.json_response(denied_response(review.uid, denial(boot)))
        return web.json_response(review_response(review.uid, None))

    async def warn_vm(request: web.Request) -> web.Response:
        review = await _read_review(request, kind_wanted="VirtualMachine", operations=("CREATE", "UPDATE"))
        if isinstance(review, web.Response):
            return review
        boot = check_vm_boot(review.namespace, review.obj) if review.obj is not None and check_vm_boot else None
        text = warning(boot) if boot is not None else None
        return web.json_response(review_response(review.uid, None, warnings=(text,) if text else ()))

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post(PATH, mutate)
    app.router.add_post(VM_PATH, warn_vm)
    app.router.add_post(VALIDATE_PATH, validate)
    return app


class WebhookServer:
    """The webhook app on a dedicated thread with its own event loop and its own SSLContext.

    `reload(cert, key)` may be called from any thread (ServingTLS.subscribe): the pair is loaded on
    the server's own loop, so no other thread ever touches its SSLContext during a handshake.
    """

    def __init__(self, app: web.Application, address: str) -> None:
        self._app = app
        self._address = address
        self.context = server_context()
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._pending: tuple[bytes, bytes] | None = None
        self._lock = threading.Lock()

    def reload(self, cert: bytes, key: bytes) -> None:
        with self._lock:
            loop = self._loop
            if loop is None:
                self._pending = (cert, key)  # loaded when the thread starts
                return
        loop.call_soon_threadsafe(self._load, cert, key)

    def _load(self, cert: bytes, key: bytes) -> None:
        try:
            load_pair(self.context, cert, key)
        except (ssl.SSLError, OSError) as e:  # ServingTLS validated the pair; keep serving the old one
            log.error("webhook could not load the serving certificate", error=type(e).__name__)

    def start(self, timeout: float = 30.0) -> int:
        """Bind and serve; returns the bound port (the address may say port 0)."""
        # The interpreter hands the GIL over every "switch interval" (5 ms by default); an answer
        # needs it a few times, so a CPU-bound reconcile pass on the main thread would add that
        # several times over. 1 ms bounds the wait (docs/design.md#webhook-thread).
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        self._thread = threading.Thread(target=self._run, name="licensectl-webhook", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError("webhook listener did not start")
        if self._error is not None:
            raise self._error
        return self.port

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            with self._lock:
                self._loop = loop
                pending, self._pending = self._pending, None
            if pending is not None:
                self._load(*pending)
            self._runner, self.port = loop.run_until_complete(
                start_site(self._app, self._address, ssl_context=self.context))
        except BaseException as e:  # reported to start(), which re-raises in the caller's thread
            self._error = e
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            if self._runner is not None:
                loop.run_until_complete(self._runner.cleanup())
            loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
