"""Tasks that sleep long enough to be caught running when the scheduler is killed."""

from __future__ import annotations

import time
from datetime import timedelta

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import dag, task


@dag(dag_id="sleepers", schedule=None, catchup=False, tags=["e2e"])
def sleepers() -> None:
    @task(retries=1, retry_delay=timedelta(seconds=0))
    def sleep(i: int) -> int:
        time.sleep(25)
        return i

    sleep.expand(i=[0, 1, 2])
    # Airflow runs a BashOperator's shell in a session of its own, out of reach of the parent-death
    # chain: its first try outlives a killed scheduler until the next one starts. The retry is quick.
    BashOperator(
        task_id="shell",
        bash_command="{{ 'sleep 600' if ti.try_number == 1 else 'true' }}",
        retries=1,
        retry_delay=timedelta(seconds=0),
    )


sleepers()
