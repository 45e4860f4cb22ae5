"""SIGTERM or SIGINT to a real scheduler with a task that ignores SIGTERM: a bounded, complete shutdown.

The executor waits shutdown_timeout, sends SIGTERM, then SIGKILL after termination_grace_period, gives
the workload its final event, joins its loop thread, and the scheduler exits 0 with nothing left
running. The stock executor's end() waits for running tasks without a bound.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from typing import Any

import psutil
import pytest

from harness.sandbox import AirflowSandbox
from tests.core.helpers import alive
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
# Only a hang trips it: the shutdown itself takes SHUTDOWN_TIMEOUT + GRACE, the rest is the scheduler's.
EXIT_GUARD = 120.0


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
    _stop_with(sandbox, signal.SIGTERM)
    sandbox.restart("scheduler")
    _stop_with(sandbox, signal.SIGINT)


def _stop_with(sandbox: AirflowSandbox, sig: signal.Signals) -> None:
    run_id = sandbox.trigger("stubborn")
    poll(
        "the task running",
        lambda: [r.state for r in sandbox.task_instances("stubborn", run_id)] == ["running"],
    )
    # The fork server, the workload process and the task process that ignores SIGTERM.
    launched = _descendants(sandbox.pids["scheduler"])
    assert len(launched) >= 3, [" ".join(cmdline(pid)) for pid in launched]
    if sig is signal.SIGTERM:
        _status_shows_the_running_task(sandbox)
    log = sandbox.process_logs["scheduler"]
    before = log.stat().st_size

    started = time.monotonic()
    status = sandbox.signal_and_wait("scheduler", sig, timeout=EXIT_GUARD)
    took = time.monotonic() - started

    assert status == 0, f"{sig.name}: scheduler exited with {status}"
    assert took < EXIT_GUARD
    # What the dying scheduler did not reap is reparented and reaped by init; none may still run.
    poll("launched processes to be gone", lambda: not [pid for pid in launched if alive(pid)])
    shutdown = log.read_bytes()[before:].decode(errors="replace")
    assert f"Exiting gracefully upon receiving signal {int(sig)}" in shutdown
    # The first round's task was reset by the restarted scheduler and runs again here: count them.
    waiting = re.search(
        rf"shutting down: waiting up to {SHUTDOWN_TIMEOUT}s for (\d+) running workloads", shutdown
    )
    assert waiting, shutdown
    # Each one's final event, with why; the task ignores SIGTERM, so only the escalation ended it.
    ended = re.findall(
        r"workload stubborn\.ignore_sigterm try \d+ failed: executor shut down: terminated", shutdown
    )
    assert len(ended) == int(waiting.group(1)) >= 1, shutdown
    assert "after SIGTERM; sending SIGKILL" in shutdown


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
