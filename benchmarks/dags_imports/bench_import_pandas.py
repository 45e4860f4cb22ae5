"""``bench_noop`` with one line added at its top, ``import pandas``: the imports scenario's first DAG.

Real DAG files import libraries at their top, so every task process that parses the file pays for the
import before its task runs. This folder is the DAG folder of the imports scenario only: the other
scenarios' dag-processors never parse pandas. Same sizes (``ALE_BENCH_TASKS``), the same tasks
(each only prints its own process's private memory for the benchmark to read, then sleeps
``ALE_BENCH_HOLD_S`` seconds, 0 but in the held case), no retries, no XCom.
"""

from __future__ import annotations

import os
import time
from datetime import datetime

import pandas  # type: ignore[import-untyped,unused-ignore]  # noqa: F401 - the line added

try:
    from airflow.sdk import dag, task
except ImportError:  # Airflow 2
    from airflow.decorators import dag, task  # type: ignore[no-redef,attr-defined,unused-ignore]

START = datetime(2024, 1, 1)

TASKS = int(os.environ.get("ALE_BENCH_TASKS", "200"))


def report_private_memory() -> None:
    """Print this process's private memory (USS, KiB): the benchmark reads the line from the task log."""
    with open("/proc/self/smaps_rollup") as f:
        kib = sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean", "Private_Dirty")))
    print(f"ale-bench-task-uss-kib={kib}")


@dag(
    dag_id="bench_import_pandas",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=1,
    tags=["benchmark"],
)
def bench_import_pandas() -> None:
    @task(do_xcom_push=False, retries=0)
    def noop(i: int) -> None:
        report_private_memory()
        # Only in the benchmark's held case: the task stays running, so memory is seen in a steady state.
        time.sleep(float(os.environ.get("ALE_BENCH_HOLD_S", "0")))

    noop.expand(i=list(range(TASKS)))


bench_import_pandas()
