"""A scheduler restart hands running tasks over: they run on and the next scheduler adopts them.

With the defaults (``on_stop = handover``, ``handover_timeout = 300``), a stopped scheduler exits within
seconds and a killed one leaves its tasks running; the next scheduler adopts them, so every task runs
once, at try 1, and its end is reported. Without a successor, the tasks kill themselves once
``handover_timeout`` has passed. Each task records every execution it starts and ends (dags/handover.py),
so the tests count executions from the tasks themselves, not from Airflow's database alone.

Nothing is mocked: a real Airflow 3.3 (scheduler, api-server, dag-processor) on SQLite, the default
fork-server launcher, real task processes.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest

from harness.sandbox import AirflowSandbox
from tests.core.helpers import alive
from tests.e2e.helpers import QUICK_ORPHANS, cmdline, poll

TASKS = 2
pytestmark = [pytest.mark.e2e, pytest.mark.sandbox(parallelism=4, config=QUICK_ORPHANS)]
# The bound: a stopped scheduler exits within 10 s of the signal.
EXIT_BOUND = 10.0


def _marks(tmp_path: Path, suffix: str) -> list[str]:
    return sorted(p.stem for p in tmp_path.glob(f"hold*{suffix}"))


def _running(sandbox: AirflowSandbox, tmp_path: Path) -> tuple[str, list[int]]:
    """Trigger the DAG; once both tasks run, the pids of what the scheduler launched for them."""
    sandbox.wait_for_dag("handover", timeout=120)
    run_id = sandbox.trigger("handover")
    poll("both tasks running", lambda: len(_marks(tmp_path, ".start")) == TASKS)
    scheduler = psutil.Process(sandbox.pids["scheduler"])
    # Each task process and the workload process that supervises it, which the scheduler launched.
    tasks = [int(mark.rsplit(".pid", 1)[1]) for mark in _marks(tmp_path, ".start")]
    assert len(tasks) == TASKS, tasks
    workloads = [psutil.Process(pid).ppid() for pid in tasks]
    assert all(psutil.Process(pid).ppid() == scheduler.pid for pid in workloads), workloads
    return run_id, [*workloads, *tasks]


def _finish_after_adoption(sandbox: AirflowSandbox, tmp_path: Path, run_id: str, launched: list[int]) -> None:
    log = sandbox.process_logs["scheduler"]
    poll(
        "the new scheduler to adopt both task instances",
        lambda: f"adopted {TASKS} task instance(s)" in log.read_text(errors="replace"),
    )
    assert all(alive(pid) for pid in launched), {pid: alive(pid) for pid in launched}
    (tmp_path / "gate").write_text("")
    poll("the run to end", lambda: sandbox.run_state("handover", run_id) in ("success", "failed"))
    rows = sandbox.task_instances("handover", run_id)
    assert sandbox.run_state("handover", run_id) == "success", rows
    assert [(r.state, r.try_number) for r in rows] == [("success", 1)] * TASKS, rows
    # One execution per task, which ran to its end: nothing was killed and nothing ran again.
    assert _marks(tmp_path, ".start") == _marks(tmp_path, ".end")
    assert [m.split(".")[1] for m in _marks(tmp_path, ".start")] == ["try1"] * TASKS


def test_a_stopped_scheduler_hands_its_running_tasks_to_the_next_which_adopts_them(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, launched = _running(sandbox, tmp_path)
    log = sandbox.process_logs["scheduler"]
    before = log.stat().st_size
    started = time.monotonic()
    status = sandbox.signal_and_wait("scheduler", signal.SIGTERM, timeout=120)
    took = time.monotonic() - started
    assert status == 0
    assert took < EXIT_BOUND, f"the scheduler took {took:.1f}s to exit"
    stopped = log.read_bytes()[before:].decode(errors="replace")
    assert f"handed over {TASKS} running task workload(s)" in stopped, stopped
    assert all(alive(pid) for pid in launched)

    sandbox.restart("scheduler")
    _finish_after_adoption(sandbox, tmp_path, run_id, launched)


def test_a_killed_scheduler_s_tasks_wait_for_the_next_which_adopts_them(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, launched = _running(sandbox, tmp_path)
    sandbox.kill("scheduler")
    sandbox.restart("scheduler")
    _finish_after_adoption(sandbox, tmp_path, run_id, launched)


HANDOVER_TIMEOUT = 5.0


@pytest.mark.sandbox(config={"AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT": str(HANDOVER_TIMEOUT)})
def test_without_a_next_scheduler_nothing_a_task_started_outlives_the_handover_timeout(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    _, launched = _running(sandbox, tmp_path)
    sandbox.kill("scheduler")
    killed = time.monotonic()
    deadline = killed + HANDOVER_TIMEOUT + 10.0
    while survivors := [pid for pid in launched if alive(pid)]:
        assert time.monotonic() < deadline, {pid: cmdline(pid) for pid in survivors}
        time.sleep(0.1)
    # They waited for a successor first: not killed with the scheduler.
    assert time.monotonic() - killed >= HANDOVER_TIMEOUT - 1.0
    assert _marks(tmp_path, ".end") == []
