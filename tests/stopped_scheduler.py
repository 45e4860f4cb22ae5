"""SIGTERM or SIGINT to a real scheduler whose task ignores SIGTERM, with ``on_stop = terminate``, on Airflow 3
and on Airflow 2: the checks both majors' tests share (tests/e2e/test_scheduler_stopped.py,
tests/airflow2/test_scheduler_lifecycle.py).

The executor waits ``shutdown_timeout``, sends SIGTERM, then SIGKILL after ``termination_grace_period``,
gives the workload its final event, joins its loop thread, and the scheduler exits 0 with nothing it
launched left running.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Sequence

from harness.sandbox import AirflowSandbox
from tests.core.helpers import alive
from tests.e2e.helpers import cmdline, poll

# Only a hang trips it: the shutdown itself takes shutdown_timeout + the grace, the rest is the scheduler's.
EXIT_GUARD = 120.0


def running(sandbox: AirflowSandbox, dag_id: str) -> str:
    """Trigger ``dag_id`` (one task) and wait until its task runs; its run id."""
    run_id = sandbox.trigger(dag_id)
    poll("the task running", lambda: [r.state for r in sandbox.task_instances(dag_id, run_id)] == ["running"])
    return run_id


def stop_is_bounded(
    sandbox: AirflowSandbox, sig: signal.Signals, dag_id: str, launched: Sequence[int], shutdown_timeout: int
) -> str:
    """Stop the scheduler with ``sig`` while ``dag_id``'s task runs: it exits 0 within the guard, leaving
    nothing of ``launched`` (the fork server, the workload process and the task process at least), and
    its log says each running workload ended by the escalation.

    :returns: what the scheduler logged from the signal on
    """
    assert len(launched) >= 3, [" ".join(cmdline(pid)) for pid in launched]
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
    # A task an earlier stop left is reset by the restarted scheduler and runs again: count them.
    waiting = re.search(
        rf"shutting down: waiting up to {shutdown_timeout}s for (\d+) running workloads", shutdown
    )
    assert waiting, shutdown
    # Each one's final event, with why; the task ignores SIGTERM, so only the escalation ended it.
    ended = re.findall(
        rf"workload {re.escape(dag_id)}\.ignore_sigterm try \d+ failed: executor shut down: terminated",
        shutdown,
    )
    assert len(ended) == int(waiting.group(1)) >= 1, shutdown
    assert "after SIGTERM; sending SIGKILL" in shutdown
    return shutdown
