"""Guest reports: untrusted text from inside a VM turned into a bounded, typed guest state.

Pure: no I/O, no clock (`now` is passed in). Everything here parses attacker-controlled bytes, so
every field is length- and charset-bounded, XML goes through defusedxml, and every failure is a
`ReportError` with one of a few machine reasons (used as a metric label) and a message that never
quotes the input. The wire format is documented in docs/guest.md; the probe that produces it is
licensectl/guest/licensectl-probe.sh.

May import: the standard library, defusedxml (parsing only) and other core modules; never the shell.
Being pure, the same bytes always give the same answer, so every rule is tested with plain values.

One module per job, each importing only modules listed above it:

    limits          rejection reasons, ReportError, ReportLimits, wire-format constants
    state           the data: GpuLicense, GriddEvent, GuestReport, GuestState, LicenseState
    bounded_text    whitespace-collapsed, charset-filtered, truncated strings
    products        free-text products onto metric labels; the FeatureType check
    license_status  nvidia-smi's `License Status` to a state, expiry and grace flag
    smi_xml         `nvidia-smi -q -x` (defusedxml)
    smi_text        `nvidia-smi -q` text
    gridd_log       nvidia-gridd log lines to events
    envelope        the report body: headers, sections, parse_report, render_report
    evaluation      a parsed report at `now` to one GuestState
    observation     guests over time: patience for a first report, the lease length a report implies

The public names are re-exported here; callers import them from the package.
"""

from __future__ import annotations

from licensectl.core.guest_report.bounded_text import clean_text
from licensectl.core.guest_report.envelope import (
    HEADER_KEYS,
    MAX_CLOCK,
    SECTION_END,
    SECTION_GRIDD_LOG,
    SECTION_MARKER,
    SECTION_SMI_TEXT,
    SECTION_SMI_XML,
    SECTIONS,
    parse_report,
    render_report,
)
from licensectl.core.guest_report.evaluation import evaluate, unlicensed_reason
from licensectl.core.guest_report.gridd_log import ScannedLog, parse_gridd_log, scan_gridd_log
from licensectl.core.guest_report.license_status import is_grace, parse_expiry, parse_license_status
from licensectl.core.guest_report.limits import (
    BAD_ENCODING,
    BAD_FIELD,
    BAD_FORMAT,
    BAD_XML,
    DEFAULT_LIMITS,
    FORMAT_VERSION,
    MAGIC_KEY,
    MAX_MESSAGE_CHARS,
    MAX_PRODUCT_CHARS,
    MAX_RAW_STATUS_CHARS,
    REASONS,
    SMI_FAILED,
    SMI_HEADER,
    SMI_MISSING,
    SMI_OK,
    SMI_STATUSES,
    SUPPORTED_FORMAT_VERSIONS,
    TOO_LARGE,
    XML_FORBIDDEN,
    ReportError,
    ReportLimits,
)
from licensectl.core.guest_report.products import PRODUCT_LABELS, implied_products, product_label, wrong_product
from licensectl.core.guest_report.smi_text import parse_smi_text
from licensectl.core.guest_report.smi_xml import parse_smi_xml
from licensectl.core.guest_report.state import (
    REASON_ACQUIRE_FAILED,
    REASON_CONFIG_MISSING,
    REASON_LEASE_EXPIRED,
    REASON_NOT_FOUND,
    REASON_TOKEN_CORRUPT,
    REASON_TOKEN_MISSING,
    REASON_UNKNOWN,
    UNLICENSED_REASONS,
    GpuLicense,
    GriddEvent,
    GriddEventKind,
    GuestReport,
    GuestState,
    LicenseState,
)

__all__ = [
    "BAD_ENCODING",
    "BAD_FIELD",
    "BAD_FORMAT",
    "BAD_XML",
    "DEFAULT_LIMITS",
    "FORMAT_VERSION",
    "HEADER_KEYS",
    "MAGIC_KEY",
    "MAX_CLOCK",
    "MAX_MESSAGE_CHARS",
    "MAX_PRODUCT_CHARS",
    "MAX_RAW_STATUS_CHARS",
    "PRODUCT_LABELS",
    "REASONS",
    "REASON_ACQUIRE_FAILED",
    "REASON_CONFIG_MISSING",
    "REASON_LEASE_EXPIRED",
    "REASON_NOT_FOUND",
    "REASON_TOKEN_CORRUPT",
    "REASON_TOKEN_MISSING",
    "REASON_UNKNOWN",
    "SECTIONS",
    "SECTION_END",
    "SECTION_GRIDD_LOG",
    "SECTION_MARKER",
    "SECTION_SMI_TEXT",
    "SECTION_SMI_XML",
    "SMI_FAILED",
    "SMI_HEADER",
    "SMI_MISSING",
    "SMI_OK",
    "SMI_STATUSES",
    "SUPPORTED_FORMAT_VERSIONS",
    "TOO_LARGE",
    "UNLICENSED_REASONS",
    "XML_FORBIDDEN",
    "GpuLicense",
    "GriddEvent",
    "GriddEventKind",
    "GuestReport",
    "GuestState",
    "LicenseState",
    "ReportError",
    "ReportLimits",
    "ScannedLog",
    "clean_text",
    "evaluate",
    "implied_products",
    "is_grace",
    "parse_expiry",
    "parse_gridd_log",
    "parse_license_status",
    "parse_report",
    "parse_smi_text",
    "parse_smi_xml",
    "product_label",
    "render_report",
    "scan_gridd_log",
    "unlicensed_reason",
    "wrong_product",
]
