"""Chaos: the restart chaos test at full size, on PostgreSQL; how many sequences keep every invariant.

The sequences, the DAG and the invariants are the end-to-end test's (``tests/e2e/chaos.py``,
``tests/e2e/dags/chaos.py``): each sequence is one DAG run of ``chaos`` whose tasks decide their own end
(succeed, fail on purpose, or run past a limit), played while seeded steps stop, crash and restart the
scheduler (SIGTERM, SIGKILL, gaps none, under and over ``handover_timeout``), run a second scheduler beside
it, and retry an adoption. Full size: 20 sequences of 100 tasks (every other one; the rest 63) at a
parallelism 16 over the host's crowd threshold (64 on 2 cores), 4 steps each; ``ALE_CHAOS_SEQUENCES``,
``ALE_CHAOS_TASKS``, ``ALE_CHAOS_PARALLELISM``, ``ALE_CHAOS_STEPS`` and ``ALE_CHAOS_SEED`` change it.

Only this executor hands tasks over: the stock variant's run is recorded as ``n/a`` without a deployment.
Full profile only: a sequence takes minutes.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Final

from benchmarks import timed_executor
from benchmarks.deployment import OURS, deployment
from benchmarks.scenarios.base import Case, Figures, Outcome, RunContext, wait_parsed
from tests.e2e import chaos

DATABASE: Final[str] = "postgres"
# At most this many violation lines go into a record's notes (every one is in the progress output).
NOTES: Final[int] = 40


def cases(profile: str) -> list[Case]:
    if profile != "full":
        return []
    size = chaos.full_size()
    return [
        Case(
            "chaos",
            f"{size.sequences}x{size.tasks}-p{size.parallelism}",
            asdict(size),
            functools.partial(run, size),
            database=DATABASE,
        )
    ]


def figures(result: chaos.Result) -> Figures:
    observed = result.observed
    per_task = list(chaos.executions_per_task(result))
    return {
        "sequences": float(len(observed)),
        "sequences_failed": float(result.failed),
        "violations": float(sum(len(found) for found in result.violations)),
        "seconds_per_sequence": result.seconds_per_sequence(),
        "executions": float(sum(per_task)),
        "task_instances_run_twice": float(sum(1 for n in per_task if n > 1)),
        "gaps_over_handover_timeout": float(
            sum(1 for o in observed for gap in o.gaps if gap.seconds > result.size.handover_timeout)
        ),
        "crowded_sequences": float(sum(1 for o in observed if o.crowded)),
        "peak_running": float(max((o.peak for o in observed), default=0)),
        "sigterm_exit_max_s": max((x for o in observed for x in o.exits), default=None),
    }


def run(size: chaos.Size, ctx: RunContext) -> Outcome:
    if ctx.variant.executor != OURS:
        return Outcome(
            dict.fromkeys(figures(chaos.Result(0, size)), None),
            status="n/a",
            notes=["the chaos case is this executor's: the stock LocalExecutor hands no task over"],
            text={"seed": "none"},
        )
    folder = Path(tempfile.mkdtemp(prefix="ale-bench-chaos-"))
    chosen = chaos.seed()
    report = ctx.progress or chaos.say
    try:
        with deployment(
            ctx.variant,
            airflow_cfg=ctx.airflow_cfg,
            parallelism=size.parallelism,
            database=ctx.database,
            dag_env={chaos.DIR_ENV: str(folder)},
            # The injected executor (a retried adoption) extends the timed one, which extends the variant's.
            airflow_env=size.config(base=timed_executor.CLASS_PATH),
            dags_folder=chaos.DAGS,
            progress=ctx.progress,
            keep_home=ctx.keep_home,
        ) as dep:
            wait_parsed(dep, chaos.DAG_ID)
            info = dep.executor_info()
            result = chaos.run(dep.sandbox, size, chosen, folder, report)
    finally:
        if ctx.keep_home:
            report(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    found = [
        f"sequence {o.sequence.index}: {line}"
        for o, lines in zip(result.observed, result.violations, strict=True)
        for line in lines
    ]
    notes = [f"seed {chosen} (replay with {chaos.SEED_ENV}={chosen})", *found[:NOTES]]
    if len(found) > NOTES:
        notes.append(f"... and {len(found) - NOTES} more")
    per = result.seconds_per_sequence()
    if per is not None:
        report(f"chaos: {per:.0f}s per sequence (median)")
    status = "ok" if not result.failed else "invariants broken"
    return Outcome(figures(result), {}, status, notes, info=info, text={"seed": str(chosen)})
