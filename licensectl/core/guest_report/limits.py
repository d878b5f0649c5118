"""Errors and limits of guest-report parsing: the rejection reasons (a bounded metric label),
`ReportError`, `ReportLimits`, the wire-format version and header constants, and the bounds on stored
strings. At the bottom of the package because every parser raises these and sizes against them; it
imports nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

TOO_LARGE: Final = "too_large"
BAD_ENCODING: Final = "bad_encoding"
BAD_FORMAT: Final = "bad_format"
BAD_FIELD: Final = "bad_field"
BAD_XML: Final = "bad_xml"
XML_FORBIDDEN: Final = "xml_forbidden"
REASONS: Final = frozenset({TOO_LARGE, BAD_ENCODING, BAD_FORMAT, BAD_FIELD, BAD_XML, XML_FORBIDDEN})


class ReportError(ValueError):
    """A rejected report. `reason` is one of REASONS; `message` never contains report content."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown report error reason {reason!r}")
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class ReportLimits:
    """Bounds on what a guest may send. The probe stays well below them (docs/guest.md)."""

    max_body_bytes: int = 512 * 1024
    max_header_lines: int = 16
    max_field_chars: int = 256
    max_log_lines: int = 200
    max_line_chars: int = 2048
    max_gpus: int = 32
    max_text_lines: int = 20_000


DEFAULT_LIMITS: Final = ReportLimits()

# Version 2 adds the `nvidia-smi` header (ok | missing | failed) so an image without the guest
# driver is told apart from a driver that printed nothing; version 1 bodies are still accepted.
FORMAT_VERSION: Final = 2
SUPPORTED_FORMAT_VERSIONS: Final = frozenset({1, 2})
MAGIC_KEY: Final = "licensectl-report"
SMI_HEADER: Final = "nvidia-smi"
SMI_OK: Final = "ok"
SMI_MISSING: Final = "missing"  # no nvidia-smi on PATH: the image has no vGPU guest driver
SMI_FAILED: Final = "failed"  # nvidia-smi present but gave no usable output
SMI_STATUSES: Final = frozenset({SMI_OK, SMI_MISSING, SMI_FAILED})
# Optional version 2 headers: the guest OS (the Windows agent sends `windows`), and its UTC offset,
# which places log times written without a zone (the Windows licensing log's) on the UTC axis.
OS_HEADER: Final = "os"
OS_VALUES: Final = frozenset({"linux", "windows"})
UTC_OFFSET_HEADER: Final = "utc-offset"

# Bounds on stored strings (independent of limits: they shape what downstream code may assume).
MAX_PRODUCT_CHARS: Final = 96
MAX_RAW_STATUS_CHARS: Final = 96
MAX_MESSAGE_CHARS: Final = 240
