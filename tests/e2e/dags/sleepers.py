"""Tasks that sleep long enough to be caught running when the scheduler is killed."""

from __future__ import annotations

import time
from datetime import timedelta

from airflow.sdk import dag, task


@dag(dag_id="sleepers", schedule=None, catchup=False, tags=["e2e"])
def sleepers() -> None:
    @task(retries=1, retry_delay=timedelta(seconds=0))
    def sleep(i: int) -> int:
        time.sleep(25)
        return i

    sleep.expand(i=[0, 1, 2])


sleepers()
