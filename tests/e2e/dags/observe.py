"""Tasks that report what they observe of their own process: what a task's code could depend on.

A no-op task observes nothing; these return, as their XCom, facts about the process they ran in, so a
test can compare them with what Airflow itself configures.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.sdk import dag, task

TASKS = 4


@dag(dag_id="observe", schedule=None, catchup=False, max_active_tasks=TASKS, tags=["e2e"])
def observe() -> None:
    @task
    def look(i: int) -> dict[str, Any]:
        # The timeout the task SDK's client of this process uses for its calls to the api-server (the
        # supervisor's client, in the process this one was forked from, read the same way).
        from airflow.sdk.api import client

        return {
            "i": i,
            "pid": os.getpid(),
            "api_timeout": client.API_TIMEOUT,
            "api_timeout_env": os.environ.get("AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"),
        }

    look.expand(i=list(range(TASKS)))


observe()
