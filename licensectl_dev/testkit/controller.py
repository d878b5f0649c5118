"""licensectl as a real process (`python -m licensectl run`), for e2e tests, fault scenarios and benchmarks.

Built on `ManagedProcess`: own process group, environment hygiene, one log file that every
incarnation appends to (so a restarted controller's whole story can be scanned afterwards).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api

from licensectl_dev.devcluster import webhook as webhook_registration
from licensectl_dev.devcluster.controlplane import free_port
from licensectl_dev.testkit.metrics_text import Scrape, parse_metrics
from licensectl_dev.testkit.poll import EventuallyTimeout, eventually
from licensectl_dev.testkit.process import ManagedProcess, child_env
from licensectl_dev.testkit.proxy import LOOPBACK


def settings_args(**settings: Any) -> list[str]:
    """`max_unavailable="2"` -> ["--max-unavailable", "2"]; booleans become true/false."""
    out: list[str] = []
    for k, v in settings.items():
        out.append("--" + k.replace("_", "-"))
        out.append(str(v).lower() if isinstance(v, bool) else str(v))
    return out


class ControllerProcess:
    """`python -m licensectl run` against a kubeconfig on loopback ports chosen up front; restartable.

    `settings` are Settings field names -> values, passed as flags (JSON logs always). `wrapper`
    runs it under another program (e.g. faketime); ending the process ends the wrapper's whole
    group. With `keep_bodies`, every body read through `get()` is kept in `http_bodies` for a
    secrecy scan.
    """

    def __init__(self, kubeconfig: str | Path, namespace: str, *, log_dir: Path, name: str = "controller",
                 settings: Mapping[str, Any] | None = None, args: Sequence[str] = (), wrapper: Sequence[str] = (),
                 extra_env: Mapping[str, str] | None = None, metrics_port: int | None = None,
                 reports_port: int | None = None, keep_bodies: bool = False, tls_and_webhook: bool = True,
                 webhook_api: ApiClient | None = None, webhook_ca: bool = True, tree: Path | None = None) -> None:
        self.kubeconfig = str(kubeconfig)
        self.namespace = namespace
        self.name = name
        self.metrics_port = free_port() if metrics_port is None else metrics_port
        self.reports_port = free_port() if reports_port is None else reports_port
        # The admission webhook listens on its own loopback port; with `webhook_api` (an admin client)
        # it is registered on the apiserver once the controller's CA exists, and removed by close().
        # `tls_and_webhook=False` runs a version from before both existed (upgrade tests).
        self.webhook = tls_and_webhook
        self.webhook_port = free_port() if tls_and_webhook else 0
        self.args = [*settings_args(**(settings or {})), *args]
        # A --webhook-configuration in the settings names the registration too (e.g. the shipped
        # "licensectl", whose caBundle the controller keeps; `webhook_ca=False` leaves that to it).
        self.webhook_configuration = self._flag("--webhook-configuration") or f"licensectl-{namespace}-{name}"[:253]
        self._webhook_ca = webhook_ca
        self._webhook_api = webhook_api
        self._registration: asyncio.Task[None] | None = None
        self.wrapper = list(wrapper)
        self.log_path = log_dir / f"{name}.log"
        self.keep_bodies = keep_bodies
        self.http_bodies: list[tuple[str, str]] = []
        self.incarnations = 0
        self.kills = 0
        # `tree`: run another version's package (testkit.process.extract_package) with this interpreter.
        env = {**(extra_env or {}), **({"PYTHONPATH": str(tree)} if tree is not None else {})}
        self.process = ManagedProcess(self.cmd, log_path=self.log_path, env=child_env(env), name=name,
                                      **({"cwd": tree} if tree is not None else {}))
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"ControllerProcess({self.name!r}, pid={self.pid})"

    @property
    def cmd(self) -> list[str]:
        return [*self.wrapper, sys.executable, "-m", "licensectl", "run", "--kubeconfig", self.kubeconfig,
                "--namespace", self.namespace, "--metrics-address", f"{LOOPBACK}:{self.metrics_port}",
                "--reports-address", f"{LOOPBACK}:{self.reports_port}", "--log-format", "json",
                *(["--webhook-address", f"{LOOPBACK}:{self.webhook_port}",
                   "--webhook-configuration", self.webhook_configuration] if self.webhook else []),
                *([] if self._tls_hosts_set or not self.webhook else ["--tls-hosts", LOOPBACK]), *self.args]

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def started_at(self) -> float:
        return self.process.started_at

    @property
    def metrics_url(self) -> str:
        return f"http://{LOOPBACK}:{self.metrics_port}/metrics"

    def _flag(self, flag: str) -> str | None:
        """The value `args` give `flag` ("--x v" or "--x=v"; the last one wins, as in argparse)."""
        value: str | None = None
        for i, a in enumerate(self.args):
            if a == flag and i + 1 < len(self.args):
                value = self.args[i + 1]
            elif a.startswith(flag + "="):
                value = a.split("=", 1)[1]
        return value

    @property
    def _tls_hosts_set(self) -> bool:
        return self._flag("--tls-hosts") is not None

    @property
    def reports_url(self) -> str:
        """The loopback reports URL: https (the self-managed certificate names 127.0.0.1) unless plain."""
        plain = (self._flag("--reports-plain-http") or "false").strip().lower() in ("1", "true", "yes", "on")
        return f"{'http' if plain else 'https'}://{LOOPBACK}:{self.reports_port}/v1/reports"

    def alive(self) -> bool:
        return self.process.alive()

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        self.process.start()
        self.incarnations += 1
        if self._webhook_api is not None and self.webhook and self._registration is None:
            self._registration = asyncio.create_task(self._register_webhook())
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    def sigterm(self) -> None:
        """SIGTERM (what the kubelet sends), without waiting."""
        if self.alive():
            self.process.signal(signal.SIGTERM)

    async def kill(self) -> int | None:
        """SIGKILL: a crash. Nothing graceful runs; a held Lease stays held until it expires."""
        if self.alive():
            self.kills += 1
        elif not self.process.group_alive():
            return self.returncode
        return await self.process.kill()

    async def stop(self, grace: float = 40.0) -> int | None:
        """SIGTERM, SIGKILL after `grace` s; the exit code of the last incarnation."""
        return await self.process.stop(grace)

    async def restart(self) -> None:
        await self.kill()
        await self.start()

    async def _register_webhook(self) -> None:
        """Register the shipped webhook configuration once the controller has written its CA."""
        api = self._webhook_api
        assert api is not None
        core = CoreV1Api(api)
        tls_secret = self._flag("--tls-secret") or "licensectl-tls"

        async def ca() -> bytes | None:
            try:
                s = await core.read_namespaced_secret(tls_secret, self.namespace)
            except ApiException:
                return None
            raw = (s.data or {}).get("ca.crt")
            return base64.b64decode(raw) if raw else None

        if not self._webhook_ca:
            # The controller's self-managed TLS fills the caBundle in (what a cluster without
            # cert-manager relies on); until then the apiserver cannot call it (failurePolicy Ignore).
            await webhook_registration.register(api, name=self.webhook_configuration, port=self.webhook_port,
                                                wait=False)
            return
        bundle = await eventually(ca, timeout=60, interval=0.2, what=f"{self.name}'s CA")
        await webhook_registration.register(api, name=self.webhook_configuration, port=self.webhook_port,
                                            ca_bundle=bundle or b"")

    async def webhook_registered(self, timeout: float = 90.0) -> None:  # noqa: ASYNC109
        """Wait until the apiserver calls this controller's webhook (VMIs created after pass it)."""
        if self._registration is not None:
            await asyncio.wait_for(asyncio.shield(self._registration), timeout)

    async def close(self) -> None:
        """Stop the process and release the HTTP session (safe to call more than once)."""
        if self._registration is not None:
            self._registration.cancel()
            with contextlib.suppress(BaseException):
                await self._registration
            self._registration = None
            if self._webhook_api is not None:
                with contextlib.suppress(Exception):
                    await webhook_registration.unregister(self._webhook_api, self.webhook_configuration)
        await self.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- HTTP ----------------------------------------------------------------------------------
    async def get(self, path: str) -> tuple[int, str] | None:
        """GET on the metrics listener; None while it does not answer."""
        if self._session is None:
            return None
        try:
            async with self._session.get(f"http://{LOOPBACK}:{self.metrics_port}{path}") as r:
                text = await r.text()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None
        if self.keep_bodies:
            self.http_bodies.append((f"{self.name}{path}", text))
        return r.status, text

    async def scrape(self) -> Scrape | None:
        """One /metrics scrape, or None while the listener does not answer."""
        got = await self.get("/metrics")
        if got is None or got[0] != 200:
            return None
        return parse_metrics(got[1], time.monotonic())

    async def must_scrape(self, within: float = 60.0) -> Scrape:
        """A scrape, waiting up to `within` s for the listener; fails at once if the process exited."""
        deadline = time.monotonic() + within
        while True:
            self._check_alive("a scrape")
            s = await self.scrape()
            if s is not None:
                return s
            if time.monotonic() > deadline:
                raise EventuallyTimeout(f"{self.name}: /metrics did not answer within {within:g}s")
            await asyncio.sleep(0.1)

    async def status(self) -> dict[str, Any] | None:
        got = await self.get("/v1/status")
        if got is None or got[0] != 200:
            return None
        doc: dict[str, Any] = json.loads(got[1])
        return doc

    async def wait_ready(self, timeout: float = 60.0) -> None:  # noqa: ASYNC109 - also bounds the sleeps
        """Until /readyz answers 200; fails at once if the process exits."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive("readiness")
            got = await self.get("/readyz")
            if got is not None and got[0] == 200:
                return
            if time.monotonic() > deadline:
                raise EventuallyTimeout(f"{self.name} not ready within {timeout:g}s:\n{self.log_tail()}")
            await asyncio.sleep(0.1)

    async def wait_metric(self, name: str, want: float, *,
                          timeout: float = 30.0,  # noqa: ASYNC109 - also bounds the sleeps between scrapes
                          **labels: str) -> Scrape:
        """Until the (summed) series `name{labels}` equals `want`; fails at once if the process exits."""
        deadline = time.monotonic() + timeout
        last: float | None = None
        while True:
            s = await self.scrape()
            if s is not None:
                last = s.value(name, **labels)
                if last == want:
                    return s
            self._check_alive(name)
            if time.monotonic() > deadline:
                raise EventuallyTimeout(f"{self.name}: {name}{labels} = {last}, wanted {want}")
            await asyncio.sleep(0.1)

    def _check_alive(self, what: str) -> None:
        if not self.alive():
            raise AssertionError(f"{self.name} exited ({self.returncode}) waiting for {what}:\n{self.log_tail()}")

    # -- the log -------------------------------------------------------------------------------
    def log_lines(self) -> list[str]:
        return self.process.log_lines()

    def log_tail(self, lines: int = 40) -> str:
        return self.process.log_tail(lines)

    def log_records(self) -> list[dict[str, Any]]:
        return self.process.log_records()
