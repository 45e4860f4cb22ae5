"""A real Airflow 2.11 scheduler stopped, killed and asked to revoke: the executor's guarantees hold.

- SIGTERM: a bounded shutdown (shutdown_timeout, then SIGTERM, grace, SIGKILL), exit 0, nothing left.
- kill -9: what the parent-death chain reaches dies within seconds; a BashOperator's shell (its own
  session) is killed by the restarted scheduler before it launches anything; the run then succeeds.
  Airflow's DAG file processor manager, which the scheduler forks after the executor started, ends
  with the scheduler too (the executor tied it to the scheduler's life).
- [scheduler] task_queued_timeout: Airflow 2.11 calls revoke_task for a task waiting inside the
  executor; it is forgotten there, rescheduled by Airflow, and runs once a slot frees.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from harness.airflow2 import Airflow2Sandbox
from tests import killed_scheduler, stopped_scheduler
from tests.core.helpers import alive
from tests.e2e.helpers import cmdline, poll

pytestmark = pytest.mark.e2e

DAGS = Path(__file__).with_name("dags")
EXECUTOR = "async_local_executor.executor.AsyncLocalExecutor"

Make = Callable[..., Airflow2Sandbox]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    made: list[Airflow2Sandbox] = []

    def build(parallelism: int = 4, **config: str) -> Airflow2Sandbox:
        sb = Airflow2Sandbox(
            executor=EXECUTOR,
            dags_folder=DAGS,
            parallelism=parallelism,
            extra_config={"ALE_GATE_DIR": str(tmp_path), **config},
        )
        made.append(sb)
        sb.start()
        return sb

    yield build
    for sb in made:
        sb.stop()


def _launched(sandbox: Airflow2Sandbox) -> list[int]:
    scheduler = psutil.Process(sandbox.pids["scheduler"])
    # Airflow 2's own children of the scheduler (its DAG file processor, the log server) are not ours:
    # ours are the fork server and, beside it, the workload processes it forked for the scheduler.
    ours = [
        p
        for p in scheduler.children()
        if any(mark in " ".join(cmdline(p.pid)) for mark in ("async_local_executor", "AsyncLocalExecutor"))
    ]
    launched: list[int] = []
    for child in ours:
        try:
            launched += [child.pid, *(p.pid for p in child.children(recursive=True))]
        except psutil.NoSuchProcess:
            continue  # ended while it was listed (a fork server being replaced): it leaves nothing
    return launched


def test_sigterm_stops_the_scheduler_within_its_bound_leaving_nothing(make: Make) -> None:
    sandbox = make(
        AIRFLOW__ASYNC_LOCAL_EXECUTOR__ON_STOP="terminate",  # the stop this test checks is the terminating one
        AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT="2",
        AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE_PERIOD="2",
    )
    sandbox.wait_for_dag("stubborn2", timeout=120)
    stopped_scheduler.running(sandbox, "stubborn2")
    stopped_scheduler.stop_is_bounded(sandbox, signal.SIGTERM, "stubborn2", _launched(sandbox), 2)


# Also on 2.10: a crash's idle-in-transaction row locks kept 2.10.5's restarted scheduler from queueing.
@pytest.mark.airflow210
def test_nothing_outlives_a_killed_scheduler_and_a_restart_finishes(make: Make) -> None:
    sandbox = make(
        AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT="0",  # tasks die with the scheduler, as checked here
        AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD="10",
        AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL="5",
        AIRFLOW__SCHEDULER__SCHEDULER_ZOMBIE_TASK_THRESHOLD="20",
    )
    sandbox.wait_for_dag("sleepers2", timeout=120)
    run_id = sandbox.trigger("sleepers2")
    killed_scheduler.running_with_the_shell(sandbox, "sleepers2", run_id, 3, lambda: _launched(sandbox))
    launched = _launched(sandbox)
    chained, escaped = killed_scheduler.by_session(sandbox.pids["scheduler"], launched)

    # Airflow's own helpers of the scheduler. Its DAG file processor manager, forked after the executor
    # started, dies with it: the executor tied it to the scheduler (SIGTERM at its death). Left running,
    # it would keep the database connection it inherited and any transaction the kill interrupted, with
    # its row locks, so a new scheduler might never queue the reset tasks (seen on 2.10.5). Its log
    # server, forked before the executor existed, survives a kill -9; a service manager kills it with
    # the scheduler (systemd's KillMode=mixed, docs/operations.md), and so does this test.
    helpers = [
        child
        for child in psutil.Process(sandbox.pids["scheduler"]).children()
        if child.pid not in launched and "forkserver.helper" not in " ".join(cmdline(child.pid))
    ]
    [manager] = [h for h in helpers if "DagFileProcessorManager" in " ".join(cmdline(h.pid))]
    sandbox.kill("scheduler")
    for helper in helpers:
        if helper is not manager:
            with contextlib.suppress(psutil.NoSuchProcess):
                helper.kill()
    poll("the DAG file processor manager to end with the scheduler", lambda: not alive(manager.pid), guard=30)
    killed_scheduler.chain_ends(chained)
    escaped = killed_scheduler.shell_survives(escaped)
    killed_scheduler.restart_finishes_and_reclaims(sandbox, "sleepers2", run_id, escaped)


# Also on 2.10: its scheduler handles tasks stuck in queued (the revoke, the requeue count) otherwise.
@pytest.mark.airflow210
def test_a_task_queued_too_long_is_revoked_then_runs(make: Make, tmp_path: Path) -> None:
    # One slot, one more prefetched; Airflow 2.11 revokes what stays queued longer than 8 s.
    sandbox = make(
        parallelism=1,
        AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT="8",
        AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL="2",
        AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG="16",
    )
    sandbox.wait_for_dag("gated2", timeout=120)
    run_id = sandbox.trigger("gated2")
    log = sandbox.process_logs["scheduler"]
    poll("the waiting task revoked", lambda: "revoking gated2.hold" in log.read_text(errors="replace"))
    assert len(list(tmp_path.glob("started.*"))) == 1  # the revoked one never started
    (tmp_path / "gate").touch()
    assert sandbox.wait_for_run("gated2", run_id, timeout=180) == "success"
    assert len(list(tmp_path.glob("started.*"))) == 2
