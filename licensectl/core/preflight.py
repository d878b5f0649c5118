"""Pre-flight before a restart: a VM is restarted only while the apiserver says its new VMI would be admitted.

A restart deletes the running VMI and the VM controller creates a new one from the VM's template, through
every admission webhook and policy of the cluster. One that refuses it (licensectl's own boot image check in
`--vgpu-driver-check=enforce`, a policy engine, a quota) leaves the VM with no VMI at all. So before each
restart the shell asks the apiserver for a server-side dry-run create of the VMI the template makes
(kube/preflight.py); this module decides what an answer means and keeps the hold it leads to.

The hold is recorded on the VM (annotations licensectl owns), so a new leader knows it without asking again
(docs/design.md#restart-preflight): it names the revision and the VMI the restart was for, when it was
checked and the refusal. While it holds, the VM is blocked (never picked, no restart slot, not in progress);
after `RECHECK_SECONDS` it is planned again, and the restart path asks again before any restart. A hold for
another revision or another VMI holds nothing. The restart intent clears it in the same write.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from licensectl.core.model import DOMAIN
from licensectl.core.timecodec import annotation_value_time, format_micro_time

ANN_PREFLIGHT_DENIED = f"{DOMAIN}/preflight-denied"  # the refusal, as the apiserver worded it (bounded)
ANN_PREFLIGHT_REVISION = f"{DOMAIN}/preflight-revision"
ANN_PREFLIGHT_VMI_UID = f"{DOMAIN}/preflight-vmi-uid"
ANN_PREFLIGHT_AT = f"{DOMAIN}/preflight-at"
HOLD_ANNOTATIONS = (ANN_PREFLIGHT_DENIED, ANN_PREFLIGHT_REVISION, ANN_PREFLIGHT_VMI_UID, ANN_PREFLIGHT_AT)

# How long a refusal holds before the VM is planned, and so asked about, again: a hoster who marks the
# image or changes the policy sees the VM restarted within about this long, without touching the VM.
RECHECK_SECONDS = 60.0
MESSAGE_LIMIT = 400

# Metric label values of licensectl_restart_preflights_total.
ADMITTED = "admitted"
DENIED = "denied"
UNANSWERED = "unanswered"
RESULTS = (ADMITTED, DENIED, UNANSWERED)


@dataclass(frozen=True, slots=True)
class Admission:
    """What the dry-run create of a VM's next VMI said. `answered`: the apiserver decided (a refusal by
    admission or validation), as opposed to no decision (a timeout, a 5xx, no connection)."""

    admitted: bool
    message: str = ""
    answered: bool = True

    @property
    def result(self) -> str:
        return ADMITTED if self.admitted else DENIED if self.answered else UNANSWERED


@dataclass(frozen=True, slots=True)
class PreflightHold:
    """A refused pre-flight, as recorded on the VM."""

    revision: str
    vmi_uid: str
    at: dt.datetime
    message: str

    def render_annotations(self) -> dict[str, str]:
        return {ANN_PREFLIGHT_DENIED: bounded(self.message), ANN_PREFLIGHT_REVISION: self.revision,
                ANN_PREFLIGHT_VMI_UID: self.vmi_uid, ANN_PREFLIGHT_AT: format_micro_time(self.at)}

    @property
    def recheck_at(self) -> dt.datetime:
        return self.at + dt.timedelta(seconds=RECHECK_SECONDS)

    def holds(self, revision: str, vmi_uid: str, now: dt.datetime) -> bool:
        """Whether it holds back a restart of VMI `vmi_uid` for `revision` at `now`."""
        return self.revision == revision and self.vmi_uid == vmi_uid and now < self.recheck_at

    def reason(self) -> str:
        return f"restart pre-flight: the new VMI would be refused ({self.message}); asked again after " \
               f"{format_micro_time(self.recheck_at)}"


def bounded(message: str) -> str:
    """One line, at most MESSAGE_LIMIT characters: an annotation, an Event and a status row carry it."""
    text = " ".join(message.split())
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT - 3] + "..."


def hold_of(annotations: Mapping[str, str]) -> PreflightHold | None:
    """The hold recorded on the VM; None when absent or unreadable (an unreadable one holds nothing: the
    restart path asks again before any restart anyway)."""
    revision, at = annotations.get(ANN_PREFLIGHT_REVISION), annotation_value_time(annotations.get(ANN_PREFLIGHT_AT))
    if not revision or at is None:
        return None
    return PreflightHold(revision, annotations.get(ANN_PREFLIGHT_VMI_UID, ""), at,
                         annotations.get(ANN_PREFLIGHT_DENIED, "") or "refused")


def cleared() -> dict[str, str | None]:
    """The merge patch that drops a hold (written with the restart intent that supersedes it)."""
    return dict.fromkeys(HOLD_ANNOTATIONS)
