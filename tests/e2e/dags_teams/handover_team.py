"""One team's DAG: tasks that run until the test opens a gate, recording each execution.

The test copies this file into each team's DAG bundle folder, named after the team; the DAG is
``handover_<team>``, so every team has one of its own from the same file. Each execution writes
``<dir>/<team>.hold<i>.try<N>.pid<P>.start`` when it begins and the matching ``.end`` once the gate
file ``<dir>/gate`` appears, so a test counts executions per team from the tasks themselves.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from airflow.sdk import dag, get_current_context, task

TASKS = 2
# The bundle's folder names the team; the task process runs this same file from it.
TEAM = Path(__file__).resolve().parent.name


@dag(dag_id=f"handover_{TEAM}", schedule=None, catchup=False, max_active_tasks=TASKS, tags=["e2e"])
def handover_team() -> None:
    @task(retries=1)
    def hold(i: int) -> int:
        folder = Path(os.environ["ALE_HANDOVER_DIR"])
        ti = get_current_context()["ti"]
        mark = f"{TEAM}.hold{i}.try{ti.try_number}.pid{os.getpid()}"
        (folder / f"{mark}.start").write_text("")
        while not (folder / "gate").exists():  # a file the test creates; no clock decides anything
            time.sleep(0.2)
        (folder / f"{mark}.end").write_text("")
        return i

    hold.expand(i=list(range(TASKS)))


handover_team()
