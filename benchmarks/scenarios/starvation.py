"""Starvation: a CPU-heavy task that starts in a crowd must get its share of the CPU once the crowd ends.

AsyncLocalExecutor lowers the CPU priority of a workload that starts while the scheduler runs more than
``CROWD_PER_CORE`` workloads per core, so a burst of starts cannot starve the scheduler's loop. A
workload that keeps that priority after the crowd is gone is starved by every ordinary one. The DAG
(``benchmarks/dags/bench_starvation.py``) queues a crowd of sleeping tasks first and ``long_cpu`` right
after them, so it starts inside the crowd; ``cpu_a`` and ``cpu_b`` start when the crowd has ended and
compete with it for the cores. All three do the same fixed CPU work, so their wall times from the task
instance rows show the share each got: ``long_cpu_stretch`` is its wall time over its CPU time.
"""

from __future__ import annotations

import functools
import os
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Final

from benchmarks.deployment import deployment
from benchmarks.scenarios.base import (
    Case,
    Figures,
    Outcome,
    RunContext,
    airflow_config,
    cpu_figures,
    loop_figures,
    run_status,
    trigger_and_wait,
    wait_parsed,
)
from harness.sandbox import TaskInstanceRow

DAG_ID: Final[str] = "bench_starvation"
CROWD_TASK: Final[str] = "crowd"
LONG_TASK: Final[str] = "long_cpu"
CPU_TASKS: Final[tuple[str, ...]] = ("cpu_a", "cpu_b")
# The executor's rule (workload_cpu_priority = auto): a workload that starts while the scheduler has
# more than this many children per core runs at idle priority. Only for the note on a run whose
# long_cpu started outside such a crowd; the executor decides for itself.
CROWD_PER_CORE: Final[int] = 24


@dataclass(frozen=True)
class Size:
    crowd: int  # mapped sleeping tasks, queued before long_cpu
    crowd_sleep: float
    cpu_seconds: float  # CPU time each of long_cpu, cpu_a and cpu_b burns
    parallelism: int
    timeout: float

    @property
    def tasks(self) -> int:
        return self.crowd + 1 + len(CPU_TASKS)


# Quick and full are the measured size: 100 in the crowd is more than 24 per core on 2 cores, and
# parallelism lets all of them and long_cpu run at once. Smoke only proves the harness works.
SIZES: Final[dict[str, Size]] = {
    "smoke": Size(crowd=4, crowd_sleep=2, cpu_seconds=2, parallelism=8, timeout=180),
    "quick": Size(crowd=100, crowd_sleep=30, cpu_seconds=60, parallelism=128, timeout=900),
    "full": Size(crowd=100, crowd_sleep=30, cpu_seconds=60, parallelism=128, timeout=900),
}


def cases(profile: str) -> list[Case]:
    size = SIZES[profile]
    name = f"crowd-{size.crowd}x{size.crowd_sleep:g}s-cpu-{size.cpu_seconds:g}s-p{size.parallelism}"
    return [Case("starvation", name, asdict(size), functools.partial(run, size))]


def run(size: Size, ctx: RunContext) -> Outcome:
    with deployment(
        ctx.variant,
        airflow_cfg=ctx.airflow_cfg,
        parallelism=size.parallelism,
        database=ctx.database,
        dag_env={
            "ALE_BENCH_CROWD": str(size.crowd),
            "ALE_BENCH_CROWD_SLEEP": str(size.crowd_sleep),
            "ALE_BENCH_CPU_SECONDS": str(size.cpu_seconds),
        },
        progress=ctx.progress,
        keep_home=ctx.keep_home,
    ) as dep:
        wait_parsed(dep, DAG_ID)
        info = dep.executor_info()
        applied = airflow_config(dep.sandbox)
        done = trigger_and_wait(dep, DAG_ID, size.timeout)
    rows = done.rows
    succeeded = sum(1 for r in rows if r.state == "success")
    metrics: Figures = {
        "tasks_succeeded": float(succeeded),
        **timeline_figures(rows, size.cpu_seconds),
        "makespan_s": done.makespan_s,
        "run_duration_s": done.run_duration_s,
        **loop_figures(done.heartbeats, done.loop),
        **cpu_figures(done.cpu_before, done.cpu_after, len(rows)),
    }
    notes = [done.problem] if done.problem else []
    crowd_limit = CROWD_PER_CORE * (os.cpu_count() or 1)
    at_start = metrics["crowd_running_at_long_cpu_start"]
    # Smoke's crowd is too small to be one: a note there would only be noise.
    if size.crowd > crowd_limit and at_start is not None and at_start <= crowd_limit:
        notes.append(
            f"long_cpu started with {at_start:.0f} crowd tasks running, not more than {crowd_limit}: "
            "this run did not test a start in a crowd"
        )
    return Outcome(
        metrics,
        {"timeline": timeline(rows), "airflow_config": applied},
        run_status(done.state == "success" and succeeded == size.tasks, done.state, done.problem),
        notes,
        info=info,
        text={"run_state": done.state or "none"},
    )


def _span(row: TaskInstanceRow | None) -> tuple[datetime, datetime] | None:
    if row is None or row.start_date is None or row.end_date is None:
        return None
    return row.start_date, row.end_date


def _wall(row: TaskInstanceRow | None) -> float | None:
    span = _span(row)
    return None if span is None else (span[1] - span[0]).total_seconds()


def _crowd_spans(rows: Sequence[TaskInstanceRow]) -> list[tuple[datetime, datetime]]:
    return [span for r in rows if r.task_id == CROWD_TASK and (span := _span(r)) is not None]


def _one(rows: Sequence[TaskInstanceRow], task_id: str) -> TaskInstanceRow | None:
    return next((r for r in rows if r.task_id == task_id), None)


def peak_overlap(spans: Sequence[tuple[datetime, datetime]]) -> int:
    """Most spans open at one instant; one that ends as another starts does not overlap it."""
    # Ends sort before starts at the same instant (False < True).
    events = sorted([(start, True) for start, _ in spans] + [(end, False) for _, end in spans])
    peak = current = 0
    for _, starts in events:
        current += 1 if starts else -1
        peak = max(peak, current)
    return peak


def timeline_figures(rows: Sequence[TaskInstanceRow], cpu_seconds: float) -> Figures:
    """The case's own figures, from the task instance rows' start and end dates."""
    long_wall = _wall(_one(rows, LONG_TASK))
    cpu_walls = [w for task_id in CPU_TASKS if (w := _wall(_one(rows, task_id))) is not None]
    crowd = _crowd_spans(rows)
    long_span = _span(_one(rows, LONG_TASK))
    at_start = (
        None if long_span is None else float(sum(1 for start, end in crowd if start <= long_span[0] < end))
    )
    return {
        "long_cpu_wall_s": long_wall,
        "cpu_tasks_wall_s": statistics.median(cpu_walls) if cpu_walls else None,
        "long_cpu_stretch": None if long_wall is None or not cpu_seconds else long_wall / cpu_seconds,
        "crowd_running_at_long_cpu_start": at_start,
        "crowd_peak_running": float(peak_overlap(crowd)) if crowd else None,
    }


def timeline(rows: Sequence[TaskInstanceRow]) -> dict[str, Any]:
    """Start and end of each task, seconds from the first task's start: what the report's chart draws."""
    starts = [r.start_date for r in rows if r.start_date]
    if not starts:
        return {}
    origin = min(starts)

    def offsets(span: tuple[datetime, datetime]) -> list[float]:
        return [round((t - origin).total_seconds(), 3) for t in span]

    found: dict[str, Any] = {"crowd": sorted(offsets(s) for s in _crowd_spans(rows))}
    for task_id in (LONG_TASK, *CPU_TASKS):
        if (span := _span(_one(rows, task_id))) is not None:
            found[task_id] = offsets(span)
    return found
