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

from pathlib import Path

import pytest

from harness.airflow2 import Airflow2Sandbox
from tests.e2e.helpers import adopted_while_queued_then_revoked, marks, requeued_tries_run_once

pytestmark = pytest.mark.e2e

DAG_ID = "revoke2"
TASKS = 2


def test_an_adopted_task_still_queued_is_revoked_by_the_next_scheduler_and_its_process_stopped(
    gated_sandbox: Airflow2Sandbox, tmp_path: Path
) -> None:
    hold_import = tmp_path / "hold-import"
    hold_import.write_text("")
    gated_sandbox.wait_for_dag(DAG_ID, timeout=120)
    run_id = gated_sandbox.trigger(DAG_ID)
    offset = adopted_while_queued_then_revoked(gated_sandbox, DAG_ID, run_id, TASKS)
    # The adopted tries never started their task. Requeued, each runs once its DAG file imports.
    assert marks(tmp_path, ".start") == []
    hold_import.unlink()
    requeued_tries_run_once(gated_sandbox, tmp_path, DAG_ID, run_id, offset, TASKS)
