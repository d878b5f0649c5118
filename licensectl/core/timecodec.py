"""Time values as the Kubernetes API carries them: the two forms licensectl writes, one parser.

Every timestamp licensectl writes to, or reads from, an API object goes through this module, so
the wire forms are decided in one place. Stdlib only: the pure core imports it.

Written forms (both RFC 3339 in UTC with a literal ``Z``; naive datetimes are taken as UTC, which
is what the controller's clocks return):

* ``format_time`` — whole seconds, ``2024-05-01T12:00:00Z``. The wire form of ``metav1.Time``
  (``metadata.creationTimestamp``, core/v1 Event ``firstTimestamp``/``lastTimestamp``, condition
  ``lastTransitionTime``; the apiserver keeps only seconds of these) and of licensectl's
  ``revision-time`` annotation on replica Secrets, which the rollout compares with VMI start times
  of one-second resolution.
* ``format_micro_time`` — six fractional digits, ``2024-05-01T12:00:00.000000Z``. The wire form of
  ``metav1.MicroTime`` (coordination/v1 Lease ``spec.acquireTime``/``spec.renewTime``,
  events.k8s.io ``eventTime``) and of licensectl's ``restart-issued-at``, ``restart-attempted-at``
  and ``rollout-resumed-at`` annotations, where the order of a resume and a restart inside one
  second decides whether a failure is forgiven.

``parse_time`` reads all of these and what other writers produce: RFC 3339 with ``Z`` or a numeric
offset, any number of fractional digits (cut to microseconds, as Go's RFC3339Nano may carry nine).
``annotation_time`` reads one annotation with it, forgiving the whitespace of hand edits.

``to_epoch_us``/``from_epoch_us`` hold a time as microseconds since the Unix epoch in a float, half
a datetime's size (an int that large takes 32 bytes, a float 24): the caches keep two times per VMI.
A double holds every whole microsecond exactly from 1686 to 2254, which covers every time an
apiserver writes; beyond, a time is kept to the nearest count a double holds (within datetime's range).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping

__all__ = ["annotation_time", "format_micro_time", "format_time", "from_epoch_us", "parse_time", "to_epoch_us",
           "to_utc"]

# RFC 3339 date-time plus the leniencies of real writers: lower-case t/z and a space separator
# (RFC 3339 §5.6 note), an offset without colon (journald's short-iso), no zone at all (only with
# assume_utc). Whitespace is not part of the grammar: callers reading hand-edited text strip it.
_DATE_TIME = re.compile(
    r"(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})[Tt ](?P<h>\d{2}):(?P<mi>\d{2}):(?P<s>\d{2})"
    r"(?:\.(?P<frac>\d+))?"
    r"(?:(?P<z>[Zz])|(?P<sign>[+-])(?P<oh>\d{2}):?(?P<om>\d{2}))?",
    re.ASCII,  # \d would otherwise match any Unicode digit
)


def to_utc(t: dt.datetime) -> dt.datetime:
    """``t`` as an aware UTC datetime; a naive ``t`` is taken to be UTC already (never local time)."""
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MICROSECOND = dt.timedelta(microseconds=1)
# The floats nearest to datetime's ends that stay inside its range.
_MIN_US = math.nextafter(float((dt.datetime.min.replace(tzinfo=dt.UTC) - _EPOCH) // _MICROSECOND), 0.0)
_MAX_US = math.nextafter(float((dt.datetime.max.replace(tzinfo=dt.UTC) - _EPOCH) // _MICROSECOND), 0.0)


def to_epoch_us(t: dt.datetime) -> float:
    """Microseconds since the Unix epoch (a naive ``t`` is taken as UTC, like everywhere here)."""
    return min(max(float((to_utc(t) - _EPOCH) // _MICROSECOND), _MIN_US), _MAX_US)


def from_epoch_us(us: float) -> dt.datetime:
    """The aware UTC datetime of ``to_epoch_us``: ``from_epoch_us(to_epoch_us(t)) == t`` in 1686..2254.

    Hot (the rollout reads VMI start times every pass): one timedelta, no checks. ``us`` must come
    from ``to_epoch_us``; anything else may be out of datetime's range (OverflowError).
    """
    return _EPOCH + dt.timedelta(0, 0, us)


def format_time(t: dt.datetime) -> str:
    """RFC 3339, UTC, whole seconds (fraction dropped): ``metav1.Time`` and the revision-time annotation."""
    return to_utc(t).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


def format_micro_time(t: dt.datetime) -> str:
    """RFC 3339, UTC, exactly six fractional digits: ``metav1.MicroTime`` and the restart/resume annotations."""
    return to_utc(t).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_time(value: object, *, assume_utc: bool = False) -> dt.datetime | None:
    """An RFC 3339 timestamp as an aware UTC datetime; None for anything else, never an exception.

    Accepts ``Z`` or a numeric offset, with or without fractional seconds. A value without a zone is
    ambiguous: it is rejected (None) unless ``assume_utc`` is set, which is for data licensectl or a
    guest tool wrote in UTC without saying so. Non-strings, empty strings, surrounding whitespace,
    impossible dates and values outside datetime's range all give None.
    """
    if not isinstance(value, str):
        return None
    m = _DATE_TIME.fullmatch(value)
    if m is None or (m["z"] is None and m["sign"] is None and not assume_utc):
        return None
    frac = (m["frac"] or "")[:6].ljust(6, "0")
    try:
        tz = dt.UTC
        if m["sign"] is not None:
            hours, minutes = int(m["oh"]), int(m["om"])
            if minutes > 59:
                return None
            offset = dt.timedelta(hours=hours, minutes=minutes)  # 24h or more: timezone() refuses
            tz = dt.timezone(-offset if m["sign"] == "-" else offset)
        t = dt.datetime(int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]),
                        int(frac), tzinfo=tz)
        return t.astimezone(dt.UTC)
    except (ValueError, OverflowError):
        return None


def annotation_time(annotations: Mapping[str, str], key: str) -> dt.datetime | None:
    """The time in annotation ``key``; None when absent or unreadable.

    Annotations can be edited by hand (``kubectl annotate``), so surrounding whitespace is ignored;
    a zone is still required, since a zone-less time could be read hours off.
    """
    return annotation_value_time(annotations.get(key))


def annotation_value_time(raw: object) -> dt.datetime | None:
    """`annotation_time` of a value already read (a missing annotation is None)."""
    return parse_time(raw.strip()) if isinstance(raw, str) else None
