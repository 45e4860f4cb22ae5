"""Running task instances cleared together: each runs again, and the executor finds them restarting.

When many cleared task instances end together, the executor hands the scheduler their exits one per
loop (Airflow 3.3 commits its session for each; see async_local_executor/cleared_exits.py). Which exits
those are it reads from the metadata database; this test runs that read against a real Airflow, with
the exits held back by stopping the scheduler (SIGSTOP) while the api-server stops the cleared tasks,
so the task instances stay ``restarting`` for as long as the test looks. Nothing is mocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.sandbox import AirflowSandbox
from tests.core.helpers import alive
from tests.e2e.helpers import (
    SWITCH_TASKS,
    open_the_gate,
    poll,
    stopped_outside_a_transaction,
)

pytestmark = pytest.mark.e2e

TASKS = SWITCH_TASKS

LOOKUP = """
import json, sys
from airflow.models.taskinstancekey import TaskInstanceKey
from async_local_executor.adapter.metadata_db import restarting_task_instances
run_id, count = sys.argv[1], int(sys.argv[2])
keys = [TaskInstanceKey("switch", "hold", run_id, 1, i) for i in range(count)]
keys.append(TaskInstanceKey("switch", "hold", "no-such-run", 1, 0))
print(json.dumps(sorted(key.map_index for key in restarting_task_instances(keys))))
"""


def _states(sandbox: AirflowSandbox, run_id: str) -> list[str | None]:
    return [row.state for row in sandbox.task_instances("switch", run_id)]


def test_cleared_running_tasks_are_found_restarting_and_run_again(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    sandbox.wait_for_dag("switch", timeout=120)
    run_id = sandbox.trigger("switch")
    poll(f"{TASKS} tasks at the gate", lambda: len(list(tmp_path.glob("started.*"))) == TASKS)
    first = [int(path.name.split(".")[1]) for path in tmp_path.glob("started.*")]
    for path in tmp_path.glob("started.*"):
        path.unlink()

    with stopped_outside_a_transaction(sandbox, sandbox.pids["scheduler"]):
        sandbox.clear("switch", run_id, "hold", range(TASKS))
        # The api-server tells each supervisor to stop; nobody hands the exits to the scheduler yet.
        poll("the cleared tasks to end", lambda: not any(alive(pid) for pid in first))
        assert _states(sandbox, run_id) == ["restarting"] * TASKS
        found = subprocess.run(
            [sys.executable, "-c", LOOKUP, run_id, str(TASKS)],
            env=sandbox.env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        assert json.loads(found.stdout.splitlines()[-1]) == list(range(TASKS))

    poll(f"{TASKS} tasks at the gate again", lambda: len(list(tmp_path.glob("started.*"))) == TASKS)
    tries, log = open_the_gate(sandbox, tmp_path, run_id)
    assert tries == [("success", 2)] * TASKS
    assert log.count("was cleared and successfully terminated") == TASKS
    assert "could not read which task instances are restarting" not in log
