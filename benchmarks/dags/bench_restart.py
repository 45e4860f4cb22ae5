"""The restart and control cases: long sleeping tasks that record every execution of theirs in a directory.

The scheduler is stopped or killed while these run and a new one started (benchmarks/scenarios/restart.py).
What happened to each task is then read from files the tasks wrote, not from Airflow's database alone:
a task instance's row holds its last try only, and a process that kept running after its try was reset
leaves no trace there. Each execution writes ``<map_index>-<try_number>-<pid>.json`` into
``ALE_BENCH_EXECUTIONS_DIR`` when it starts (its task instance's key, its process and its start time)
and writes it again with its end time when its sleep is over; an execution killed part-way never
records an end. Sizes come from the environment at parse time (see bench_dags.py); no retries, no XCom.

``bench_control`` is the same task for the control case (benchmarks/scenarios/control.py), sized by
``ALE_BENCH_CONTROL_TASKS`` and ``ALE_BENCH_CONTROL_SLEEP``: an operator pauses, drains or resizes the
executor while they run, and the files tell what started while starts were held, how many ran at once,
and whether a task instance ran twice.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

try:
    from airflow.sdk import dag, get_current_context, task
except ImportError:  # Airflow 2
    from airflow.decorators import dag, task  # type: ignore[no-redef,attr-defined,unused-ignore]
    from airflow.operators.python import (  # type: ignore[no-redef,attr-defined,unused-ignore]
        get_current_context,
    )

START = datetime(2024, 1, 1)

TASKS = int(os.environ.get("ALE_BENCH_RESTART_TASKS", "24"))
SLEEP = float(os.environ.get("ALE_BENCH_RESTART_SLEEP", "90"))
EXECUTIONS_DIR = os.environ.get("ALE_BENCH_EXECUTIONS_DIR", "")
CONTROL_TASKS = int(os.environ.get("ALE_BENCH_CONTROL_TASKS", "40"))
CONTROL_SLEEP = float(os.environ.get("ALE_BENCH_CONTROL_SLEEP", "20"))


def start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat``: with the pid, it names one process (a pid can be reused)."""
    try:
        # The command name is in parentheses and may hold spaces: count fields after the last ')'.
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def record(path: Path, execution: dict[str, Any]) -> None:
    # Atomic: the benchmark polls the directory and must never read half a file.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(execution))
    os.replace(tmp, path)


def sleep_and_record(ti: Any, seconds: float, directory: str) -> None:
    """Sleep ``seconds``, with a file in ``directory`` (if one is named) that says so, start and end."""
    pid = os.getpid()
    execution: dict[str, Any] = {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "map_index": ti.map_index,
        "try_number": ti.try_number,
        "pid": pid,
        "start_ticks": start_ticks(pid),
        "start": time.time(),
        "end": None,
    }
    path = Path(directory) / f"{ti.map_index}-{ti.try_number}-{pid}.json"
    if directory:
        record(path, execution)
    time.sleep(seconds)
    # Only a sleep that ran to its end records one: a task killed part-way (SIGKILL, or SIGTERM, which
    # the task SDK turns into an exception out of the sleep) leaves its file without.
    if directory:
        record(path, {**execution, "end": time.time()})


@dag(
    dag_id="bench_restart",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=1,
    tags=["benchmark"],
)
def bench_restart() -> None:
    @task(do_xcom_push=False, retries=0)
    def sleep(i: int) -> None:
        sleep_and_record(get_current_context()["ti"], SLEEP, EXECUTIONS_DIR)

    sleep.expand(i=list(range(TASKS)))


bench_restart()


@dag(
    dag_id="bench_control",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=1,
    max_active_tasks=512,
    tags=["benchmark"],
)
def bench_control() -> None:
    @task(do_xcom_push=False, retries=0)
    def sleep(i: int) -> None:
        sleep_and_record(get_current_context()["ti"], CONTROL_SLEEP, EXECUTIONS_DIR)

    sleep.expand(i=list(range(CONTROL_TASKS)))


bench_control()
