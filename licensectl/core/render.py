"""The desired replica Secret for one (namespace, GPU class), and how it differs from what exists.

Pure: the source Secret and class come in as model projections, the clock as `now`. Token bytes
live only in fields with repr=False and never reach a message.

The *revision* identifies what a guest actually consumes (token + gridd.conf): it changes exactly
when a VMI restart is needed. The report URL/credential are delivered too, but rotating them must
not restart VMs, so they only change the data digest (an in-place Secret update). The same holds
for the reports CA bundle (`report-ca.crt`): a new serving CA updates replicas without restarts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from licensectl.core.model import (
    ANN_CLASS,
    ANN_CLASS_LICENSE,
    ANN_CREDENTIAL_KEY,
    ANN_REVISION,
    ANN_REVISION_TIME,
    ANN_SOURCE_NAME,
    ANN_SOURCE_NAMESPACE,
    ANN_SOURCE_REVISION,
    ANN_SOURCE_UID,
    KEY_GRIDD_CONF,
    KEY_REPORT_CA,
    KEY_REPORT_CREDENTIAL,
    KEY_REPORT_NAMESPACE,
    KEY_REPORT_URL,
    KEY_TOKEN,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    GpuClass,
    GpuMode,
    ObjectRef,
    ReplicaSecret,
    SourceSecret,
    data_digest,
    u64,
)
from licensectl.core.rotation import content_revision
from licensectl.core.timecodec import annotation_time, format_time

REPLICA_PREFIX = "nvidia-vgpu-license-"
MAX_NAME_LENGTH = 253  # DNS-1123 subdomain, the limit for Secret names
_NAME_HASH_CHARS = 16  # 64 bits of SHA-256

MAX_TOKEN_BYTES = 64 * 1024
MAX_GRIDD_CONF_BYTES = 16 * 1024
# Optional key of the source Secret holding hoster lines for gridd.conf.
SOURCE_GRIDD_CONF_KEY = "gridd.conf"

# FeatureType values nvidia-gridd accepts (docs/design.md#feature-type: 0 unlicensed, 1 vGPU auto-detected,
# 2 RTX Virtual Workstation, 4 Virtual Compute Server); anything else is reserved.
VALID_FEATURE_TYPES = frozenset({0, 1, 2, 4})

GRIDD_CONF_HEADER = (
    "# Rendered by licensectl; edits are overwritten.\n"
    "# FeatureType comes from the GPUClass, other lines from the license Secret's gridd.conf key.\n"
)


def replica_name(class_name: str) -> str:
    """Name of the replica Secret for a class: `nvidia-vgpu-license-<class>`.

    Class names are DNS-1123 subdomains, so the result is one too while it fits in 253 chars.
    Longer results are cut to exactly 253 chars: the class name is truncated, a trailing "." of
    the cut part is replaced by "0" (a label may not start with "-"), and "-" plus the first 16
    hex digits of SHA-256(class name) are appended, so distinct classes get distinct names unless
    64-bit hash prefixes collide. Short names are kept verbatim (readable `kubectl get`).
    """
    name = REPLICA_PREFIX + class_name
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(class_name.encode()).hexdigest()[:_NAME_HASH_CHARS]
    head = name[: MAX_NAME_LENGTH - _NAME_HASH_CHARS - 1]
    if head.endswith("."):
        head = head[:-1] + "0"
    return f"{head}-{digest}"


class SourceProblemReason(StrEnum):
    SOURCE_MISSING = "source_missing"
    TOKEN_KEY_MISSING = "token_key_missing"
    TOKEN_EMPTY = "token_empty"
    TOKEN_TOO_LARGE = "token_too_large"
    INVALID_FEATURE_TYPE = "invalid_feature_type"
    INVALID_MODE = "invalid_mode"
    SECRET_REF_MISSING = "secret_ref_missing"
    GRIDD_CONF_INVALID = "gridd_conf_invalid"


@dataclass(frozen=True, slots=True)
class SourceProblem:
    """Why no license can be rendered; `ref` is the GPUClass ("" namespace) or the source Secret."""

    reason: SourceProblemReason
    ref: ObjectRef
    message: str


@dataclass(frozen=True, slots=True)
class RenderedLicense:
    """What a guest consumes. `revision` changes iff token or gridd.conf changes."""

    token: bytes = field(repr=False)
    gridd_conf: bytes
    feature_type: int
    revision: str
    token_sha256: str  # what the guest probe reports for the installed token
    # The source revision it renders (core/rotation.content_revision): what the hoster rotates.
    source_revision: str = ""


@dataclass(frozen=True, slots=True)
class DesiredReplica:
    namespace: str
    name: str
    class_name: str
    data: Mapping[str, bytes] = field(repr=False)
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    revision: str
    revision_time: dt.datetime
    data_digest: bytes

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(self.namespace, self.name)


class ReplicaAction(StrEnum):
    CREATE = "create"
    UPDATE = "update"
    NOOP = "noop"
    CONFLICT = "conflict"  # a Secret we do not own (or another class's) holds the name


class ReplicaState(StrEnum):
    IN_SYNC = "in_sync"
    DRIFTED = "drifted"
    MISSING = "missing"
    CONFLICT = "conflict"
    # Rendered from other class license fields than the class has now, and the hoster has not accepted
    # the change: kept exactly as it is (docs/design.md#decision-class-change).
    HELD = "held"


def _revision(token: bytes, gridd_conf: bytes, credential_epoch: str = "") -> str:
    h = hashlib.sha256(b"licensectl-revision-v1\0")
    h.update(u64(len(token)))
    h.update(token)
    h.update(u64(len(gridd_conf)))
    h.update(gridd_conf)
    if credential_epoch:  # absent: the revision every release before key revocation computed
        h.update(b"credential-epoch\0" + credential_epoch.encode())
    return h.hexdigest()


def _is_feature_type_line(line: str) -> bool:
    key, sep, _ = line.partition("=")
    return bool(sep) and key.strip().lower() == "featuretype"


def _render_gridd_conf(hoster: str, feature_type: int) -> bytes:
    """Header, the hoster's lines (normalized, FeatureType dropped), then the class's FeatureType.

    FeatureType goes last so that, should gridd ever read a duplicate, the class's value wins.
    """
    lines = [ln.rstrip() for ln in hoster.splitlines() if not _is_feature_type_line(ln)]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    body = "".join(ln + "\n" for ln in lines)
    return (GRIDD_CONF_HEADER + body + f"FeatureType={feature_type}\n").encode()


def class_license(gpu_class: GpuClass) -> str | None:
    """The class license fields a replica is rendered from, as it records them: `<namespace>/<name>:<featureType>`.

    Readable, so the hoster can tell what changed and type it into the class's accept annotation
    (docs/design.md#decision-class-change). None when the class has no usable secretRef or FeatureType
    (render refuses such a class anyway). Not part of the revision: recording it restarts nothing.
    """
    ref, ft = gpu_class.secret_ref, gpu_class.feature_type
    if ref is None or isinstance(ft, bool) or not isinstance(ft, int) or ft not in VALID_FEATURE_TYPES:
        return None
    return f"{ref.namespace}/{ref.name}:{ft}"


def held_license(existing: ReplicaSecret | None, gpu_class: GpuClass) -> str | None:
    """The class license an existing replica of this class records, when the replica must be held.

    Held: the class's license fields were edited since the replica was written, and the class's
    accept annotation does not name the fields it has now. A replica without a record (written by
    a release before it), or of another owner or class, is never held.
    """
    if existing is None or not existing.owned or existing.annotations.get(ANN_CLASS) != gpu_class.name:
        return None
    recorded = existing.annotations.get(ANN_CLASS_LICENSE)
    current = class_license(gpu_class)
    if recorded is None or current is None or recorded == current or gpu_class.accept_license_change == current:
        return None
    return recorded


def _class_ref(c: GpuClass) -> ObjectRef:
    return ObjectRef("", c.name)


def render_license(source: SourceSecret | None, gpu_class: GpuClass,
                   token_key: str, *, credential_epoch: str = "") -> RenderedLicense | SourceProblem:
    """Validate the class and its source Secret, and build what the guest will consume.

    `credential_epoch` (the signing-key revocation, docs/design.md#key-ring) is part of the revision:
    a revoked key is a reason to restart every VM, like a new token."""
    cref = _class_ref(gpu_class)
    if gpu_class.secret_ref is None:
        return SourceProblem(SourceProblemReason.SECRET_REF_MISSING, cref,
                             f"GPUClass {gpu_class.name} has no spec.license.secretRef")
    if gpu_class.mode != GpuMode.VGPU:
        return SourceProblem(SourceProblemReason.INVALID_MODE, cref,
                             f"GPUClass {gpu_class.name} has mode {gpu_class.mode!r}; only vgpu "
                             "classes get a license replica")
    ft = gpu_class.feature_type
    if isinstance(ft, bool) or not isinstance(ft, int) or ft not in VALID_FEATURE_TYPES:
        return SourceProblem(SourceProblemReason.INVALID_FEATURE_TYPE, cref,
                             f"GPUClass {gpu_class.name}: featureType {ft!r:.40} is not one of "
                             f"{sorted(VALID_FEATURE_TYPES)}")
    if source is None:
        return SourceProblem(SourceProblemReason.SOURCE_MISSING, gpu_class.secret_ref,
                             f"license Secret {gpu_class.secret_ref} of GPUClass {gpu_class.name} "
                             "does not exist")
    content = source_content(source, token_key)
    if isinstance(content, SourceProblem):
        return content
    token, hoster = content
    conf = _render_gridd_conf(hoster, ft)
    return RenderedLicense(token=token, gridd_conf=conf, feature_type=ft,
                           revision=_revision(token, conf, credential_epoch),
                           token_sha256=hashlib.sha256(token).hexdigest(),
                           source_revision=content_revision(token, source.data.get(SOURCE_GRIDD_CONF_KEY)))


def source_content(source: SourceSecret, token_key: str) -> tuple[bytes, str] | SourceProblem:
    """The token and the hoster's gridd.conf text of a source Secret, or why it has none usable.

    Independent of GPU classes: what a source revision is made of (docs/design.md#safe-rotation)."""
    sref = source.ref
    token = source.data.get(token_key)
    if token is None:
        return SourceProblem(SourceProblemReason.TOKEN_KEY_MISSING, sref,
                             f"license Secret {sref} has no key {token_key!r}")
    if not token.strip():
        return SourceProblem(SourceProblemReason.TOKEN_EMPTY, sref,
                             f"license Secret {sref}: key {token_key!r} is empty")
    if len(token) > MAX_TOKEN_BYTES:
        return SourceProblem(SourceProblemReason.TOKEN_TOO_LARGE, sref,
                             f"license Secret {sref}: token is {len(token)} bytes, more than "
                             f"{MAX_TOKEN_BYTES}")
    raw_conf = source.data.get(SOURCE_GRIDD_CONF_KEY, b"")
    hoster = _decode_gridd_conf(raw_conf)
    if hoster is None:
        return SourceProblem(SourceProblemReason.GRIDD_CONF_INVALID, sref,
                             f"license Secret {sref}: key {SOURCE_GRIDD_CONF_KEY!r} must be UTF-8 "
                             f"text without NUL bytes, at most {MAX_GRIDD_CONF_BYTES} bytes")
    return token, hoster


def _decode_gridd_conf(raw: bytes) -> str | None:
    if len(raw) > MAX_GRIDD_CONF_BYTES or b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _revision_time(existing: ReplicaSecret | None, revision: str, now: dt.datetime) -> dt.datetime:
    """When this revision was first written: kept from an owned replica, so restarts re-derive it.

    A kept time later than `now` (skew or tampering) is replaced, so it cannot postpone a rollout.
    """
    if existing is not None and existing.owned and existing.annotations.get(ANN_REVISION) == revision:
        kept = annotation_time(existing.annotations, ANN_REVISION_TIME)
        if kept is not None and kept.replace(microsecond=0) <= now:
            return kept.replace(microsecond=0)
    return now


def render_replica(lic: RenderedLicense, *, namespace: str, gpu_class: GpuClass, source: SourceSecret,
                   report_url: str, credential: str, existing: ReplicaSecret | None,
                   now: dt.datetime, report_ca: bytes = b"", source_revision: str = "",
                   credential_key: str = "") -> DesiredReplica:
    """The complete desired replica Secret for one namespace and class.

    `report_ca` (the reports listener's CA bundle) is delivered like the URL: outside the revision.
    `source_revision` names the stable or candidate source revision it carries (docs/design.md#safe-rotation).
    `credential_key` is the id of the signing key `credential` comes from (docs/design.md#key-ring): an
    annotation only, outside the revision, so a key rotation restarts no VM.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    now = now.astimezone(dt.UTC).replace(microsecond=0)
    fields = {
        KEY_TOKEN: lic.token,
        KEY_GRIDD_CONF: lic.gridd_conf,
        KEY_REPORT_URL: report_url.encode(),
        KEY_REPORT_NAMESPACE: namespace.encode(),
        KEY_REPORT_CREDENTIAL: credential.encode(),
    }
    if report_ca:
        fields[KEY_REPORT_CA] = report_ca
    data = MappingProxyType(fields)
    revision_time = _revision_time(existing, lic.revision, now)
    recorded = class_license(gpu_class)
    annotations = MappingProxyType({
        ANN_SOURCE_NAMESPACE: source.namespace,
        ANN_SOURCE_NAME: source.name,
        ANN_SOURCE_UID: source.uid,
        ANN_CLASS: gpu_class.name,
        ANN_REVISION: lic.revision,
        ANN_REVISION_TIME: format_time(revision_time),
        **({ANN_SOURCE_REVISION: source_revision} if source_revision else {}),
        **({ANN_CLASS_LICENSE: recorded} if recorded is not None else {}),
        **({ANN_CREDENTIAL_KEY: credential_key} if credential_key else {}),
    })
    return DesiredReplica(
        namespace=namespace, name=replica_name(gpu_class.name), class_name=gpu_class.name,
        data=data, labels=MappingProxyType({MANAGED_BY_LABEL: MANAGED_BY_VALUE}),
        annotations=annotations, revision=lic.revision, revision_time=revision_time,
        data_digest=data_digest(data),
    )


def _subset(want: Mapping[str, str], have: Mapping[str, str]) -> bool:
    return all(have.get(k) == v for k, v in want.items())


def replica_diff(existing: ReplicaSecret | None, desired: DesiredReplica) -> ReplicaAction:
    """What to do about one replica. Keys others add to an owned replica are not drift.

    A Secret under the name that we do not own is never touched (conflict). Neither is an owned one
    whose class annotation names another class: two classes whose names collide must not fight.
    """
    if existing is None:
        return ReplicaAction.CREATE
    if (existing.namespace, existing.name) != (desired.namespace, desired.name):
        raise ValueError(f"replica_diff: {existing.namespace}/{existing.name} is not {desired.ref}")
    if not existing.owned or existing.annotations.get(ANN_CLASS) != desired.class_name:
        return ReplicaAction.CONFLICT
    want = desired.annotations
    if ANN_SOURCE_REVISION not in existing.annotations and existing.annotations.get(ANN_REVISION) == desired.revision:
        # A replica from a release before safe rotation, already on this revision: the source-revision
        # mark alone is not worth a write per replica at upgrade; it comes with the next revision change.
        want = {k: v for k, v in want.items() if k != ANN_SOURCE_REVISION}
    if ANN_CLASS_LICENSE not in existing.annotations:
        # Likewise a replica from a release before the class-license record: it gains the record with
        # its next write, not with one of its own.
        want = {k: v for k, v in want.items() if k != ANN_CLASS_LICENSE}
    if ANN_CREDENTIAL_KEY not in existing.annotations:
        # And a replica from a release before the key ring: without the mark its key counts as unknown, so
        # every key is kept (docs/design.md#key-ring); the mark comes with its next write.
        want = {k: v for k, v in want.items() if k != ANN_CREDENTIAL_KEY}
    if (existing.data_digest != desired.data_digest or not _subset(desired.labels, existing.labels)
            or not _subset(want, existing.annotations)):
        return ReplicaAction.UPDATE
    return ReplicaAction.NOOP


class UpdateKind(StrEnum):
    """What kind of change an update of an owned replica is, read from the diff (the Event it gets)."""

    CONTENT = "content"  # the source's token or gridd.conf, or the class's license fields: a rotation
    REVOCATION = "revocation"  # only a signing-key revocation changed the revision: the source did not change
    CREDENTIAL = "credential"  # the report credential rewritten for a new signing key: same revision
    DRIFT = "drift"  # content or marks edited by someone else, written back


def update_kind(existing: ReplicaSecret, desired: DesiredReplica) -> UpdateKind:
    """Why `desired` overwrites `existing`, from what differs between them.

    A new revision over new bytes is a rotation, unless the source revision and the class license the
    replica records are both unchanged while its signing key changed: then the only other input of
    the revision, the key revocation (docs/design.md#key-ring), changed. The same revision with another
    signing key is a credential rewrite. Anything else (a revision mark edited alone, bytes edited
    under the same key) is drift."""
    have, want = existing.annotations, desired.annotations
    new_key = bool(want.get(ANN_CREDENTIAL_KEY)) and have.get(ANN_CREDENTIAL_KEY) != want.get(ANN_CREDENTIAL_KEY)
    if existing.data_digest == desired.data_digest:
        return UpdateKind.DRIFT
    if have.get(ANN_REVISION) != desired.revision:
        same_source = bool(want.get(ANN_SOURCE_REVISION)) and have.get(ANN_SOURCE_REVISION) == want.get(
            ANN_SOURCE_REVISION)
        same_class = ANN_CLASS_LICENSE in have and have.get(ANN_CLASS_LICENSE) == want.get(ANN_CLASS_LICENSE)
        return UpdateKind.REVOCATION if same_source and same_class and new_key else UpdateKind.CONTENT
    return UpdateKind.CREDENTIAL if new_key else UpdateKind.DRIFT


_STATE = {
    ReplicaAction.CREATE: ReplicaState.MISSING,
    ReplicaAction.UPDATE: ReplicaState.DRIFTED,
    ReplicaAction.NOOP: ReplicaState.IN_SYNC,
    ReplicaAction.CONFLICT: ReplicaState.CONFLICT,
}


def replica_state(existing: ReplicaSecret | None, desired: DesiredReplica) -> ReplicaState:
    """The metric-facing classification of one replica."""
    return _STATE[replica_diff(existing, desired)]
