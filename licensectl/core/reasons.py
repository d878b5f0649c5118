"""The reasons of the Kubernetes Events licensectl writes, as named constants.

A reason is an interface: hosters filter on it (`kubectl get events --field-selector reason=...`)
and docs/operations.md#events lists each one. Naming them in one place keeps a typo from silently
creating a new reason and makes the full list reviewable next to that table. The values are the
wire strings, unchanged; a `StrEnum` member is the plain string wherever it is written.
"""

from __future__ import annotations

from enum import StrEnum


class EventType(StrEnum):
    """A Kubernetes Event's type: the only two values core/v1 knows."""

    NORMAL = "Normal"
    WARNING = "Warning"


class Reason(StrEnum):
    # -- replication (controllers/replication_loop.py) ------------------------------------------
    LICENSE_ROTATED = "LicenseRotated"  # once per rotation pass and class, on the source Secret
    REPLICA_REVERTED = "ReplicaReverted"  # a replica's content or marks drifted and were written back
    CREDENTIAL_REWRITTEN = "CredentialRewritten"  # once per pass and class: a new signing key's credential written
    CREDENTIAL_REVOKED = "CredentialRevoked"  # once per pass and class: a key revocation's new revision written
    REPLICA_DELETED = "ReplicaDeleted"  # a replica deleted: its namespace is no longer entitled
    REPLICA_CONFLICT = "ReplicaConflict"  # a Secret licensectl does not own holds a replica's name
    DELETION_CAP_HIT = "DeletionCapHit"  # replica deletions deferred by the per-minute cap
    LICENSE_TOKEN_UNREADABLE = "LicenseTokenUnreadable"  # the token is no JWT with an exp: expiry unknown
    LICENSE_SOURCE_INVALID = "LicenseSourceInvalid"  # the source is missing or invalid: replicas kept
    # The class's featureType cannot license its spec.profile (core/profiles.py); replicas still rendered.
    FEATURE_TYPE_MISMATCH = "FeatureTypeMismatch"
    # A class's secretRef or featureType was edited in place: its replicas are held until accepted.
    GPU_CLASS_LICENSE_CHANGED = "GPUClassLicenseChanged"
    # The tenant problems (core.entitlement.ProblemKind), on the namespace, claim or class at fault.
    CYCLE = "Cycle"  # the tenant tree loops at this namespace
    MISSING_PARENT = "MissingParent"  # the namespace's parent tenant does not exist
    LINK_MISMATCH = "LinkMismatch"  # ownerReference, name and ancestor labels disagree
    UNKNOWN_CLASS = "UnknownClass"  # a GPUClaim names a GPUClass that does not exist
    INVALID_CLASS = "InvalidClass"  # a GPUClass's mode or license reference is invalid

    # -- safe rotation (core/rotation.py decides, controllers/rotation.py emits) -------------
    ROTATION_STARTED = "RotationStarted"  # a candidate revision starts its canary
    NO_GUEST_EVIDENCE = "NoGuestEvidence"  # with RotationStarted: no guest ever reported, readiness only
    CANARY_EMPTY = "CanaryEmpty"  # with RotationStarted: no VM fits the canary, on to step 1 unanalysed
    ROTATION_STEP_STARTED = "RotationStepStarted"  # a wave passed; the next step gets the candidate
    ROTATION_PROMOTED = "RotationPromoted"  # the last step passed: every namespace on the candidate
    ROLLOUT_ABORTED = "RolloutAborted"  # a wave failed its analysis: every namespace back to stable
    ROLLOUT_UNDONE = "RolloutUndone"  # the hoster ran `licensectl rollout undo`
    CANDIDATE_WITHDRAWN = "CandidateWithdrawn"  # the source holds the stable revision again
    ROTATION_SUPERSEDED = "RotationSuperseded"  # a new source revision replaced a candidate not yet promoted
    REVISION_STORE_INVALID = "RevisionStoreInvalid"  # the revision store holds no readable record

    # -- rollout (controllers/rollout_loop.py) ----------------------------------------------------
    ROLLOUT_STARTED = "RolloutStarted"  # restarts of stale VMIs begin (after the settle period)
    ROLLOUT_PAUSED = "RolloutPaused"  # failure budget spent, or paused by hand
    ROLLOUT_COMPLETED = "RolloutCompleted"  # every affected VMI runs the current revision
    RESTART_FAILED = "RestartFailed"  # a restarted VMI did not come back, or no way to restart exists
    RESTART_BLOCKED = "RestartBlocked"  # a stale VMI licensectl cannot restart (e.g. no owning VM)
    # The restart pre-flight (a dry-run create of the VM's next VMI) was refused: the VM is not restarted.
    RESTART_PREFLIGHT_DENIED = "RestartPreflightDenied"
    LICENSE_VOLUME_MISSING = "LicenseVolumeMissing"  # a VMI of an entitled vGPU claim lacks its volume
    # A VMI lacks its volume and its spec makes delivery impossible (a volume name or serial taken): not restarted.
    LICENSE_DELIVERY_BLOCKED = "LicenseDeliveryBlocked"

    # -- tenant cluster workers (controllers/worker_drain.py, docs/design.md#tenant-worker-drain) -----
    # A worker's drain cannot go on: closed for its revision (PDBBlocked, DrainTimeout, BootTimeout,
    # IntentUnreadable) or held (ClusterUnreachable, NodeMissing); on the VM and on the source Secret.
    WORKER_DRAIN_BLOCKED = "WorkerDrainBlocked"

    # -- hoster actions (cli/actions.py, `licensectl rollout pause|resume|retry|undo`) ---------------
    ROLLOUT_PAUSE_REQUESTED = "RolloutPauseRequested"  # the hoster paused a source's rollout
    ROLLOUT_RESUME_REQUESTED = "RolloutResumeRequested"  # the hoster resumed it
    ROLLOUT_RETRY_REQUESTED = "RolloutRetryRequested"  # the hoster retried an aborted or undone candidate
    ROLLOUT_UNDO_REQUESTED = "RolloutUndoRequested"  # the hoster undid a candidate
    WORKER_RETRY_REQUESTED = "WorkerRetryRequested"  # the hoster asked to retry a worker down after BootTimeout
    WORKER_SKIP_REQUESTED = "WorkerSkipRequested"  # the hoster gave a worker down after BootTimeout up

    # -- admission (app.py, from the webhook's answers) -------------------------------------------
    LICENSE_NOT_DELIVERED = "LicenseNotDelivered"  # a VMI admitted unchanged, without a license volume
    VGPU_DRIVER_UNMARKED = "VGPUDriverUnmarked"  # a vGPU VMI boots from an image not marked as having the driver

    # -- serving certificate (kube/serving_tls.py) ------------------------------------------------
    FOREIGN_TLS_SECRET = "ForeignTLSSecret"  # the serving-certificate Secret is not licensectl's
    # The webhook configuration licensectl needs is missing, or a webhook of it has no caBundle: VMIs are
    # admitted without their license volume (failurePolicy Ignore) while it lasts.
    WEBHOOK_CONFIGURATION_PROBLEM = "WebhookConfigurationProblem"
