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
import re
import signal
from pathlib import Path

import pytest

from harness.sandbox import AirflowSandbox
from tests.core.helpers import alive
from tests.e2e.helpers import QUICK_ORPHANS, launched_workloads, marks, poll, since

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
# The restarted scheduler's [scheduler] task_queued_timeout. Long enough for a requeued try to start
# once the api-server answers again, so that only the adopted tries are revoked (they were queued
# before the first scheduler's stop and the second one's start, so they reach it first).
QUEUED_TIMEOUT = 15
REVOKED = re.compile(r"revoking handover\.hold\S* try \d+: stopping it if it started")


def test_an_adopted_task_still_queued_is_revoked_by_the_next_scheduler_and_its_process_stopped(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    sandbox.wait_for_dag("handover", timeout=120)
    sandbox.unpause("handover")
    # The run is made while no scheduler runs, then the api-server's group is paused: the scheduler
    # started next queues and launches both tries, which then wait for the api-server.
    assert sandbox.signal_and_wait("scheduler", signal.SIGTERM, timeout=120) == 0
    run_id = sandbox.trigger("handover", unpause=False)
    api = os.getpgid(sandbox.pids["api-server"])
    os.killpg(api, signal.SIGSTOP)
    try:
        sandbox.restart("scheduler")
        poll("both tries launched", lambda: len(launched_workloads(sandbox)) == TASKS)
        workloads = sorted(launched_workloads(sandbox).values())
        assert [r.state for r in sandbox.task_instances("handover", run_id)] == ["queued"] * TASKS
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
        )
        assert all(alive(pid) for pid in workloads), {pid: alive(pid) for pid in workloads}
        assert [r.state for r in sandbox.task_instances("handover", run_id)] == ["queued"] * TASKS
        # Still queued past task_queued_timeout: the scheduler revokes each adopted try and requeues it.
        poll("both adopted tries revoked", lambda: len(REVOKED.findall(since(sandbox, offset))) == TASKS)
        poll("the adopted workloads stopped", lambda: not any(alive(pid) for pid in workloads))
        revoked = since(sandbox, offset)
    finally:
        os.killpg(api, signal.SIGCONT)
    # The adopted tries never started their task. Requeued, each runs once the api-server answers.
    assert marks(tmp_path, ".start") == []
    poll("both requeued tries running", lambda: len(marks(tmp_path, ".start")) == TASKS)
    (tmp_path / "gate").write_text("")
    poll("the run to end", lambda: sandbox.run_state("handover", run_id) in ("success", "failed"))
    rows = sandbox.task_instances("handover", run_id)
    assert sandbox.run_state("handover", run_id) == "success", rows
    assert [r.state for r in rows] == ["success"] * TASKS, rows
    assert marks(tmp_path, ".start") == marks(tmp_path, ".end")
    # Each adopted try's end was the executor's to note, not to report: no executor event for it.
    text = since(sandbox, offset)
    assert len(re.findall(r"revoked workload handover\.hold\S* try \d+ ended", text)) == TASKS, text
    assert "Received executor event with state failed" not in text, text
    assert len(REVOKED.findall(text)) == TASKS, revoked  # nothing else was revoked
