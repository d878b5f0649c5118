"""virt-api stand-in: KubeVirt's VM restart subresource in front of the real apiserver.

`RestartProxy` is a reverse proxy (`licensectl_dev.testkit.proxy.ReverseProxy`) that answers
`PUT /apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}/restart` itself and
forwards everything else, so the controller under test talks to something shaped like a KubeVirt
cluster.

Upstream semantics encoded here (kubevirt/kubevirt):
- pkg/virt-api/rest/lifecycle.go `RestartVMRequestHandler` + `getChangeRequestJson`: validate the
  RestartOptions body, refuse Halted/Once run strategies and VMs without a VMI, then append
  Stop(vmi uid) + Start to status.stateChangeRequests with a JSON patch guarded by a test op.
- pkg/virt-api/rest/authorizer.go: the caller needs `update` on `virtualmachines/restart`.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

import structlog
from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from licensectl_dev.devcluster.controlplane import render_kubeconfig
from licensectl_dev.devcluster.ledger import RestartRecord
from licensectl_dev.devcluster.virt_controller import KubevirtSimulator, patch_kubevirt
from licensectl_dev.devcluster.vm_semantics import (
    GROUP,
    JSON_PATCH,
    SUBRESOURCE_GROUP,
    VERSION,
    VM_PLURAL,
    VMI_PLURAL,
    change_request_patch,
    run_strategy,
    uid_of,
)
from licensectl_dev.testkit.poll import EventuallyTimeout, eventually
from licensectl_dev.testkit.proxy import ReverseProxy

log = structlog.get_logger(__name__)

RESTART_PATH = "/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}/restart"


def _status(code: int, reason: str, message: str, *, kind: str = "virtualmachines", name: str = "") -> web.Response:
    body = {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
        "details": {"name": name, "group": "kubevirt.io", "kind": kind} if name else {},
    }
    return web.json_response(body, status=code)


class RestartProxy(ReverseProxy):
    """HTTP(S) reverse proxy on 127.0.0.1 that adds KubeVirt's VM restart subresource.

    Everything else (all verbs, streaming watches, chunked bodies) is forwarded to the apiserver
    with the caller's own credentials. Upgrade requests (exec/port-forward) are not supported.
    Set `restart_enabled = False` to look like a cluster without the subresource (404), and
    `hang_up_after_restarts = n` to break the connection after acting on the next n restarts, once
    the VM runs its new VMI and before answering: the caller cannot know the restart happened, and a
    client that sends it again stops the new VMI.
    """

    def __init__(
        self,
        simulator: KubevirtSimulator,
        *,
        upstream: str,
        ca_path: str | os.PathLike[str],
        token: str,
        restart_enabled: bool = True,
        tls: tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
    ) -> None:
        """`tls` = (cert, key) signed by the cluster CA makes the proxy serve HTTPS; Go clients
        (kubectl, client-go) need it, as they never send a bearer token over plain HTTP."""
        super().__init__(upstream, ca_path=ca_path, tls=tls, name="kubevirt-restart")
        self.simulator = simulator
        self.record = simulator.record
        self._token = token
        self.restart_enabled = restart_enabled
        self.hang_up_after_restarts = 0
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._co = client.CustomObjectsApi(simulator.api)

    def kubeconfig_for(self, token: str) -> str:
        """A kubeconfig that reaches the cluster through this proxy with the given bearer token."""
        ca = Path(self.ca_path).read_bytes() if self.tls and self.ca_path else None
        return render_kubeconfig(self.url, ca, token=token, name="licensectl-dev-kubevirt")

    @property
    def kubeconfig_path(self) -> Path:
        """A kubeconfig (admin credential) pointing at the proxy."""
        if self._tmp is None:
            raise RuntimeError("proxy not started")
        return Path(self._tmp.name) / "kubeconfig"

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_route("PUT", RESTART_PATH, self._restart)
        router.add_route("GET", "/apis/subresources.kubevirt.io/v1", self._discovery)

    async def start(self) -> None:
        await super().start()
        self._tmp = tempfile.TemporaryDirectory(prefix="licensectl-kv-proxy-")
        self.kubeconfig_path.write_text(self.kubeconfig_for(self._token))
        self.kubeconfig_path.chmod(0o600)
        log.info("restart proxy started", url=self.url, upstream=self.upstream)

    async def stop(self) -> None:
        await super().stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def __aenter__(self) -> RestartProxy:
        await self.start()
        return self

    async def _discovery(self, request: web.Request) -> web.StreamResponse:
        if not self.restart_enabled:
            return await self.forward(request)
        return web.json_response({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{SUBRESOURCE_GROUP}/v1",
            "resources": [{"name": "virtualmachines/restart", "singularName": "", "namespaced": True,
                           "kind": "RestartOptions", "verbs": ["update"]}],
        })

    async def _authorized(self, request: web.Request, ns: str, name: str) -> web.Response | None:
        """virt-api authorizer.go: a SubjectAccessReview for update on virtualmachines/restart.

        Done as a SelfSubjectAccessReview with the caller's own credentials (the proxy sees the
        bearer token, not the aggregator's identity headers)."""
        review = {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {
                "namespace": ns, "verb": "update", "group": SUBRESOURCE_GROUP, "version": "v1",
                "resource": "virtualmachines", "subresource": "restart", "name": name}},
        }
        headers = {k: v for k, v in self.upstream_headers(request).items()
                   if k.lower() in ("authorization",) or k.lower().startswith("impersonate-")}
        headers["Content-Type"] = "application/json"
        async with self.session.post(
            self.upstream + "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            json=review, headers=headers,
        ) as r:
            if r.status == 401:
                return _status(401, "Unauthorized", "Unauthorized")
            if r.status >= 300:
                return _status(r.status, "InternalError", f"access review failed: HTTP {r.status}")
            result = await r.json()
        if not (result.get("status") or {}).get("allowed"):
            msg = (f'virtualmachines.{SUBRESOURCE_GROUP} "{name}" is forbidden: User cannot update '
                   f'resource "virtualmachines/restart" in API group "{SUBRESOURCE_GROUP}" in the '
                   f'namespace "{ns}"')
            return _status(403, "Forbidden", msg, name=name)
        return None

    async def _restart(self, request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if not self.restart_enabled:
            return await self.forward(request)
        denied = await self._authorized(request, ns, name)
        if denied is not None:
            self._log(ns, name, "", denied.status, denied.text or "", None)
            return denied
        resp, vmi_uid, grace = await self._do_restart(request, ns, name)
        body = resp.text if resp.status != 202 else ""
        reason = ""
        if resp.status != 202 and body:
            with contextlib.suppress(ValueError):
                reason = str(json.loads(body).get("message", ""))
        self._log(ns, name, vmi_uid, resp.status, reason, grace)
        if resp.status == 202 and self.hang_up_after_restarts > 0 and request.transport is not None:
            self.hang_up_after_restarts -= 1
            await self._replaced(ns, name, vmi_uid)
            log.info("restart answer dropped", namespace=ns, vm=name, vmi_uid=vmi_uid)
            request.transport.abort()
        return resp

    async def _replaced(self, ns: str, name: str, old_uid: str) -> None:
        """Wait (at most 10 s) until the VM runs a VMI other than `old_uid`."""

        async def new_vmi() -> bool:
            try:
                vmi = await self._co.get_namespaced_custom_object(GROUP, VERSION, ns, VMI_PLURAL, name)
            except ApiException:
                return False
            return uid_of(vmi) != old_uid

        with contextlib.suppress(EventuallyTimeout):
            await eventually(new_vmi, timeout=10.0, interval=0.05, what=f"{ns}/{name} runs a new VMI")

    def _log(self, ns: str, name: str, vmi_uid: str, status: int, reason: str, grace: int | None) -> None:
        self.record.restarts.append(RestartRecord(time.monotonic(), ns, name, vmi_uid, status, reason, grace))
        if status == 202:
            self.record.vm_down(ns, name, time.monotonic())
        log.info("restart request", namespace=ns, vm=name, vmi_uid=vmi_uid, status=status, reason=reason)

    async def _do_restart(self, request: web.Request, ns: str, name: str) -> tuple[web.Response, str, int | None]:
        """lifecycle.go RestartVMRequestHandler, step by step."""
        grace: int | None = None
        raw = await request.read()
        if raw.strip():
            try:
                opts = json.loads(raw)
            except ValueError as e:
                return _status(400, "BadRequest", f"Can not unmarshal Request body to struct: {e}"), "", None
            g = opts.get("gracePeriodSeconds") if isinstance(opts, dict) else None
            if g is not None:
                grace = int(g)
                if grace > 0:
                    return _status(400, "BadRequest",
                                   "For force restart, only gracePeriod=0 is supported for now"), "", grace
                if grace < 0:
                    return _status(400, "BadRequest", "gracePeriod has to be greater or equal to 0"), "", grace
        try:
            vm = await self._co.get_namespaced_custom_object(GROUP, VERSION, ns, VM_PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return _status(404, "NotFound", f'virtualmachines.kubevirt.io "{name}" not found', name=name), "", grace
            raise
        strategy = run_strategy(vm)
        if strategy in ("Halted", "Once"):
            return _status(409, "Conflict", f'Operation cannot be fulfilled on virtualmachine.kubevirt.io "{name}": '
                           f"RunStategy {strategy} does not support manual restart requests", name=name), "", grace
        try:
            vmi = await self._co.get_namespaced_custom_object(GROUP, VERSION, ns, VMI_PLURAL, name)
        except ApiException as e:
            if e.status != 404:
                raise
            return _status(409, "Conflict", f'Operation cannot be fulfilled on virtualmachine.kubevirt.io "{name}": '
                           "VM is not running: Halted", name=name), "", grace
        vmi_uid = uid_of(vmi)
        try:
            patch = change_request_patch(vm, [{"action": "Stop", "uid": vmi_uid}, {"action": "Start"}])
        except ValueError as e:
            # Upstream wraps this in NewInternalError: HTTP 500, not 409.
            return _status(500, "InternalError", f"Internal error occurred: {e}", name=name), vmi_uid, grace
        try:
            await patch_kubevirt(self._co, ns, VM_PLURAL, name=name, body=patch, content_type=JSON_PATCH, status=True)
        except ApiException as e:
            if e.status in (409, 422):  # jsonpatch test failed: a concurrent change request
                return _status(409, "Conflict", f'Operation cannot be fulfilled on virtualmachine.kubevirt.io '
                               f'"{name}": jsonpatch test operation does not apply', name=name), vmi_uid, grace
            return _status(500, "InternalError", f"Internal error occurred: HTTP {e.status}", name=name), vmi_uid, grace
        if grace == 0:
            self.simulator.force_stop(vmi_uid)
        return web.Response(status=202), vmi_uid, grace

