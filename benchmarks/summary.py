"""Medians per variant and the ratio of each pair (variant / baseline, same repetition)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.metrics import Metric, metric
from benchmarks.stats import median, ratio


@dataclass
class Row:
    scenario: str
    case: str
    name: str
    info: Metric
    medians: dict[str, float | None] = field(default_factory=dict)
    # Median over repetitions of (variant value / baseline value) in the same repetition.
    ratios: dict[str, float | None] = field(default_factory=dict)


@dataclass
class Summary:
    variants: list[str]
    baseline: str
    rows: list[Row]
    statuses: dict[tuple[str, str, str], list[str]]  # (scenario, case, variant) -> statuses


def summarize(records: Sequence[dict[str, Any]], baseline: str = "stock") -> Summary:
    variants: list[str] = []
    values: dict[tuple[str, str, str], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    statuses: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    order: list[tuple[str, str, str]] = []
    for rec in records:
        if rec["variant"] not in variants:
            variants.append(rec["variant"])
        statuses[(rec["scenario"], rec["case"], rec["variant"])].append(rec["status"])
        for name, value in rec["metrics"].items():
            key = (rec["scenario"], rec["case"], name)
            if key not in values:
                order.append(key)
            if value is not None:
                values[key][rec["variant"]][int(rec["repetition"])] = float(value)
            else:
                values[key].setdefault(rec["variant"], {})
    if baseline in variants:
        variants.remove(baseline)
        variants.insert(0, baseline)
    rows: list[Row] = []
    for scenario, case, name in order:
        per_variant = values[(scenario, case, name)]
        row = Row(scenario, case, name, metric(scenario, name))
        base = per_variant.get(baseline, {})
        for v in variants:
            reps = per_variant.get(v, {})
            row.medians[v] = median(list(reps.values()))
            if v != baseline:
                pairs = [r for r in (ratio(reps.get(i), base.get(i)) for i in reps) if r is not None]
                row.ratios[v] = median(pairs)
        rows.append(row)
    return Summary(variants, baseline, rows, dict(statuses))
