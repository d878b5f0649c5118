"""`nvidia-smi -q -x` output to per-GPU licensing. Separate because it is the one parser of untrusted
XML: it goes through defusedxml with DTDs, entities and external references refused, and that
boundary is easiest to review when nothing else shares the module.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET  # only for the ParseError type; parsing goes through defusedxml

import defusedxml
import defusedxml.ElementTree as DET

from licensectl.core.guest_report.license_status import _gpu
from licensectl.core.guest_report.limits import (
    BAD_FORMAT,
    BAD_XML,
    DEFAULT_LIMITS,
    TOO_LARGE,
    XML_FORBIDDEN,
    ReportError,
    ReportLimits,
)
from licensectl.core.guest_report.state import GpuLicense

# Real `nvidia-smi -q -x` output starts with `<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_vNN.dtd">`
# (see apache/hadoop GpuDeviceInformationParser.java, which disables external DTD loading for the
# same reason). That exact external-subset-only declaration is removed before parsing; any other
# DTD (internal subset, entities, other names) is refused by defusedxml as xml_forbidden.
_NVIDIA_DOCTYPE = re.compile(
    rb'\A(\s*<\?xml[^<>]*\?>)?(\s*)<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+"nvsmi[A-Za-z0-9_.-]{0,40}\.dtd"\s*>'
)


def parse_smi_xml(xml: bytes, limits: ReportLimits = DEFAULT_LIMITS) -> tuple[GpuLicense, ...]:
    """Licensing of every GPU in `nvidia-smi -q -x` output (defusedxml: no DTD, entities, externals)."""
    if len(xml) > limits.max_body_bytes:
        raise ReportError(TOO_LARGE, "nvidia-smi XML exceeds the size limit")
    xml = _NVIDIA_DOCTYPE.sub(lambda m: (m.group(1) or b"") + m.group(2), xml, count=1)
    try:
        root = DET.fromstring(xml, forbid_dtd=True, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException:
        raise ReportError(XML_FORBIDDEN, "XML with a DTD, entity or external reference") from None
    except (ET.ParseError, ValueError, LookupError, UnicodeError, RecursionError):
        raise ReportError(BAD_XML, "nvidia-smi XML is not well-formed") from None
    if root.tag != "nvidia_smi_log":
        raise ReportError(BAD_XML, "XML root is not nvidia_smi_log")
    driver = root.findtext("driver_version")
    gpus = root.findall("gpu")
    if len(gpus) > limits.max_gpus:
        raise ReportError(BAD_FORMAT, "too many GPUs")
    out = []
    for g in gpus:
        lic = g.find("vgpu_software_licensed_product")
        product = lic.findtext("licensed_product_name") if lic is not None else None
        status = lic.findtext("license_status") if lic is not None else None
        out.append(_gpu(product, status, driver_version=driver, pci_id=g.get("id"),
                        gpu_uuid=g.findtext("uuid"), gpu_name=g.findtext("product_name")))
    return tuple(out)
