"""Medians per variant and the ratio of each pair (variant / baseline, same repetition)."""

from __future__ import annotations

from collections import Counter, defaultdict
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
    # A figure that is a word (e.g. run_state): per variant, the values over the repetitions.
    text: dict[str, str] | None = None


@dataclass
class Summary:
    variants: list[str]
    baseline: str
    rows: list[Row]
    statuses: dict[tuple[str, str, str], list[str]]  # (scenario, case, variant) -> statuses


def words(values: Sequence[str]) -> str:
    """One word when every repetition agrees, else each word with its count, most frequent first."""
    if not values:
        return "-"
    counts = Counter(values)
    if len(counts) == 1:
        return values[0]
    return ", ".join(f"{n}x {word}" for word, n in counts.most_common())


def summarize(records: Sequence[dict[str, Any]], baseline: str = "stock") -> Summary:
    variants: list[str] = []
    values: dict[tuple[str, str, str], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    texts: dict[tuple[str, str, str], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    statuses: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    order: list[tuple[str, str, str]] = []
    for rec in records:
        if rec["variant"] not in variants:
            variants.append(rec["variant"])
        statuses[(rec["scenario"], rec["case"], rec["variant"])].append(rec["status"])
        for name, word in rec.get("text", {}).items():
            key = (rec["scenario"], rec["case"], name)
            if key not in texts:
                order.append(key)
            texts[key][rec["variant"]].append(str(word))
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
        if (scenario, case, name) in texts:
            per_run = texts[(scenario, case, name)]
            rows.append(
                Row(
                    scenario,
                    case,
                    name,
                    metric(scenario, name),
                    text={v: words(per_run[v]) for v in variants},
                )
            )
            continue
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
