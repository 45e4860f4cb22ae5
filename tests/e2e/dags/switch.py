"""Tasks held at a gate, so a scheduler can be stopped with some running and some queued."""

from __future__ import annotations

import os
import time
from pathlib import Path

from airflow.sdk import dag, get_current_context, task

# The test sets the folder; each task marks that it started, then waits for the gate file. A run on a
# deployment several tests share names a folder of its own in its conf ({"folder": ...}).
FOLDER = Path(os.environ.get("ALE_SWITCH_DIR", "/nonexistent"))


@dag(dag_id="switch", schedule=None, catchup=False, max_active_tasks=16, tags=["e2e"])
def switch() -> None:
    @task
    def hold(i: int) -> int:
        folder = Path((get_current_context()["dag_run"].conf or {}).get("folder") or FOLDER)
        (folder / f"started.{os.getpid()}").touch()
        while not (folder / "gate").exists():
            time.sleep(0.2)  # the task's own work: waiting for the test to open the gate
        return i

    hold.expand(i=[0, 1, 2, 3])


switch()
