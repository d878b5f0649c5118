"""The snapshot gauges in the Prometheus text format (0.0.4), written straight into bytes.

prometheus-client's `generate_latest` builds a `Sample` and a label dict per series, then a list of
one string per line, joins it into one string and encodes that: at 50,000 guests the text is held
three to four times over, on top of the samples. A scrape of a large fleet set the controller's
peak memory that way. Here each family's lines go into a bytearray of its own (a family's series
arrive interleaved with other families'), and the families are joined into the largest one in place,
so the text is held about once. The bytes are the ones `generate_latest` writes for the same
samples: a unit test compares both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, cast

from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.utils import floatToGoString

# prometheus-client's own float format (Go's), so the bytes match its writer's; it has no annotations.
_float_text = cast(Callable[[float], str], floatToGoString)


class Series(Protocol):
    """One gauge series: the metric name without its prefix, label pairs, value."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> tuple[tuple[str, str], ...]: ...
    @property
    def value(self) -> float: ...


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def gauge_text(samples: Iterable[Series], help_of: Mapping[str, str], prefix: str) -> bytearray:
    """Every sample as `prefix_name{labels} value`, grouped into families in the order each name first
    appears, each family under its `# HELP` and `# TYPE ... gauge` lines; labels sorted by name.

    A name without help text is a programming error (KeyError), as it is for `GaugeMetricFamily`."""
    families: dict[str, tuple[str, bytearray]] = {}  # sample name -> (exposed metric name, its lines)
    label_names: dict[str, str] = {}
    for s in samples:
        name, labels, value = s.name, s.labels, s.value
        family = families.get(name)
        if family is None:
            full = escape_metric_name(f"{prefix}_{name}")
            family = families[name] = (full, bytearray(
                f"# HELP {full} {_escape_help(help_of[name])}\n# TYPE {full} gauge\n".encode()))
        full, buf = family
        if labels:
            pairs = []
            for k, v in sorted(labels):
                shown = label_names.get(k)
                if shown is None:
                    shown = label_names[k] = escape_label_name(k)
                pairs.append(f'{shown}="{_escape_value(v)}"')
            buf += f"{full}{{{','.join(pairs)}}} {_float_text(value)}\n".encode()
        else:
            buf += f"{full} {_float_text(value)}\n".encode()
    return _joined([buf for _, buf in families.values()])


def _joined(parts: list[bytearray]) -> bytearray:
    """The parts in order, joined into the largest part in place: the others are small beside it, so
    the joined text costs little more than the text itself."""
    if not parts:
        return bytearray()
    big = max(range(len(parts)), key=lambda i: len(parts[i]))
    out = parts[big]
    head = b"".join(parts[:big])
    tail = parts[big + 1:]
    parts.clear()
    if head:
        out[0:0] = head
    del head
    for part in tail:
        out += part
    return out
