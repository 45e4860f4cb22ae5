"""A real Airflow 3.3 (api-server, scheduler, dag-processor) runs the demo DAG on AsyncLocalExecutor.

Two runs: on PostgreSQL (a fresh database on 127.0.0.1:5432) with the fork server, and on SQLite (in a
temporary AIRFLOW_HOME) with ``launcher = subprocess``, so that both databases and both launch paths run
every workload type (tasks, the deadline callback, a connection test) on a real Airflow. The tests then
read what each run left behind. Nothing is mocked. SQLite with the fork server, the laptop default, is
what most other end-to-end tests run on.

The subprocess run maps ``square`` to 4 instances (the run's ``mapped`` param) instead of 24: each of its
workloads is a fresh interpreter (about 3 s of CPU), the width changes nothing on that path, and the
24-wide map runs on the fork server's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.demo import DAG_ID, EXECUTOR, MAPPED_COUNT, unexpected
from harness.sandbox import AirflowSandbox, CallbackRow, TaskInstanceRow

pytestmark = pytest.mark.e2e

RUN_TIMEOUT = 900.0


@dataclass
class Finished:
    sandbox: AirflowSandbox
    run_id: str
    state: str
    rows: list[TaskInstanceRow]
    callbacks: list[CallbackRow]
    missing_logs: list[Path]
    xcom: object
    connection_test: tuple[str, str]
    scheduler_log: str
    mapped: int  # the run's ``mapped`` param


def wait_for_connection_test(sandbox: AirflowSandbox, token: str) -> tuple[str, str]:
    # The row's state is the only signal there is; poll it, with the guard only against a hang.
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        rows = sandbox.query(
            "select state, result_message from connection_test_request where token = :token", token=token
        )
        if rows and rows[0][0] in ("success", "failed"):
            return str(rows[0][0]), str(rows[0][1])
        time.sleep(0.2)
    raise TimeoutError(f"connection test {token} did not finish within {RUN_TIMEOUT}s")


@pytest.fixture(
    scope="module",
    # The run's conf: the default width (the DAG's param) on one run, 4 on the other.
    params=[("postgres", "forkserver", {}), ("sqlite", "subprocess", {"mapped": 4})],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def finished(request: pytest.FixtureRequest) -> Iterator[Finished]:
    database, launcher, conf = request.param
    # The home is kept past stop() so the scheduler log, with the executor's shutdown, can be read.
    sandbox = AirflowSandbox(
        executor=EXECUTOR,
        database=database,
        parallelism=8,
        keep_home=True,
        extra_config={
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__LAUNCHER": launcher,
            # Connection tests run on executors only when enabled.
            "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
        },
    )
    with sandbox:
        sandbox.wait_for_dag(DAG_ID)
        run_id = sandbox.trigger(DAG_ID, conf)
        # The third workload type: a connection test the api-server queues for the executor.
        queued = sandbox.api(
            "POST",
            "connections/enqueue-test",
            {"connection_id": "e2e_fs", "conn_type": "fs", "extra": json.dumps({"path": str(sandbox.home)})},
        )
        state = sandbox.wait_for_run(DAG_ID, run_id, timeout=RUN_TIMEOUT)
        callbacks = sandbox.wait_for_callbacks(DAG_ID, run_id)
        connection_test = wait_for_connection_test(sandbox, queued["token"])
        result = Finished(
            sandbox=sandbox,
            run_id=run_id,
            state=state,
            rows=sandbox.task_instances(DAG_ID, run_id),
            callbacks=callbacks,
            missing_logs=sandbox.missing_task_logs(DAG_ID, run_id),
            xcom=sandbox.xcom(DAG_ID, run_id, "push_value"),
            connection_test=connection_test,
            scheduler_log="",
            mapped=conf.get("mapped", MAPPED_COUNT),
        )
    # Read after stop(): the executor's shutdown lines are in it too.
    result.scheduler_log = sandbox.process_logs["scheduler"].read_text(errors="replace")
    yield result
    shutil.rmtree(sandbox.home, ignore_errors=True)


def test_the_run_succeeds(finished: Finished) -> None:
    assert finished.state == "success"


def test_every_task_instance_ends_as_the_dag_promises(finished: Finished) -> None:
    # The mapped tasks, one that always fails, one that succeeds on its retry, an XCom pushed and checked
    assert unexpected(finished.rows, finished.mapped) == []


def test_every_task_log_exists(finished: Finished) -> None:
    assert finished.missing_logs == []


def test_xcom_pushed_upstream_is_what_downstream_read(finished: Finished) -> None:
    assert finished.xcom == {"token": "async-local-executor", "n": 42}  # demo_dag.XCOM_PAYLOAD


def test_deadline_callback_ran_through_this_executor(finished: Finished) -> None:
    [callback] = finished.callbacks
    assert (callback.type, callback.state, callback.deadline_missed) == ("executor", "success", True)
    # The callback's own side effect, written from inside the process our executor launched.
    written = json.loads((finished.sandbox.callback_dir / f"{finished.run_id}.json").read_text())
    assert written["pid"] > 0
    # The mark every process this executor launches carries: the callback ran as our ExecuteCallback.
    assert written["executor_instance"]
    # On either launcher, at the scheduler's priority: workload_cpu_priority = auto, and no crowd here.
    assert written["cpu_policy"] == os.SCHED_OTHER


def test_the_scheduler_used_this_executor_and_shut_it_down(finished: Finished) -> None:
    assert "AsyncLocalExecutor started" in finished.scheduler_log
    assert "falling back" not in finished.scheduler_log
    # The default stop (on_stop = handover) says what it hands over, and nothing about zero workloads.
    handing = re.search(r"stopping: (\d+) running workload\(s\) are handed over", finished.scheduler_log)
    idle = "stopping: no workload runs, nothing to hand over" in finished.scheduler_log
    assert (handing is None) == idle, finished.scheduler_log[-2000:]
    assert "handed over 0 running" not in finished.scheduler_log


def test_connection_test_ran_through_this_executor(finished: Finished) -> None:
    state, message = finished.connection_test
    assert state == "success", message
    assert "is existing" in message
    # This executor is the deployment's only one: a test that ran (it stays queued otherwise) ran here.
    assert not [line for line in finished.scheduler_log.splitlines() if "workload connection-test" in line]
