"""Runs inside a child process: drives one executor the way the scheduler does and records heartbeat().

``python -m benchmarks.scenarios.dispatch_driver --executor PATH --workloads K --parallelism P
--window SECONDS --block-limit SECONDS --out FILE``

Queues K real ``ExecuteTask`` workloads (on Airflow 2, K ``airflow tasks run`` commands), then calls
``heartbeat()`` and ``get_event_buffer()`` in a loop for ``window`` seconds. The workers' task SDK
supervisors talk to an execution API address (on Airflow 2, the task's CLI to a metadata database
address) set by the parent, which accepts connections and never answers, so every started workload
blocks, as a long-running task does: this is the realistic case in which the stock executor's activity
pipe fills.
A watchdog thread writes ``blocked`` and ends the process when one heartbeat() call runs longer than
``block-limit``; the parent also has a hard timeout. Output lines in FILE:

    hb <seconds> <dispatched>      one per completed heartbeat()
    blocked <dispatched> <seconds> a heartbeat() that did not return
    done <dispatched>
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import types
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import IO, Any

AIRFLOW2 = int(version("apache-airflow").split(".", 1)[0]) < 3


def workload(index: int) -> Any:
    """An Airflow 3 task workload as the scheduler builds one, minus the database row."""
    from airflow.executors.workloads import BundleInfo, ExecuteTask, TaskInstanceDTO

    ti = TaskInstanceDTO(
        id=uuid.uuid4(),
        task_id="sleep",
        dag_id="bench_dispatch",
        run_id="manual__1",
        try_number=1,
        dag_version_id=uuid.uuid4(),
        map_index=index,
        pool_slots=1,
        priority_weight=1,
    )
    return ExecuteTask(
        ti=ti,
        dag_rel_path=Path("bench_dags.py"),
        token="bench-token",  # noqa: S106 - nothing checks it: the API never answers
        log_path=None,
        bundle_info=BundleInfo(name="dags-folder"),
    )


class _TaskInstance:
    """What an Airflow 2 executor reads of a queued TaskInstance (a database row needs a database)."""

    def __init__(self, index: int) -> None:
        from airflow.models.taskinstancekey import TaskInstanceKey

        self.key = TaskInstanceKey("bench_dispatch", "sleep", "manual__1", 1, index)
        self.executor_config: dict[str, Any] = {}
        self.dag_run = types.SimpleNamespace(start_date=None)  # no trace for the stock base class


def _queue(executor: Any, index: int) -> None:
    if not AIRFLOW2:
        executor.queue_workload(workload(index), session=None)
        return
    ti = _TaskInstance(index)
    command = [
        "airflow",
        "tasks",
        "run",
        "bench_dispatch",
        "sleep",
        "manual__1",
        "--local",
        "--map-index",
        str(index),
    ]
    executor.queue_command(ti, command, priority=1, queue="default")


def _watchdog(executor: Any, total: int, limit: float, state: dict[str, float], out: IO[str]) -> None:
    while True:
        time.sleep(0.1)
        began = state.get("in_heartbeat_since")
        if began is not None and time.perf_counter() - began > limit:
            # The main thread is stuck in a pipe write (which released the GIL): report and leave.
            dispatched = total - len(executor.queued_tasks)
            out.write(f"blocked {dispatched} {time.perf_counter() - began:.6f}\n")
            out.flush()
            os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executor", required=True)
    parser.add_argument("--workloads", type=int, required=True)
    parser.add_argument("--parallelism", type=int, required=True)
    parser.add_argument("--window", type=float, required=True)
    parser.add_argument("--block-limit", type=float, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from benchmarks.timed_executor import resolve

    executor = resolve(args.executor)(parallelism=args.parallelism)
    out = open(args.out, "a", buffering=1)  # noqa: SIM115 - os._exit ends the process, not a with block
    state: dict[str, float] = {}
    threading.Thread(
        target=_watchdog, args=(executor, args.workloads, args.block_limit, state, out), daemon=True
    ).start()
    executor.start()
    for index in range(args.workloads):
        _queue(executor, index)
    deadline = time.monotonic() + args.window
    while time.monotonic() < deadline:
        state["in_heartbeat_since"] = began = time.perf_counter()
        executor.heartbeat()
        elapsed = time.perf_counter() - began
        state.pop("in_heartbeat_since", None)
        out.write(f"hb {elapsed:.6f} {args.workloads - len(executor.queued_tasks)}\n")
        executor.get_event_buffer()
        time.sleep(0.05)  # a busy scheduler loop's pacing between heartbeats
    out.write(f"done {args.workloads - len(executor.queued_tasks)}\n")
    out.flush()
    # Workers block on purpose; end() would wait for them. The parent kills the whole tree.
    os._exit(0)


if __name__ == "__main__":
    main()
