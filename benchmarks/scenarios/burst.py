"""Burst: the dispatch-deadlock repro. Many sleeping mapped tasks; finished ones are cleared again while
the rest are still running, several times, so dispatch bursts coincide with results coming back."""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass

from async_local_executor.sandbox import AirflowSandbox
from benchmarks.deployment import deployment
from benchmarks.probes import LoopProbe
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

DAG_ID = "bench_sleep"
STALL_GAP = 5.0
# The scheduler logs this when an executor event contradicts the database ("killed externally").
MISMATCH = "but the task instance's state attribute is"
TASK_KILLED = "shouldn't be running anymore"


@dataclass(frozen=True)
class Size:
    parallelism: int
    tasks: int
    sleep: float
    sleep_spread: float
    clears: int
    batch: int  # clear once at least this many task instances have succeeded since the last clear
    timeout: float
    stall_abort: float


SIZES = {
    "smoke": Size(
        parallelism=8, tasks=6, sleep=3, sleep_spread=3, clears=1, batch=2, timeout=120, stall_abort=60
    ),
    "quick": Size(
        parallelism=64, tasks=48, sleep=8, sleep_spread=8, clears=2, batch=12, timeout=300, stall_abort=60
    ),
    "full": Size(
        parallelism=256,
        tasks=300,
        sleep=30,
        sleep_spread=30,
        clears=3,
        batch=60,
        timeout=1200,
        stall_abort=120,
    ),
}


def cases(profile: str) -> list[Case]:
    s = SIZES[profile]
    return [
        Case(
            "burst",
            f"{s.tasks}-tasks-p{s.parallelism}-{s.clears}-clears",
            asdict(s),
            functools.partial(run, s),
        )
    ]


def _succeeded(sb: AirflowSandbox, run_id: str) -> list[int]:
    rows = sb.query(
        "SELECT map_index FROM task_instance WHERE dag_id = :d AND run_id = :r AND state = 'success'",
        d=DAG_ID,
        r=run_id,
    )
    return [int(str(r[0])) for r in rows]


def _count_in_task_logs(sb: AirflowSandbox, needle: str) -> int:
    count = 0
    for path in (sb.logs_dir / f"dag_id={DAG_ID}").rglob("*.log"):
        count += path.read_text(errors="replace").count(needle)
    return count


def run(size: Size, ctx: RunContext) -> Outcome:
    dag_env = {
        "ALE_BENCH_TASKS": str(size.tasks),
        "ALE_BENCH_SLEEP": str(size.sleep),
        "ALE_BENCH_SLEEP_SPREAD": str(size.sleep_spread),
    }
    notes: list[str] = []
    with deployment(
        ctx.variant,
        parallelism=size.parallelism,
        database=ctx.database,
        dag_env=dag_env,
        progress=ctx.progress,
        keep_home=ctx.keep_home,
    ) as dep:
        sb = dep.sandbox
        wait_parsed(dep, DAG_ID)
        info = dep.executor_info()
        loop = LoopProbe(dep.query)
        is_stalled = stalled(loop, size.stall_abort)
        deadline = time.monotonic() + size.timeout
        clears = 0
        problem: str | None = None
        cpu_before = dep.cpu()
        with loop.sampling():
            run_id = sb.trigger(DAG_ID)
            while clears < size.clears and problem is None:
                if time.monotonic() > deadline:
                    problem = f"timeout after {size.timeout:.0f}s before clear {clears + 1}"
                    break
                problem = is_stalled()
                done = _succeeded(sb, run_id)
                if len(done) >= size.batch:
                    sb.clear(DAG_ID, run_id, "sleep", done)
                    clears += 1
                    if ctx.progress is not None:
                        ctx.progress(
                            f"burst: cleared {len(done)} finished task instances ({clears}/{size.clears})"
                        )
                time.sleep(0.5)
            state: str | None = None
            if problem is None:
                state, problem = wait_for_run(
                    sb, DAG_ID, run_id, timeout=max(1.0, deadline - time.monotonic()), abort=is_stalled
                )
            heartbeats = dep.heartbeats()
        cpu_after = dep.cpu()
        rows = sb.task_instances(DAG_ID, run_id)
        mismatches = sb.process_logs["scheduler"].read_text(errors="replace").count(MISMATCH)
        killed_in_tasks = _count_in_task_logs(sb, TASK_KILLED)
    if problem:
        notes.append(problem)
    gaps = [g for g in loop.gaps() if g > STALL_GAP]
    ran = sum(r.try_number for r in rows)
    metrics = {
        **loop_figures(heartbeats, loop),
        "job_heartbeat_stalls": float(len(gaps)),
        "job_heartbeat_stalled_s": sum(gaps),
        "clears": float(clears),
        "run_finished": 1.0 if state in ("success", "failed") else 0.0,
        "tasks_failed": float(sum(1 for r in rows if r.state in ("failed", "up_for_retry"))),
        "tasks_lost": float(sum(1 for r in rows if r.state not in ("success", "failed", "up_for_retry"))),
        "tasks_killed": float(mismatches + killed_in_tasks),
        **cpu_figures(cpu_before, cpu_after, ran),
    }
    series = {
        "heartbeat_ms": [d * 1000 for d in heartbeats.durations],
        "job_heartbeat_gaps_s": [round(g, 3) for g in loop.gaps()],
    }
    status = (
        "ok" if state == "success" else ("stalled" if problem and "stalled" in problem else f"run {state}")
    )
    return Outcome(metrics, series, status, notes, info=info)
