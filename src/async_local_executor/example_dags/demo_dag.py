"""Demo DAG exercising the executor paths that matter: mapping, failure, retry, XCom, deadline callback.

Expected final states of one manual run (deterministic):

=====================  ==========  =========  ==============================================
task_id                map_index   state      notes
=====================  ==========  =========  ==============================================
push_value             -1          success    pushes an XCom (return value)
check_value            -1          success    pulls the XCom and asserts its content
make_items             -1          success    returns ``list(range(mapped))``
square                 0..N-1      success    ``mapped`` mapped instances (the run's param)
sum_squares            -1          success    asserts the sum of the mapped results
always_fails           -1          failed     retries=0, try_number 1
flaky                  -1          success    fails on try 1, succeeds on try 2 (retries=1)
wait_for_deadline      -1          success    keeps the run alive until the deadline fired
finish                 -1          success    trigger_rule=all_done, the only leaf
=====================  ==========  =========  ==============================================

The DAG run ends in ``success`` because ``finish`` (all_done) is the only leaf task. The run's
``mapped`` param (default ``MAPPED_COUNT``) sets how many ``square`` instances it fans out to:
``airflow dags trigger async_local_executor_demo --conf '{"mapped": 200}'``.

Deadline alert: ``DAGRUN_QUEUED_AT + DEADLINE_SECONDS`` with a ``SyncCallback``. Airflow 3.3's
scheduler turns the missed deadline into a ``callback`` row of type ``executor`` and queues an
``ExecuteCallback`` workload on the executor. The callback writes
``<dir>/<run_id>.json`` where ``<dir>`` is ``$ALE_DEMO_CALLBACK_DIR`` (fallback:
``$AIRFLOW_HOME/deadline_callbacks``). ``wait_for_deadline`` polls for that file so the run cannot
finish before the deadline was missed (a run that finishes first prunes its deadline).
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param, get_current_context, task
from airflow.sdk.definitions.callback import SyncCallback
from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

DAG_ID = "async_local_executor_demo"
MAPPED_COUNT = 24
DEADLINE_SECONDS = 2
CALLBACK_DIR_ENV = "ALE_DEMO_CALLBACK_DIR"
# Upper bound only; normally the callback file shows up a few seconds after the deadline.
WAIT_FOR_DEADLINE_TIMEOUT = 90.0
XCOM_PAYLOAD = {"token": "async-local-executor", "n": 42}

log = logging.getLogger(__name__)


def callback_dir() -> Path:
    explicit = os.environ.get(CALLBACK_DIR_ENV)
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("AIRFLOW_HOME", str(Path.home() / "airflow"))) / "deadline_callbacks"


def callback_marker(run_id: str) -> Path:
    return callback_dir() / f"{run_id}.json"


def on_deadline_missed(context: dict[str, Any], message: str = "") -> None:
    """Deadline callback; runs inside an ExecuteCallback workload on the executor."""
    dag_run = context.get("dag_run") or {}
    # DAGRunResponse dumps the run id as ``dag_run_id``; accept ``run_id`` too in case that changes.
    run_id = str(dag_run.get("dag_run_id") or dag_run.get("run_id") or "unknown")
    record = {
        "message": message,
        "dag_id": dag_run.get("dag_id"),
        "run_id": run_id,
        "deadline": context.get("deadline"),
        "pid": os.getpid(),
        # Set in every process the executor launches (its crash-recovery mark): says who ran this.
        "executor_instance": os.environ.get("ASYNC_LOCAL_EXECUTOR_INSTANCE"),
        # Workloads run below the scheduler's CPU priority ([async_local_executor] workload_cpu_priority).
        "cpu_policy": os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None,
        "written_at": time.time(),
    }
    log.warning("deadline missed: %s", record)
    marker = callback_marker(run_id)
    marker.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename so a poller never reads a half-written file.
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, default=str))
    tmp.replace(marker)


with DAG(
    dag_id=DAG_ID,
    schedule=None,
    catchup=False,
    tags=["async-local-executor", "demo"],
    params={
        "mapped": Param(MAPPED_COUNT, type="integer", minimum=1, description="square's mapped instances")
    },
    deadline=DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=timedelta(seconds=DEADLINE_SECONDS),
        callback=SyncCallback(on_deadline_missed, kwargs={"message": "demo deadline missed"}),
    ),
):

    @task
    def push_value() -> dict[str, Any]:
        return XCOM_PAYLOAD

    @task
    def check_value(value: Any) -> None:  # Any: it is called with an XComArg
        assert value == XCOM_PAYLOAD, f"unexpected xcom {value!r}"

    @task
    def make_items() -> list[int]:
        return list(range(int(get_current_context()["params"]["mapped"])))

    @task
    def square(x: int) -> int:
        return x * x

    @task
    def sum_squares(values: Any) -> int:  # Any: it is called with an XComArg
        total = int(sum(values))
        expected = sum(i * i for i in range(int(get_current_context()["params"]["mapped"])))
        assert total == expected, f"sum {total} != {expected}"
        return total

    @task(retries=0)
    def always_fails() -> None:
        raise RuntimeError("always_fails fails on purpose")

    @task(retries=1, retry_delay=timedelta(seconds=1))
    def flaky() -> str:
        try_number = get_current_context()["ti"].try_number
        if try_number < 2:
            raise RuntimeError(f"flaky fails on try {try_number} on purpose")
        return f"succeeded on try {try_number}"

    @task
    def wait_for_deadline() -> bool:
        run_id = get_current_context()["run_id"]
        marker = callback_marker(run_id)
        deadline = time.monotonic() + WAIT_FOR_DEADLINE_TIMEOUT
        while time.monotonic() < deadline:
            if marker.exists():
                log.info("deadline callback marker found at %s", marker)
                return True
            time.sleep(0.25)
        # Succeed anyway: the callback is asserted separately, the task states stay deterministic.
        log.warning("deadline callback marker not seen at %s", marker)
        return False

    @task(trigger_rule="all_done")
    def finish() -> None:
        log.info("demo finished")

    pushed = push_value()
    checked = check_value(pushed)
    total = sum_squares(square.expand(x=make_items()))
    [checked, total, always_fails(), flaky(), wait_for_deadline()] >> finish()
