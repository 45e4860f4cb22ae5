"""Tasks held at a gate that say what descriptor limit they run with: many at once, so a scheduler with
a low ``RLIMIT_NOFILE`` runs out of room to launch them all.

The test sets the folder and the number of tasks (read at parse time, so the dag-processor and the task
processes agree). Each task writes ``started.<i>`` (its pid and its ``RLIMIT_NOFILE``, as JSON) in the
folder, then waits for the file ``gate`` there.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

from airflow.sdk import dag, task

FOLDER = Path(os.environ.get("ALE_DESCRIPTORS_DIR", "/nonexistent"))
TASKS = int(os.environ.get("ALE_DESCRIPTORS_TASKS", "4"))


@dag(dag_id="descriptor_table", schedule=None, catchup=False, max_active_tasks=TASKS, tags=["e2e"])
def descriptor_table() -> None:
    @task(retries=0, do_xcom_push=False)
    def hold(i: int) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        mark = {"pid": os.getpid(), "nofile": [soft, hard]}
        (FOLDER / f"started.{i}.tmp").write_text(json.dumps(mark))
        (FOLDER / f"started.{i}.tmp").rename(FOLDER / f"started.{i}")
        while not (FOLDER / "gate").exists():
            time.sleep(0.2)  # the task's own work: waiting for the test to open the gate

    hold.expand(i=list(range(TASKS)))


descriptor_table()
