"""Airflow 2 tasks that run until the test opens a gate, recording each execution: caught by a restart.

Each execution writes ``<dir>/hold<i>.try<N>.pid<P>.start`` when it begins and the matching ``.end`` once
the gate file ``<dir>/gate`` appears, so a test counts executions and sees which one ran to its end,
whatever Airflow's database says about them. ``<dir>`` is ``$ALE_HANDOVER_DIR``; ``P`` is the task's
own process (the one ``airflow tasks run --local`` forked to run it).
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

with DAG(
    "handover2", start_date=datetime(2024, 1, 1), schedule=None, catchup=False, max_active_tasks=TASKS
) as handover2:

    @task(retries=1)
    def hold(i: int) -> int:
        folder = Path(os.environ["ALE_HANDOVER_DIR"])
        ti = get_current_context()["ti"]
        # Built as a string: Path.with_suffix would take ".pid<P>" for a suffix and cut it off.
        mark = f"hold{i}.try{ti.try_number}.pid{os.getpid()}"
        (folder / f"{mark}.start").write_text("")
        while not (folder / "gate").exists():  # a file the test creates; no clock decides anything
            time.sleep(0.2)
        (folder / f"{mark}.end").write_text("")
        return i

    hold.expand(i=list(range(TASKS)))
