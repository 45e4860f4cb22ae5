"""A task instance cleared while its workload waits inside the executor runs again; it is not failed.

Under a burst, a workload can wait inside the executor (prefetched, or starting slowly) while its task
instance is cleared. Clearing gives the task instance a new id, so the workload's start is refused with
404. When an earlier start of the same try had reached the api-server (a start call whose answer the
client never saw, then retried), the cleared task instance is ``restarting``, and the scheduler applies the
workload's end to it: a failure fails it (that lost one task per run of the full-size burst), an end lets
it run again.

Staged here against a real Airflow on SQLite, nothing mocked: parallelism 2 with the prefetch keeps two
of the switch DAG's tasks queued inside the executor; the test itself makes the start call that a lost
first attempt would have made (Airflow's own task SDK client, with the token the scheduler would mint),
then clears that task instance, then opens the gate so the waiting workload starts with the old id.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import open_the_gate, poll, switch_sandbox

pytestmark = pytest.mark.e2e

# Airflow's task SDK client starting a task instance, as a workload's supervisor does first.
START = """
import os, sys, uuid
from datetime import datetime, timezone
from airflow.configuration import conf
from airflow.executors.base_executor import BaseExecutor
from airflow.executors.workloads.base import BaseWorkloadSchema
from airflow.sdk.api.client import Client
from async_local_executor.adapter.compat import execution_api_url
ti_id = sys.argv[1]
token = BaseWorkloadSchema.generate_token(ti_id, BaseExecutor.jwt_generator.func(None))
client = Client(base_url=execution_api_url(conf), token=token)
client.task_instances.start(uuid.UUID(ti_id), os.getpid(), datetime.now(tz=timezone.utc))
print("started")
"""


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[AirflowSandbox]:
    with switch_sandbox(tmp_path, parallelism=2, AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG="16") as sb:
        yield sb


def test_a_task_cleared_while_its_workload_waits_runs_again(sandbox: AirflowSandbox, tmp_path: Path) -> None:
    sandbox.wait_for_dag("switch", timeout=120)
    run_id = sandbox.trigger("switch")

    def rows() -> list[tuple[int, str, str | None, int]]:
        found = sandbox.query(
            "SELECT map_index, id, state, try_number FROM task_instance "
            "WHERE dag_id = 'switch' AND run_id = :run_id ORDER BY map_index",
            run_id=run_id,
        )
        return [(int(r[0]), str(r[1]), r[2], int(r[3])) for r in found]

    poll(
        "two tasks running and two waiting inside the executor",
        lambda: (
            sorted(str(r[2]) for r in rows()) == ["queued", "queued", "running", "running"]
            and len(list(tmp_path.glob("started.*"))) == 2
        ),
    )
    index, old_id, _, _ = next(r for r in rows() if r[2] == "queued")
    started = subprocess.run(
        [sys.executable, "-c", START, old_id],
        env=sandbox.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert started.stdout.strip().endswith("started"), started.stderr
    sandbox.clear("switch", run_id, "hold", [index])
    cleared = next(r for r in rows() if r[0] == index)
    assert cleared[1] != old_id, cleared
    assert cleared[2] == "restarting", cleared

    tries, log = open_the_gate(sandbox, tmp_path, run_id)
    assert tries[index] == ("success", 2)
    assert "reported as ended, not failed" in log
    assert log.count("was cleared and successfully terminated") == 1
    assert "Marking task" not in log
    assert "state mismatch" not in log
