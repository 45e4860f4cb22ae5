"""Switching a deployment from LocalExecutor to AsyncLocalExecutor: nothing is left stuck.

A PostgreSQL deployment runs the stock LocalExecutor with history (a finished run) and a run caught
with two tasks running and two queued (stock 3.3.2 queues past parallelism: it never counts running
tasks). The operator stops the scheduler: stock end() waits for the running tasks without a bound,
so the service manager kills it (SIGKILL to the whole tree, what systemd does after TimeoutStopSec).
The setting changes, the scheduler starts again with this executor: the orphaned tasks are reset and
run by it, the run succeeds, no task instance stays queued or running, the history is intact.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from harness.demo import EXECUTOR
from harness.sandbox import AirflowSandbox
from tests.core.helpers import alive
from tests.e2e.helpers import poll

# The restarted scheduler resets a dead scheduler's tasks once that one has missed heartbeats for
# this long, checking this often (defaults 30 s and 300 s; shorter here to keep the test short).
HEALTH_CHECK_THRESHOLD = 10
ORPHAN_CHECK_INTERVAL = 5
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.sandbox(
        executor="LocalExecutor",
        database="postgres",
        parallelism=2,
        config={
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": "16",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": str(HEALTH_CHECK_THRESHOLD),
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": str(ORPHAN_CHECK_INTERVAL),
        },
    ),
]


def test_switching_from_local_executor_leaves_nothing_stuck(sandbox: AirflowSandbox, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    sandbox.wait_for_dag("switch", timeout=120)

    gate.touch()
    history = sandbox.trigger("switch")
    assert sandbox.wait_for_run("switch", history, timeout=180) == "success"

    gate.unlink()
    caught = sandbox.trigger("switch")

    def states() -> list[str]:
        return sorted(str(r.state) for r in sandbox.task_instances("switch", caught))

    poll("two tasks running and two queued", lambda: states() == ["queued", "queued", "running", "running"])
    stock_tree = psutil.Process(sandbox.pids["scheduler"]).children(recursive=True)

    scheduler_log = sandbox.process_logs["scheduler"]
    os.kill(sandbox.pids["scheduler"], signal.SIGTERM)
    poll(
        "stock end() waiting for the running tasks",
        lambda: b"Shutting down LocalExecutor" in scheduler_log.read_bytes(),
    )
    for proc in stock_tree:
        proc.kill()
    sandbox.kill("scheduler")
    poll("the stock scheduler's tree to be gone", lambda: not [p.pid for p in stock_tree if alive(p.pid)])

    sandbox.reconfigure({"AIRFLOW__CORE__EXECUTOR": EXECUTOR})
    before = scheduler_log.stat().st_size
    sandbox.restart("scheduler")
    gate.touch()

    assert sandbox.wait_for_run("switch", caught, timeout=180) == "success"
    assert states() == ["success"] * 4
    assert sandbox.run_state("switch", history) == "success"
    assert {str(r.state) for r in sandbox.task_instances("switch", history)} == {"success"}
    restarted = scheduler_log.read_bytes()[before:].decode(errors="replace")
    assert "AsyncLocalExecutor" in restarted
    assert "Reset the following 4 orphaned TaskInstances" in restarted, restarted[-3000:]
    left = sandbox.query(
        "select count(*) from task_instance where state in ('queued', 'running', 'scheduled')"
    )
    assert left == [(0,)]
    # A run after the switch is an ordinary run.
    after = sandbox.trigger("switch")
    assert sandbox.wait_for_run("switch", after, timeout=180) == "success"
