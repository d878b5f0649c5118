"""The words and the objects of replication's Events: which Reason a tenant problem gets, what a held
license change says, and on which object an Event lands. Pure helpers the reconcile emits through."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from licensectl.core.entitlement import ProblemKind
from licensectl.core.model import ANN_ACCEPT_LICENSE_CHANGE
from licensectl.core.ports import InvolvedObject
from licensectl.core.reasons import Reason
from licensectl.core.render import UpdateKind
from licensectl.core.replication import LicenseChange

# The Event reason of each tenant problem is its kind in UpperCamelCase (`missing_parent` ->
# `MissingParent`); a kind without a Reason member fails here, at import, not mid-reconcile.
PROBLEM_REASONS: Mapping[ProblemKind, Reason] = {
    kind: Reason("".join(part.capitalize() for part in kind.value.split("_"))) for kind in ProblemKind}


def _short(values: Iterable[str]) -> str:
    items = list(values)
    return ", ".join(items[:3]) + (f" and {len(items) - 3} more" if len(items) > 3 else "")


def license_change_message(change: LicenseChange) -> str:
    """The GPUClassLicenseChanged Event: what changed, what licensectl did, and the two ways on."""
    return (f"GPUClass {change.class_name}: its license (secretRef namespace/name:featureType) was edited in place "
            f"from {_short(change.recorded)} to {change.current}. Its replicas are held as they are, so no VM "
            f"restarts. Better: restore the class and create a new class for the change. To roll it out to every "
            f"tenant of the class (restarting their VMs), annotate the class "
            f"{ANN_ACCEPT_LICENSE_CHANGE}={change.current}")


def namespace_object(name: str, uid: str = "") -> InvolvedObject:
    """Events about a Namespace live in that namespace, so tenants' `kubectl get events` shows them."""
    return InvolvedObject("v1", "Namespace", name, name, uid)


def secret_object(namespace: str, name: str, uid: str = "") -> InvolvedObject:
    return InvolvedObject("v1", "Secret", namespace, name, uid)


def rewrite_event(kind: UpdateKind, class_name: str, *, revision_text: str, replicas: int) -> tuple[Reason, str]:
    """The one summarising Event of a pass's routine rewrites of one kind, source and class: it says what
    happened (a new license, a key revocation, a new report credential), never "reverted"."""
    n = f"{replicas} replica{'s' if replicas != 1 else ''}"
    if kind is UpdateKind.REVOCATION:
        return (Reason.CREDENTIAL_REVOKED,
                f"{revision_text} of class {class_name} written to {n} for a signing-key revocation: the license "
                f"did not change; the rollout restarts their VMs onto the new report credential")
    if kind is UpdateKind.CREDENTIAL:
        return (Reason.CREDENTIAL_REWRITTEN,
                f"Report credential of class {class_name} rewritten in {n} for the current signing key; "
                f"the license did not change, no VM restarts")
    return Reason.LICENSE_ROTATED, f"{revision_text} of class {class_name} written to {n}"
