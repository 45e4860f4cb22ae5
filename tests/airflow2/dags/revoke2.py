"""Airflow 2 tasks whose DAG file is slow to import in the task's own workload: their try stays queued.

While ``<dir>/hold-import`` exists, importing this file waits in any process an executor launched (it
carries the executor's instance mark, ``ASYNC_LOCAL_EXECUTOR_INSTANCE``), as a DAG file that calls a slow
service at import does. ``airflow tasks run`` imports it before it marks the try running, so the try
stays ``queued`` with its workload running. The scheduler's own parsing and the CLI never wait. Each
execution then records itself as handover2.py's do (``<dir>`` is ``$ALE_HANDOVER_DIR``).
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

from airflow import DAG
from airflow.decorators import task
from airflow.operators.python import get_current_context

TASKS = 2
_FOLDER = os.environ.get("ALE_HANDOVER_DIR")

if _FOLDER and os.environ.get("ASYNC_LOCAL_EXECUTOR_INSTANCE"):
    while (Path(_FOLDER) / "hold-import").exists():  # a file the test removes; no clock decides anything
        time.sleep(0.2)

with DAG(
    "revoke2", start_date=datetime(2024, 1, 1), schedule=None, catchup=False, max_active_tasks=TASKS
) as revoke2:

    @task(retries=0)
    def hold(i: int) -> int:
        folder = Path(os.environ["ALE_HANDOVER_DIR"])
        ti = get_current_context()["ti"]
        mark = f"hold{i}.try{ti.try_number}.pid{os.getpid()}"
        (folder / f"{mark}.start").write_text("")
        while not (folder / "gate").exists():
            time.sleep(0.2)
        (folder / f"{mark}.end").write_text("")
        return i

    hold.expand(i=list(range(TASKS)))
