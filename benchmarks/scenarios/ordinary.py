"""Ordinary load: many no-op mapped tasks on a deployment as Airflow sets one up.

The home's ``airflow.cfg`` is the one Airflow writes on its first start (every option with its
default: ``[workers] execution_api_timeout = 5.0``), with one api-server worker: what a deployment gets
out of the box (``--airflow-cfg empty`` runs it on an empty file instead). A start burst can queue a
task's call to the api-server past the client's timeout; Airflow 3.3.2 retries calls that are not
idempotent, and a task that succeeded can end up failed by the scheduler. So the figures are how many
tasks really succeeded (final states from the database) and how often the scheduler logged an executor
event that contradicted the database.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from benchmarks.deployment import deployment
from benchmarks.scenarios.base import (
    Case,
    Outcome,
    RunContext,
    airflow_config,
    cpu_figures,
    loop_figures,
    roles_figures,
    roles_notes,
    run_status,
    trigger_and_wait,
    wait_parsed,
)

DAG_ID = "bench_noop"
# The scheduler logs this when an executor event contradicts the database ("killed externally").
MISMATCH = "but the task instance's state attribute is"
FAILED = ("failed", "up_for_retry", "upstream_failed")


@dataclass(frozen=True)
class Size:
    tasks: int
    parallelism: int
    api_workers: int  # [api] workers, Airflow's default
    timeout: float


# The case is its load: quick and full are the same size (smoke only proves the harness works).
SIZES = {
    "smoke": Size(tasks=4, parallelism=4, api_workers=1, timeout=120),
    "quick": Size(tasks=200, parallelism=32, api_workers=1, timeout=900),
    "full": Size(tasks=200, parallelism=32, api_workers=1, timeout=900),
}


def cases(profile: str) -> list[Case]:
    size = SIZES[profile]
    config = asdict(size)
    return [
        Case(
            "ordinary",
            f"{size.tasks}-noop-p{size.parallelism}-api-defaults",
            config,
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
        airflow_env={"AIRFLOW__API__WORKERS": str(size.api_workers)},
        progress=ctx.progress,
        keep_home=ctx.keep_home,
    ) as dep:
        sb = dep.sandbox
        wait_parsed(dep, DAG_ID)
        info = dep.executor_info()
        applied = airflow_config(sb)
        done = trigger_and_wait(dep, DAG_ID, size.timeout, roles=True)
        mismatches = sb.process_logs["scheduler"].read_text(errors="replace").count(MISMATCH)
    rows, state, problem, heartbeats = done.rows, done.state, done.problem, done.heartbeats
    # Final states: a task that succeeded and was then failed by the scheduler counts as failed.
    succeeded = sum(1 for r in rows if r.state == "success")
    failed = sum(1 for r in rows if r.state in FAILED)
    metrics = {
        "tasks_succeeded": float(succeeded),
        "tasks_failed": float(failed),
        "tasks_lost": float(len(rows) - succeeded - failed),
        "state_mismatches": float(mismatches),
        "makespan_s": done.makespan_s,
        "run_duration_s": done.run_duration_s,
        "tries": float(sum(r.try_number for r in rows)),
        **loop_figures(heartbeats, done.loop),
        **cpu_figures(done.cpu_before, done.cpu_after, len(rows)),
        **roles_figures(done.roles, len(rows)),
    }
    status = run_status(state == "success" and succeeded == size.tasks, state, problem)
    notes = [problem] if problem else []
    notes += roles_notes(done.roles)
    if failed:
        notes.append(
            f"{failed} of {len(rows)} task instances ended failed; {mismatches} state mismatch line(s)"
        )
    return Outcome(
        metrics,
        {"heartbeat_ms": [d * 1000 for d in heartbeats.durations], "airflow_config": applied},
        status,
        notes,
        info=info,
        text={"run_state": state or "none"},
    )
