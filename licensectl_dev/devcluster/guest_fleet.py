"""Simulated guests that live and die with their VMIs, and license according to the token they boot with.

A VM's license disk is fixed when its VMI starts (docs/design.md#kubevirt-secret-disks), so a guest
boots once per VMI: whenever a Ready VMI has a uid its guest has not booted on, the guest re-boots
from the replica Secret the VMI mounts, with the profile `profile_for(token)` picks -- what a license
server would make of that token. Between boots it probes on a timer. Every boot is kept as a `Boot`
record, so a test can tell which revision (and which token, by its SHA-256 only) each guest ran.

Pure parts (ready-VMI selection, token hashing, boot records, profile choice) are functions; the
`GuestFleet` shell does one VMI LIST per round, then boots and probes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime as dt
import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, CustomObjectsApi

from licensectl.core.model import ANN_REVISION, ANN_SOURCE_REVISION, KEY_TOKEN
from licensectl.kube.raw import RawApi
from licensectl_dev.devcluster.guest_sim import UNLICENSED_TEXT, GuestProfile, SimulatedGuest, mounted_secret

log = structlog.get_logger(__name__)

Key = tuple[str, str]
ProfileFor = Callable[[bytes], GuestProfile]

# Recorded gridd log of a client the license server refused (registration, then acquisition failed):
# the probe reports reason `acquire_failed`.
REGISTER_FAILURE_LOG = "gridd-log-register-failure.txt"


@dataclass(frozen=True, slots=True)
class Boot:
    """One boot of a guest: the VMI it booted on and what its license disk held then."""

    vmi_uid: str
    replica_name: str  # the Secret the VMI mounts; "" when it mounts none
    revision: str  # licensectl.io/revision of that Secret at boot; "" when absent
    source_revision: str  # licensectl.io/source-revision at boot; "" when absent
    token_sha256: str  # hex SHA-256 of the token file on the disk; "" when there was none
    at: dt.datetime
    profile: str = ""  # name of the GuestProfile the guest booted as
    install_rc: int | None = None  # exit code of the install unit (None: not run)


def always_licensed(token: bytes) -> GuestProfile:
    """The default license server: any token licenses the guest."""
    return GuestProfile.licensed()


def acquire_failed_profile() -> GuestProfile:
    """The recorded `Unlicensed` output with gridd's register/acquire failure in the journal."""
    return GuestProfile("acquire-failed", text_fixture=UNLICENSED_TEXT, gridd_log=REGISTER_FAILURE_LOG)


def licensed_unless(bad: Collection[bytes]) -> ProfileFor:
    """A license server that refuses the tokens in `bad` (say, those of another server instance)
    and licenses every other guest."""
    refused = frozenset(bad)

    def profile_for(token: bytes) -> GuestProfile:
        return acquire_failed_profile() if token in refused else GuestProfile.licensed()

    return profile_for


def constant(profile: GuestProfile) -> ProfileFor:
    """The same profile whatever the token (a guest whose behaviour is fixed by the scenario)."""
    return lambda _token: profile


def is_ready(vmi: Mapping[str, Any]) -> bool:
    conds = (vmi.get("status") or {}).get("conditions") or []
    return any(isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def ready_vmis(items: Iterable[Mapping[str, Any]]) -> dict[Key, Mapping[str, Any]]:
    """The Ready VMIs of a LIST, by (namespace, name)."""
    out: dict[Key, Mapping[str, Any]] = {}
    for v in items:
        meta = v.get("metadata") or {}
        if is_ready(v) and meta.get("namespace") and meta.get("name") and meta.get("uid"):
            out[(str(meta["namespace"]), str(meta["name"]))] = v
    return out


def token_bytes(secret: Mapping[str, Any] | None) -> bytes:
    """The token file the license disk holds (b"" when the Secret or its key is absent or unreadable)."""
    raw = ((secret or {}).get("data") or {}).get(KEY_TOKEN)
    if not isinstance(raw, str):
        return b""
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return b""


def token_sha256(token: bytes) -> str:
    return hashlib.sha256(token).hexdigest() if token else ""


def needs_boot(history: Sequence[Boot], vmi_uid: str) -> bool:
    """A guest boots on every VMI it has not booted on yet: the first one, and each restart."""
    return not history or history[-1].vmi_uid != vmi_uid


def boot_record(vmi: Mapping[str, Any], secret: Mapping[str, Any] | None, *, replica: str, at: dt.datetime,
                profile: str = "", install_rc: int | None = None) -> Boot:
    """What a boot on `vmi` with license Secret `secret` (None: absent) amounts to."""
    ann = ((secret or {}).get("metadata") or {}).get("annotations") or {}
    return Boot(vmi_uid=str((vmi.get("metadata") or {}).get("uid", "")), replica_name=replica,
                revision=str(ann.get(ANN_REVISION, "")), source_revision=str(ann.get(ANN_SOURCE_REVISION, "")),
                token_sha256=token_sha256(token_bytes(secret)), at=at, profile=profile, install_rc=install_rc)


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class _Member:
    profile_for: ProfileFor | None
    guest: SimulatedGuest | None = None
    history: list[Boot] = field(default_factory=list)
    probes: int = 0
    last_probe_rc: int | None = None


class GuestFleet:
    """Registered guests, booted on their Ready VMIs and probed every `interval_seconds`."""

    def __init__(self, api: ApiClient, report_url: str, *, profile_for: ProfileFor = always_licensed,
                 interval_seconds: float = 2.0, clock: Callable[[], dt.datetime] = _utc_now) -> None:
        self.api = api
        self.report_url = report_url
        self.profile_for = profile_for
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.rounds = 0
        self._members: dict[Key, _Member] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, namespace: str, vmi: str, *, profile_for: ProfileFor | None = None) -> None:
        """Register the guest of VMI `namespace/vmi`; `profile_for` overrides the fleet's for it."""
        m = self._members.get((namespace, vmi))
        if m is None:
            self._members[(namespace, vmi)] = _Member(profile_for)
        else:
            m.profile_for = profile_for

    def boots(self, namespace: str, vmi: str) -> list[Boot]:
        m = self._members.get((namespace, vmi))
        return list(m.history) if m else []

    def last_boot(self, namespace: str, vmi: str) -> Boot | None:
        m = self._members.get((namespace, vmi))
        return m.history[-1] if m and m.history else None

    def probes(self, namespace: str, vmi: str) -> int:
        """Probes run since the guest was registered (all boots)."""
        m = self._members.get((namespace, vmi))
        return m.probes if m else 0

    def guest(self, namespace: str, vmi: str) -> SimulatedGuest | None:
        """The simulated guest (None before its first boot): its last exit code and stderr tell why."""
        m = self._members.get((namespace, vmi))
        return m.guest if m else None

    async def run_once(self) -> None:
        """One round: one VMI LIST, then every registered guest on a Ready VMI boots if needed and probes."""
        listed = await RawApi(CustomObjectsApi(self.api)).list_cluster_custom_object(
            "kubevirt.io", "v1", "virtualmachineinstances")
        ready = ready_vmis(listed.get("items") or [])
        await asyncio.gather(*(self._step(key, m, ready[key]) for key, m in list(self._members.items())
                               if key in ready))
        self.rounds += 1

    async def run(self) -> None:
        """Rounds until cancelled; a failed round is logged and the next one tries again."""
        while True:
            try:
                await self.run_once()
            except ApiException as e:
                log.warning("guest fleet: VMI list failed", status=e.status, reason=e.reason)
            except (aiohttp.ClientError, OSError, TimeoutError) as e:
                log.warning("guest fleet: VMI list failed", error=type(e).__name__)
            await asyncio.sleep(self.interval_seconds)

    async def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="guest-fleet")

    async def stop(self) -> None:
        """Stop the rounds (history and guests stay for inspection; `cleanup` removes the guests)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def cleanup(self) -> None:
        for m in self._members.values():
            if m.guest is not None:
                m.guest.cleanup()
                m.guest = None

    async def __aenter__(self) -> GuestFleet:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()
        self.cleanup()

    async def _step(self, key: Key, m: _Member, vmi: Mapping[str, Any]) -> None:
        ns, name = key
        try:
            uid = str(vmi["metadata"]["uid"])
            if needs_boot(m.history, uid):
                await self._boot(key, m, vmi)
            if m.guest is not None:
                m.last_probe_rc = await m.guest.probe()
                m.probes += 1
        except ApiException as e:
            log.warning("guest fleet: guest step failed", namespace=ns, vmi=name, status=e.status, reason=e.reason)
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            log.warning("guest fleet: guest step failed", namespace=ns, vmi=name, error=type(e).__name__)

    async def _boot(self, key: Key, m: _Member, vmi: Mapping[str, Any]) -> None:
        ns, name = key
        replica = mounted_secret(dict(vmi)) or ""
        secret: dict[str, Any] | None = None
        if replica:
            try:
                secret = await RawApi(CoreV1Api(self.api)).read_namespaced_secret(replica, ns)
            except ApiException as e:
                if e.status != 404:
                    raise
                # An optional Secret volume that does not exist: the VMI runs without the disk.
        profile = (m.profile_for or self.profile_for)(token_bytes(secret))
        if m.guest is None:
            m.guest = SimulatedGuest(ns, name, profile)
        else:
            m.guest.set_profile(profile)
        rc = await m.guest.install(dict(vmi), secret, report_url=self.report_url)
        boot = boot_record(vmi, secret, replica=replica, at=self.clock(), profile=profile.name, install_rc=rc)
        m.history.append(boot)
        log.info("guest booted", namespace=ns, vmi=name, vmi_uid=boot.vmi_uid, replica=replica,
                 revision=boot.revision, token_sha256=boot.token_sha256, profile=profile.name, install_rc=rc)
