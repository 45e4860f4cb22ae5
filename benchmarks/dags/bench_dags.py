"""DAGs the benchmark suite triggers. Sizes come from environment variables of the sandbox.

The counts are read at parse time, so the dag-processor and the task processes (which parse this file
again) agree; each benchmark run has a fresh deployment with its own values. No task retries (stated, not
left to ``[core] default_task_retries``): a task the scheduler fails stays failed and is counted as such.
"""

from __future__ import annotations

import os
import time
from datetime import datetime

try:
    from airflow.sdk import dag, task
except ImportError:  # Airflow 2
    from airflow.decorators import dag, task  # type: ignore[no-redef,attr-defined,unused-ignore]

START = datetime(2024, 1, 1)

TASKS = int(os.environ.get("ALE_BENCH_TASKS", "200"))
SLEEP = float(os.environ.get("ALE_BENCH_SLEEP", "20"))
# Spreads sleep lengths over the map indexes so tasks finish at different times (0: all sleep SLEEP).
SLEEP_SPREAD = float(os.environ.get("ALE_BENCH_SLEEP_SPREAD", "0"))


@dag(
    dag_id="bench_noop", schedule=None, start_date=START, catchup=False, max_active_runs=1, tags=["benchmark"]
)
def bench_noop() -> None:
    @task(do_xcom_push=False, retries=0)
    def noop(i: int) -> None:
        return None

    noop.expand(i=list(range(TASKS)))


@dag(
    dag_id="bench_sleep",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=1,
    tags=["benchmark"],
)
def bench_sleep() -> None:
    @task(do_xcom_push=False, retries=0)
    def sleep(i: int) -> None:
        time.sleep(SLEEP + SLEEP_SPREAD * (i % 10) / 9)

    sleep.expand(i=list(range(TASKS)))


bench_noop()
bench_sleep()
