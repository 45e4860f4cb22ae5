"""A task that ignores SIGTERM: only the executor's escalation to SIGKILL ends it before it finishes."""

from __future__ import annotations

import signal
import time

from airflow.sdk import dag, task


@dag(dag_id="stubborn", schedule=None, catchup=False, tags=["e2e"])
def stubborn() -> None:
    @task
    def ignore_sigterm() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)

    ignore_sigterm()


stubborn()
