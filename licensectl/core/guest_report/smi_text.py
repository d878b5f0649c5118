"""`nvidia-smi -q` text to per-GPU licensing, for probes that send the plain-text form. A line scanner
with its own tolerance for layout differences between drivers (padding, indentation, grep'd output),
independent of the XML parser that yields the same result.
"""

from __future__ import annotations

import re

from licensectl.core.guest_report.license_status import _gpu
from licensectl.core.guest_report.limits import BAD_FORMAT, DEFAULT_LIMITS, TOO_LARGE, ReportError, ReportLimits
from licensectl.core.guest_report.state import GpuLicense

_GPU_HEADER = re.compile(r"GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_LICENSE_SECTION = "vgpu software licensed product"


def parse_smi_text(text: str, limits: ReportLimits = DEFAULT_LIMITS) -> tuple[GpuLicense, ...]:
    """Licensing of every GPU in `nvidia-smi -q` text.

    Key/value lines are split on the first `:` (column padding varies between drivers). The
    license section ends at the next header line or at a line indented no deeper than its header;
    the header itself may be unindented (fixtures/nvidia/smi-q-licensed-unpadded-date.txt).
    """
    lines = text.splitlines()
    if len(lines) > limits.max_text_lines:
        raise ReportError(TOO_LARGE, "nvidia-smi text has too many lines")
    driver: str | None = None
    gpus: list[dict[str, str | None]] = []
    current: dict[str, str | None] | None = None
    section_indent: int | None = None  # set while inside a license section

    for raw in lines:
        stripped = raw.strip()
        if not stripped:
            continue
        indent = len(raw) - len(raw.lstrip())
        header = _GPU_HEADER.fullmatch(stripped)
        if header:
            current = {"pci_id": header.group(1)}
            gpus.append(current)
            section_indent = None
            continue
        key, sep, value = stripped.partition(":")
        if not sep:
            section_indent = None
            if stripped.lower() == _LICENSE_SECTION:
                if current is None or "license_seen" in current:
                    # No GPU header (grep'd output) or a second section: a GPU of its own.
                    current = {"pci_id": None} if current is None else {"pci_id": current.get("pci_id")}
                    gpus.append(current)
                current["license_seen"] = "1"
                section_indent = indent
            continue
        key, value = key.strip().lower(), value.strip()
        if section_indent is not None and indent <= section_indent:
            section_indent = None
        if section_indent is not None and current is not None:
            if key == "product name":
                current["product"] = value
            elif key == "license status":
                current["status"] = value
        elif key == "driver version" and driver is None:
            driver = value
        elif current is not None and key == "gpu uuid":
            current["gpu_uuid"] = value
        elif current is not None and key == "product name":
            current["gpu_name"] = value
        if len(gpus) > limits.max_gpus:
            raise ReportError(BAD_FORMAT, "too many GPUs")
    return tuple(
        _gpu(g.get("product"), g.get("status"), driver_version=driver, pci_id=g.get("pci_id"),
             gpu_uuid=g.get("gpu_uuid"), gpu_name=g.get("gpu_name"))
        for g in gpus
    )
