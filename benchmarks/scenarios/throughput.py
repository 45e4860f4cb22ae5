"""Throughput: N mapped no-op tasks; makespan, tasks/s, queued-to-start latency."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from benchmarks.deployment import deployment
from benchmarks.scenarios.base import (
    Case,
    Outcome,
    RunContext,
    cpu_figures,
    loop_figures,
    trigger_and_wait,
    wait_parsed,
)
from benchmarks.stats import percentile

DAG_ID = "bench_noop"


@dataclass(frozen=True)
class Size:
    tasks: int
    parallelism: int
    timeout: float


SIZES = {
    "smoke": Size(tasks=4, parallelism=4, timeout=120),
    "quick": Size(tasks=40, parallelism=32, timeout=300),
    "full": Size(tasks=200, parallelism=32, timeout=900),
}


def cases(profile: str) -> list[Case]:
    size = SIZES[profile]
    return [
        Case(
            "throughput",
            f"{size.tasks}-tasks-p{size.parallelism}",
            asdict(size),
            functools.partial(run, size),
        )
    ]


def run(size: Size, ctx: RunContext) -> Outcome:
    with deployment(
        ctx.variant,
        airflow_cfg=ctx.airflow_cfg,
        parallelism=size.parallelism,
        database=ctx.database,
        dag_env={"ALE_BENCH_TASKS": str(size.tasks)},
        progress=ctx.progress,
        keep_home=ctx.keep_home,
    ) as dep:
        wait_parsed(dep, DAG_ID)
        info = dep.executor_info()
        done = trigger_and_wait(dep, DAG_ID, size.timeout)
    rows, makespan = done.rows, done.makespan_s
    waits = [(r.start_date - r.queued_dttm).total_seconds() for r in rows if r.start_date and r.queued_dttm]
    succeeded = sum(1 for r in rows if r.state == "success")
    metrics = {
        "makespan_s": makespan,
        "run_duration_s": done.run_duration_s,
        "tasks_per_s": len(rows) / makespan if makespan else None,
        "queued_to_start_p50_s": percentile(waits, 50),
        "queued_to_start_p95_s": percentile(waits, 95),
        "tasks_succeeded": float(succeeded),
        **loop_figures(done.heartbeats, done.loop),
        **cpu_figures(done.cpu_before, done.cpu_after, len(rows)),
    }
    status = "ok" if done.state == "success" and succeeded == size.tasks else f"run {done.state}"
    notes = [done.problem] if done.problem else []
    return Outcome(
        metrics, {"heartbeat_ms": [d * 1000 for d in done.heartbeats.durations]}, status, notes, info=info
    )
