"""Burst: the dispatch-deadlock repro of upstream #70526, as the report runs it.

One DAG run of many mapped tasks that sleep, more of them than ``[core] parallelism``; once the first
task instance runs, *every* task instance of the run is cleared through the REST API, several times at a
fixed interval, so each clear's dispatch burst meets the results of the tasks it killed coming back.
Then the run is awaited, bounded, and abandoned early if the scheduler stops heartbeating (the stock
LocalExecutor can block for good in a pipe write here: that is a result, reported as ``stalled``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from dataclasses import asdict, dataclass

from async_local_executor.core.runtime import THREAD_NAME as LOOP_THREAD
from benchmarks import scheduler_profile
from benchmarks.deployment import deployment
from benchmarks.probes import as_utc, thread_cpu_seconds
from benchmarks.scenarios.base import (
    EXITED,
    Case,
    Outcome,
    RunContext,
    airflow_config,
    cpu_figures,
    loop_figures,
    roles_figures,
    roles_notes,
    run_status,
    stalled,
    wait_for_run,
    wait_parsed,
)
from harness.sandbox import AirflowSandbox, SandboxError

DAG_ID = "bench_sleep"
TASK_ID = "sleep"
STALL_GAP = 5.0
# The scheduler logs this when an executor event contradicts the database ("killed externally").
MISMATCH = "but the task instance's state attribute is"
# The report's database; --database overrides it.
DATABASE = "postgres"


@dataclass(frozen=True)
class Size:
    parallelism: int
    tasks: int  # more than parallelism: a second wave waits while the first runs
    sleep: float  # every task sleeps this long (no spread: they finish together, as in the report)
    clears: int
    # The first clear this long after the first task instance is running, the next ones as far apart.
    clear_interval: float
    api_workers: int  # [api] workers
    max_tis_per_query: int  # [scheduler] max_tis_per_query; 0 means parallelism
    timeout: float  # trigger to run end, at most
    stall_abort: float  # abandon the run after this long without a scheduler job heartbeat


# Smaller sizes keep the full size's shape: more tasks than slots, tasks twice as long as the interval
# (so every clear finds tasks running), three clears.
SIZES = {
    "smoke": Size(
        parallelism=4,
        tasks=6,
        sleep=4,
        clears=3,
        clear_interval=2,
        api_workers=2,
        max_tis_per_query=0,
        timeout=240,
        stall_abort=60,
    ),
    "quick": Size(
        parallelism=48,
        tasks=60,
        sleep=12,
        clears=3,
        clear_interval=6,
        api_workers=2,
        max_tis_per_query=0,
        timeout=600,
        stall_abort=60,
    ),
    "full": Size(
        parallelism=256,
        tasks=300,
        sleep=30,
        clears=3,
        clear_interval=15,
        api_workers=2,
        max_tis_per_query=0,
        timeout=1200,
        stall_abort=120,
    ),
}


# Beyond the report's size, in the full profile: twice its tasks at the same parallelism, so each clear
# meets two waves of waiting task instances as well as the running one.
LARGER = {"full": dataclasses.replace(SIZES["full"], tasks=600, timeout=1800)}


def cases(profile: str) -> list[Case]:
    return [
        Case(
            "burst",
            f"{s.tasks}x{s.sleep:g}s-p{s.parallelism}-{s.clears}-clears",
            asdict(s),
            functools.partial(run, s),
            database=DATABASE,
        )
        for s in (SIZES[profile], *([LARGER[profile]] if profile in LARGER else []))
    ]


def _running(sb: AirflowSandbox, run_id: str) -> int:
    rows = sb.query(
        "SELECT count(*) FROM task_instance WHERE dag_id = :d AND run_id = :r AND state = 'running'",
        d=DAG_ID,
        r=run_id,
    )
    return int(str(rows[0][0])) if rows else 0


def _exited(sb: AirflowSandbox) -> str | None:
    """Why a process of the deployment exited (its last error line), or None while all run.

    A scheduler that crashes is a result of the run, not a failure of the benchmark: its figures up to
    that moment are kept.
    """
    try:
        sb.check_processes()
    except SandboxError as exc:
        text = str(exc)
        name = text.split(" ", 1)[0]
        errors = [line.strip() for line in text.splitlines() if "Error:" in line]
        return f"{name}{EXITED}{errors[-1][:300] if errors else text.splitlines()[0]}"
    return None


def _run_end(sb: AirflowSandbox, run_id: str) -> float | None:
    rows = sb.query("SELECT end_date FROM dag_run WHERE dag_id = :d AND run_id = :r", d=DAG_ID, r=run_id)
    end = as_utc(rows[0][0]) if rows else None
    return end.timestamp() if end else None


def run(size: Size, ctx: RunContext) -> Outcome:
    dag_env = {
        "ALE_BENCH_TASKS": str(size.tasks),
        "ALE_BENCH_SLEEP": str(size.sleep),
        "ALE_BENCH_SLEEP_SPREAD": "0",
    }
    airflow_env = {
        "AIRFLOW__API__WORKERS": str(size.api_workers),
        "AIRFLOW__SCHEDULER__MAX_TIS_PER_QUERY": str(size.max_tis_per_query),
    }
    notes: list[str] = []
    clear_offsets: list[float] = []  # seconds after the first running task instance
    clear_calls: list[float] = []  # how long each REST call took
    first_running_s: float | None = None
    with deployment(
        ctx.variant,
        airflow_cfg=ctx.airflow_cfg,
        parallelism=size.parallelism,
        database=ctx.database,
        dag_env=dag_env,
        airflow_env=airflow_env,
        progress=ctx.progress,
        keep_home=ctx.keep_home,
    ) as dep:
        sb = dep.sandbox
        wait_parsed(dep, DAG_ID)
        info = dep.executor_info()
        applied = airflow_config(sb)
        loop = dep.loop_probe()
        is_stalled = stalled(loop, size.stall_abort)
        problem: str | None = None
        state: str | None = None
        cpu_before = dep.cpu()
        threads_before = thread_cpu_seconds(dep.scheduler_pid)
        profiling = (
            contextlib.nullcontext()
            if ctx.profile_stem is None
            else scheduler_profile.profiled(dep.scheduler_pid, ctx.profile_stem)
        )
        account = dep.role_account()
        with loop.sampling(), profiling, account.measuring():
            triggered = time.time()
            deadline = time.monotonic() + size.timeout
            run_id = sb.trigger(DAG_ID)
            # The schedule starts when the first task instance runs.
            while problem is None:
                if (problem := _exited(sb)) is not None:
                    break
                if _running(sb, run_id) > 0:
                    first_running_s = time.time() - triggered
                    break
                problem = is_stalled()
                if time.monotonic() > deadline:
                    problem = f"timeout after {size.timeout:.0f}s: no task instance ever ran"
                time.sleep(0.25)
            start = time.monotonic()
            for k in range(1, size.clears + 1):
                if problem is not None:
                    break
                due = start + k * size.clear_interval
                while problem is None and time.monotonic() < due:
                    problem = _exited(sb) or is_stalled()
                    time.sleep(min(0.25, max(0.0, due - time.monotonic())))
                if problem is not None:
                    break
                began = time.monotonic()
                try:
                    # Every map index of the run: the whole run goes back to the scheduler.
                    sb.clear(DAG_ID, run_id, TASK_ID, list(range(size.tasks)))
                except (SandboxError, OSError) as exc:
                    notes.append(f"clear {k} failed after {time.monotonic() - began:.1f}s: {exc}"[:500])
                else:
                    clear_offsets.append(round(began - start, 2))
                clear_calls.append(round(time.monotonic() - began, 2))
                if ctx.progress is not None:
                    ctx.progress(f"burst: clear {k}/{size.clears} of all {size.tasks} task instances")
            if problem is None:
                try:
                    state, problem = wait_for_run(
                        sb, DAG_ID, run_id, timeout=max(1.0, deadline - time.monotonic()), abort=is_stalled
                    )
                except SandboxError:
                    state, problem = sb.run_state(DAG_ID, run_id), _exited(sb)
            else:
                state = sb.run_state(DAG_ID, run_id)
            ended = time.time()
            heartbeats = dep.heartbeats()
        cpu_after = dep.cpu()
        threads_after = thread_cpu_seconds(dep.scheduler_pid)
        rows = sb.task_instances(DAG_ID, run_id)
        run_end = _run_end(sb, run_id) if state in ("success", "failed") else None
        mismatches = sb.process_logs["scheduler"].read_text(errors="replace").count(MISMATCH)
    if problem:
        notes.insert(0, problem)
    if state not in ("success", "failed"):
        # What the run waited on when it was given up: which map indexes, in which state, at which try.
        unfinished = [r for r in rows if r.state not in ("success", "failed", "skipped", "upstream_failed")]
        notes.append(
            "unfinished task instances at the end: "
            + (", ".join(f"[{r.map_index}] {r.state} try {r.try_number}" for r in unfinished) or "none")
        )
    gaps = [g for g in loop.gaps() if g > STALL_GAP]
    ran = sum(r.try_number for r in rows)
    metrics = {
        "tasks_succeeded": float(sum(1 for r in rows if r.state == "success")),
        "tasks_failed": float(sum(1 for r in rows if r.state in ("failed", "up_for_retry"))),
        "tasks_lost": float(sum(1 for r in rows if r.state not in ("success", "failed", "up_for_retry"))),
        "makespan_s": (run_end if run_end is not None else ended) - triggered,
        "run_finished": 1.0 if state in ("success", "failed") else 0.0,
        "first_running_s": first_running_s,
        "clears": float(len(clear_offsets)),
        "clear_call_max_s": max(clear_calls, default=None),
        "tries": float(ran),
        "state_mismatches": float(mismatches),
        **loop_figures(heartbeats, loop),
        "job_heartbeat_stalls": float(len(gaps)),
        "job_heartbeat_stalled_s": sum(gaps),
        **cpu_figures(cpu_before, cpu_after, ran),
        **roles_figures(account, ran),
        # The scheduler's own thread, and the executor's loop thread where it has one (named in the
        # kernel since this figure exists; stock has none).
        # None when the scheduler is gone by the end (it crashed): its threads took their counts along.
        "scheduler_main_thread_cpu_s": (
            threads_after["main"] - threads_before.get("main", 0.0) if threads_after else None
        ),
        "scheduler_other_threads_cpu_s": (
            sum(threads_after.values())
            - threads_after["main"]
            - (sum(threads_before.values()) - threads_before.get("main", 0.0))
            if threads_after
            else None
        ),
        "executor_loop_thread_cpu_s": (
            threads_after[LOOP_THREAD] - threads_before.get(LOOP_THREAD, 0.0)
            if LOOP_THREAD in threads_after
            else None
        ),
    }
    series = {
        "heartbeat_ms": [d * 1000 for d in heartbeats.durations],
        "job_heartbeat_gaps_s": [round(g, 3) for g in loop.gaps()],
        "job_heartbeats_recorded": len(loop.recorded),
        "clear_offsets_s": clear_offsets,
        "clear_calls_s": clear_calls,
        "airflow_config": applied,
    }
    status = run_status(state == "success", state, problem)
    notes += roles_notes(account)
    if loop.record_error is not None:
        notes.append(
            f"heartbeats from the samples alone: the database's record could not be read ({loop.record_error})"
        )
    return Outcome(metrics, series, status, notes, info=info, text={"run_state": state or "none"})
