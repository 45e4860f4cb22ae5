"""Footprint: memory of the scheduler process tree idle, and while N tasks sleep."""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass

from benchmarks.deployment import deployment
from benchmarks.probes import MemoryProbe
from benchmarks.scenarios.base import (
    Case,
    Figures,
    Outcome,
    RunContext,
    busy_memory_figures,
    cpu_figures,
    sample_median,
    stalled,
    wait_for_run,
    wait_parsed,
)
from benchmarks.stats import percentile
from harness.sandbox import TaskInstanceRow

DAG_ID = "bench_sleep"


@dataclass(frozen=True)
class Size:
    parallelism: int
    tasks: int  # 0: idle only
    sleep: float
    idle_window: float
    settle: float = 5.0
    timeout: float = 600.0


SIZES = {
    "smoke": [Size(parallelism=4, tasks=4, sleep=8, idle_window=3, settle=2, timeout=120)],
    "quick": [
        Size(parallelism=32, tasks=0, sleep=0, idle_window=8),
        Size(parallelism=16, tasks=16, sleep=20, idle_window=8, timeout=300),
    ],
    "full": [
        Size(parallelism=32, tasks=0, sleep=0, idle_window=15),
        Size(parallelism=256, tasks=0, sleep=0, idle_window=15),
        Size(parallelism=64, tasks=64, sleep=20, idle_window=15),
    ],
}


def cases(profile: str) -> list[Case]:
    return [
        Case(
            "footprint",
            f"idle-p{s.parallelism}" if not s.tasks else f"busy-{s.tasks}x{s.sleep:g}s-p{s.parallelism}",
            asdict(s),
            functools.partial(run, s),
        )
        for s in SIZES[profile]
    ]


def run(size: Size, ctx: RunContext) -> Outcome:
    with deployment(
        ctx.variant,
        airflow_cfg=ctx.airflow_cfg,
        parallelism=size.parallelism,
        database=ctx.database,
        dag_env={"ALE_BENCH_TASKS": str(max(1, size.tasks)), "ALE_BENCH_SLEEP": str(size.sleep)},
        progress=ctx.progress,
        keep_home=ctx.keep_home,
    ) as dep:
        sb = dep.sandbox
        wait_parsed(dep, DAG_ID)
        info = dep.executor_info()
        memory = MemoryProbe(dep.scheduler_pid)
        loop = dep.loop_probe()
        problem: str | None = None
        state: str | None = None
        cpu_before = cpu_after = dep.cpu()
        rows: list[TaskInstanceRow] = []
        with memory.sampling(), loop.sampling():
            time.sleep(size.settle)
            idle_from = time.monotonic()
            time.sleep(size.idle_window)
            idle_to = time.monotonic()
            if size.tasks:
                cpu_before = dep.cpu()
                run_id = sb.trigger(DAG_ID)

                def abort() -> str | None:
                    if memory.low_memory:
                        return "aborted: less than 1 GB of memory available"
                    return stalled(loop, 120)()

                state, problem = wait_for_run(sb, DAG_ID, run_id, timeout=size.timeout, abort=abort)
                cpu_after = dep.cpu()
                rows = sb.task_instances(DAG_ID, run_id)
    origin = memory.samples[0].t if memory.samples else 0.0
    idle = memory.between(idle_from, idle_to)
    metrics: Figures = {
        "idle_uss_mb": sample_median(idle, "uss_mb"),
        "idle_pss_mb": sample_median(idle, "pss_mb"),
        "idle_scheduler_pss_mb": sample_median(idle, "root_pss_mb"),
        "idle_processes": sample_median(idle, "processes"),
    }
    series = {
        "memory": [
            [round(s.t - origin, 2), round(s.uss_mb, 1), round(s.pss_mb, 1), s.processes]
            for s in memory.samples
        ],
        "running": [[round(s.t - origin, 2), s.running] for s in loop.samples],
        "idle_window": [round(idle_from - origin, 2), round(idle_to - origin, 2)],
    }
    if size.tasks:
        waits = [
            (r.start_date - r.queued_dttm).total_seconds() for r in rows if r.start_date and r.queued_dttm
        ]
        idle_uss, idle_pss = metrics["idle_uss_mb"], metrics["idle_pss_mb"]
        metrics.update(
            {
                **busy_memory_figures(memory, loop, idle_uss, idle_pss),
                "queued_to_start_p50_s": percentile(waits, 50),
                "queued_to_start_p95_s": percentile(waits, 95),
                **cpu_figures(cpu_before, cpu_after, size.tasks),
            }
        )
    status = "ok" if not size.tasks or state == "success" else f"run {state}"
    return Outcome(metrics, series, status, [problem] if problem else [], info=info)
