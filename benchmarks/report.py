"""Presentation: the rich table in the terminal, the PNG charts, docs/benchmarks.md."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from rich.table import Table

from benchmarks import roles
from benchmarks.metrics import METRICS
from benchmarks.stats import median
from benchmarks.summary import Row, Summary

CHARTS = ("makespan.png", "memory.png", "heartbeat.png")
# Written only when the records hold that scenario.
IMPORTS_CHART = "imports.png"
IMPORTS_FIGURES = (
    ("makespan_s", "makespan (s)"),
    ("task_duration_p50_s", "task run time, median (s)"),
    ("scheduler_cpu_s", "scheduler-tree CPU (s)"),
    ("per_task_uss_mb", "USS per running task (MB)"),
    ("task_process_uss_mb", "task process USS, median (MB)"),
)
STARVATION_CHART = "starvation.png"
# The timeline's rows, top to bottom: the crowd's span, then each CPU task.
STARVATION_ROWS = ("crowd", "long_cpu", "cpu_a", "cpu_b")
RESTART_CHART = "restart.png"
ROLES_CHART = "roles.png"


def fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    magnitude = abs(value)
    if magnitude >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 0.1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _status(summary: Summary, scenario: str, case: str) -> str:
    parts = []
    for v in summary.variants:
        st = summary.statuses.get((scenario, case, v), [])
        bad = [s for s in st if s != "ok"]
        if bad:
            parts.append(f"{v}: {', '.join(bad)}")
    return "; ".join(parts)


def _values(row: Row, variants: Sequence[str]) -> list[str]:
    if row.text is not None:
        return [row.text.get(v, "-") for v in variants]
    return [fmt(row.medians.get(v)) for v in variants]


def _ratios(row: Row, others: Sequence[str]) -> list[str]:
    # Words have no ratio.
    return ["" if row.text is not None else fmt_ratio(row.ratios.get(v)) for v in others]


def rich_table(summary: Summary, title: str = "results (medians; ratio = variant / stock per pair)") -> Table:
    table = Table(title=title, show_lines=False, header_style="bold")
    table.add_column("scenario / case")
    table.add_column("figure")
    table.add_column("unit")
    for v in summary.variants:
        table.add_column(v, justify="right")
    others = [v for v in summary.variants if v != summary.baseline]
    for v in others:
        table.add_column(f"{v}/{summary.baseline}", justify="right")
    table.add_column("better")
    last = None
    for row in summary.rows:
        where = f"{row.scenario} / {row.case}"
        label = where if where != last else ""
        if where != last and (problem := _status(summary, row.scenario, row.case)):
            label = f"{where}\n[red]{problem}[/red]"
        last = where
        table.add_row(
            label,
            row.name,
            row.info.unit,
            *_values(row, summary.variants),
            *_ratios(row, others),
            row.info.better if row.info.better != "none" else "",
        )
    return table


def markdown_table(summary: Summary) -> str:
    others = [v for v in summary.variants if v != summary.baseline]
    head = [
        "scenario / case",
        "figure",
        "unit",
        *summary.variants,
        *(f"{v}/{summary.baseline}" for v in others),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    last = None
    for row in summary.rows:
        where = f"{row.scenario} / `{row.case}`"
        label = where if where != last else ""
        last = where
        cells = [
            label,
            f"`{row.name}`" + (f" ({row.info.better} is better)" if row.info.better != "none" else ""),
            row.info.unit,
            *_values(row, summary.variants),
            *_ratios(row, others),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ charts


def _first(
    records: Sequence[dict[str, Any]], scenario: str, variant: str, case: str | None = None
) -> dict[str, Any] | None:
    for rec in records:
        if (
            rec["scenario"] == scenario
            and rec["variant"] == variant
            and (case is None or rec["case"] == case)
        ):
            return rec
    return None


def write_charts(records: Sequence[dict[str, Any]], variants: Sequence[str], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    colors = {v: plt.get_cmap("tab10")(i) for i, v in enumerate(variants)}

    # Makespan: medians with min..max whiskers over repetitions.
    fig, ax = plt.subplots(figsize=(7, 4))
    figures = ("makespan_s", "run_duration_s")
    width = 0.8 / max(1, len(variants))
    any_data = False
    for i, v in enumerate(variants):
        meds, lows, highs = [], [], []
        for name in figures:
            vals = [
                float(r["metrics"][name])
                for r in records
                if r["scenario"] == "throughput" and r["variant"] == v and r["metrics"].get(name) is not None
            ]
            m = median(vals) or 0.0
            meds.append(m)
            lows.append(m - min(vals) if vals else 0.0)
            highs.append(max(vals) - m if vals else 0.0)
            any_data = any_data or bool(vals)
        xs = [j + i * width for j in range(len(figures))]
        ax.bar(xs, meds, width, yerr=[lows, highs], capsize=3, label=v, color=colors[v])
        for x, m in zip(xs, meds, strict=True):
            ax.annotate(f"{m:.1f}s", (x, m), ha="center", va="bottom", fontsize=8)
    ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(figures))])
    ax.set_xticklabels(["first start → last end", "trigger → run end"])
    ax.set_ylabel("seconds (median, whiskers min..max)")
    case = next((r["case"] for r in records if r["scenario"] == "throughput"), "no throughput run")
    ax.set_title(f"throughput makespan ({case})" if any_data else "throughput: no data")
    ax.legend()
    fig.tight_layout()
    written.append(out_dir / "makespan.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # Memory over time: the busy footprint case if there is one, else the first footprint case.
    fig, ax = plt.subplots(figsize=(8, 4))
    cases = [r["case"] for r in records if r["scenario"] == "footprint"]
    busy = next((c for c in cases if c.startswith("busy")), cases[0] if cases else None)
    ax2 = ax.twinx()
    for v in variants:
        rec = _first(records, "footprint", v, busy)
        if rec is None or not rec["series"].get("memory"):
            continue
        mem = rec["series"]["memory"]
        ax.plot([m[0] for m in mem], [m[1] for m in mem], label=f"{v} USS", color=colors[v])
        ax.plot([m[0] for m in mem], [m[2] for m in mem], label=f"{v} PSS", color=colors[v], linestyle=":")
        running = rec["series"].get("running", [])
        ax2.plot([r[0] for r in running], [r[1] for r in running], color=colors[v], alpha=0.3, linestyle="--")
    ax.set_xlabel("seconds since sampling started (dashed, right axis: running task instances)")
    ax.set_ylabel("scheduler tree memory (MB)")
    ax2.set_ylabel("running")
    ax.set_title(f"scheduler process tree memory ({busy or 'no footprint run'})")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    written.append(out_dir / "memory.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    # Heartbeat latency: ECDF per variant for the largest dispatch case and for the burst's scheduler.
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    dispatch_cases = sorted(
        {r["case"] for r in records if r["scenario"] == "dispatch"},
        key=lambda c: int(c.split("-")[0].lstrip("k") or 0),
    )
    panels = [
        ("dispatch", dispatch_cases[-1] if dispatch_cases else None, "driver heartbeat()"),
        ("burst", None, "scheduler's executor heartbeat()"),
    ]
    for ax, (scenario, case, what) in zip(axes, panels, strict=True):
        for v in variants:
            rec = _first(records, scenario, v, case)
            if rec is None:
                continue
            data = sorted(max(1e-3, float(x)) for x in rec["series"].get("heartbeat_ms", []))
            if not data:
                continue
            label = v
            if rec["metrics"].get("blocked"):
                label += f" (blocked after {fmt(rec['metrics'].get('blocked_after_dispatched'))} dispatched)"
            elif scenario == "burst" and rec["metrics"].get("executor_heartbeat_max_s"):
                label += f" (max {rec['metrics']['executor_heartbeat_max_s'] * 1000:.1f} ms)"
            ax.step(
                data,
                [(i + 1) / len(data) for i in range(len(data))],
                where="post",
                label=label,
                color=colors[v],
            )
        ax.set_xscale("log")
        ax.set_xlabel("heartbeat() duration (ms, log)")
        ax.set_ylabel("fraction of calls ≤ x")
        ax.set_title(f"{scenario} {case or ''}: {what}".strip())
        ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out_dir / "heartbeat.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    if any(r["scenario"] == "imports" for r in records):
        written.append(_imports_chart(records, variants, colors, out_dir / IMPORTS_CHART))
    if any(r["scenario"] == "starvation" for r in records):
        written.append(_starvation_chart(records, variants, colors, out_dir / STARVATION_CHART))
    if any(r["scenario"] == "restart" for r in records):
        written.append(_restart_chart(records, variants, colors, out_dir / RESTART_CHART))
    if _with_roles(records):
        written.append(_roles_chart(records, variants, out_dir / ROLES_CHART))
    return written


def _with_roles(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs that have an account of their tasks' CPU by role."""
    first = roles.metric(roles.ROLES[0])
    return [r for r in records if r["metrics"].get(first) is not None]


def _bar_heights(
    runs: Sequence[dict[str, Any]], group: tuple[str, str, str], variants: Sequence[str], metric: str
) -> list[float]:
    """Each variant's median of ``metric`` in ``group`` (scenario, case, database); a signed figure
    (unattributed, the exits' work) below zero has no bar to stack."""
    heights = []
    for v in variants:
        vals = [
            float(r["metrics"].get(metric) or 0.0)
            for r in runs
            if (r["scenario"], r["case"], r["database"], r["variant"]) == (*group, v)
        ]
        heights.append(max(0.0, median(vals) or 0.0))
    return heights


def _roles_chart(records: Sequence[dict[str, Any]], variants: Sequence[str], path: Path) -> Path:
    """A panel per case and database, a stacked bar per variant: each role's CPU per task (medians)."""
    import matplotlib.pyplot as plt

    runs = _with_roles(records)
    groups = list(dict.fromkeys((r["scenario"], r["case"], r["database"]) for r in runs))
    fig, axes = plt.subplots(1, len(groups), figsize=(max(7.0, 3.4 * len(groups)), 6.0), squeeze=False)
    palette = plt.get_cmap("tab20")
    for ax, (scenario, case, database) in zip(axes[0], groups, strict=True):
        # Every variant keeps its place; one without an account in this group (its run ended early,
        # or another run held the accounting) is labelled so.
        shown = list(variants)
        bottoms = [0.0] * len(shown)

        for k, role in enumerate(roles.ROLES):
            heights = _bar_heights(runs, (scenario, case, database), shown, roles.metric(role))
            ax.bar(shown, heights, 0.6, bottom=bottoms, color=palette(k), label=roles.LABELS[role])
            if role == "workload":
                # The exits' work no record holds sits in the workload's figure: hatched at its top.
                exits = _bar_heights(runs, (scenario, case, database), shown, roles.EXITS)
                tops = [b + h for b, h in zip(bottoms, heights, strict=True)]
                ax.bar(
                    shown,
                    exits,
                    0.6,
                    bottom=[t - e for t, e in zip(tops, exits, strict=True)],
                    color="none",
                    edgecolor="black",
                    hatch="//",
                    linewidth=0,
                    label="of the workload process's: exits' teardown (task's and workload's)",
                )
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        for x, (v, total) in enumerate(zip(shown, bottoms, strict=True)):
            had = any(
                (r["scenario"], r["case"], r["database"], r["variant"]) == (scenario, case, database, v)
                for r in runs
            )
            label = f"{total * 1000:.0f} ms" if had else "no account"
            ax.annotate(label, (x, total), ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, max(bottoms, default=0.0) * 1.12 or 1.0)
        ax.set_title(f"{scenario} {_case_label(case)}\n{database}", fontsize=9)
        ax.set_ylabel("CPU seconds per task")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="lower center", ncol=2, fontsize=7)
    fig.suptitle("Where each task's CPU goes, by role (medians)", fontsize=11)
    fig.tight_layout(rect=(0, 0.2, 1, 0.95))
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend's long labels stay whole
    plt.close(fig)
    return path


def _imports_chart(
    records: Sequence[dict[str, Any]], variants: Sequence[str], colors: dict[str, Any], path: Path
) -> Path:
    """One panel per figure, a group of bars per case, a bar per variant (median, whiskers min..max)."""
    import matplotlib.pyplot as plt

    runs = [r for r in records if r["scenario"] == "imports"]
    cases = list(dict.fromkeys(r["case"] for r in runs))
    fig, axes = plt.subplots(1, len(IMPORTS_FIGURES), figsize=(4 * len(IMPORTS_FIGURES), 4))
    width = 0.8 / max(1, len(variants))
    for ax, (name, title) in zip(axes, IMPORTS_FIGURES, strict=True):
        for i, v in enumerate(variants):
            meds, lows, highs = [], [], []
            for case in cases:
                vals = [
                    float(r["metrics"][name])
                    for r in runs
                    if r["case"] == case and r["variant"] == v and r["metrics"].get(name) is not None
                ]
                m = median(vals) or 0.0
                meds.append(m)
                lows.append(m - min(vals) if vals else 0.0)
                highs.append(max(vals) - m if vals else 0.0)
            xs = [j + i * width for j in range(len(cases))]
            ax.bar(xs, meds, width, yerr=[lows, highs], capsize=3, label=v, color=colors[v])
            for x, m in zip(xs, meds, strict=True):
                ax.annotate(fmt(m), (x, m), ha="center", va="bottom", fontsize=8)
        ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(cases))])
        ax.set_xticklabels([_case_label(c) for c in cases], fontsize=8)
        ax.set_title(title, fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=len(variants), fontsize=8)
    fig.suptitle("imports: DAG files that import pandas (median, whiskers min..max)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def median_run(
    records: Sequence[dict[str, Any]], scenario: str, variant: str, figure: str
) -> dict[str, Any] | None:
    """The run of ``variant`` whose ``figure`` is the median (the lower one of an even count): a chart
    drawn from one run shows a typical one, not the first or an outlier."""
    runs = sorted(
        (
            r
            for r in records
            if r["scenario"] == scenario and r["variant"] == variant and r["metrics"].get(figure) is not None
        ),
        key=lambda r: float(r["metrics"][figure]),
    )
    return runs[(len(runs) - 1) // 2] if runs else None


def _starvation_chart(
    records: Sequence[dict[str, Any]], variants: Sequence[str], colors: dict[str, Any], path: Path
) -> Path:
    """A timeline per variant (its median run by long_cpu_wall_s): the crowd's span and each CPU task."""
    import matplotlib.pyplot as plt

    # One case per profile; should there be more, the first one recorded is drawn.
    case = next(r["case"] for r in records if r["scenario"] == "starvation")
    runs = [r for r in records if r["scenario"] == "starvation" and r["case"] == case]
    shown = [(v, rec) for v in variants if (rec := median_run(runs, "starvation", v, "long_cpu_wall_s"))]
    fig, axes = plt.subplots(
        max(1, len(shown)), 1, figsize=(9, 1.2 + 1.5 * max(1, len(shown))), sharex=True, squeeze=False
    )
    for ax, (v, rec) in zip(axes[:, 0], shown, strict=False):
        spans = rec["series"].get("timeline", {})
        crowd = spans.get("crowd") or []
        bars = {"crowd": [min(s for s, _ in crowd), max(e for _, e in crowd)] if crowd else None}
        bars.update({name: spans.get(name) for name in STARVATION_ROWS[1:]})
        for y, name in enumerate(STARVATION_ROWS):
            span = bars.get(name)
            if not span:
                continue
            start, end = span
            # The crowd is context (it only sleeps); the CPU tasks are the figures.
            ax.barh(y, end - start, left=start, color=colors[v], alpha=0.35 if name == "crowd" else 0.9)
            ax.annotate(f" {end - start:.0f}s", (end, y), va="center", fontsize=8)
        ax.set_yticks(range(len(STARVATION_ROWS)))
        ax.set_yticklabels([f"crowd ({len(crowd)} tasks)", *STARVATION_ROWS[1:]], fontsize=8)
        ax.invert_yaxis()
        m = rec["metrics"]
        ax.set_title(
            f"{v}: long_cpu {fmt(m.get('long_cpu_wall_s'))} s (stretch "
            f"{fmt(m.get('long_cpu_stretch'))}), started with "
            f"{fmt(m.get('crowd_running_at_long_cpu_start'))} crowd tasks running",
            fontsize=9,
        )
    axes[-1, 0].set_xlabel("seconds since the run's first task started")
    fig.suptitle(f"starvation {case}: median run of each variant by long_cpu wall time", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _restart_chart(
    records: Sequence[dict[str, Any]], variants: Sequence[str], colors: dict[str, Any], path: Path
) -> Path:
    """Every execution of every task, a row per map index: one panel per case (row) and variant (column),
    each variant's median run by makespan; the signal, the old scheduler's exit, the restart, the run's end.
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    runs = [r for r in records if r["scenario"] == "restart"]
    cases = list(dict.fromkeys(r["case"] for r in runs))
    fig, axes = plt.subplots(
        len(cases), len(variants), figsize=(5.5 * len(variants), 3.6 * len(cases)), squeeze=False
    )
    lines: tuple[tuple[str, str, Literal["-", "--", ":"]], ...] = (
        ("signal", "red", "-"),
        ("exit", "black", "--"),
        ("restart", "green", "--"),
        ("run_end", "gray", ":"),
    )
    for row, case in enumerate(cases):
        for col, v in enumerate(variants):
            ax = axes[row, col]
            of_case = [r for r in runs if r["case"] == case]
            rec = median_run(of_case, "restart", v, "makespan_s") or next(
                (r for r in of_case if r["variant"] == v), None
            )
            if rec is None:
                ax.set_axis_off()
                continue
            for index, try_number, start, until, ended in rec["series"].get("timeline", []):
                ax.barh(
                    index,
                    until - start,
                    left=start,
                    height=0.8,
                    color=colors[v],
                    alpha=0.45 if try_number == 1 else 0.95,
                    hatch=None if ended else "////",
                    edgecolor="none" if ended else "red",
                )
            for name, color, style in lines:
                at = rec["series"].get("events", {}).get(name)
                if at is not None:
                    ax.axvline(at, color=color, linestyle=style, linewidth=1)
            m = rec["metrics"]
            ax.set_title(
                f"{v}, {case.rsplit('-', 1)[-1]}: exit {fmt(m.get('old_scheduler_exit_s'))} s, "
                f"run {rec['text'].get('run_state', '-')}\n{fmt(m.get('tasks_succeeded'))} succeeded, "
                f"{fmt(m.get('tasks_rerun'))} rerun, {fmt(m.get('tasks_ran_twice_at_once'))} twice at once, "
                f"{fmt(m.get('executions_killed'))} killed part-way",
                fontsize=9,
            )
            ax.set_ylabel("map index", fontsize=8)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.invert_yaxis()
    for ax in axes[-1, :]:
        ax.set_xlabel("seconds since the first task started")
    handles = [
        Patch(facecolor="gray", alpha=0.45, label="try 1"),
        Patch(facecolor="gray", alpha=0.95, label="try 2 and later"),
        Patch(facecolor="white", edgecolor="red", hatch="////", label="killed part-way (no end recorded)"),
        *(Line2D([], [], color=c, linestyle=s, label=n.replace("_", " ")) for n, c, s in lines),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8)
    fig.suptitle(
        "restart: every execution of every task (median run of each variant by makespan)", fontsize=11
    )
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_CASE_NAME = re.compile(r"(?P<kind>.+)-(?P<count>\d+)-tasks-(?P<rest>.+)")


def _case_label(case: str) -> str:
    """``pandas-held-16-tasks-p16`` -> ``pandas-held`` over ``16 tasks p16``: short lines under a bar."""
    match = _CASE_NAME.fullmatch(case)
    return f"{match['kind']}\n{match['count']} tasks {match['rest']}" if match else case


# ------------------------------------------------------------------ docs/benchmarks.md


def _meanings() -> str:
    lines = []
    for scenario, figures in METRICS.items():
        lines.append(f"\n**{scenario}**\n")
        lines.extend(
            f"- `{name}` ({'word' if m.word else m.unit or 'count'}): {m.meaning}."
            for name, m in figures.items()
        )
    return "\n".join(lines)


def _configs(records: Sequence[dict[str, Any]]) -> str:
    seen: dict[str, tuple[dict[str, Any], str, str]] = {}
    for r in records:
        seen.setdefault(f"{r['scenario']} / {r['case']}", (r["config"], r["database"], _airflow_cfg(r)))
    return "\n".join(f"- {k}: `{config}`, database `{db}`, {cfg}" for k, (config, db, cfg) in seen.items())


def _airflow_cfg(record: dict[str, Any]) -> str:
    # Records written before the option existed ran on an empty airflow.cfg.
    kind = record.get("airflow_cfg", "empty")
    return "airflow.cfg generated by Airflow" if kind == "generated" else f"airflow.cfg {kind}"


def _databases(records: Sequence[dict[str, Any]]) -> str:
    """`database x` when every run used the same one, else which case ran on which."""
    per_case: dict[str, str] = {}
    for r in records:
        per_case.setdefault(f"{r['scenario']} / {r['case']}", r["database"])
    if len(set(per_case.values())) == 1:
        return f"database `{next(iter(per_case.values()))}`"
    return "databases " + ", ".join(f"{case} `{db}`" for case, db in per_case.items())


def _notes(records: Sequence[dict[str, Any]]) -> str:
    lines = []
    for r in records:
        if r["status"] != "ok" or r["notes"]:
            note = "; ".join(n.splitlines()[0] for n in r["notes"] if n) or ""
            lines.append(
                f"- {r['scenario']} / {r['case']} / {r['variant']} rep {r['repetition']}: "
                f"status `{r['status']}`{' - ' + note if note else ''}"
            )
    return "\n".join(lines) or "- every run ended with status `ok`"


def write_markdown(
    path: Path,
    records: Sequence[dict[str, Any]],
    summary: Summary,
    *,
    command: str,
    charts_rel: str,
    observations: str = "",
) -> None:
    first = records[0]
    m, vers = first["machine"], first["versions"]
    launchers = sorted(
        {
            f"{r['variant']}: {r['executor']}"
            + (
                f" with {', '.join(f'{k}={v}' for k, v in r['variant_env'].items())}"
                if r["variant_env"]
                else ""
            )
            for r in records
        }
    )
    used = sorted(
        {
            f"{r['variant']}: launcher {r.get('executor_info', {}).get('launcher', 'n/a')}"
            for r in records
            if r.get("executor_info")
        }
    )
    digests = sorted({r.get("source_digest", "?") for r in records})
    when = min(r["started_at"] for r in records)
    wall = sum(float(r["wall_s"]) for r in records)
    jobs = max(int(r.get("jobs", 1)) for r in records)
    shared = (
        f"\n- {jobs} runs at a time (`--jobs {jobs}`): runs shared the machine and slowed each other down; "
        "these figures only show that the suite works, not how the variants compare."
        if jobs > 1
        else ""
    )
    if any(r.get("profiled") for r in records):
        shared += (
            "\n- Some runs had their scheduler profiled (`--profile-scheduler`): the profilers took a share "
            "of a core, so those runs' figures are not for comparing."
        )
    airflow2 = str(vers.get("apache-airflow") or "").startswith("2.")
    deployment = (
        "Airflow 2.11 (a scheduler, which parses DAG files itself, on a fresh PostgreSQL database and "
        "`AIRFLOW_HOME` per run)"
        if airflow2
        else "Airflow 3.3 (api-server, scheduler and dag-processor as separate processes, a fresh "
        "`AIRFLOW_HOME` and database per run)"
    )
    how = (
        """$ make bench-airflow2   # quick profile on Airflow 2.11 (.venv-airflow2), writes this page
$ .venv-airflow2/bin/python -m benchmarks --profile full --variants stock,ours --repeat 3 \\
      --out results.jsonl"""
        if airflow2
        else """$ make bench        # quick profile (about 10 minutes on 2 cores), writes this page and the charts
$ make bench-full   # every scenario at full size, 3 repetitions
$ make bench-smoke  # a few tasks, one repetition, two runs at a time: proves the harness works (CI runs it)
$ .venv/bin/python -m benchmarks --profile quick --scenarios throughput,dispatch \\
      --variants stock,ours,ours-forkserver --repeat 3 --database postgres --out results.jsonl
$ .venv/bin/python -m benchmarks --profile full --scenarios burst \\
      --variants stock,ours --repeat 3 --out build/bench/burst.jsonl       # upstream #70526, PostgreSQL
$ .venv/bin/python -m benchmarks --profile quick --scenarios ordinary \\
      --variants stock,ours --repeat 10 --out build/bench/ordinary.jsonl   # Airflow's api defaults
$ .venv/bin/python -m benchmarks --profile full --scenarios imports \\
      --variants stock,ours --repeat 1 --out build/bench/imports.jsonl     # DAG files importing pandas
$ .venv/bin/python -m benchmarks --profile quick --scenarios starvation \\
      --variants stock,ours --repeat 3 --out build/bench/starvation.jsonl  # a CPU task started in a crowd
$ .venv/bin/python -m benchmarks --profile full --scenarios restart \\
      --variants stock,ours --repeat 1 --out build/bench/restart.jsonl     # scheduler SIGTERM / kill -9
$ .venv/bin/python -m benchmarks --profile full --scenarios chaos \\
      --variants ours --repeat 1 --out build/bench/chaos.jsonl             # restart chaos, seeded
$ .venv/bin/python -m benchmarks --profile full --scenarios control \\
      --variants ours --repeat 1 --out build/bench/control.jsonl           # pause, drain, resize
$ .venv/bin/python -m benchmarks --profile full --scenarios burst --variants ours --repeat 1 \
      --profile-scheduler build/profile --out build/bench/profiled.jsonl  # where the scheduler's threads go"""
    )
    imports_chart = (
        f"\n![imports]({charts_rel}/{IMPORTS_CHART})\n"
        if any(r["scenario"] == "imports" for r in records)
        else ""
    )
    starvation_chart = (
        f"\n![starvation]({charts_rel}/{STARVATION_CHART})\n"
        if any(r["scenario"] == "starvation" for r in records)
        else ""
    )
    restart_chart = (
        f"\n![restart]({charts_rel}/{RESTART_CHART})\n"
        if any(r["scenario"] == "restart" for r in records)
        else ""
    )
    roles_chart = f"\n![CPU per task by role]({charts_rel}/{ROLES_CHART})\n" if _with_roles(records) else ""
    text = f"""# Benchmarks: AsyncLocalExecutor against the stock LocalExecutor

Every performance claim this project makes comes from this suite (`benchmarks/`). It runs a real
{deployment} once per executor variant, alternating A B A B over the repetitions on the same DAG and
configuration, and reports medians and the ratio of each pair.

## How to run it

```console
{how}
```

`--variants` takes known labels (`stock`, `ours`, `ours-forkserver`, `ours-subprocess`) or
`label=class.path:ENV=VALUE,...`; ratios are each variant against `stock`. Every run appends one JSON
line (machine, versions, configuration, every figure, raw series) to `--out`; `--report-only` rebuilds
the table, charts and this page from such a file. Each case runs on its own database unless
`--database` names one for all: burst on PostgreSQL (a fresh database per run on 127.0.0.1:5432), the
others on SQLite (on PostgreSQL with Airflow 2, which refuses SQLite for parallel executors); the
command prints each case's database and this page lists it with the case's configuration. Every
deployment's `airflow.cfg` is the one Airflow writes on its first start (every option with its
default, as on a real deployment); `--airflow-cfg empty` runs on an empty file instead.

## Latest results

- Date: {when[:19].replace("T", " ")} UTC; profile `{first["profile"]}`; {_databases(records)};
  {"; ".join(sorted({_airflow_cfg(r) for r in records}))};
  {max(r["repetition"] for r in records) + 1} repetition(s); {len(records)} runs, {
        wall / 60:.1f} minutes in total.{shared}
- Machine: {m["cpu_model"]}, {m["cpus"]} cores, {m["memory_gb"]} GB, {m["platform"]}.
- Versions: Python {vers["python"]}, apache-airflow {vers["apache-airflow"]}, task SDK
  {vers["apache-airflow-task-sdk"]}, async-local-executor {vers["async-local-executor"]} (git
  {vers["git_commit"]}{", uncommitted changes" if vers["git_dirty"] else ""}), uvloop {vers["uvloop"]}.
- Variants: {"; ".join(launchers)}.
- Launcher each AsyncLocalExecutor run reported at start (scheduler log): {"; ".join(used) or "n/a"}.
  Source digest of `src/async_local_executor` per run: {", ".join(digests)}{
        " (the source changed during the session: compare with care)" if len(digests) > 1 else ""
    }.
- Command: `{command}`

The machine is shared and has 2 cores: other work may have been running, so single figures are noisy.
Quote the ratios (each variant against stock in the same repetition, runs back to back), not the
absolute numbers, and re-run before relying on a small difference.

{markdown_table(summary)}

Runs that did not end cleanly:

{_notes(records)}

{observations}

![makespan]({charts_rel}/makespan.png)

![memory over time]({charts_rel}/memory.png)

![heartbeat latency]({charts_rel}/heartbeat.png)
{imports_chart}{starvation_chart}{restart_chart}{roles_chart}
Configuration of each case:

{_configs(records)}

## What each figure means

Scenarios:

- **throughput**: `bench_noop`, N mapped tasks that do nothing, at the given parallelism. Times come
  from the `task_instance` and `dag_run` rows.
- **footprint**: memory of the scheduler process tree (the scheduler and every descendant: the stock
  executor's pre-forked workers, our task supervisors, the task processes), sampled with psutil
  `memory_full_info()` at about 2 Hz; USS is memory only that process holds, PSS adds its share of
  shared pages. Idle cases start a deployment and trigger nothing; the busy case triggers N tasks that
  sleep, and pairs each memory sample with the number of task instances in state running.
- **burst**: the dispatch-deadlock repro as upstream #70526 reports it. One DAG run of `bench_sleep`
  (no retries): more mapped tasks than `[core] parallelism`, each sleeping the same time, with
  `[scheduler] max_tis_per_query = 0` (as many per loop as parallelism allows) and `[api] workers = 2`.
  Once the first task instance runs, every task instance of the run is cleared through the REST API
  (`POST /api/v2/dags/{{dag_id}}/clearTaskInstances`, every map index, the run reset) three times, one
  interval apart, the first one interval after that first task instance started: each clear's
  dispatch burst meets the results of the tasks it killed coming back. Full size: 300 tasks of 30 s at
  parallelism 256, clears at 15, 30 and 45 s, and a second case with 600 tasks at the same parallelism
  (two waves waiting behind the running one at each clear); quick keeps the shape with 60 tasks of 12 s at 48 and
  6 s apart, smoke with 6 tasks of 4 s at 4 and 2 s apart. Then the run is awaited up to the case's
  timeout. Loop stalls are gaps in the scheduler job's `latest_heartbeat` (polled from the database
  at 2 Hz); a scheduler that has not heartbeated for `stall_abort` seconds (120 s at full size) is
  reported as `stalled` and the run abandoned (upstream reports the stock executor freezing for good
  here, blocked writing to its activity pipe); a run still going at the timeout is reported as
  `timeout`. Either way the record's notes name the task instances left unfinished (map index, state,
  try). Runs on PostgreSQL unless `--database` says otherwise; on Airflow 2 the clears call Airflow's
  own `clear_task_instances`.
- **dispatch**: no deployment; a driver process builds the executor, queues K real `ExecuteTask`
  workloads and calls `heartbeat()` + `get_event_buffer()` in a loop, like the scheduler. The execution
  API address accepts connections and never answers, so every started workload blocks, as long tasks
  do: the realistic case in which the stock executor's 64 KiB activity pipe fills. A heartbeat() that
  does not return within 10 s is reported as blocked with the number of workloads dispatched before it
  (the driver then ends; a hard timeout backs that up). The stock executor dispatches up to
  `parallelism` per heartbeat because it never fills `running`; ours stops at `parallelism` because it
  does, so its heartbeat() cost is the scheduling bookkeeping over K queued workloads. On Airflow 2 the
  workloads are `airflow tasks run` commands whose metadata database address never answers, and the
  stock executor at a limited parallelism hands them to its workers through a `multiprocessing`
  manager's queue (a server process), not a raw pipe, so it does not block there.
- **ordinary**: `bench_noop`, 200 no-op mapped tasks at parallelism 32 (quick and full are that size;
  smoke runs 4) on SQLite, on a deployment as Airflow sets one up: its generated `airflow.cfg`
  (`[workers] execution_api_timeout = 5.0`, the task SDK's client timeout) and `[api] workers = 1`. A
  start burst can queue a call past the client's timeout; Airflow 3.3.2 retries calls that are not
  idempotent, and a task that succeeded can then be failed by the scheduler. Tasks are counted from their final states in the database (such a task counts as
  failed), and `state_mismatches` counts the scheduler's log lines about an executor event that
  contradicted the database. Each record's `series.airflow_config` holds the values the deployment ran
  with, as Airflow read them (the environment, else `airflow.cfg`).
- **imports**: the throughput fan-out from DAG files that import libraries at their top, as real DAG
  files do (`benchmarks/dags_imports`, a DAG folder only this scenario's deployments parse). Case
  `pandas-*`: `bench_import_pandas`, `bench_noop` with `import pandas` added at the top of its file.
  Case `real-imports-*`: `bench_real_imports`, a file that imports pandas and numpy and whose task
  imports matplotlib in its body (no Airflow task process imports it by itself). 100 tasks at
  parallelism 16 at full size (quick 32, smoke 4), on SQLite. Every task process parses its DAG file
  after its task instance is marked running, so the task run time (start to end) holds the file's
  imports. Memory is sampled as in the footprint scenario: an idle window before the trigger, then the
  samples taken while the most tasks ran; each running task's share is the difference divided by
  that count. That count is of task instances in state `running`, which a task enters and leaves
  through calls to the api-server: with tasks of a fraction of a second, processes that are still
  starting or already ending hold memory without being counted, so case `pandas-held-*` (full and
  quick only) runs the same DAG as one wave of 16 tasks that stay running 25 s (15 s at quick), for
  the same figure in the steady state. Each task also prints the private memory (USS) of its own
  process when it runs, read back from the task logs (`task_process_uss_mb`): the process that runs
  the task's code, for stock and ours alike, without the worker or supervisor beside it.
- **starvation**: `bench_starvation` on SQLite, quick and full the same size (smoke: a crowd of 4).
  `crowd`, 100 mapped tasks that sleep 30 s at the highest priority weight, then `long_cpu`, one task
  with no upstream at the lowest (both `weight_rule="absolute"`), so it is queued last and starts while
  the crowd runs; `cpu_a` and `cpu_b` start when the whole crowd has ended. Each of the three burns
  60 s of its own CPU time (`time.process_time()`) in a pure-Python loop: fixed work, so its wall time
  (task instance start to end) shows the CPU share it got. Parallelism 128 and the DAG's
  `max_active_tasks=200` let the whole crowd and `long_cpu` run at once: more than 24 workloads per
  core on 2 cores, where AsyncLocalExecutor runs a workload that starts at idle CPU priority (its
  default `workload_cpu_priority = auto`) so a burst of starts cannot starve the scheduler. The case
  shows whether `long_cpu` keeps that priority once the crowd is gone: if it does, `cpu_a` and `cpu_b`
  take both cores and it waits for them (`long_cpu_stretch` far above 1.5), where the stock executor
  shares the cores among the three. `crowd_running_at_long_cpu_start` says whether `long_cpu` really
  started in the crowd (a run in which it did not gets a note). The chart draws, for each variant, the
  run with the median `long_cpu_wall_s`: the crowd's span (first start to last end) and each CPU task.
- **restart**: `bench_restart` on PostgreSQL, full profile only: 24 mapped tasks that sleep 90 s, no
  retries, parallelism 32. 20 s after the first task started, the scheduler process alone (not its
  process group) gets SIGTERM (case `*-sigterm`) or SIGKILL (case `*-kill9`); the benchmark waits for
  it to exit (SIGKILL after `exit_timeout`, with a note), starts a new scheduler in the same home and
  waits for the DAG run to end. Each execution of a task writes a file (its task instance's key, try
  number, pid, start and, when its sleep is over, its end): the figures about executions come from
  those files and from the benchmark's watch of their processes (every 0.5 s), the figures about task
  instances from the database. The chart draws every execution of every task of each variant's median
  run, with the signal, the old scheduler's exit, the restart and the run's end.
- **chaos**: the restart chaos test (`tests/e2e/chaos.py`) at full size, on PostgreSQL, full profile
  only, this executor only (stock is recorded `n/a`). Each sequence is one run of `chaos` (tasks that
  succeed, fail on purpose, or run past the executor's `task_timeout` or Airflow's `execution_timeout`,
  some just inside it) with more tasks than parallelism every other sequence, and seeded steps: SIGTERM
  and SIGKILL of the scheduler with a gap none, under or over `handover_timeout` (20 s), a second
  scheduler beside the first for a while, and a retried adoption (the one injected fault: an
  `OperationalError` after the real `try_adopt_task_instances`). After each run the invariants are
  checked: the state its code decides, at try 1 with one execution (unless it spent the timeout
  without a live owner, summed over the schedulers that claimed it and died within it), no two executions at once, limits neither early nor missed, nothing outliving the
  timeout by 10 s without a scheduler, no CPU share left lowered after a crowd, a SIGTERM'd scheduler
  gone within 10 s. Default: 20 sequences of 100 tasks at parallelism 16 over the host's crowd
  threshold; `ALE_CHAOS_SEQUENCES`, `ALE_CHAOS_TASKS`, `ALE_CHAOS_PARALLELISM`, `ALE_CHAOS_STEPS`
  and `ALE_CHAOS_SEED` change it. The notes hold the seed and the first violations.
- **control**: live control (`airflow async-local-executor pause | resume | drain | resize`) at full
  size, on PostgreSQL, full profile only, this executor only (stock is recorded `n/a`: it has none).
  One run of `bench_control` per case, whose tasks record each execution: a pause held 300 s over 40
  task instances with `task_queued_timeout = 120` (what started, was queued, failed or was requeued while
  paused, then every task after the resume); 16 tasks of 60 s drained with a 30 s deadline under
  `on_stop = handover` and `terminate`, and with 120 s (how long the drain took, whether it passed its
  deadline, how many it named); 40 tasks of 30 s at parallelism 4 raised to 16 and lowered to 2, the
  status file sampled every 0.25 s for the running count beside the limit in force (starts past it).

How the executor heartbeat is timed in a deployment: Airflow 3.3 only emits
`scheduler.executor_heartbeat_duration` to StatsD/OpenTelemetry, so the deployment runs
`benchmarks.timed_executor.TimedExecutor`, a subclass of the executor under test (named in
`ALE_BENCH_EXECUTOR`) whose `heartbeat()` writes a start and an end line to a file. Both variants carry
the same wrapper. CPU seconds are psutil `cpu_times()` (user, system and reaped children) summed over
each process tree, the difference between the start and the end of the measured phase.

Figures:
{_meanings()}
"""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def generated_at() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
