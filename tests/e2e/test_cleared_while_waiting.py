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

The second test stages what a slow clear does under the burst: having read the row before the scheduler
queued it again, it writes only a new id onto a task instance that is ``queued`` for the same try. The
test writes that id itself (an UPDATE of the one column, as the clear's would be), as the race's timing
cannot be produced on demand; everything else is real. Any event would fail that task instance, so the
executor sends none, and puts it back to scheduled, as the scheduler would after its queued timeout.
The third and fourth stage the same write on a task instance its workload had already started
(``running``): the api-server then refuses the workload's heartbeat, or the success it reports when the
task ends at once, and the row goes to no state, to run as a new try.

The tests share one deployment (``shared=True``): each only runs the switch DAG and reads its own
run (its tasks' marks and gate in its own folder, the scheduler's log from where it stood when the test
began), so only the first pays for a deployment's start; test_prefetch.py starts its own of this
configuration.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import log_size, open_the_gate, poll, since

QUEUED_WAITING = ["queued", "queued", "running", "running"]

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.sandbox(parallelism=2, config={"AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "16"}, shared=True),
]

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


Row = tuple[int, str, str | None, int]


def _rows(sandbox: AirflowSandbox, run_id: str) -> list[Row]:
    found = sandbox.query(
        "SELECT map_index, id, state, try_number FROM task_instance "
        "WHERE dag_id = 'switch' AND run_id = :run_id ORDER BY map_index",
        run_id=run_id,
    )
    return [(int(r[0]), str(r[1]), r[2], int(r[3])) for r in found]


def _two_waiting(sandbox: AirflowSandbox, tmp_path: Path) -> tuple[str, Row]:
    """Trigger the switch DAG, its tasks' marks and gate in ``tmp_path``; return its run and one of the two
    task instances waiting in the executor."""
    sandbox.wait_for_dag("switch", timeout=120)
    run_id = sandbox.trigger("switch", {"folder": str(tmp_path)})
    poll(
        "two tasks running and two waiting inside the executor",
        lambda: (
            sorted(str(r[2]) for r in _rows(sandbox, run_id)) == QUEUED_WAITING
            and len(list(tmp_path.glob("started.*"))) == 2
        ),
    )
    return run_id, next(r for r in _rows(sandbox, run_id) if r[2] == "queued")


def _new_id(sandbox: AirflowSandbox, old_id: str, executor: str | None = None) -> str:
    """Write a new id onto a task instance, as a clear that read its row before the scheduler queued it
    again does (an UPDATE of that column alone); with ``executor``, name that executor on it too."""
    new_id = str(uuid.uuid4()) if "-" in old_id else uuid.uuid4().hex  # as the database stores it
    with sandbox.engine.begin() as connection:
        connection.execute(
            sa.text(
                "UPDATE task_instance SET id = :new, executor = COALESCE(:executor, executor) WHERE id = :old"
            ),
            {"new": new_id, "old": old_id, "executor": executor},
        )
    return new_id


def test_a_task_cleared_while_its_workload_waits_runs_again(sandbox: AirflowSandbox, tmp_path: Path) -> None:
    offset = log_size(sandbox)
    run_id, (index, old_id, _, _) = _two_waiting(sandbox, tmp_path)
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
    cleared = next(r for r in _rows(sandbox, run_id) if r[0] == index)
    assert cleared[1] != old_id, cleared
    assert cleared[2] == "restarting", cleared

    tries, log = open_the_gate(sandbox, tmp_path, run_id, offset)
    assert tries[index] == ("success", 2)
    assert "reported as ended, not failed" in log
    assert log.count("was cleared and successfully terminated") == 1
    assert "Marking task" not in log
    assert "state mismatch" not in log


def test_a_queued_task_given_a_new_id_while_its_workload_waits_is_not_failed(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    offset = log_size(sandbox)
    run_id, (index, old_id, _, tries) = _two_waiting(sandbox, tmp_path)
    _new_id(sandbox, old_id)

    tries_after, log = open_the_gate(sandbox, tmp_path, run_id, offset)
    # Put back to scheduled at once, not after [scheduler] task_queued_timeout (10 minutes), and run.
    _ran_again(log, tries_after, index, tries, "queued under an id no workload has, put back to scheduled")


def _a_running_row_given_a_new_id(sandbox: AirflowSandbox, tmp_path: Path) -> tuple[str, Row, int]:
    """The run, the running row a stale clear gave a new id, and that row's max_tries then."""
    run_id, _ = _two_waiting(sandbox, tmp_path)
    row = next(r for r in _rows(sandbox, run_id) if r[2] == "running")
    _new_id(sandbox, row[1])
    return run_id, row, _max_tries(sandbox, run_id, row[0])


def _max_tries(sandbox: AirflowSandbox, run_id: str, index: int) -> int:
    [(found,)] = sandbox.query(
        "SELECT max_tries FROM task_instance WHERE dag_id = 'switch' AND run_id = :run_id AND map_index = :i",
        run_id=run_id,
        i=index,
    )
    return int(found)


def _ran_again(
    log: str, tries_after: list[tuple[str | None, int]], index: int, at: int, put_back: str
) -> None:
    """The run succeeded with the task instance given a new id at try ``at``, put back as ``put_back``
    says, and no executor event contradicted the database."""
    assert [state for state, _ in tries_after] == ["success"] * len(tries_after)
    assert tries_after[index] == ("success", at)
    assert "no event is sent" in log
    assert put_back in log
    assert "finished with state" not in log
    assert "Marking task" not in log
    assert "state mismatch" not in log


RESET = "under an id no workload has, put to no state"


def test_a_running_task_given_a_new_id_is_run_again_not_failed(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    # The same stale clear, come after the workload started its task instance: the row is running under
    # an id no workload has. The api-server refuses the workload's next heartbeat ("not found") and its
    # supervisor kills the task; a success event for that key would fail the running row ("finished with
    # state success, but the task instance's state attribute is running"), so none is sent, and the row
    # goes to no state, as the scheduler does for a cleared running task whose workload ended.
    offset = log_size(sandbox)
    run_id, (index, _, _, tries), max_tries = _a_running_row_given_a_new_id(sandbox, tmp_path)
    poll(
        "the running row put to no state once its workload's heartbeat was refused",
        lambda: RESET in since(sandbox, offset),
    )
    tries_after, log = open_the_gate(sandbox, tmp_path, run_id, offset)
    _ran_again(log, tries_after, index, tries + 1, RESET)  # ran again as a new try
    assert "reported as ended, not failed" in log
    # The retry the new try would have had, had the scheduler reset it (a real stale clear counts one short).
    assert _max_tries(sandbox, run_id, index) == max_tries + 1


def test_a_running_task_given_a_new_id_that_ends_at_once_is_run_again(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    # The same, with the gate opened at once: the task ends within a fifth of a second, mostly before its
    # supervisor's next heartbeat (every 5 s), so the api-server refuses the success it reports, which
    # Airflow's supervisor hands to the task and does not raise. A heartbeat in that fifth of a second
    # takes the other path; either ends the same way, which is what this asserts (test_airflow3.py pins
    # the refused success report on its own).
    offset = log_size(sandbox)
    run_id, (index, _, _, tries), max_tries = _a_running_row_given_a_new_id(sandbox, tmp_path)
    tries_after, log = open_the_gate(sandbox, tmp_path, run_id, offset)
    _ran_again(log, tries_after, index, tries + 1, RESET)  # ran again as a new try
    assert "reported as ended, not failed" in log
    # The retry the new try would have had, had the scheduler reset it (a real stale clear counts one short).
    assert _max_tries(sandbox, run_id, index) == max_tries + 1


def test_a_queued_row_of_another_executor_is_left_queued(sandbox: AirflowSandbox, tmp_path: Path) -> None:
    # The same stale clear, on a row that names another executor of the same scheduler (its job id is
    # every executor's): that executor may be running the task instance, so it is not put back. Its run
    # stays running, that row queued, which holds no slot the tests after it on the shared deployment need.
    offset = log_size(sandbox)
    run_id, (index, old_id, _, _) = _two_waiting(sandbox, tmp_path)
    new_id = _new_id(sandbox, old_id, executor="CeleryExecutor")
    (tmp_path / "gate").touch()
    poll("the requeue's verdict", lambda: "left as it is" in since(sandbox, offset))
    said = since(sandbox, offset)
    assert "its row is for CeleryExecutor, which may be running it" in said
    assert "put back to scheduled" not in said
    [row] = [r for r in _rows(sandbox, run_id) if r[0] == index]
    assert (row[1], row[2]) == (new_id, "queued")
