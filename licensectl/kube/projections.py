"""Raw API objects (parsed JSON dicts) -> the slim dataclasses of `licensectl.core.model`.

Pure and total: every function takes whatever the apiserver (or a broken client) handed us and
either returns a projection or None. Nothing here raises on a malformed object, because one bad
object must never stop a watch or the controller. None means "cannot even identify this object"
(no name); anything identifiable is projected with the fields that could not be read left empty,
and the pure core decides what an empty field means.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypedDict

from licensectl.core import boot_image, model
from licensectl.core.delivery import parse_stamp
from licensectl.core.render import REPLICA_PREFIX
from licensectl.core.timecodec import parse_time, to_epoch_us

KUBEVIRT_GROUP = "kubevirt.io"


# ---------------------------------------------------------------------------------------------
# Tolerant accessors
# ---------------------------------------------------------------------------------------------
def _dict(v: object) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _list(v: object) -> list[Any]:
    return v if isinstance(v, list) else []


def _str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def _path(obj: object, *keys: str) -> object:
    cur: object = obj
    for k in keys:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(k)
    return cur


def _str_map(v: object) -> Mapping[str, str]:
    """Labels/annotations: keep str->str entries only."""
    if not isinstance(v, Mapping):
        return model.EMPTY
    return model.frozen_map({k: val for k, val in v.items() if isinstance(k, str) and isinstance(val, str)})


# ---------------------------------------------------------------------------------------------
# Sharing: a value many cached objects repeat is held once, so the caches stay small
# ---------------------------------------------------------------------------------------------
def _shared(s: str) -> str:
    """One copy of a string many objects repeat (a namespace, class or phase name, an annotation key).

    Interned strings are freed with their last user; an exact str only (intern refuses subclasses).
    Never for strings unique to one object (uids, names): the intern table entry would cost more.
    """
    return sys.intern(s) if type(s) is str else s


def _shared_name(v: object) -> str | None:
    s = _str(v)
    return None if s is None else _shared(s)


@functools.lru_cache(maxsize=1024)
def _shared_tuple(names: tuple[str, ...]) -> tuple[str, ...]:
    """Equal tuples of names (a VMI's license volumes, its claims) as one object across the cache."""
    return tuple(_shared(n) for n in names)


@functools.lru_cache(maxsize=1024)
def _shared_items(items: tuple[tuple[str, str], ...]) -> Mapping[str, str]:
    return model.frozen_map(dict(items)) if items else model.EMPTY


# VM annotation values many VMs repeat (one revision, replica name or result per wave); the restart
# times and VMI uids differ per VM and stay unshared.
_SHARED_VM_VALUES = frozenset({model.ANN_RESTART_REVISION, model.ANN_RESTART_RESULT, model.ANN_RESTART_REPLICA,
                               model.ANN_RESTART_POLICY})
_OWN_PREFIX = model.DOMAIN + "/"


def _own_annotations(v: object) -> Mapping[str, str]:
    """A VM's licensectl.io/ annotations only: nothing else on a VM is read, and others' annotations
    (a kubectl last-applied-configuration above all) can be larger than the rest of the projection."""
    if not isinstance(v, Mapping):
        return model.EMPTY
    own: dict[str, str] = {}
    values: dict[str, str] = {}  # restart-issued-at and -attempted-at are mostly equal: one string
    for k, val in v.items():
        if isinstance(k, str) and k.startswith(_OWN_PREFIX) and isinstance(val, str):
            own[_shared(k)] = _shared(val) if k in _SHARED_VM_VALUES else values.setdefault(val, val)
    return model.frozen_map(own) if own else model.EMPTY


def _labels(v: object, name: str) -> Mapping[str, str]:
    """A Namespace's labels with their values shared: "" or "true", or the namespace's own name
    (kubernetes.io/metadata.name), which is then the name itself. (The JSON decoder already shares
    the keys within a page; a tenant's own label key is unique, so interning it would only cost.)"""
    if not isinstance(v, Mapping):
        return model.EMPTY
    out = {k: name if val == name else _shared(val) for k, val in v.items()
           if isinstance(k, str) and isinstance(val, str)}
    return model.frozen_map(out) if out else model.EMPTY


def _shared_map(v: object) -> Mapping[str, str]:
    """`_str_map` for maps many objects carry verbatim (licensectl's own replica labels and annotations):
    equal maps come out as one object. Bounded, so a churn of distinct maps only costs the cache's size."""
    if not isinstance(v, Mapping):
        return model.EMPTY
    return _shared_items(tuple((k, val) for k, val in v.items() if isinstance(k, str) and isinstance(val, str)))


def _meta(obj: object) -> Mapping[str, Any]:
    return _dict(_path(obj, "metadata"))


class _Meta(TypedDict):
    """The metadata fields the namespaced projections share, named as in `licensectl.core.model`."""

    namespace: str
    name: str
    uid: str
    resource_version: str


def _common(obj: object) -> _Meta | None:
    """Shared metadata of a namespaced object; None when it has no name or namespace (unidentifiable)."""
    meta = _meta(obj)
    name, ns = _str(meta.get("name")), _shared_name(meta.get("namespace"))
    if name is None or ns is None:
        return None
    return _Meta(namespace=ns, name=name, uid=_str(meta.get("uid")) or "",
                 resource_version=_str(meta.get("resourceVersion")) or "")


def _annotations(obj: object) -> Mapping[str, str]:
    return _str_map(_path(obj, "metadata", "annotations"))


def _controller_owner(meta: Mapping[str, Any], kind: str, group: str | None) -> Mapping[str, Any] | None:
    """The ownerReference with controller=true of the given kind (and API group, when given)."""
    for ref in _list(meta.get("ownerReferences")):
        if not isinstance(ref, Mapping) or ref.get("kind") != kind or ref.get("controller") is not True:
            continue
        api_version = ref.get("apiVersion")
        if group is not None:
            if not isinstance(api_version, str) or api_version.partition("/")[0] != group:
                continue
        elif api_version not in (None, "v1"):
            continue
        if _str(ref.get("name")) is None:
            continue
        return ref
    return None


def _decode_data(v: object) -> dict[str, bytes]:
    """Secret .data is base64 per key; undecodable keys are dropped (the apiserver never sends them)."""
    out: dict[str, bytes] = {}
    for k, val in _dict(v).items():
        if not isinstance(k, str) or not isinstance(val, str):
            continue
        try:
            out[k] = base64.b64decode(val, validate=True)
        except (binascii.Error, ValueError):
            continue
    return out


# ---------------------------------------------------------------------------------------------
# Projections
# ---------------------------------------------------------------------------------------------
def namespace_from(obj: object) -> model.Namespace | None:
    meta = _meta(obj)
    name = _shared_name(meta.get("name"))  # every namespaced object in it repeats the name
    if name is None:
        return None
    # Cozystack's parent link: the controller ownerReference of kind Namespace (core group, "v1").
    owner = _controller_owner(meta, "Namespace", None)
    terminating = bool(meta.get("deletionTimestamp")) or _path(obj, "status", "phase") == "Terminating"
    # The parent's name and uid recur in every child: shared.
    return model.Namespace(
        name=name,
        uid=_str(meta.get("uid")) or "",
        labels=_labels(meta.get("labels"), name),
        owner_name=_shared_name(owner.get("name")) if owner else None,
        owner_uid=_shared_name(owner.get("uid")) if owner else None,
        terminating=terminating,
    )


def _raw_scalar(v: object) -> object | None:
    """featureType stays raw for render to validate, but only as an immutable scalar."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return f"<{type(v).__name__}>"


def gpu_class_from(obj: object) -> model.GpuClass | None:
    meta = _meta(obj)
    name = _str(meta.get("name"))
    if name is None:
        return None
    spec = _dict(_path(obj, "spec"))
    lic = _dict(spec.get("license"))
    ref = _dict(lic.get("secretRef"))
    ref_ns, ref_name = _str(ref.get("namespace")), _str(ref.get("name"))
    return model.GpuClass(
        name=name,
        uid=_str(meta.get("uid")) or "",
        mode=_str(spec.get("mode")),
        secret_ref=model.ObjectRef(ref_ns, ref_name) if ref_ns and ref_name else None,
        feature_type=_raw_scalar(lic.get("featureType")),
        profile=_raw_scalar(spec.get("profile")),
        accept_license_change=_str(_dict(meta.get("annotations")).get(model.ANN_ACCEPT_LICENSE_CHANGE)),
    )


def gpu_claim_from(obj: object) -> model.GpuClaim | None:
    m = _common(obj)
    if m is None:
        return None
    # Claim names recur across namespaces (the informer's key shares them too: watch.shared_name_key).
    return model.GpuClaim(namespace=m["namespace"], name=_shared(m["name"]),
                          class_name=_shared_name(_path(obj, "spec", "className")))


def source_secret_from(obj: object) -> model.SourceSecret | None:
    """Holds token bytes: callers must never log `data`."""
    m = _common(obj)
    return None if m is None else model.SourceSecret(**m, annotations=_annotations(obj),
                                                     data=MappingProxyType(_decode_data(_path(obj, "data"))))


def secret_version_from(obj: object) -> str | None:
    """Only a Secret's resourceVersion: what a watch needs to tell that it changed, never its data."""
    m = _common(obj)
    return None if m is None else m["resource_version"] or None


def replica_secret_from(obj: object) -> model.ReplicaSecret | None:
    """Keeps a digest of the data, never the bytes."""
    m = _common(obj)
    if m is None:
        return None
    # Named after its class in every namespace: the name is shared (and so by watch.shared_name_key).
    # Labels and annotations are kept whole (a replace keeps others' keys) but shared: every replica of
    # one revision carries the same.
    m["name"] = _shared(m["name"])
    return model.ReplicaSecret(**m, labels=_shared_map(_path(obj, "metadata", "labels")),
                               annotations=_shared_map(_path(obj, "metadata", "annotations")),
                               data_digest=model.data_digest(_decode_data(_path(obj, "data"))))


def _running_since(status: Mapping[str, Any]) -> dt.datetime | None:
    # kubevirt/kubevirt staging/src/kubevirt.io/api/core/v1/types.go:
    # status.phaseTransitionTimestamps[] = {phase, phaseTransitionTimestamp}; the latest Running entry.
    best: dt.datetime | None = None
    for e in _list(status.get("phaseTransitionTimestamps")):
        if not isinstance(e, Mapping) or e.get("phase") != "Running":
            continue
        t = parse_time(e.get("phaseTransitionTimestamp"))
        if t is not None and (best is None or t > best):
            best = t
    return best


def vmi_gpu_claims(obj: object) -> tuple[str, ...]:
    """The GPUClaims a VMI uses, in device order, without duplicates (docs/design.md#vmi-claims).

    KubeVirt's DRA shape (kubevirt.io/api core/v1 >= v1.6): `spec.domain.devices.gpus[].claimName`
    names an entry of `spec.resourceClaims[]`, whose `resourceClaimName` (or
    `resourceClaimTemplateName`) is taken as the GPUClaim's name: the assumed contract. Platforms
    without DRA list claim names in the `licensectl.io/gpu-claims` annotation instead; both are read.
    """
    spec = _dict(_path(obj, "spec"))
    pod_claims: dict[str, str] = {}
    for rc in _list(spec.get("resourceClaims")):
        name = _str(_path(rc, "name"))
        target = _str(_path(rc, "resourceClaimName")) or _str(_path(rc, "resourceClaimTemplateName"))
        if name is not None and target is not None:
            pod_claims.setdefault(name, target)
    out: list[str] = []
    for gpu in _list(_path(spec, "domain", "devices", "gpus")):
        claim = _str(_path(gpu, "claimName"))
        target = pod_claims.get(claim) if claim is not None else None
        if target is not None and target not in out:
            out.append(target)
    ann = _str_map(_path(obj, "metadata", "annotations")).get(model.ANN_GPU_CLAIMS, "")
    for raw in ann.split(","):
        name = raw.strip()
        if name and name not in out:
            out.append(name)
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _stamp(value: str) -> tuple[tuple[str, str], ...]:
    """One parsed stamp per distinct value: every VMI admitted at one revision carries the same."""
    return tuple((_shared(n), _shared(r)) for n, r in parse_stamp(value))


def _disk_ids(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """Disk serials and secret volume labels: what a guest finds a disk by (core.delivery.refusal)."""
    out: list[str] = []
    for d in _list(_path(spec, "domain", "devices", "disks")):
        serial = _str(_path(d, "serial"))
        if serial is not None and serial not in out:
            out.append(serial)
    for v in _list(spec.get("volumes")):
        label = _str(_path(v, "secret", "volumeLabel"))
        if label is not None and label not in out:
            out.append(label)
    return tuple(out)


def vmi_from(obj: object) -> model.Vmi | None:
    meta = _meta(obj)
    m = _common(obj)
    created = parse_time(meta.get("creationTimestamp"))
    # Without a creation time the rollout cannot tell old from new: invisible is safer than guessed.
    if m is None or created is None:
        return None
    status = _dict(_path(obj, "status"))
    spec = _dict(_path(obj, "spec"))
    owner = _controller_owner(meta, "VirtualMachine", KUBEVIRT_GROUP)
    ready = any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in _list(status.get("conditions"))
    )
    volumes = tuple(
        sn
        for v in _list(spec.get("volumes"))
        if (sn := _str(_path(v, "secret", "secretName"))) is not None
    )
    volume_names = tuple(n for v in _list(spec.get("volumes")) if (n := _str(_path(v, "name"))) is not None)
    annotations = _dict(meta.get("annotations"))
    stamp = annotations.get(model.ANN_DELIVERED_REVISION)
    key = annotations.get(model.ANN_DELIVERED_KEY)
    name = m["name"]
    owner_vm = _str(owner.get("name")) if owner else None
    running = _running_since(status)
    return model.Vmi(
        namespace=m["namespace"],
        name=name,
        uid=m["uid"],
        created_us=to_epoch_us(created),
        owner_vm=name if owner_vm == name else owner_vm,  # a VM's VMI carries its name: one string
        phase=_shared(_str(status.get("phase")) or ""),
        ready=ready,
        running_since_us=None if running is None else to_epoch_us(running),
        secret_volumes=_shared_tuple(volumes),
        firmware_uuid=_str(_path(spec, "domain", "firmware", "uuid")),
        deleting=bool(meta.get("deletionTimestamp")),
        gpu_claims=_shared_tuple(vmi_gpu_claims(obj)),
        volume_names=_shared_tuple(volume_names),
        delivered_revisions=_stamp(stamp) if isinstance(stamp, str) and stamp else (),
        delivered_key=_shared(key) if isinstance(key, str) and key else None,
        disk_serials=_shared_tuple(_disk_ids(spec)),
    )


# ---------------------------------------------------------------------------------------------
# Relevance: the VMIs and VMs the caches hold (docs/design.md#decision-cache-relevance)
# ---------------------------------------------------------------------------------------------
def _asks_for_license(obj: object) -> bool:
    """A VMI (or a VM's template) that names a GPU claim, mounts a replica or carries a licensectl.io/
    annotation: the only ones licensectl could ever deliver to, restart, drain or judge.

    `spec.resourceClaims` or `spec.domain.devices.gpus` alone count too, so a claim wired in a way
    `vmi_gpu_claims` cannot read yet is held rather than missed (its view then says why)."""
    spec = _dict(_path(obj, "spec"))
    if _list(spec.get("resourceClaims")) or _list(_path(spec, "domain", "devices", "gpus")):
        return True
    for v in _list(spec.get("volumes")):
        name = _path(v, "secret", "secretName")
        if isinstance(name, str) and name.startswith(REPLICA_PREFIX):
            return True
    annotations = _path(obj, "metadata", "annotations")
    return isinstance(annotations, Mapping) and any(
        isinstance(k, str) and k.startswith(_OWN_PREFIX) for k in annotations)


def vmi_relevant(obj: Mapping[str, Any]) -> bool:
    """Whether the VMI cache holds this VMI: a VMI that asks for no license costs the controller nothing."""
    return _asks_for_license(obj)


def vm_relevant(obj: Mapping[str, Any]) -> bool:
    """Whether the VM cache holds this VM: its template asks for a license (so its VMIs do), it carries
    licensectl's own annotations (an intent or a drain cycle outlives its VMI) or it is a tenant-cluster
    worker (model.CAPK_LABELS)."""
    if _asks_for_license(_path(obj, "spec", "template")):
        return True
    meta = _dict(_path(obj, "metadata"))
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping) and any(isinstance(k, str) and k.startswith(_OWN_PREFIX) for k in annotations):
        return True
    labels = meta.get("labels")
    return isinstance(labels, Mapping) and any(k in labels for k in model.CAPK_LABELS)


def run_strategy_of(spec: Mapping[str, Any]) -> str | None:
    """Mirror of VirtualMachine.RunStrategy() in kubevirt/kubevirt
    staging/src/kubevirt.io/api/core/v1/types.go: legacy `running` maps true->Always, false->Halted;
    neither set -> Halted; both set is invalid (None: unknown)."""
    running, strategy = spec.get("running"), spec.get("runStrategy")
    if running is not None and strategy is not None:
        return None
    if running is not None:
        if not isinstance(running, bool):
            return None
        return "Always" if running else "Halted"
    if strategy is not None:
        return _str(strategy)
    return "Halted"


def vm_from(obj: object) -> model.Vm | None:
    m = _common(obj)
    if m is None:
        return None
    strategy = run_strategy_of(_dict(_path(obj, "spec")))
    return model.Vm(namespace=m["namespace"], name=m["name"], resource_version=m["resource_version"],
                    run_strategy=None if strategy is None else _shared(strategy),
                    annotations=_own_annotations(_path(obj, "metadata", "annotations")),
                    labels=_machine_labels(_path(obj, "metadata", "labels")))


def _machine_labels(v: object) -> Mapping[str, str]:
    """The CAPK machine labels only (model.CAPK_LABELS): every other VM label is never read."""
    if not isinstance(v, Mapping):
        return model.EMPTY
    own = {_shared(k): _shared(val) for k in model.CAPK_LABELS if isinstance(val := v.get(k), str) and val}
    return model.frozen_map(own) if own else model.EMPTY


def tls_secret_from(obj: object) -> model.TLSSecret | None:
    """The serving-certificate Secret; undecodable data keys are dropped, like any Secret's."""
    meta = _meta(obj)
    name = _str(meta.get("name"))
    if name is None:
        return None
    return model.TLSSecret(
        namespace=_str(meta.get("namespace")) or "", name=name, uid=_str(meta.get("uid")) or "",
        resource_version=_str(meta.get("resourceVersion")) or "", type=_str(_path(obj, "type")) or "",
        annotations=_str_map(meta.get("annotations")), data=MappingProxyType(_decode_data(_path(obj, "data"))))


def revision_store_from(obj: object) -> model.RevisionStore | None:
    """Holds token bytes: callers must never log `data`."""
    m = _common(obj)
    return None if m is None else model.RevisionStore(**m, annotations=_annotations(obj),
                                                      data=MappingProxyType(_decode_data(_path(obj, "data"))))


# ---------------------------------------------------------------------------------------------
# Boot image marks (licensectl/core/boot_image.py): the vGPU guest driver label on golden images
# ---------------------------------------------------------------------------------------------
def boot_mark_from(obj: object) -> boot_image.Marked | None:
    """A PVC or CDI DataSource from the label-selected caches: only its identity is kept (the label
    selector already says it carries the mark)."""
    m = _common(obj)
    return None if m is None else boot_image.Marked(namespace=m["namespace"], name=m["name"])


def _ref_in(namespace: str, ref: object) -> tuple[str, str] | None:
    """(namespace, name) of a CDI object reference; its namespace defaults to the referrer's."""
    name = _str(_path(ref, "name"))
    return None if name is None else (_shared_name(_path(ref, "namespace")) or namespace, _shared(name))


def vm_template(obj: object) -> dict[str, Any]:
    """A VirtualMachine's `spec.template` as the VMI it starts would look (its metadata and spec): what
    the boot image check and the GPU claims are read from at VirtualMachine admission."""
    template = _dict(_path(obj, "spec", "template"))
    return {"metadata": _dict(template.get("metadata")), "spec": _dict(template.get("spec"))}


def vm_data_volume_templates(namespace: str, obj: object) -> dict[tuple[str, str], boot_image.DataVolumeRef]:
    """The DataVolumes a VirtualMachine's `spec.dataVolumeTemplates` will create, slim as `data_volume_from`
    reads them: at the VM's creation they do not exist yet, but their marks and golden images are known."""
    out: dict[tuple[str, str], boot_image.DataVolumeRef] = {}
    for t in _list(_path(obj, "spec", "dataVolumeTemplates")):
        name = _str(_path(t, "metadata", "name"))
        dv = data_volume_from({"metadata": {**_dict(_path(t, "metadata")), "namespace": namespace, "name": name},
                               "spec": _path(t, "spec")}) if name else None
        if dv is not None:
            out[(namespace, dv.name)] = dv
    return out


def data_volume_from(obj: object) -> boot_image.DataVolumeRef | None:
    """A CDI DataVolume (cdi.kubevirt.io/v1beta1), slim: its own mark and the golden image it is cloned
    from, `spec.sourceRef` (kind DataSource) or `spec.source.pvc`. The references are shared: many
    DataVolumes clone the same few golden images."""
    m = _common(obj)
    if m is None:
        return None
    spec = _dict(_path(obj, "spec"))
    source_ref = _dict(spec.get("sourceRef"))
    labels = _dict(_path(obj, "metadata", "labels"))
    return boot_image.DataVolumeRef(
        namespace=m["namespace"], name=m["name"],
        marked=labels.get(boot_image.MARK_LABEL) == boot_image.MARK_VALUE,
        data_source=_ref_in(m["namespace"], source_ref) if source_ref.get("kind") == boot_image.DATA_SOURCE_KIND
        else None,
        source_pvc=_ref_in(m["namespace"], _path(spec, "source", "pvc")))
