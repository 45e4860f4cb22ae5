"""A DAG file as real ones are written: pandas and numpy at its top, one more library inside the task.

The task imports matplotlib in its body, which no Airflow task process imports by itself: that import
happens only when the task runs, never when the file is parsed. The task reads the library's version so
the import is used, then prints its own process's private memory for the benchmark to read. Sizes come from ``ALE_BENCH_TASKS``; no retries, no XCom.
"""

from __future__ import annotations

import os
from datetime import datetime

import numpy as np
import pandas as pd  # type: ignore[import-untyped,unused-ignore]

try:
    from airflow.sdk import dag, task
except ImportError:  # Airflow 2
    from airflow.decorators import dag, task  # type: ignore[no-redef,attr-defined,unused-ignore]

START = datetime(2024, 1, 1)

TASKS = int(os.environ.get("ALE_BENCH_TASKS", "200"))
# The map indexes through both libraries, as a DAG file that builds its work list with them would.
INDEXES: list[int] = pd.Series(np.arange(TASKS)).tolist()


def report_private_memory() -> None:
    """Print this process's private memory (USS, KiB): the benchmark reads the line from the task log."""
    with open("/proc/self/smaps_rollup") as f:
        kib = sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean", "Private_Dirty")))
    print(f"ale-bench-task-uss-kib={kib}")


@dag(
    dag_id="bench_real_imports",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=1,
    tags=["benchmark"],
)
def bench_real_imports() -> None:
    @task(do_xcom_push=False, retries=0)
    def plot_version(i: int) -> None:
        import matplotlib  # at run time only, like an import a task makes for its own work

        if not matplotlib.__version__:
            raise RuntimeError("matplotlib has no version")
        report_private_memory()

    plot_version.expand(i=INDEXES)


bench_real_imports()
