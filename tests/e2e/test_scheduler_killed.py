"""kill -9 of a real scheduler while tasks run: nothing it launched survives, and a restart finishes the run.

What the parent-death chain reaches dies within seconds; what escaped it (a BashOperator's shell, in a
session of its own) is killed by the restarted scheduler before it launches anything. So is Airflow's
log server, which the scheduler forked before the executor started and which a kill -9 spares: it must
not keep the dead scheduler's database connection (a transaction the kill cut short would keep its row
locks, and the next scheduler would never queue a task) nor, once the next scheduler starts, run on.

Nothing is mocked: a real Airflow on PostgreSQL, the default fork-server launcher, real task processes.
The steps it shares with its Airflow 2 twin are tests/killed_scheduler.py's.
"""

from __future__ import annotations

import psutil
import pytest

from harness.sandbox import AirflowSandbox
from tests import killed_scheduler
from tests.core.helpers import alive
from tests.e2e.helpers import QUICK_ORPHANS, cmdline

# handover_timeout = 0: tasks die with their scheduler (the default's crash is tests/e2e/test_handover.py's).
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.sandbox(
        database="postgres",
        config={**QUICK_ORPHANS, "AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT": "0"},
    ),
]

DATABASE_PORT = 5432  # the sandbox's PostgreSQL


def test_no_task_process_outlives_a_killed_scheduler_and_a_restart_finishes(sandbox: AirflowSandbox) -> None:
    sandbox.wait_for_dag("sleepers", timeout=120)
    run_id = sandbox.trigger("sleepers")
    scheduler = psutil.Process(sandbox.pids["scheduler"])
    killed_scheduler.running_with_the_shell(
        sandbox, "sleepers", run_id, 4, lambda: [p.pid for p in scheduler.children(recursive=True)]
    )
    # The fork server, and per task its supervisor and the task process; the log server is Airflow's.
    children = scheduler.children(recursive=True)
    launched = [p.pid for p in children if "serve-logs" not in " ".join(cmdline(p.pid))]
    [log_server] = [p for p in children if "serve-logs" in " ".join(cmdline(p.pid))]
    chained, escaped = killed_scheduler.by_session(scheduler.pid, launched)
    assert len(chained) >= 1 + 4 * 2, [" ".join(cmdline(pid)) for pid in chained]

    sandbox.kill("scheduler")
    killed_scheduler.chain_ends(chained)
    escaped = killed_scheduler.shell_survives(escaped)
    # The log server runs on; of the database connections it was forked with, none is still open at
    # the database's end: the scheduler closed them at its executor's start and used its own after.
    assert log_server.is_running()
    held = [c for c in log_server.net_connections("tcp") if c.raddr and c.raddr.port == DATABASE_PORT]
    assert [c for c in held if c.status == psutil.CONN_ESTABLISHED] == [], held

    log = killed_scheduler.restart_finishes_and_reclaims(sandbox, "sleepers", run_id, escaped)
    # The restarted scheduler's executor stopped the dead one's log server.
    assert f"stopped airflow serve-logs (pid {log_server.pid})" in log
    assert not alive(log_server.pid)
    # No try ran twice: every attempt's log holds one run of the task.
    logs = sorted((sandbox.logs_dir / "dag_id=sleepers" / f"run_id={run_id}").rglob("attempt=*.log"))
    assert len(logs) >= 4
    for path in logs:
        assert path.read_text().count("::group::Pre Execute") <= 1, path
