"""Airflow 2 tasks for the scheduler lifecycle tests: one that ignores SIGTERM, ones held at a gate."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime, timedelta
from pathlib import Path

from airflow import DAG
from airflow.decorators import task
from airflow.operators.bash import BashOperator

GATE_DIR = Path(os.environ.get("ALE_GATE_DIR", "/nonexistent"))
START = datetime(2024, 1, 1)

with DAG("stubborn2", start_date=START, schedule=None, catchup=False) as stubborn2:

    @task
    def ignore_sigterm() -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)

    ignore_sigterm()

with DAG("sleepers2", start_date=START, schedule=None, catchup=False) as sleepers2:

    @task(retries=1, retry_delay=timedelta(seconds=0))
    def sleep(i: int) -> int:
        time.sleep(25)
        return i

    sleep.expand(i=[0, 1])
    # Its shell runs in a session of its own: only a restarted scheduler's reclaim reaches it.
    BashOperator(
        task_id="shell",
        bash_command="{{ 'sleep 600' if ti.try_number == 1 else 'true' }}",
        retries=1,
        retry_delay=timedelta(seconds=0),
    )

with DAG("gated2", start_date=START, schedule=None, catchup=False, max_active_tasks=16) as gated2:

    @task
    def hold(i: int) -> int:
        (GATE_DIR / f"started.{i}.{os.getpid()}").touch()
        while not (GATE_DIR / "gate").exists():
            time.sleep(0.2)  # the task's own work: waiting for the test to open the gate
        return i

    hold.expand(i=[0, 1])
