"""Real imports: the throughput fan-out from DAG files that import libraries, as real DAG files do.

Two cases per profile, each a DAG of its own in ``benchmarks/dags_imports`` (the only deployments that
parse that folder): ``pandas``, the no-op fan-out with ``import pandas`` at the top of its file, and
``real-imports``, a file importing pandas and numpy whose task imports matplotlib in its body. Every
task process parses its DAG file before the task runs, so each pays for these imports unless the
executor has them imported already. Measured: makespan, task run time (start to end of each task
instance, the DAG file's parse included), scheduler-tree CPU and what each running task adds to the
scheduler tree's memory (sampled as in the footprint scenario, against an idle window before the run).
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

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
    trigger_and_wait,
    wait_parsed,
)
from benchmarks.stats import percentile

DAGS_FOLDER: Final[Path] = Path(__file__).resolve().parent.parent / "dags_imports"
# Case prefix -> the DAG it triggers.
DAG_IDS: Final[dict[str, str]] = {"pandas": "bench_import_pandas", "real-imports": "bench_real_imports"}


@dataclass(frozen=True)
class Size:
    tasks: int
    parallelism: int
    timeout: float
    idle_window: float
    settle: float = 5.0


# The full size is the measured case: 100 tasks at parallelism 16.
SIZES = {
    "smoke": Size(tasks=4, parallelism=4, timeout=180, idle_window=3, settle=2),
    "quick": Size(tasks=32, parallelism=16, timeout=300, idle_window=8),
    "full": Size(tasks=100, parallelism=16, timeout=900, idle_window=10),
}


def cases(profile: str) -> list[Case]:
    size = SIZES[profile]
    return [
        Case(
            "imports",
            f"{kind}-{size.tasks}-tasks-p{size.parallelism}",
            {"dag_id": dag_id, **asdict(size)},
            functools.partial(run, dag_id, size),
        )
        for kind, dag_id in DAG_IDS.items()
    ]


def run(dag_id: str, size: Size, ctx: RunContext) -> Outcome:
    with deployment(
        ctx.variant,
        parallelism=size.parallelism,
        database=ctx.database,
        dag_env={"ALE_BENCH_TASKS": str(size.tasks)},
        progress=ctx.progress,
        keep_home=ctx.keep_home,
        dags_folder=DAGS_FOLDER,
    ) as dep:
        wait_parsed(dep, dag_id)
        info = dep.executor_info()
        memory = MemoryProbe(dep.scheduler_pid)
        with memory.sampling():
            time.sleep(size.settle)
            idle_from = time.monotonic()
            time.sleep(size.idle_window)
            idle = memory.between(idle_from, time.monotonic())
            done = trigger_and_wait(dep, dag_id, size.timeout)
    rows = done.rows
    durations = [(r.end_date - r.start_date).total_seconds() for r in rows if r.start_date and r.end_date]
    succeeded = sum(1 for r in rows if r.state == "success")
    idle_uss, idle_pss = sample_median(idle, "uss_mb"), sample_median(idle, "pss_mb")
    metrics: Figures = {
        "makespan_s": done.makespan_s,
        "run_duration_s": done.run_duration_s,
        "task_duration_p50_s": percentile(durations, 50),
        "task_duration_p95_s": percentile(durations, 95),
        "tasks_succeeded": float(succeeded),
        "idle_uss_mb": idle_uss,
        **busy_memory_figures(memory, done.loop, idle_uss, idle_pss),
        **cpu_figures(done.cpu_before, done.cpu_after, len(rows)),
    }
    origin = memory.samples[0].t if memory.samples else 0.0
    series = {
        "memory": [[round(s.t - origin, 2), round(s.uss_mb, 1), round(s.pss_mb, 1)] for s in memory.samples],
        "running": [[round(s.t - origin, 2), s.running] for s in done.loop.samples],
        "task_duration_s": sorted(round(d, 3) for d in durations),
    }
    status = "ok" if done.state == "success" and succeeded == size.tasks else f"run {done.state}"
    return Outcome(metrics, series, status, [done.problem] if done.problem else [], info=info)
