"""Plain data the pure core works on.

Everything here is a slim, immutable projection of a Kubernetes object (or of a guest report):
only the fields a decision needs, so caches stay small and pure functions stay easy to test.
The kube/ layer builds these from API objects; nothing in this module does I/O.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NoReturn

from licensectl.core.timecodec import from_epoch_us

# ---------------------------------------------------------------------------------------------
# Names licensectl writes onto objects. One place, so docs, RBAC and code agree.
# ---------------------------------------------------------------------------------------------
DOMAIN = "licensectl.io"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "licensectl"

# Replica Secret annotations.
ANN_SOURCE_NAMESPACE = f"{DOMAIN}/source-namespace"
ANN_SOURCE_NAME = f"{DOMAIN}/source-name"
ANN_SOURCE_UID = f"{DOMAIN}/source-uid"
ANN_CLASS = f"{DOMAIN}/class"
ANN_REVISION = f"{DOMAIN}/revision"
ANN_REVISION_TIME = f"{DOMAIN}/revision-time"
# Replica annotation: the source revision (stable or candidate, docs/design.md#safe-rotation) it carries.
ANN_SOURCE_REVISION = f"{DOMAIN}/source-revision"
# Replica annotation: the class license fields it was rendered from, `<namespace>/<name>:<featureType>`
# (docs/design.md#decision-class-change): a class edited in place holds its replicas instead of rolling.
ANN_CLASS_LICENSE = f"{DOMAIN}/class-license"
# GPUClass annotation: the hoster accepts that the class's replicas move to this class-license value.
ANN_ACCEPT_LICENSE_CHANGE = f"{DOMAIN}/accept-license-change"
# Label of the revision store Secrets in licensectl's namespace (not managed-by: they are no replicas).
REVISION_STORE_LABEL = f"{DOMAIN}/revision-store"

# Keys inside a replica Secret (and so files on the guest's license disk).
KEY_TOKEN = "client_configuration_token.tok"
KEY_GRIDD_CONF = "gridd.conf"
KEY_REPORT_URL = "report-url"
KEY_REPORT_NAMESPACE = "report-namespace"
KEY_REPORT_CREDENTIAL = "report-credential"
# PEM CA bundle the probe verifies an https report URL with (docs/guest.md); absent over plain HTTP.
KEY_REPORT_CA = "report-ca.crt"

# VirtualMachine annotations: intent written *before* acting, so a restarted controller can tell
# "restart issued for revision R at T" from cluster state alone.
ANN_RESTART_REVISION = f"{DOMAIN}/restart-revision"
ANN_RESTART_ISSUED_AT = f"{DOMAIN}/restart-issued-at"
ANN_RESTART_RESULT = f"{DOMAIN}/restart-result"
# The labels CAPK puts on a KubevirtMachine's VM and its VMI template (cluster-api-provider-kubevirt
# pkg/kubevirt/utils.go, api/v1alpha1/kubevirtcluster_types.go): which tenant cluster, which role, which
# KubevirtMachine (the tenant Node's providerID is kubevirt://<that name>).
LABEL_CAPI_CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
LABEL_CAPI_ROLE = "cluster.x-k8s.io/role"
LABEL_KUBEVIRT_MACHINE = "capk.cluster.x-k8s.io/kubevirt-machine-name"
CAPK_LABELS = (LABEL_CAPI_CLUSTER_NAME, LABEL_CAPI_ROLE, LABEL_KUBEVIRT_MACHINE)
ANN_RESTART_POLICY = f"{DOMAIN}/restart"  # "manual" opts a VM out of automatic restarts
# UID of the VMI the restart targeted: a VMI with another UID was already recreated, never restart it.
ANN_RESTART_VMI_UID = f"{DOMAIN}/restart-vmi-uid"
# Replica Secret (same namespace) whose revision the restart delivers.
ANN_RESTART_REPLICA = f"{DOMAIN}/restart-replica"
# Last time the restart subresource was (about to be) called; re-issue is timed from here.
ANN_RESTART_ATTEMPTED_AT = f"{DOMAIN}/restart-attempted-at"
# Which restart for this revision the intent is (1, 2, ...): backstop retries back off on it.
ANN_RESTART_ATTEMPT = f"{DOMAIN}/restart-attempt"
# Whether the VM's guest had reported when the restart was issued ("true"/"false"; absent: the leader could
# not know yet): the done gate's evidence, kept in the cluster so a new leader has it too.
ANN_RESTART_GUEST_REPORTS = f"{DOMAIN}/restart-guest-reports"

# VMI annotations stamped by the admission webhook on the VMI it admits (docs/design.md#delivery-stamp):
# what it delivered, so "is this VMI current" compares revisions, never times.
# `<replica name>=<replica licensectl.io/revision>` pairs, comma-separated, one per license volume added.
ANN_DELIVERED_REVISION = f"{DOMAIN}/delivered-revision"
# The signing-key id of the report credential in the replica(s) at admission (docs/design.md#key-ring).
ANN_DELIVERED_KEY = f"{DOMAIN}/delivered-key"
# Replica annotation: the signing-key id its report credential was derived from.
ANN_CREDENTIAL_KEY = f"{DOMAIN}/credential-key"
# Delivery readiness probe (docs/design.md#delivery-readiness): a server-side dry-run VMI in licensectl's
# own namespace carries ANN_DELIVERY_PROBE; the webhook answers it by adding ANN_DELIVERY_PROBE_ANSWER.
ANN_DELIVERY_PROBE = f"{DOMAIN}/delivery-probe"
ANN_DELIVERY_PROBE_ANSWER = f"{DOMAIN}/delivery-probe-answer"

# VMI annotation naming the GPUClaims of a VMI on platforms without DRA (comma-separated names in
# the VMI's namespace; docs/design.md#vmi-claims).
ANN_GPU_CLAIMS = f"{DOMAIN}/gpu-claims"

# Serving TLS Secret annotation: set by licensectl on the Secret it created (self-managed mode).
ANN_TLS = f"{DOMAIN}/tls"
MODE_SELF_MANAGED = "self-managed"

# Source Secret annotation: "true" marks its token as knowingly opaque (not a JWT on purpose, e.g. if
# NVIDIA changes the format): no "unreadable" warning, status or alert for it (docs/operations.md#opaque-tokens).
ANN_TOKEN_OPAQUE = f"{DOMAIN}/token-opaque"

# Source Secret annotation: rollout-wide pause switch set by the hoster.
ANN_ROLLOUT_PAUSED = f"{DOMAIN}/rollout-paused"
# Source Secret annotation: failures issued before this time no longer count against the budget.
ANN_ROLLOUT_RESUMED_AT = f"{DOMAIN}/rollout-resumed-at"

class FrozenMap(dict[str, str]):
    """An immutable, hashable str -> str dict: the labels and annotations of cached objects.

    A dict behind a mappingproxy would cost 40 bytes more per map (tens of thousands of cached
    objects carry one or two), and mappingproxy is not hashable on Python 3.11, which a dataclass
    default must be. Every mutator raises; lookups are a dict's.
    """

    __slots__ = ()

    def _immutable(self, *_args: object, **_kwargs: object) -> NoReturn:
        raise TypeError("FrozenMap is immutable")

    __setitem__ = __delitem__ = __ior__ = _immutable
    clear = pop = popitem = setdefault = update = _immutable

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[type[FrozenMap], tuple[dict[str, str]]]:
        return FrozenMap, (dict(self),)

    def __repr__(self) -> str:
        return dict.__repr__(self)


EMPTY: Mapping[str, str] = FrozenMap()


def frozen_map(d: Mapping[str, str] | None) -> Mapping[str, str]:
    """A read-only copy, so projections cannot be mutated behind a cache's back."""
    return FrozenMap(d) if d else EMPTY


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Namespace/name of a namespaced object ("" namespace for cluster-scoped)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True, slots=True)
class Namespace:
    """A Namespace as the tenant tree sees it."""

    name: str
    uid: str
    labels: Mapping[str, str] = EMPTY
    # The controller ownerReference of kind Namespace (Cozystack's authoritative parent link).
    owner_name: str | None = None
    owner_uid: str | None = None
    terminating: bool = False


class GpuMode(StrEnum):
    VGPU = "vgpu"
    PASSTHROUGH = "passthrough"


@dataclass(frozen=True, slots=True)
class GpuClass:
    """A GPUClass (assumed contract, docs/design.md#gpu-contract). Fields are raw: validation is the core's job."""

    name: str
    uid: str
    mode: str | None
    secret_ref: ObjectRef | None
    feature_type: object | None  # raw value from spec.license.featureType, validated in render
    profile: object | None = None  # raw value from spec.profile (a vGPU type name), checked in core.profiles
    # The class's licensectl.io/accept-license-change annotation (docs/design.md#decision-class-change).
    accept_license_change: str | None = None


@dataclass(frozen=True, slots=True)
class GpuClaim:
    namespace: str
    name: str
    class_name: str | None


@dataclass(frozen=True, slots=True)
class SourceSecret:
    """The hoster's license Secret. Holds token bytes: never log or repr them."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    data: Mapping[str, bytes] = field(repr=False)
    annotations: Mapping[str, str] = EMPTY

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(self.namespace, self.name)


def source_of(annotations: Mapping[str, str]) -> ObjectRef | None:
    """The source Secret a licensectl-written Secret (replica, revision store) names; None if it names none."""
    ns, name = annotations.get(ANN_SOURCE_NAMESPACE), annotations.get(ANN_SOURCE_NAME)
    return ObjectRef(ns, name) if ns and name else None


def u64(n: int) -> bytes:
    """A length prefix for hashing: fixed 8 bytes, so concatenations cannot be ambiguous."""
    return n.to_bytes(8, "big")


def data_digest(data: Mapping[str, bytes]) -> bytes:
    """SHA-256 over sorted keys, each key and value length-prefixed (no ambiguous concatenation).

    Here, not in render, because both sides need it: render for the desired replica, the kube
    projections for the observed one (which keeps the digest instead of token bytes). The raw 32
    bytes, not hex: one per cached replica, and only ever compared.
    """
    h = hashlib.sha256(b"licensectl-data-v1\0")
    for key in sorted(data):
        k = key.encode()
        v = data[key]
        h.update(u64(len(k)) + k + u64(len(v)))
        h.update(v)
    return h.digest()


@dataclass(frozen=True, slots=True)
class ReplicaSecret:
    """A Secret observed under a replica's name (owned by licensectl or not)."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    labels: Mapping[str, str] = EMPTY
    annotations: Mapping[str, str] = EMPTY
    # `data_digest(data)`: compare with the desired digest, keep no bytes.
    data_digest: bytes = b""

    @property
    def owned(self) -> bool:
        return self.labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE and ANN_CLASS in self.annotations


@dataclass(frozen=True, slots=True)
class Vmi:
    """A VirtualMachineInstance as the rollout sees it.

    The two times are kept as `timecodec.to_epoch_us` floats, half a datetime's size (the cache holds
    every VMI of the cluster); `created` and `running_since` give them back as datetimes.
    """

    namespace: str
    name: str
    uid: str
    created_us: float
    owner_vm: str | None  # name of the controlling VirtualMachine, None for standalone VMIs
    phase: str
    ready: bool
    running_since_us: float | None
    secret_volumes: tuple[str, ...]  # volumes[].secret.secretName
    firmware_uuid: str | None
    deleting: bool = False
    # GPUClaims the VMI uses, resolved by the contract adapter (docs/design.md#vmi-claims).
    gpu_claims: tuple[str, ...] = ()
    # spec.volumes[].name: a license volume name already taken blocks delivery.
    volume_names: tuple[str, ...] = ()
    # The webhook's stamp (ANN_DELIVERED_REVISION): (replica name, replica revision) pairs.
    delivered_revisions: tuple[tuple[str, str], ...] = ()
    # The webhook's stamp (ANN_DELIVERED_KEY): the signing-key id the guest's credential came from.
    delivered_key: str | None = None
    # Disk serials and secret volume labels: what a guest finds a disk by; a serial taken blocks delivery.
    disk_serials: tuple[str, ...] = ()

    @property
    def created(self) -> dt.datetime:
        return from_epoch_us(self.created_us)

    @property
    def running_since(self) -> dt.datetime | None:
        return None if self.running_since_us is None else from_epoch_us(self.running_since_us)


@dataclass(frozen=True, slots=True)
class Vm:
    """A VirtualMachine: run strategy plus the intent annotations licensectl keeps on it.

    Only the licensectl.io/ annotations are kept (nothing else on a VM is read), and no uid: restarts
    are guarded by the VMI's uid and the VM's resourceVersion.
    """

    namespace: str
    name: str
    run_strategy: str | None
    annotations: Mapping[str, str] = EMPTY
    resource_version: str = ""
    # Only the CAPK machine labels (CAPK_LABELS): a tenant cluster's worker is drained before its restart.
    labels: Mapping[str, str] = EMPTY


@dataclass(frozen=True, slots=True)
class TLSSecret:
    """The serving-certificate Secret (docs/operations.md#serving-tls). Key material stays out of repr."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    type: str
    annotations: Mapping[str, str]
    data: Mapping[str, bytes] = field(repr=False)

    @property
    def self_managed(self) -> bool:
        return self.annotations.get(ANN_TLS) == MODE_SELF_MANAGED


@dataclass(frozen=True, slots=True)
class RevisionStore:
    """A source's revision store (docs/design.md#safe-rotation): stable and candidate bytes plus the
    rotation record in its annotations. Holds token bytes: never log or repr `data`."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    annotations: Mapping[str, str]
    data: Mapping[str, bytes] = field(repr=False)

    @property
    def source(self) -> ObjectRef | None:
        return source_of(self.annotations)
