"""kill -9 of the fork server while tasks run: a new helper takes over, and every running task finishes.

The helper only forks: each task's process is the scheduler's own child, so the helper's death (the
OOM killer, a bug in a preloaded module) costs no running task. Nothing is mocked: a real Airflow on
SQLite, the default fork-server launcher, real task processes held at a gate the test opens.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from harness.sandbox import AirflowSandbox
from tests.core.helpers import alive
from tests.e2e.helpers import SWITCH_TASKS, cmdline, open_the_gate, poll

pytestmark = [
    pytest.mark.e2e,
    # An explicit idle: the default (auto) keeps 4 tasks at the scheduler's priority.
    pytest.mark.sandbox(config={"AIRFLOW__ASYNC_LOCAL_EXECUTOR__WORKLOAD_CPU_PRIORITY": "idle"}),
]

TASKS = SWITCH_TASKS


def _helpers(scheduler: psutil.Process) -> list[int]:
    return [p.pid for p in scheduler.children() if "forkserver.helper" in " ".join(cmdline(p.pid))]


def test_killing_the_fork_server_loses_no_running_task(sandbox: AirflowSandbox, tmp_path: Path) -> None:
    scheduler = psutil.Process(sandbox.pids["scheduler"])
    sandbox.wait_for_dag("switch", timeout=120)
    run_id = sandbox.trigger("switch")
    poll(f"{TASKS} tasks at the gate", lambda: len(list(tmp_path.glob("started.*"))) == TASKS)
    tasks = [int(path.name.split(".")[1]) for path in tmp_path.glob("started.*")]
    [helper] = _helpers(scheduler)
    # Task processes run below the scheduler's CPU priority (workload_cpu_priority = idle).
    assert {os.sched_getscheduler(pid) for pid in tasks} == {os.SCHED_IDLE}
    assert os.sched_getscheduler(scheduler.pid) == os.SCHED_OTHER

    psutil.Process(helper).kill()
    poll("a new fork server", lambda: _helpers(scheduler) not in ([], [helper]))
    assert all(alive(pid) for pid in tasks)

    tries, log = open_the_gate(sandbox, tmp_path, run_id)
    assert tries == [("success", 1)] * TASKS
    assert f"fork server (pid {helper}) exited; a new one replaces it" in log
    assert not [line for line in log.splitlines() if "workload switch.hold" in line and "failed" in line]
