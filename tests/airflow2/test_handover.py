"""A restart of a real Airflow 2.11 scheduler hands its running tasks over: they run on, the next adopts them.

With the defaults (``on_stop = handover``, ``handover_timeout = 300``), a stopped scheduler exits within
seconds and a killed one leaves its tasks running; the next scheduler adopts them, so every task runs
once, at try 1, and its end is reported once. An adopted task's run-time limit (``task_timeout``)
counts from its launch, not from its adoption: the new scheduler holds it to what was left, and the one
end it reports is a failure. A handed-over task whose processes are gone by the restart is not adopted:
Airflow 2 resets its task instance in the same pass and it runs again, at try 2; so is one whose recorded
pid another process runs now, which is left alone, while the workload the record no longer names is
killed before the reset (its LocalTaskJob, left running, would write its end over the next try's). Each
task records every
execution it starts and ends (dags/handover2.py, dags/handover_overrun2.py), so the tests count
executions from the tasks themselves, not from the database alone. Nothing is mocked: Airflow 2.11's
scheduler (which parses the DAGs itself) on PostgreSQL, the default fork-server launcher, real task
processes.

What Airflow 2 does meanwhile, and why none of it stops an adopted task:

- The process tree. The executor's workload process (a child of the scheduler) runs ``airflow tasks
  run --local`` in itself: it is the task instance's LocalTaskJob, which forks the task's own process
  (``--raw``, in a process group of its own). The handover keeps both: the workload outlives the
  scheduler in custody (core/custody.py) and its task process stays tied to it alone.
- The LocalTaskJob needs no scheduler. It heartbeats its own ``job`` row (``[scheduler]
  job_heartbeat_sec``) and, at each beat, reads its task instance back: it stops the task only if the
  state is no longer ``running`` (which a reset would do: ``state = None``) or if the recorded hostname
  or pid are not its own. Adoption changes neither: the new scheduler's
  ``adopt_or_reset_orphaned_tasks`` sets ``queued_by_job_id`` to its own job for each task instance
  the executor adopted, and nothing else (try_number, ``job_id`` = the LocalTaskJob, ``pid`` stay).
- No zombie. A task instance is a zombie (2.x: ``_find_zombies``) only when its LocalTaskJob's row is
  not ``running`` or has not beaten for ``scheduler_zombie_task_threshold``, and only for the scheduler
  whose job queued it (``queued_by_job_id``). While no scheduler runs, nobody looks; the killed
  scheduler's tasks keep beating for longer than the threshold (checked below); once adopted, the
  task instance is the new scheduler's, whose check finds its LocalTaskJob fresh.
- One end. The task process writes its final state itself; the workload then exits 0 and records it
  (``<state_dir>/custody/<pid>-<start>.exit``), the adopter turns it into the one executor event
  Airflow gets (``Received executor event with state success``), checked below per task instance.
- A kill leaves Airflow 2's own helpers of the scheduler running (its DAG file processor manager, its
  log server), as systemd's ``KillMode=process`` does. Forked with the scheduler's pooled database
  connections open, they used to keep the transaction the kill cut short open, with its row locks: a
  task ending blocks on its run's row, and the run never finished. The executor closes the pool at its
  start (``scheduler_helpers.unshare_db_connections``); the crash test kills the scheduler at that worst moment.
- A timeout's end. The executor's limit SIGTERMs the workload's processes; the task process fails its
  task instance itself (``AirflowTaskTerminated``; not retried: ``failed``) and the run ends with it,
  before the workload's exit reaches the executor: its event (``failed``) comes after the run's end.
- A reset. The executor returns the task instance whose workload it does not hold; the scheduler sets its
  state to None (``Reset the following 1 orphaned TaskInstances``) and schedules it again, which raises
  its try number to 2. Its first try's LocalTaskJob must be gone by then: one still running sees its
  state changed and fails the task instance, at its new try (retries=1: for good).

The steps and checks these tests share with their Airflow 3 twins (tests/e2e/test_handover.py) are
tests/handover_scenarios.py's. What differs here: the DAGs (dags/handover2.py, dags/handover_overrun2.py);
the line with which the scheduler resets a task instance the executor refused, which these tests wait
for; the retried adoption's answer, which comes in one offer (no api-server holds a row meanwhile); and
what these tests check beyond their twins: the LocalTaskJobs and their heartbeats, zombies, the killed
scheduler's lock of the run's row, the task process that fails its own task instance on a timeout, and
the one executor event each end gets.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

import psutil
import pytest
import sqlalchemy as sa

from harness.airflow2 import Airflow2Sandbox
from tests import handover_scenarios as scenarios
from tests.core.helpers import alive
from tests.e2e.helpers import (
    bystander_at_recorded_pid,
    cmdline,
    final_events,
    first_tries,
    marks,
    poll,
    since,
)

pytestmark = pytest.mark.e2e

DAGS = Path(__file__).with_name("dags")
EXECUTOR = "async_local_executor.executor.AsyncLocalExecutor"
AIRFLOW2 = scenarios.Major(
    dag_id="handover2", overrun_dag_id="handover_overrun2", awaits_reset=True, split_offers=False
)
DAG_ID = AIRFLOW2.dag_id
OVERRUN_DAG_ID = AIRFLOW2.overrun_dag_id
TASKS = scenarios.TASKS
ZOMBIE_THRESHOLD = 20
QUICK_ORPHANS = {
    # A crashed scheduler's job counts as dead once its heartbeat is this old. Not 10 s: a scheduler
    # whose own start (its executor's reclaim included) takes longer on a loaded host counts itself
    # dead at its first check.
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "20",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__SCHEDULER_ZOMBIE_TASK_THRESHOLD": str(ZOMBIE_THRESHOLD),
}
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's error code for a NOWAIT lock another transaction holds


class Make(Protocol):
    def __call__(self, config: Mapping[str, str] | None = None) -> Airflow2Sandbox:
        """A started sandbox; ``config`` adds to its environment (``AIRFLOW__...`` options)."""


# A task instance: its map index, state, try, LocalTaskJob and the scheduler job that queued it.
Row = tuple[int, str, int, int, int]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    made: list[Airflow2Sandbox] = []

    def build(config: Mapping[str, str] | None = None) -> Airflow2Sandbox:
        sb = Airflow2Sandbox(
            executor=EXECUTOR,
            dags_folder=DAGS,
            parallelism=4,
            extra_config={"ALE_HANDOVER_DIR": str(tmp_path), **QUICK_ORPHANS, **(config or {})},
        )
        made.append(sb)
        sb.start()
        return sb

    yield build
    for sb in made:
        # What a failure is read from outlives the sandbox's home, beside the marks: the scheduler's log,
        # the tasks' logs and the executor's state directory (custody files, journals).
        for name, path in sb.process_logs.items():
            if path.exists():
                shutil.copyfile(path, tmp_path / f"{name}.log")
        for folder in ("logs", "async_local_executor"):
            if (sb.home / folder).is_dir():
                shutil.copytree(sb.home / folder, tmp_path / "home" / folder, dirs_exist_ok=True)
        sb.stop()


def _running(sandbox: Airflow2Sandbox, tmp_path: Path) -> tuple[str, list[int]]:
    """:func:`~tests.handover_scenarios.running`: each workload runs ``tasks run --local`` (the task
    instance's LocalTaskJob), which forked the task's own process (``tasks run --raw``)."""
    run_id, launched = scenarios.running(sandbox, tmp_path, AIRFLOW2)
    described = {pid: cmdline(pid) for pid in launched[:TASKS]}
    assert all("AsyncLocalExecutor" in " ".join(argv) for argv in described.values()), described
    return run_id, launched


def _rows(sandbox: Airflow2Sandbox, run_id: str) -> list[Row]:
    """The run's task instances, by map index."""
    return [
        (int(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]))
        for r in sandbox.query(
            "SELECT map_index, state, try_number, job_id, queued_by_job_id FROM task_instance "
            "WHERE dag_id = :dag_id AND run_id = :run_id ORDER BY map_index",
            dag_id=DAG_ID,
            run_id=run_id,
        )
    ]


def _finish_after_adoption(
    sandbox: Airflow2Sandbox, tmp_path: Path, run_id: str, launched: list[int], before: list[Row]
) -> None:
    scenarios.adopted(sandbox, launched)
    scenarios.name_the_new_scheduler_s_job(sandbox, AIRFLOW2, run_id)
    adopted = _rows(sandbox, run_id)
    # Still running at try 1 under the same LocalTaskJob; only the scheduler job that answers for it changed.
    assert [r[:4] for r in adopted] == [r[:4] for r in before], (adopted, before)
    scenarios.finish_at_try_1(sandbox, tmp_path, AIRFLOW2, run_id)
    # One final event per task instance, from the scheduler that adopted it.
    text = scenarios.reported_once(sandbox, AIRFLOW2, 0, [("success", i, 1) for i in range(TASKS)])
    assert "Detected zombie job" not in text
    assert "Reset the following" not in text
    # Each LocalTaskJob ran to its own end (it had, before its workload exited).
    jobs = sandbox.query("SELECT state FROM job WHERE id = ANY(:ids)", ids=[r[3] for r in before])
    assert sorted(str(j[0]) for j in jobs) == ["success"] * TASKS, jobs


def _run_locked(sandbox: Airflow2Sandbox, run_id: str) -> bool:
    """Whether another transaction holds a lock on the run's row that a task's end must wait for."""
    try:
        with sandbox.engine.connect() as conn:  # rolled back at its close: the probe keeps no lock
            conn.execute(
                sa.text(
                    "SELECT 1 FROM dag_run WHERE dag_id = :dag_id AND run_id = :run_id "
                    "FOR NO KEY UPDATE NOWAIT"
                ),
                {"dag_id": DAG_ID, "run_id": run_id},
            )
    except sa.exc.OperationalError as exc:
        if getattr(exc.orig, "pgcode", None) == LOCK_NOT_AVAILABLE:
            return True
        raise
    return False


def _stop_holding_the_run(sandbox: Airflow2Sandbox, run_id: str, guard: float = 120.0) -> None:
    """SIGSTOP the scheduler at a moment it holds its ``FOR UPDATE`` lock of the run's row.

    Each of its loops locks the running dag runs it examines, in a transaction of a few milliseconds;
    it is stopped, looked at and let go until it is caught in one.
    """
    scheduler = psutil.Process(sandbox.pids["scheduler"])
    deadline = time.monotonic() + guard
    while True:
        scheduler.suspend()
        caught = False
        try:
            caught = _run_locked(sandbox, run_id)
        finally:
            if not caught:
                scheduler.resume()
        if caught:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the scheduler was not caught holding its lock of the run within {guard:.0f}s"
            )
        time.sleep(0.05)  # let it run a little: the next look catches it elsewhere in its loop


def test_a_stopped_scheduler_hands_its_running_tasks_to_the_next_which_adopts_them(
    make: Make, tmp_path: Path
) -> None:
    sandbox = make()
    run_id, launched = _running(sandbox, tmp_path)
    before = _rows(sandbox, run_id)
    scenarios.stop_within_the_bound(sandbox, launched)
    sandbox.restart("scheduler")
    _finish_after_adoption(sandbox, tmp_path, run_id, launched, before)


def test_a_killed_scheduler_s_tasks_wait_for_the_next_which_adopts_them(make: Make, tmp_path: Path) -> None:
    sandbox = make()
    run_id, launched = _running(sandbox, tmp_path)
    before = _rows(sandbox, run_id)
    dead_job = scenarios.last_scheduler_job(sandbox)
    # Killed at the worst moment: inside a transaction that locks the run's row.
    _stop_holding_the_run(sandbox, run_id)
    sandbox.kill("scheduler")
    # Its helpers outlive it; its transaction must not (a task's end would wait on its lock for ever).
    poll("the killed scheduler's lock of the run to go", lambda: not _run_locked(sandbox, run_id), guard=30)
    # No scheduler at all: each LocalTaskJob beats on, longer than a zombie is given, and its task runs.
    poll(
        "the LocalTaskJobs to heartbeat past the zombie threshold without a scheduler",
        lambda: (
            sandbox.query(
                "SELECT count(*) FROM job t, job s WHERE t.id = ANY(:tasks) AND s.id = :dead "
                "AND t.state = 'running' "
                "AND t.latest_heartbeat > s.latest_heartbeat + :threshold * interval '1 second'",
                tasks=[r[3] for r in before],
                dead=dead_job,
                threshold=ZOMBIE_THRESHOLD,
            )[0][0]
            == TASKS
        ),
        guard=120,
    )
    assert all(alive(pid) for pid in launched), {pid: alive(pid) for pid in launched}
    assert marks(tmp_path, ".end") == []

    sandbox.restart("scheduler")
    _finish_after_adoption(sandbox, tmp_path, run_id, launched, before)


def _rerun_after_reset(
    sandbox: Airflow2Sandbox,
    tmp_path: Path,
    run_id: str,
    offset: int,
    gone: scenarios.Processes,
    adopted: scenarios.Processes,
) -> None:
    """:func:`~tests.handover_scenarios.runs_again` and :func:`~tests.handover_scenarios.rerun_ends`;
    each end is reported once.

    :param offset: where the new scheduler's log begins
    """
    retried = scenarios.runs_again(sandbox, tmp_path, gone, adopted)
    relaunched = retried[1]  # its LocalTaskJob, the new scheduler's workload
    assert psutil.Process(relaunched).ppid() == sandbox.pids["scheduler"], cmdline(relaunched)
    scenarios.rerun_ends(sandbox, tmp_path, AIRFLOW2, run_id, gone, adopted, retried)
    # One final event per try that ended here: none for hold0's first, which nobody held.
    text = scenarios.reported_once(sandbox, AIRFLOW2, offset, [("success", 0, 2), ("success", 1, 1)])
    assert "Detected zombie job" not in text


def test_a_handed_over_task_whose_process_vanished_before_the_restart_is_reset_and_runs_again(
    make: Make, tmp_path: Path
) -> None:
    sandbox = make()
    run_id, _ = _running(sandbox, tmp_path)
    hold0, hold1 = first_tries(tmp_path)
    scenarios.stop(sandbox, TASKS)
    scenarios.vanish(*hold0)  # its LocalTaskJob (its workload) and its task
    offset = scenarios.restart(sandbox)
    scenarios.adopts_hold1_only(sandbox, AIRFLOW2, offset, hold1[1])
    _rerun_after_reset(sandbox, tmp_path, run_id, offset, hold0, hold1)


def test_a_recorded_pid_another_process_runs_now_is_neither_adopted_nor_killed(
    make: Make, tmp_path: Path
) -> None:
    sandbox = make(
        {"AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT": str(scenarios.HANDOVER_TIMEOUT_REUSED)}
    )
    run_id, _ = _running(sandbox, tmp_path)
    hold0, hold1 = first_tries(tmp_path)
    scenarios.stop(sandbox, TASKS)
    stopped = time.monotonic()
    # Another process runs under the pid the journal records for hold0's workload (a pid reuse).
    with bystander_at_recorded_pid(sandbox, hold0[1]) as (other, other_start):
        offset = scenarios.restart(sandbox)
        scenarios.adopts_hold1_only(sandbox, AIRFLOW2, offset, hold1[1])
        scenarios.unrecorded_workload_ends(hold0, stopped)
        _rerun_after_reset(sandbox, tmp_path, run_id, offset, hold0, hold1)
        scenarios.untouched(other, other_start)


def test_an_adopted_task_times_out_when_what_was_left_of_its_limit_runs_out(
    make: Make, tmp_path: Path
) -> None:
    sandbox = make(scenarios.overrun_config(scenarios.OVERRUN_TIMEOUT))
    overrun = scenarios.overrun_running(sandbox, tmp_path, AIRFLOW2)
    scenarios.stop(sandbox, 1)
    scenarios.without_a_scheduler(overrun)
    assert alive(overrun.workload)
    assert alive(overrun.task)
    restarted = time.time()
    offset = scenarios.restart(sandbox)
    scenarios.ended_by_its_limit_from_launch(sandbox, AIRFLOW2, offset, overrun, scenarios.OVERRUN_TIMEOUT)
    scenarios.failed_in_its_one_execution(sandbox, tmp_path, AIRFLOW2, overrun)
    # On Airflow 2 the task process fails its task instance itself (SIGTERM: AirflowTaskTerminated), and
    # the run ends with it; the workload's exit, and the executor's event, come after.
    poll("its final event", lambda: final_events(since(sandbox, offset), OVERRUN_DAG_ID) != [], guard=60)
    text = since(sandbox, offset)
    reason = scenarios.held_to_what_was_left(text, overrun, restarted)
    assert f"workload {OVERRUN_DAG_ID}.overrun try 1 failed: {reason}" in text, text
    # Its end is reported once, by the executor that adopted it. Airflow 2's own zombie purge adds a failure
    # of its own when it finds the task instance still running, its LocalTaskJob's heartbeat gone (the
    # termination ended that job before it failed the task instance): that one follows its log line.
    assert text.count(f"workload {OVERRUN_DAG_ID}.overrun try 1 failed:") == 1, text[-30000:]
    purged = len(re.findall(rf"Detected zombie job: .*'DAG Id': '{OVERRUN_DAG_ID}'", text))
    assert final_events(text, OVERRUN_DAG_ID) == [("failed", -1, 1)] * (1 + purged), text[-30000:]


TWICE_TIMEOUT = 150.0  # the executor's run-time limit per task, for a task adopted twice
OPEN_AFTER = 115.0  # its gate opens then at the earliest: past a limit counted twice, well inside its own


def test_a_task_adopted_twice_after_its_adopter_crashed_finishes_inside_the_limit_counted_once(
    make: Make, tmp_path: Path
) -> None:
    sandbox = make(scenarios.overrun_config(TWICE_TIMEOUT))
    overrun = scenarios.overrun_running(sandbox, tmp_path, AIRFLOW2)
    offset = scenarios.adopted_twice_then_succeeds(
        sandbox, tmp_path, AIRFLOW2, overrun, TWICE_TIMEOUT, OPEN_AFTER
    )
    poll("its final event", lambda: final_events(since(sandbox, offset), OVERRUN_DAG_ID) != [], guard=60)
    text = scenarios.not_timed_out(sandbox, tmp_path, offset, overrun)
    assert final_events(text, OVERRUN_DAG_ID) == [("success", -1, 1)], final_events(text, OVERRUN_DAG_ID)


def test_a_retried_adoption_gets_the_same_answer(make: Make, tmp_path: Path) -> None:
    """Airflow 2 retries its adoption's transaction with the same task instances: the executor adopts them
    again, or Airflow would reset task instances whose LocalTaskJobs still run. The error is injected
    (tests/e2e/dags/chaos_adoption.py), its subclass loaded by its module path as Airflow 2 loads any
    executor: a real deadlock at that point of Airflow's transaction cannot be staged reliably. Everything
    else is real.
    """
    sandbox = make(scenarios.injecting(EXECUTOR))  # its base: the class path Airflow 2 configurations name
    run_id, launched = _running(sandbox, tmp_path)
    before = _rows(sandbox, run_id)
    scenarios.stop(sandbox, TASKS)
    offset = scenarios.restart_armed(sandbox)
    scenarios.adopted_again_after_the_injected_error(sandbox, AIRFLOW2, offset)
    # The retried transaction names the new scheduler's job; each task ends once, at try 1, its one end
    # reported once; nothing is reset.
    _finish_after_adoption(sandbox, tmp_path, run_id, launched, before)
