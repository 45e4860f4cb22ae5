"""Throughput: N mapped no-op tasks; makespan, tasks/s, queued-to-start latency."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from benchmarks.deployment import deployment
from benchmarks.probes import LoopProbe, as_utc
from benchmarks.scenarios.base import (
    Case,
    Outcome,
    RunContext,
    cpu_figures,
    loop_figures,
    stalled,
    wait_for_run,
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
        parallelism=size.parallelism,
        database=ctx.database,
        dag_env={"ALE_BENCH_TASKS": str(size.tasks)},
        progress=ctx.progress,
        keep_home=ctx.keep_home,
    ) as dep:
        sb = dep.sandbox
        wait_parsed(dep, DAG_ID)
        info = dep.executor_info()
        loop = LoopProbe(dep.query)
        cpu_before = dep.cpu()
        with loop.sampling():
            run_id = sb.trigger(DAG_ID)
            state, problem = wait_for_run(sb, DAG_ID, run_id, timeout=size.timeout, abort=stalled(loop, 120))
        cpu_after = dep.cpu()
        heartbeats = dep.heartbeats()
        rows = sb.task_instances(DAG_ID, run_id)
        [(queued_at, run_end)] = [
            (r[0], r[1])
            for r in sb.query(
                "SELECT queued_at, end_date FROM dag_run WHERE dag_id = :d AND run_id = :r",
                d=DAG_ID,
                r=run_id,
            )
        ]
    starts = [r.start_date for r in rows if r.start_date]
    ends = [r.end_date for r in rows if r.end_date]
    makespan = (max(ends) - min(starts)).total_seconds() if starts and ends else None
    trigger, finished = as_utc(queued_at), as_utc(run_end)
    waits = [(r.start_date - r.queued_dttm).total_seconds() for r in rows if r.start_date and r.queued_dttm]
    succeeded = sum(1 for r in rows if r.state == "success")
    metrics = {
        "makespan_s": makespan,
        "run_duration_s": (finished - trigger).total_seconds() if trigger and finished else None,
        "tasks_per_s": len(rows) / makespan if makespan else None,
        "queued_to_start_p50_s": percentile(waits, 50),
        "queued_to_start_p95_s": percentile(waits, 95),
        "tasks_succeeded": float(succeeded),
        **loop_figures(heartbeats, loop),
        **cpu_figures(cpu_before, cpu_after, len(rows)),
    }
    status = "ok" if state == "success" and succeeded == size.tasks else f"run {state}"
    notes = [problem] if problem else []
    return Outcome(
        metrics, {"heartbeat_ms": [d * 1000 for d in heartbeats.durations]}, status, notes, info=info
    )
