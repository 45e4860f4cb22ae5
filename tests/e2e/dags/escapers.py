"""Tasks that leave processes behind which no process group, session or environment marker ties to them.

``detach`` starts ``sleep 600`` in a session of its own with an empty environment and returns (upstream
#23520's escape); ``shell`` is a BashOperator with ``env={...}`` (so, with the default
``append_env=False``, no marker reaches its shell, which Airflow runs in a session of its own) that
backgrounds a ``sleep 600``. Each writes its sleeper's pid to ``$ALE_ESCAPERS_DIR`` as
``<task>.<try>.<pid>``; on its first try, with ``ALE_ESCAPERS_HOLD=1``, it then waits for
``$ALE_ESCAPERS_DIR/gate``.
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import timedelta
from pathlib import Path

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import dag, get_current_context, task

FOLDER = os.environ.get("ALE_ESCAPERS_DIR", "/tmp/ale-escapers")
HOLD = os.environ.get("ALE_ESCAPERS_HOLD", "0")
RETRY_DELAY = timedelta(seconds=0)


@dag(dag_id="escapers", schedule=None, catchup=False, tags=["e2e"])
def escapers() -> None:
    @task(retries=1, retry_delay=RETRY_DELAY)
    def detach() -> None:
        sleeper = subprocess.Popen(
            ["sleep", "600"],
            start_new_session=True,
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try_number = get_current_context()["ti"].try_number
        Path(FOLDER, f"detach.{try_number}.{sleeper.pid}").touch()
        while HOLD == "1" and try_number == 1 and not Path(FOLDER, "gate").exists():
            time.sleep(0.2)  # the test's gate: polled, as a task has no other way to hear of it

    detach()
    BashOperator(
        task_id="shell",
        bash_command=(
            'sleep 600 >/dev/null 2>&1 & touch "$DIR/shell.$TRY.$!"; '
            'while [ "$HOLD$TRY" = "11" ] && [ ! -f "$DIR/gate" ]; do sleep 0.2; done'
        ),
        env={"DIR": FOLDER, "HOLD": HOLD, "TRY": "{{ ti.try_number }}"},
        retries=1,
        retry_delay=RETRY_DELAY,
    )


escapers()
