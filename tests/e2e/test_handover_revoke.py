"""An adopted task instance still queued past ``task_queued_timeout`` is revoked: its workload is stopped.

Airflow revokes only what is stuck in queued: a try whose workload runs but has not marked it running.
Here the api-server is paused (SIGSTOP) while the tries start, so their first call to it waits and their
task instances stay queued; the scheduler is stopped, hands both running workloads over, and the next
one adopts them. Its check for tasks stuck in queued revokes both (and requeues them): the executor stops
each adopted workload's process, and gives no event for it (Airflow's revoke contract: the scheduler has
decided that try's fate). Once the api-server answers again, each requeued try runs to its end, once.

Nothing is mocked: a real Airflow 3.3 (scheduler, api-server, dag-processor) on SQLite, the default
fork-server launcher, real task processes (dags/handover.py records each execution it starts).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from harness.sandbox import AirflowSandbox
from tests.e2e.helpers import (
    QUICK_ORPHANS,
    adopted_while_queued_then_revoked,
    marks,
    requeued_tries_run_once,
    stop_scheduler,
)

TASKS = 2
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.sandbox(
        parallelism=4,
        config=QUICK_ORPHANS,
        # A try's first call to the api-server (the one that marks it running) waits for it, however
        # long the api-server is paused, instead of failing the try after the default 5 s.
        execution_api_timeout=600.0,
    ),
]


def test_an_adopted_task_still_queued_is_revoked_by_the_next_scheduler_and_its_process_stopped(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    sandbox.wait_for_dag("handover", timeout=120)
    sandbox.unpause("handover")
    # The run is made while no scheduler runs, then the api-server's group is paused: the scheduler
    # started next queues and launches both tries, which then wait for the api-server.
    stop_scheduler(sandbox)
    run_id = sandbox.trigger("handover", unpause=False)
    api = os.getpgid(sandbox.pids["api-server"])
    os.killpg(api, signal.SIGSTOP)
    try:
        sandbox.restart("scheduler")
        offset = adopted_while_queued_then_revoked(sandbox, "handover", run_id, TASKS)
    finally:
        os.killpg(api, signal.SIGCONT)
    # The adopted tries never started their task. Requeued, each runs once the api-server answers.
    assert marks(tmp_path, ".start") == []
    requeued_tries_run_once(sandbox, tmp_path, "handover", run_id, offset, TASKS)
