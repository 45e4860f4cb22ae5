"""A task that outruns the executor's run-time limit (``task_timeout``), caught running by a restart.

Its one execution writes ``<dir>/overrun.try<N>.pid<P>.start`` when it begins, then waits for the gate file
``<dir>/gate``, which the test never creates: only the executor's limit ends it. It is not retried, so a
second execution would be a bug, not a retry.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from airflow.sdk import dag, get_current_context, task


@dag(dag_id="handover_overrun", schedule=None, catchup=False, tags=["e2e"])
def handover_overrun() -> None:
    @task(retries=0)
    def overrun() -> None:
        folder = Path(os.environ["ALE_HANDOVER_DIR"])
        ti = get_current_context()["ti"]
        mark = f"overrun.try{ti.try_number}.pid{os.getpid()}"
        (folder / f"{mark}.start").write_text("")
        while not (folder / "gate").exists():  # never created: the executor's limit ends this
            time.sleep(0.2)
        (folder / f"{mark}.end").write_text("")

    overrun()


handover_overrun()
