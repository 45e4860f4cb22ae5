"""An Airflow 2 DAG with what a deployment's DAGs do: mapped tasks, a failure, a retry, a shell command."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from airflow import DAG
from airflow.decorators import task
from airflow.operators.bash import BashOperator

with DAG("demo2", start_date=datetime(2024, 1, 1), schedule=None, catchup=False, tags=["e2e"]) as dag:

    @task
    def sleep(i: int) -> int:
        time.sleep(2)
        return i

    @task(trigger_rule="all_done")
    def total(values: list[int]) -> int:
        return sum(values)

    @task
    def fail() -> None:
        raise RuntimeError("fails on purpose")

    @task(retries=1, retry_delay=timedelta(seconds=0))
    def flaky(ti=None) -> str:  # type: ignore[no-untyped-def]
        if ti.try_number == 1:
            raise RuntimeError("first try fails on purpose")
        return "second try"

    @task(executor_config={"async_local_executor": {"task_timeout": "soon"}})
    def bad_config() -> None:
        raise AssertionError("never launched")

    total(sleep.expand(i=[1, 2, 3, 4, 5, 6]))
    fail()
    flaky()
    bad_config()
    BashOperator(task_id="shell", bash_command="echo from the shell")
