"""Command line: ``python -m benchmarks --profile smoke|quick|full ...`` (see ``--help``)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from benchmarks import report, runner, scheduler_profile
from benchmarks.deployment import BASELINE, Variant, parse_variant
from benchmarks.scenarios.base import Case
from benchmarks.summary import summarize
from harness.environment import AIRFLOW_CFG_KINDS
from harness.sandbox import installed_airflow_major

KEY_FIGURES = {
    "throughput": ("makespan_s", "tasks_per_s", "scheduler_cpu_s"),
    "footprint": ("idle_uss_mb", "busy_uss_mb", "per_task_uss_mb"),
    "burst": ("tasks_succeeded", "tasks_failed", "job_heartbeat_max_gap_s", "makespan_s"),
    "dispatch": ("heartbeat_p99_ms", "heartbeat_max_ms", "blocked"),
    "ordinary": ("tasks_succeeded", "tasks_failed", "state_mismatches", "makespan_s"),
    "imports": (
        "makespan_s",
        "scheduler_cpu_s",
        "per_task_uss_mb",
        "task_process_uss_mb",
        "task_duration_p50_s",
    ),
    "starvation": (
        "long_cpu_wall_s",
        "cpu_tasks_wall_s",
        "crowd_running_at_long_cpu_start",
        "makespan_s",
    ),
    "restart": (
        "old_scheduler_exit_s",
        "tasks_succeeded",
        "tasks_rerun",
        "tasks_ran_twice_at_once",
        "executions_killed",
        "makespan_s",
    ),
    "chaos": ("sequences_failed", "violations", "task_instances_run_twice", "seconds_per_sequence"),
    "control": (
        "tasks_succeeded",
        "task_instances_run_twice",
        "started_while_held",
        "starts_over_limit",
        "drain_s",
    ),
}
NOTES_BEGIN, NOTES_END = "<!-- observations -->", "<!-- /observations -->"


class LiveDisplay(runner.Listener):
    """A progress bar over all runs and a table that grows by one row per finished run."""

    def __init__(self, console: Console, total: int) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
        )
        self.task = self.progress.add_task("starting", total=total)
        self.table = Table("run", "status", "wall", "key figures", title="runs", header_style="bold")
        self.live = Live(Group(self.table, self.progress), console=console, refresh_per_second=4)

    def run_started(self, index: int, total: int, case: Case, rep: int, variant: Variant) -> None:
        self.progress.update(
            self.task, description=f"{case.scenario}/{case.name} rep {rep} [b]{variant.label}[/b]"
        )

    def run_finished(self, record: dict[str, Any]) -> None:
        figures = "  ".join(
            [
                *(f"{name}={value}" for name, value in record.get("text", {}).items()),
                *(
                    f"{name}={report.fmt(record['metrics'].get(name))}"
                    for name in KEY_FIGURES[record["scenario"]]
                ),
            ]
        )
        status = record["status"]
        self.table.add_row(
            f"{record['scenario']}/{record['case']} r{record['repetition']} {record['variant']}"
            + (f" ({launcher})" if (launcher := record["executor_info"].get("launcher")) else ""),
            status if status == "ok" else f"[red]{status}[/red]",
            f"{record['wall_s']:.0f}s",
            figures,
        )
        self.progress.advance(self.task)

    def line(self, message: str) -> None:
        self.console.log(f"[dim]{message}[/dim]")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="AsyncLocalExecutor against the stock LocalExecutor on a real Airflow, side by side.",
    )
    p.add_argument("--profile", choices=runner.PROFILES, default="quick")
    p.add_argument(
        "--scenarios",
        default=",".join(runner.SCENARIOS),
        help="comma list of: " + ", ".join(runner.SCENARIOS),
    )
    p.add_argument(
        "--variants",
        default="stock,ours",
        help="comma list: stock, ours, ours-forkserver, ours-subprocess, ours-ondemand, or label=class.path[:K=V;K=V]",
    )
    p.add_argument(
        "--cases", default="", help="comma list of case names to keep (e.g. k5000-p256); default: all"
    )
    p.add_argument("--repeat", type=int, help="repetitions per variant (default: smoke 1, quick 1, full 3)")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at once, in order (a case's variants side by side); above 1 the runs slow each other "
        "down and their figures are not for comparing: it only proves the harness works sooner "
        "(default 1)",
    )
    p.add_argument(
        "--database",
        help="sqlite, postgres, or a SQLAlchemy URL of an empty DB, for every case (default: each "
        "case's own: postgres for burst; sqlite for the others on Airflow 3, postgres on Airflow 2, "
        "which refuses SQLite for parallel executors)",
    )
    p.add_argument(
        "--airflow-cfg",
        choices=AIRFLOW_CFG_KINDS,
        default="generated",
        help="each deployment's airflow.cfg: generated by Airflow on its first command, as on a real "
        "deployment (default), or empty (options the environment does not set stay unset)",
    )
    p.add_argument(
        "--out", type=Path, help="JSON lines file to append to (default build/bench/<profile>.jsonl)"
    )
    p.add_argument("--charts", type=Path, help="directory for the PNG charts")
    p.add_argument("--markdown", type=Path, help="write the results page (e.g. docs/benchmarks.md)")
    p.add_argument(
        "--report-only", action="store_true", help="report the latest session in --out, run nothing"
    )
    p.add_argument("--keep-homes", action="store_true", help="keep every AIRFLOW_HOME for inspection")
    p.add_argument(
        "--profile-scheduler",
        type=Path,
        metavar="DIR",
        help="profile the scheduler's threads through each burst run (py-spy and the kernel's per-thread "
        "times; benchmarks/scheduler_profile.py) into DIR; a profiled run's own figures are not for comparing",
    )
    return p


def _variants(spec: str) -> list[Variant]:
    # Custom specs carry commas in their env part; split on commas that start a new variant.
    parts = [p for p in re.split(r",(?=[A-Za-z0-9_.-]+(?:=|,|$))", spec) if p.strip()]
    variants = [parse_variant(p) for p in parts]
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise SystemExit(f"duplicate variant labels: {labels}")
    if BASELINE not in labels:
        variants.insert(0, parse_variant(BASELINE))
    return variants


def _keep_observations(path: Path) -> str:
    # Hand-written observations between the markers survive a regeneration of the page.
    try:
        text = path.read_text()
    except FileNotFoundError:
        return f"{NOTES_BEGIN}\n{NOTES_END}"
    start, end = text.find(NOTES_BEGIN), text.find(NOTES_END)
    if start < 0 or end < 0:
        return f"{NOTES_BEGIN}\n{NOTES_END}"
    return text[start : end + len(NOTES_END)]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console(stderr=True)
    out: Path = args.out or Path("build/bench") / f"{args.profile}.jsonl"
    if args.report_only:
        records = runner.latest_session(runner.load_records(out))
        if not records:
            raise SystemExit(f"no records in {out}")
    else:
        variants = _variants(args.variants)
        names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
        cases = runner.select_cases(args.profile, names)
        for name in names:
            if not runner.SCENARIOS[name](args.profile):
                console.print(f"  {name}: no case in profile [b]{args.profile}[/b]")
        if not cases:
            raise SystemExit(f"nothing to run: no case of {', '.join(names)} in profile {args.profile}")
        if wanted := {c.strip() for c in args.cases.split(",") if c.strip()}:
            unknown = wanted - {case.name for case in cases}
            if unknown:
                raise SystemExit(f"no such case(s) in this profile: {', '.join(sorted(unknown))}")
            cases = [case for case in cases if case.name in wanted]
        repeat = args.repeat or runner.DEFAULT_REPEAT[args.profile]
        if args.profile_scheduler is not None:
            try:
                scheduler_profile.py_spy()
            except scheduler_profile.ProfilerMissing as exc:
                raise SystemExit(str(exc)) from None
        if args.jobs < 1:
            raise SystemExit(f"--jobs must be at least 1, got {args.jobs}")
        plan = runner.Plan(
            args.profile,
            cases,
            variants,
            repeat,
            args.database or None,
            args.airflow_cfg,
            args.jobs,
            args.profile_scheduler,
        )
        if installed_airflow_major() < 3 and any(plan.database_for(c).startswith("sqlite") for c in cases):
            raise SystemExit("Airflow 2 refuses SQLite for parallel executors: use --database postgres")
        display = LiveDisplay(console, len(plan.runs()))
        console.print(
            f"profile [b]{args.profile}[/b]: {len(cases)} case(s) x {repeat} repetition(s) x "
            f"{len(variants)} variant(s) = {len(plan.runs())} runs"
            + (f", {plan.jobs} at a time" if plan.jobs > 1 else "")
            + f"; results appended to {out}"
        )
        for case in cases:
            console.print(f"  {case.scenario}/{case.name}: database [b]{plan.database_for(case)}[/b]")
        with display.live:
            records = runner.run_plan(plan, out, display, keep_home=args.keep_homes)
    summary = summarize(records, BASELINE)
    # Wide enough for the ratio columns when the output is a file or a CI log.
    Console(width=None if sys.stdout.isatty() else 160).print(report.rich_table(summary))
    if args.charts:
        for path in report.write_charts(records, summary.variants, args.charts):
            console.print(f"wrote {path}")
    if args.markdown:
        charts_rel = (
            str(Path(args.charts).resolve().relative_to(args.markdown.resolve().parent))
            if args.charts
            else "benchmarks"
        )
        report.write_markdown(
            args.markdown,
            records,
            summary,
            command=records[0].get("command") or runner.python_command(),
            charts_rel=charts_rel,
            observations=_keep_observations(args.markdown),
        )
        console.print(f"wrote {args.markdown}")
    errors = [r for r in records if r["status"] == "error"]
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
