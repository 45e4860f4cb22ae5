"""Tasks held at a gate, each recording its executions: live control's pause, resize and drain.

Each execution writes ``<dir>/hold<i>.try<N>.pid<P>.start`` when it begins and the matching ``.end`` once
the gate file ``<dir>/gate`` appears, so a test counts how many run at once and whether any ran twice.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from airflow.sdk import dag, get_current_context, task

TASKS = 12


@dag(dag_id="control", schedule=None, catchup=False, max_active_tasks=TASKS, tags=["e2e"])
def control() -> None:
    @task
    def hold(i: int) -> int:
        folder = Path(os.environ["ALE_CONTROL_DIR"])
        ti = get_current_context()["ti"]
        mark = f"hold{i}.try{ti.try_number}.pid{os.getpid()}"
        (folder / f"{mark}.start").write_text("")
        while not (folder / "gate").exists():  # a file the test creates; no clock decides anything
            time.sleep(0.2)
        (folder / f"{mark}.end").write_text("")
        return i

    hold.expand(i=list(range(TASKS)))


control()
