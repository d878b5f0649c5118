"""Parse a Prometheus text exposition (a /metrics scrape) into sums that tests and benchmarks query."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

SampleKey = tuple[str, frozenset[tuple[str, str]]]


@dataclass(frozen=True)
class Scrape:
    """One scrape: every sample as (name, labels) -> value, plus when it was taken.

    Queries match by label subset and sum, so `value("x_total")` is the total over all series and
    a counter that has not been incremented yet reads 0 instead of failing.
    """

    samples: Mapping[SampleKey, float]
    at: float = 0.0  # time.monotonic() of the scrape, for benchmarks that time convergence

    def value(self, name: str, /, **labels: str) -> float:
        """Sum of every sample named `name` whose labels include `labels` (0 when none); a label may
        itself be called `name` (the apiserver's admission metrics have one)."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def has(self, name: str, /, **labels: str) -> bool:
        want = set(labels.items())
        return any(n == name and want <= ls for (n, ls) in self.samples)

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Values of `name` summed per value of one label (e.g. API requests per verb)."""
        out: dict[str, float] = {}
        for (n, ls), v in self.samples.items():
            if n != name:
                continue
            key = dict(ls).get(label, "")
            out[key] = out.get(key, 0.0) + v
        return out

    def labels_of(self, name: str, value: float) -> list[dict[str, str]]:
        """The label sets of the samples of `name` that equal `value` (e.g. an `_info` gauge at 1)."""
        return [dict(ls) for (n, ls), v in self.samples.items() if n == name and v == value]


def parse_metrics(text: str, at: float = 0.0) -> Scrape:
    """Parse the text exposition format (counters keep their `_total` sample name)."""
    samples: dict[SampleKey, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return Scrape(samples, at)


def delta(after: Scrape, before: Scrape, name: str, **labels: str) -> float:
    return after.value(name, **labels) - before.value(name, **labels)


def delta_by_label(after: Scrape, before: Scrape, name: str, *, label: str) -> dict[str, float]:
    """Per-label-value change of `name` between two scrapes (unchanged values left out)."""
    a, b = after.by_label(name, label), before.by_label(name, label)
    return {k: a.get(k, 0.0) - b.get(k, 0.0) for k in sorted(set(a) | set(b)) if a.get(k, 0.0) != b.get(k, 0.0)}
