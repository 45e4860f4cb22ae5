"""SIGTERM or SIGINT to a real scheduler with a task that ignores SIGTERM: a bounded, complete shutdown.

The executor waits shutdown_timeout, sends SIGTERM, then SIGKILL after termination_grace_period, gives
the workload its final event, joins its loop thread, and the scheduler exits 0 with nothing left
running. The stock executor's end() waits for running tasks without a bound. The checks it shares with
its Airflow 2 twin are tests/stopped_scheduler.py's; the status command's view is this one's.
"""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any

import psutil
import pytest

from harness.sandbox import AirflowSandbox
from tests import stopped_scheduler
from tests.e2e.helpers import cmdline, poll

SHUTDOWN_TIMEOUT = 2
GRACE = 2
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.sandbox(
        config={
            # The stop that terminates (on_stop = handover's is tests/e2e/test_handover.py's).
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__ON_STOP": "terminate",
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT),
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE_PERIOD": str(GRACE),
        }
    ),
]


def _descendants(pid: int) -> list[int]:
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p.pid for p in procs if "serve-logs" not in " ".join(cmdline(p.pid))]


def test_sigterm_and_sigint_stop_the_scheduler_within_its_bound_leaving_nothing(
    sandbox: AirflowSandbox,
) -> None:
    sandbox.wait_for_dag("stubborn", timeout=120)
    stopped_scheduler.running(sandbox, "stubborn")
    launched = _descendants(sandbox.pids["scheduler"])
    _status_shows_the_running_task(sandbox)
    stopped_scheduler.stop_is_bounded(sandbox, signal.SIGTERM, "stubborn", launched, SHUTDOWN_TIMEOUT)
    sandbox.restart("scheduler")
    stopped_scheduler.running(sandbox, "stubborn")
    launched = _descendants(sandbox.pids["scheduler"])
    stopped_scheduler.stop_is_bounded(sandbox, signal.SIGINT, "stubborn", launched, SHUTDOWN_TIMEOUT)


def _status_shows_the_running_task(sandbox: AirflowSandbox) -> None:
    # The operator's view, with the deployment's own configuration (state_dir from AIRFLOW_HOME).
    def shown() -> list[dict[str, Any]]:
        out = subprocess.run(
            [str(sandbox.bin_dir / "async-local-executor"), "status", "--json"],
            env=sandbox.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return list(json.loads(out))

    # Rewritten every 2 s: wait for a write that has seen the task.
    poll("the status file to list the task", lambda: any(s["running"] for s in shown()))
    [status] = shown()
    assert status["stale"] is None
    assert status["pid"] == sandbox.pids["scheduler"]
    assert status["health"] == {
        "status": "healthy",
        "reason": None,
        "reasons": [],
        "public_reasons": [],
        "public_codes": [],
    }
    [task] = status["running"]
    assert task["key"].startswith("stubborn.ignore_sigterm try ")
    assert task["memory_mb"] > 10  # the workload process and the task process it supervises
