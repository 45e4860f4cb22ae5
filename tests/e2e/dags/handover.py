"""Tasks that run until the test opens a gate, recording each execution: caught running by a restart.

Each execution writes ``<dir>/<task>.try<N>.pid<P>.start`` when it begins and the matching ``.end`` once
the gate file ``<dir>/gate`` appears, so a test counts executions and sees which one ran to its end,
whatever Airflow's database says about them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from airflow.sdk import dag, get_current_context, task

TASKS = 2


@dag(dag_id="handover", schedule=None, catchup=False, max_active_tasks=TASKS, tags=["e2e"])
def handover() -> None:
    @task(retries=1)
    def hold(i: int) -> int:
        folder = Path(os.environ["ALE_HANDOVER_DIR"])
        ti = get_current_context()["ti"]
        mark = f"hold{i}.try{ti.try_number}.pid{os.getpid()}"
        (folder / f"{mark}.start").write_text("")
        while not (folder / "gate").exists():  # a file the test creates; no clock decides anything
            time.sleep(0.2)
        (folder / f"{mark}.end").write_text("")
        return i

    hold.expand(i=list(range(TASKS)))


handover()
