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
import re
import time
from collections.abc import Iterable
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
# What each task of these DAGs prints, followed by its own process's private memory (USS) in KiB.
USS_MARKER: Final[str] = "ale-bench-task-uss-kib="
_USS_LINE = re.compile(re.escape(USS_MARKER) + r"(\d+)")
# Case prefix -> the DAG it triggers.
DAG_IDS: Final[dict[str, str]] = {"pandas": "bench_import_pandas", "real-imports": "bench_real_imports"}


@dataclass(frozen=True)
class Size:
    tasks: int
    parallelism: int
    timeout: float
    idle_window: float
    settle: float = 5.0
    hold_s: float = 0.0  # how long each task sleeps once it has said its memory (0: a no-op task)


# The full size is the measured case: 100 tasks at parallelism 16.
SIZES = {
    "smoke": Size(tasks=4, parallelism=4, timeout=180, idle_window=3, settle=2),
    "quick": Size(tasks=32, parallelism=16, timeout=300, idle_window=8),
    "full": Size(tasks=100, parallelism=16, timeout=900, idle_window=10),
}
# The pandas DAG again, one wave of tasks that stay running: the scheduler tree's memory per running task
# in the steady state, where a no-op task's figure mixes in processes that are starting or ending
# (a task instance counts as running only between its start and end calls to the api-server). Long
# enough that the stock tasks' own import of pandas (seconds, 16 at once) is a small part of the window.
# Not at smoke size: it runs the same code as the cases above, and CI's time is better spent elsewhere.
HELD = {
    "quick": Size(tasks=16, parallelism=16, timeout=300, idle_window=8, hold_s=15),
    "full": Size(tasks=16, parallelism=16, timeout=300, idle_window=10, hold_s=25),
}


def cases(profile: str) -> list[Case]:
    size = SIZES[profile]
    # The smoke profile proves the scenario's harness runs, which one DAG does as well as two (a
    # deployment each); tests/bench/test_cases.py parses both DAG files.
    kinds = ["pandas"] if profile == "smoke" else list(DAG_IDS)
    found = [_case(kind, DAG_IDS[kind], size) for kind in kinds]
    if held := HELD.get(profile):
        found.append(_case("pandas-held", DAG_IDS["pandas"], held))
    return found


def _case(kind: str, dag_id: str, size: Size) -> Case:
    return Case(
        "imports",
        f"{kind}-{size.tasks}-tasks-p{size.parallelism}",
        {"dag_id": dag_id, **asdict(size)},
        functools.partial(run, dag_id, size),
    )


def run(dag_id: str, size: Size, ctx: RunContext) -> Outcome:
    with deployment(
        ctx.variant,
        airflow_cfg=ctx.airflow_cfg,
        parallelism=size.parallelism,
        database=ctx.database,
        dag_env={"ALE_BENCH_TASKS": str(size.tasks), "ALE_BENCH_HOLD_S": str(size.hold_s)},
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
        sb = dep.sandbox
        task_uss = task_process_uss_mb(
            sb.task_log_path(dag_id, done.run_id, r.task_id, r.try_number, r.map_index) for r in done.rows
        )
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
        "task_process_uss_mb": percentile(task_uss, 50),
        "task_process_uss_p95_mb": percentile(task_uss, 95),
        **cpu_figures(done.cpu_before, done.cpu_after, len(rows)),
    }
    origin = memory.samples[0].t if memory.samples else 0.0
    series = {
        "memory": [[round(s.t - origin, 2), round(s.uss_mb, 1), round(s.pss_mb, 1)] for s in memory.samples],
        "running": [[round(s.t - origin, 2), s.running] for s in done.loop.samples],
        "task_duration_s": sorted(round(d, 3) for d in durations),
        "task_process_uss_mb": sorted(round(u, 1) for u in task_uss),
    }
    status = "ok" if done.state == "success" and succeeded == size.tasks else f"run {done.state}"
    return Outcome(metrics, series, status, [done.problem] if done.problem else [], info=info)


def task_process_uss_mb(logs: Iterable[Path]) -> list[float]:
    """What each task said of its own process's private memory, read from its log (one path per task).

    The same figure for every executor: the process that runs the task's code (stock's task process,
    forked by a worker; ours, forked by the workload's supervisor), read by the task itself when it runs,
    after that process parsed its DAG file. The workers or supervisors are not in it: the scheduler-tree
    figures above count them. A log that is missing or says nothing of it is left out.
    """
    found = []
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if match := _USS_LINE.search(text):
            found.append(int(match.group(1)) / 1024)
    return found
