"""The chart schema's patterns (licensectl/config.py PATTERNS) agree with licensectl's own parsers.

A value the pattern accepts must start licensectl, and one licensectl refuses must fail the install:
each good and bad value below goes through both the pattern and `settings_from` (the parser the pod
runs on its LICENSECTL_* variable). Names the controller passes to the apiserver unparsed (Lease,
Secret, namespace) get Kubernetes' own name rules. Python's `re` reads these patterns as RE2 (Helm's
validator) does: they use only classes, groups, alternation and bounded repeats.
"""

from __future__ import annotations

import re

import pytest

from licensectl import config

PARSED: dict[str, tuple[list[str], list[str]]] = {
    # option: (values licensectl accepts, values it refuses)
    "canary": (["3", "0", " 12 ", "5%", "0.5%", "100%", "100.0%", "05%", "namespaces:a", "namespaces: a , b",
                "namespaces:a,,b,"],
               ["", "-1", "5 VMs", "0%", "0.0%", "100.5%", "101%", "%", "namespaces:", "namespaces: ,", "3,4"]),
    "rollout_steps": (["10%,50%,100%", "25%,100%", "50%", "", " 10% , 100% ", "10%,,100%", "0.5%,100%"],
                      ["10,50,100", "10%;100%", "150%", "0%,100%", "x%", "%"]),
    "max_unavailable": (["1", "10%", "100%", "250"], ["0", "0%", "101%", "-1", "ten", ""]),
    "vgpu_driver_images": (["registry.example.com/vgpu/", "a/*, b:1.0", "", " a , b "],
                           ["registry.example.com/a b"]),
}

NAMES: dict[str, tuple[list[str], list[str]]] = {
    "namespace": (["licensectl-system", "a"], ["Licensectl", "a_b", "-a", "a.b", "x" * 64]),
    "lease_name": (["licensectl", "lc.example"], ["Licensectl_Lease", "a..b", ""]),
    "tls_secret": (["licensectl-tls"], ["licensectl tls", ""]),
    "webhook_configuration": (["licensectl", "my-hook"], ["My_Hook"]),
    "root_tenant": (["tenant-root"], ["tenant root"]),
    "vgpu_label": (["gpu.cozystack.io/vgpu", "vgpu"], ["gpu.cozystack.io/", "/vgpu", "a b"]),
    "tenant_label_prefix": (["tenant.cozystack.io/"], ["tenant.cozystack.io", "Tenant/"]),
    "gpu_group": (["gpu.cozystack.io"], ["gpu_cozystack"]),
    "gpu_version": (["v1", "v1alpha1", "v2beta3"], ["1alpha1", "v0", "v1gamma1"]),
    "gpu_class_plural": (["gpuclasses"], ["GPUClasses"]),
    "gpu_claim_plural": (["gpuclaims"], ["gpu claims"]),
    "token_key": (["client_configuration_token.tok"], ["a/b", ""]),
    "report_url": (["", "https://licensectl-reports.licensectl-system.svc:8443/v1/reports", "http://x/v1"],
                   ["licensectl-reports:8443", "ftp://x", "https://a b"]),
    "metrics_address": (["0.0.0.0:8080", ":8080", "[::]:8080", "127.0.0.1:0"], ["8080", "0.0.0.0", "a:b:8080", ""]),
    "reports_address": (["0.0.0.0:8443"], ["0.0.0.0:https"]),
    "webhook_address": (["", "0.0.0.0:9443"], ["0.0.0.0:https"]),
    "tls_hosts": (["", "a.example.com,10.0.0.1", "a, b"], ["a b"]),
}


def matches(field: str, value: str) -> bool:
    return re.search(config.PATTERNS.get(field) or config.MAX_UNAVAILABLE_PATTERN, value) is not None


def parses(field: str, value: str) -> bool:
    option = next(o for o in config.OPTIONS if o.field == field)
    try:
        config.settings_from(None, {option.env: value})
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("field", sorted(PARSED))
def test_pattern_accepts_exactly_what_licensectl_parses(field: str) -> None:
    good, bad = PARSED[field]
    for value in good:
        assert parses(field, value), f"{field}={value!r}: licensectl refuses a sample meant to be good"
        assert matches(field, value), f"{field}={value!r}: licensectl accepts it, the chart schema refuses it"
    for value in bad:
        assert not parses(field, value), f"{field}={value!r}: licensectl accepts a sample meant to be bad"
        assert not matches(field, value), f"{field}={value!r}: licensectl refuses it, the chart schema accepts it"


@pytest.mark.parametrize("field", sorted(NAMES))
def test_name_patterns(field: str) -> None:
    good, bad = NAMES[field]
    assert [v for v in good if not matches(field, v)] == []
    assert [v for v in bad if matches(field, v)] == []
    assert [v for v in good if not parses(field, v)] == []


def test_every_parsed_string_setting_has_a_pattern() -> None:
    """A string option with its own parser (anything but plain str, numbers, booleans, choices) is checked."""
    special = {o.field for o in config.OPTIONS
               if o.parse not in (str, int, float) and not isinstance(o.parse, config._Choice)
               and o.parse.__name__ != "_bool"}
    assert special <= set(PARSED), special - set(PARSED)
    assert set(config.PATTERNS) <= set(PARSED) | set(NAMES)
    # What keeps no pattern: free text the controller only passes on (a path, a context, a pod name).
    free = {o.field for o in config.OPTIONS if o.parse is str} - set(config.PATTERNS)
    assert free == {"kubeconfig", "context", "pod_name"}, free
