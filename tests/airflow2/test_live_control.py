"""Airflow 2.11: pause, resume and drain from Airflow's CLI on a real scheduler, as on Airflow 3.

The handover2 DAG's two tasks are made while the executor is paused: they stay ``scheduled`` (the
executor reports no open slot); resumed, both start; a drain lets them end and says ``drained``; the
run succeeds with each task run once. Nothing is mocked: Airflow 2.11's scheduler (which parses the DAGs
itself) on PostgreSQL, the default fork-server launcher, real task processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.airflow2 import Airflow2Sandbox
from tests.e2e.helpers import marks, poll

pytestmark = pytest.mark.e2e

DAG_ID = "handover2"
TASKS = 2


def test_pause_resume_and_drain_from_airflows_cli_on_a_2_11_scheduler(
    gated_sandbox: Airflow2Sandbox, tmp_path: Path
) -> None:
    gated_sandbox.wait_for_dag(DAG_ID, timeout=120)
    paused = gated_sandbox.airflow("async-local-executor", "pause", "--by", "ops")
    assert "pause: paused by ops at" in paused.stdout, paused.stdout
    run_id = gated_sandbox.trigger(DAG_ID)
    poll(
        "the tasks scheduled",
        lambda: [r.state for r in gated_sandbox.task_instances(DAG_ID, run_id)] == ["scheduled"] * TASKS,
    )
    assert marks(tmp_path, ".start") == []
    resumed = gated_sandbox.airflow("async-local-executor", "resume", "--by", "ops")
    assert "resume: running by ops at" in resumed.stdout, resumed.stdout
    poll("both tasks running", lambda: len(marks(tmp_path, ".start")) == TASKS)
    drain = gated_sandbox.airflow("async-local-executor", "drain")
    assert "drain: draining by" in drain.stdout, drain.stdout
    (tmp_path / "gate").touch()
    waited = gated_sandbox.airflow("async-local-executor", "drain", "--wait")
    assert "drained: no task runs or waits" in waited.stdout, waited.stdout
    assert gated_sandbox.wait_for_run(DAG_ID, run_id, timeout=180) == "success"
    # Each task ran once, at try 1, to its end.
    started = marks(tmp_path, ".start")
    assert [stem.split(".")[:2] for stem in started] == [["hold0", "try1"], ["hold1", "try1"]], started
    assert marks(tmp_path, ".end") == started
