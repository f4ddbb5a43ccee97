"""A small reader of the Prometheus text exposition: sums of samples by name and labels."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    """One line of the exposition."""

    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    """Every sample of ``text``; comments and malformed lines are skipped."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        samples.append(Sample(name, dict(_LABEL.findall(labels or "")), number))
    return samples


def total(samples: list[Sample], name: str, **labels: str) -> float:
    """Sum of ``name`` over the label sets that include ``labels`` (0 when absent)."""
    return sum(
        sample.value
        for sample in samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def label_values(samples: list[Sample], name: str, label: str) -> dict[str, float]:
    """``name``'s value per value of ``label`` (summed over the other labels)."""
    values: dict[str, float] = {}
    for sample in samples:
        if sample.name == name and label in sample.labels:
            key = sample.labels[label]
            values[key] = values.get(key, 0.0) + sample.value
    return values
