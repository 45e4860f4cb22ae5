"""``python -m harness.demo``: run the example DAG on a real, throwaway Airflow.

Starts an api-server, a scheduler and a dag-processor (SQLite in a temporary AIRFLOW_HOME) with this
executor, triggers ``async_local_executor_demo``, prints every task instance with its state and
timings, stops everything, and exits 0 only when every task ended as the DAG says it should.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from harness.sandbox import AirflowSandbox, TaskInstanceRow

EXECUTOR = "async_local_executor.AsyncLocalExecutor"
DAG_ID = "async_local_executor_demo"
MAPPED_COUNT = 24
# What example_dags/demo_dag.py promises for one manual run: (state, try_number) per task.
EXPECTED: dict[str, tuple[str, int]] = {
    "push_value": ("success", 1),
    "check_value": ("success", 1),  # pulled push_value's XCom and asserted it
    "make_items": ("success", 1),
    "square": ("success", 1),  # the run's ``mapped`` param's count of mapped instances
    "sum_squares": ("success", 1),  # asserted the sum of the mapped results
    "always_fails": ("failed", 1),
    "flaky": ("success", 2),  # failed its first try, succeeded on the retry
    "wait_for_deadline": ("success", 1),  # kept the run alive until the deadline callback ran
    "finish": ("success", 1),
}


def expected_state(task_id: str) -> str:
    return EXPECTED.get(task_id, ("?", 0))[0]


def unexpected(rows: Sequence[TaskInstanceRow], mapped: int = MAPPED_COUNT) -> list[str]:
    """Every way the run's task instances differ from :data:`EXPECTED`; empty when all is as promised.

    :param mapped: the run's ``mapped`` param: how many ``square`` instances it has
    """
    problems = []
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.task_id] = counts.get(row.task_id, 0) + 1
        state, tries = EXPECTED.get(row.task_id, ("?", 0))
        if (row.state, row.try_number) != (state, tries):
            problems.append(
                f"{row.task_id}[{row.map_index}]: {row.state} try {row.try_number}, expected {state} try {tries}"
            )
    wanted = {task_id: (mapped if task_id == "square" else 1) for task_id in EXPECTED}
    if counts != wanted:
        problems.append(f"task instance counts {counts}, expected {wanted}")
    return problems


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def render(rows: Sequence[TaskInstanceRow]) -> str:
    header = ("task", "map", "state", "expected", "try", "queued→start s", "run s")
    lines = [header]
    for row in sorted(rows, key=lambda r: (r.task_id, r.map_index)):
        wait = None
        if row.queued_dttm and row.start_date:
            wait = (row.start_date - row.queued_dttm).total_seconds()
        lines.append(
            (
                row.task_id,
                "" if row.map_index < 0 else str(row.map_index),
                row.state or "none",
                expected_state(row.task_id),
                str(row.try_number),
                _seconds(wait),
                _seconds(row.duration),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) for line in lines]
    out.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.demo", description=__doc__)
    parser.add_argument("--database", default="sqlite", help="sqlite (default) or postgres")
    parser.add_argument("--parallelism", type=int, default=8)
    parser.add_argument(
        "--mapped", type=int, default=MAPPED_COUNT, help=f"square's mapped instances (default {MAPPED_COUNT})"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the run")
    args = parser.parse_args(argv)

    started = time.monotonic()
    with AirflowSandbox(executor=EXECUTOR, database=args.database, parallelism=args.parallelism) as sandbox:
        sandbox.wait_for_dag(DAG_ID)
        run_id = sandbox.trigger(DAG_ID, {"mapped": args.mapped})
        print(f"[demo] triggered {DAG_ID} run {run_id}; waiting for it to finish", flush=True)
        state = sandbox.wait_for_run(DAG_ID, run_id, timeout=args.timeout)
        rows = sandbox.task_instances(DAG_ID, run_id)
        print()
        print(render(rows))
        print()
        problems = unexpected(rows, args.mapped)
        if state != "success":
            problems.append(f"run ended {state}, expected success")
        print(f"[demo] run {run_id}: {state}; {len(rows)} task instances; executor {EXECUTOR}")
    print(f"[demo] everything stopped; {time.monotonic() - started:.0f}s in all")
    for problem in problems:
        print(f"[demo] unexpected: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
