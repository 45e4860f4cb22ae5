"""An Airflow 2 task that outruns the executor's run-time limit (``task_timeout``), caught by a restart.

Its one execution writes ``<dir>/overrun.try<N>.pid<P>.start`` when it begins, then waits for the gate file
``<dir>/gate``, which the test never creates: only the executor's limit ends it. It is not retried, so a
second execution would be a bug, not a retry. ``<dir>`` is ``$ALE_HANDOVER_DIR``; ``P`` is the task's own
process (the one ``airflow tasks run --local`` forked to run it).
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

from airflow import DAG
from airflow.decorators import task
from airflow.operators.python import get_current_context

with DAG(
    "handover_overrun2", start_date=datetime(2024, 1, 1), schedule=None, catchup=False
) as handover_overrun2:

    @task(retries=0)
    def overrun() -> None:
        folder = Path(os.environ["ALE_HANDOVER_DIR"])
        ti = get_current_context()["ti"]
        # Built as a string: Path.with_suffix would take ".pid<P>" for a suffix and cut it off.
        mark = f"overrun.try{ti.try_number}.pid{os.getpid()}"
        (folder / f"{mark}.start").write_text("")
        while not (folder / "gate").exists():  # never created: the executor's limit ends this
            time.sleep(0.2)
        (folder / f"{mark}.end").write_text("")

    overrun()
