"""Airflow 2: an adopted task instance still queued past ``task_queued_timeout`` is revoked, its workload stopped.

Airflow revokes only what is stuck in queued: a try whose workload runs but has not marked it running.
Here the tries' DAG file is slow to import in their workloads (dags/revoke2.py waits while a file exists),
and ``airflow tasks run`` imports it before it marks the try running, so their task instances stay
queued. The scheduler is stopped and hands both running workloads over; the next one adopts them. Its
check for tasks stuck in queued revokes both (and requeues them): the executor stops each adopted
workload's process and gives no event for it (Airflow's revoke contract: the scheduler has decided that
try's fate). Once the import goes through, each requeued try runs to its end, once.

Nothing is mocked: Airflow's scheduler (which parses the DAGs itself) on PostgreSQL, the default
fork-server launcher, real task processes.
"""

from __future__ import annotations

import re
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.airflow2 import Airflow2Sandbox
from tests.core.helpers import alive
from tests.e2e.helpers import launched_workloads, marks, poll, since

pytestmark = pytest.mark.e2e

DAGS = Path(__file__).with_name("dags")
EXECUTOR = "async_local_executor.executor.AsyncLocalExecutor"
DAG_ID = "revoke2"
TASKS = 2
# The restarted scheduler's [scheduler] task_queued_timeout. Long enough for a requeued try to start
# once the import goes through, so that only the adopted tries are revoked (they were queued before the
# first scheduler's stop and the second one's start, so they reach it first).
QUEUED_TIMEOUT = 15
REVOKED = re.compile(rf"revoking {DAG_ID}\.hold\S* try \d+: stopping it if it started")


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Airflow2Sandbox]:
    sb = Airflow2Sandbox(
        executor=EXECUTOR, dags_folder=DAGS, parallelism=4, extra_config={"ALE_HANDOVER_DIR": str(tmp_path)}
    )
    sb.start()
    try:
        yield sb
    finally:
        # What a failure is read from outlives the sandbox's home: the scheduler's log, the tasks' logs.
        for name, path in sb.process_logs.items():
            if path.exists():
                shutil.copyfile(path, tmp_path / f"{name}.log")
        if (sb.home / "logs").is_dir():
            shutil.copytree(sb.home / "logs", tmp_path / "home" / "logs", dirs_exist_ok=True)
        sb.stop()


def _states(sandbox: Airflow2Sandbox, run_id: str) -> list[str | None]:
    return [r.state for r in sandbox.task_instances(DAG_ID, run_id)]


def test_an_adopted_task_still_queued_is_revoked_by_the_next_scheduler_and_its_process_stopped(
    sandbox: Airflow2Sandbox, tmp_path: Path
) -> None:
    hold_import = tmp_path / "hold-import"
    hold_import.write_text("")
    sandbox.wait_for_dag(DAG_ID, timeout=120)
    run_id = sandbox.trigger(DAG_ID)
    poll("both tries launched", lambda: len(launched_workloads(sandbox)) == TASKS, guard=180)
    workloads = sorted(launched_workloads(sandbox).values())
    assert _states(sandbox, run_id) == ["queued"] * TASKS
    log = sandbox.process_logs["scheduler"]
    before = log.stat().st_size
    assert sandbox.signal_and_wait("scheduler", signal.SIGTERM, timeout=120) == 0
    assert f"handed over {TASKS} running task workload(s)" in since(sandbox, before)
    assert all(alive(pid) for pid in workloads), {pid: alive(pid) for pid in workloads}

    sandbox.reconfigure(
        {
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(QUEUED_TIMEOUT),
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "2",
        }
    )
    offset = log.stat().st_size
    sandbox.restart("scheduler")
    poll(
        "the new scheduler to adopt both",
        lambda: f"adopted {TASKS} task instance(s)" in since(sandbox, offset),
        guard=120,
    )
    assert all(alive(pid) for pid in workloads), {pid: alive(pid) for pid in workloads}
    assert _states(sandbox, run_id) == ["queued"] * TASKS
    # Still queued past task_queued_timeout: the scheduler revokes each adopted try and requeues it.
    poll(
        "both adopted tries revoked",
        lambda: len(REVOKED.findall(since(sandbox, offset))) == TASKS,
        guard=QUEUED_TIMEOUT + 60,
    )
    poll("the adopted workloads stopped", lambda: not any(alive(pid) for pid in workloads))
    # The adopted tries never started their task. Requeued, each runs once its DAG file imports.
    assert marks(tmp_path, ".start") == []
    hold_import.unlink()
    poll("both requeued tries running", lambda: len(marks(tmp_path, ".start")) == TASKS, guard=180)
    (tmp_path / "gate").write_text("")
    poll("the run to end", lambda: sandbox.run_state(DAG_ID, run_id) in ("success", "failed"), guard=180)
    rows = sandbox.task_instances(DAG_ID, run_id)
    assert sandbox.run_state(DAG_ID, run_id) == "success", rows
    assert _states(sandbox, run_id) == ["success"] * TASKS, rows
    assert marks(tmp_path, ".start") == marks(tmp_path, ".end")
    # Each adopted try's end was the executor's to note, not to report: no executor event for it.
    text = since(sandbox, offset)
    assert len(re.findall(rf"revoked workload {DAG_ID}\.hold\S* try \d+ ended", text)) == TASKS, text
    assert not re.search(r"Received executor event with state failed", text), text
    assert len(REVOKED.findall(text)) == TASKS, text  # nothing else was revoked
