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
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

import psutil
import pytest
import sqlalchemy as sa

from async_local_executor.core.proc_identity import start_ticks
from harness.airflow2 import Airflow2Sandbox
from tests.core.helpers import alive
from tests.e2e.dags.chaos_adoption import BASE_ENV, INJECTED, ONCE_ENV
from tests.e2e.helpers import (
    bystander_at_recorded_pid,
    cmdline,
    final_events,
    first_tries,
    marks,
    poll,
    since,
    stop_scheduler,
    task_pid,
)

pytestmark = pytest.mark.e2e

DAGS = Path(__file__).with_name("dags")
EXECUTOR = "async_local_executor.executor.AsyncLocalExecutor"
DAG_ID = "handover2"
TASKS = 2
# The bound: a stopped scheduler exits within 10 s of the signal.
EXIT_BOUND = 10.0
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
    """Trigger the DAG; once both tasks run, the pids of their processes and of their workloads."""
    sandbox.wait_for_dag(DAG_ID, timeout=120)
    run_id = sandbox.trigger(DAG_ID)
    poll("both tasks running", lambda: len(marks(tmp_path, ".start")) == TASKS, guard=180)
    scheduler = sandbox.pids["scheduler"]
    tasks = [int(mark.rsplit(".pid", 1)[1]) for mark in marks(tmp_path, ".start")]
    assert len(tasks) == TASKS, tasks
    # The task's own process (`tasks run --raw`, forked) -> the workload process running `tasks run
    # --local` (its LocalTaskJob), which the executor launched as the scheduler's child.
    workloads = [psutil.Process(pid).ppid() for pid in tasks]
    described = {pid: cmdline(pid) for pid in workloads}
    assert [psutil.Process(pid).ppid() for pid in workloads] == [scheduler] * TASKS, described
    assert all("AsyncLocalExecutor" in " ".join(argv) for argv in described.values()), described
    return run_id, [*workloads, *tasks]


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


def _last_scheduler_job(sandbox: Airflow2Sandbox) -> int:
    """The job of the scheduler started last."""
    return int(sandbox.query("SELECT max(id) FROM job WHERE job_type = 'SchedulerJob'")[0][0])


def _finish_after_adoption(
    sandbox: Airflow2Sandbox, tmp_path: Path, run_id: str, launched: list[int], before: list[Row]
) -> None:
    log = sandbox.process_logs["scheduler"]
    poll(
        "the new scheduler to adopt both task instances",
        lambda: f"adopted {TASKS} task instance(s)" in log.read_text(errors="replace"),
        guard=120,
    )
    assert all(alive(pid) for pid in launched), {pid: alive(pid) for pid in launched}
    # The executor says so before the scheduler writes it: the adopted task instances name its job.
    poll(
        "the adopted task instances to name the new scheduler's job",
        lambda: [r[4] for r in _rows(sandbox, run_id)] == [_last_scheduler_job(sandbox)] * TASKS,
        guard=30,
    )
    adopted = _rows(sandbox, run_id)
    # Still running at try 1 under the same LocalTaskJob; only the scheduler job that answers for it changed.
    assert [r[:4] for r in adopted] == [r[:4] for r in before], (adopted, before)

    (tmp_path / "gate").write_text("")
    poll("the run to end", lambda: sandbox.run_state(DAG_ID, run_id) in ("success", "failed"), guard=180)
    rows = sandbox.task_instances(DAG_ID, run_id)
    assert sandbox.run_state(DAG_ID, run_id) == "success", rows
    assert [(r.state, r.try_number) for r in rows] == [("success", 1)] * TASKS, rows
    # One execution per task, which ran to its end: nothing was killed and nothing ran again.
    assert marks(tmp_path, ".start") == marks(tmp_path, ".end")
    assert [m.split(".")[1] for m in marks(tmp_path, ".start")] == ["try1"] * TASKS
    # One final event per task instance, from the scheduler that adopted it. The run's state comes from
    # the task instances' own, so the events may still be on their way.
    poll(
        "both final events",
        lambda: len(final_events(log.read_text(errors="replace"), DAG_ID)) >= TASKS,
        guard=60,
    )
    text = log.read_text(errors="replace")
    assert sorted(final_events(text, DAG_ID)) == [("success", i, 1) for i in range(TASKS)], final_events(
        text, DAG_ID
    )
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
    started = time.monotonic()
    stopped = stop_scheduler(sandbox)
    took = time.monotonic() - started
    assert took < EXIT_BOUND, f"the scheduler took {took:.1f}s to exit"
    assert f"handed over {TASKS} running task workload(s)" in stopped, stopped
    assert all(alive(pid) for pid in launched), {pid: alive(pid) for pid in launched}

    sandbox.restart("scheduler")
    _finish_after_adoption(sandbox, tmp_path, run_id, launched, before)


def test_a_killed_scheduler_s_tasks_wait_for_the_next_which_adopts_them(make: Make, tmp_path: Path) -> None:
    sandbox = make()
    run_id, launched = _running(sandbox, tmp_path)
    before = _rows(sandbox, run_id)
    dead_job = _last_scheduler_job(sandbox)
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


def _stop(sandbox: Airflow2Sandbox, running: int) -> None:
    """SIGTERM the scheduler, which hands its ``running`` task workloads over and exits."""
    stopped = stop_scheduler(sandbox)
    assert f"handed over {running} running task workload(s)" in stopped, stopped


def _restart(sandbox: Airflow2Sandbox) -> int:
    """Start the scheduler again; where its log begins."""
    offset = sandbox.process_logs["scheduler"].stat().st_size
    sandbox.restart("scheduler")
    return offset


def _adopts_hold1_only(sandbox: Airflow2Sandbox, offset: int, workload1: int) -> None:
    """The new scheduler adopts hold1 and has Airflow reset hold0, whose try 1 it does not hold."""
    poll(
        "the new scheduler to adopt hold1 only",
        lambda: "adopted 1 task instance(s)" in since(sandbox, offset),
        guard=120,
    )
    started = since(sandbox, offset)
    assert (
        f"1 handed over by a stopped scheduler, 0 left running by a crashed one (pid {workload1})" in started
    )
    assert "1 others are left for the scheduler to reset" in started, started
    # Airflow 2 resets what the executor refused in the same pass (state None): it is scheduled again.
    reset = r"Reset the following 1 orphaned TaskInstances:\s+<TaskInstance: handover2\.hold \S+ map_index=0 "
    # Its line follows the executor's in the same pass, so it may not be in the log yet.
    poll("Airflow to reset hold0", lambda: re.search(reset, since(sandbox, offset)) is not None, guard=60)


def _rerun_after_reset(
    sandbox: Airflow2Sandbox,
    tmp_path: Path,
    run_id: str,
    offset: int,
    gone: tuple[int, int],
    adopted: tuple[int, int],
) -> None:
    """hold0 was reset and runs again (try 2), hold1 was adopted; both end once the gate opens, each end is
    reported once, and nothing any of their executions started is left running.

    :param offset: where the new scheduler's log begins
    :param gone: hold0's first task and workload processes
    :param adopted: hold1's task and workload processes
    """
    poll("hold0 to run again", lambda: any(tmp_path.glob("hold0.try2.pid*.start")), guard=120)
    assert all(alive(pid) for pid in adopted), {pid: alive(pid) for pid in adopted}
    assert not any(alive(pid) for pid in gone), {pid: cmdline(pid) for pid in gone}
    retried = task_pid(tmp_path, "hold0.try2")
    relaunched = psutil.Process(retried).ppid()  # its LocalTaskJob, the new scheduler's workload
    assert psutil.Process(relaunched).ppid() == sandbox.pids["scheduler"], cmdline(relaunched)
    launched = [*gone, *adopted, retried, relaunched]
    (tmp_path / "gate").write_text("")
    poll("the run to end", lambda: sandbox.run_state(DAG_ID, run_id) in ("success", "failed"), guard=180)
    rows = sandbox.task_instances(DAG_ID, run_id)
    assert sandbox.run_state(DAG_ID, run_id) == "success", rows
    assert [(r.map_index, r.state, r.try_number) for r in rows] == [(0, "success", 2), (1, "success", 1)]
    # hold0's first execution ended with its process; its second and hold1's one ran to their end.
    first, kept = f"hold0.try1.pid{gone[0]}", f"hold1.try1.pid{adopted[0]}"
    again = f"hold0.try2.pid{retried}"
    assert marks(tmp_path, ".start") == [first, again, kept]
    assert marks(tmp_path, ".end") == [again, kept]
    # One final event per try that ended here: none for hold0's first, which nobody held.
    poll("both final events", lambda: len(final_events(since(sandbox, offset), DAG_ID)) >= TASKS, guard=60)
    text = since(sandbox, offset)
    assert sorted(final_events(text, DAG_ID)) == [("success", 0, 2), ("success", 1, 1)], final_events(
        text, DAG_ID
    )
    assert "Detected zombie job" not in text
    poll("every process of every execution to end", lambda: not any(alive(pid) for pid in launched), guard=60)


def test_a_handed_over_task_whose_process_vanished_before_the_restart_is_reset_and_runs_again(
    make: Make, tmp_path: Path
) -> None:
    sandbox = make()
    run_id, _ = _running(sandbox, tmp_path)
    (task0, workload0), (task1, workload1) = first_tries(tmp_path)
    _stop(sandbox, TASKS)
    # While no scheduler runs, hold0's LocalTaskJob (its workload) and its task vanish (the task process
    # leads a group of its own).
    for group in {os.getpgid(workload0), os.getpgid(task0)}:
        os.killpg(group, signal.SIGKILL)
    poll("hold0's processes to be gone", lambda: not alive(workload0) and not alive(task0), guard=30)

    offset = _restart(sandbox)
    _adopts_hold1_only(sandbox, offset, workload1)
    _rerun_after_reset(sandbox, tmp_path, run_id, offset, (task0, workload0), (task1, workload1))


HANDOVER_TIMEOUT_REUSED = 60.0


def test_a_recorded_pid_another_process_runs_now_is_neither_adopted_nor_killed(
    make: Make, tmp_path: Path
) -> None:
    sandbox = make({"AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT": str(HANDOVER_TIMEOUT_REUSED)})
    run_id, _ = _running(sandbox, tmp_path)
    (task0, workload0), (task1, workload1) = first_tries(tmp_path)
    _stop(sandbox, TASKS)
    stopped = time.monotonic()
    # Another process runs under the pid the journal records for hold0's workload (a pid reuse).
    with bystander_at_recorded_pid(sandbox, workload0) as (other, other_start):
        offset = _restart(sandbox)
        _adopts_hold1_only(sandbox, offset, workload1)
        # hold0's real workload is no handed-over workload any more, only a process the stopped
        # executor left running: killed as any such survivor (found by its cgroup or its mark), or,
        # if none finds it, by itself once nobody claimed it within its handover_timeout.
        poll(
            "hold0's processes to be gone",
            lambda: not alive(workload0) and not alive(task0),
            guard=HANDOVER_TIMEOUT_REUSED + 10.0 - (time.monotonic() - stopped),
        )
        _rerun_after_reset(sandbox, tmp_path, run_id, offset, (task0, workload0), (task1, workload1))
        # The process under the recorded pid was neither taken for the workload nor touched.
        assert other.poll() is None
        assert start_ticks(other.pid) == other_start


OVERRUN_DAG_ID = "handover_overrun2"
OVERRUN_TIMEOUT = 40.0  # the executor's run-time limit per task (task_timeout)
OVERRUN_GRACE = 5.0  # termination_grace_period: SIGTERM, then SIGKILL this much later
# How long after its launch the task is left without a scheduler at least: a limit counted from the
# adoption would end it at least this much later than one counted from the launch.
WITHOUT_SCHEDULER = 20.0
SLACK = 10.0  # the polls', and the killed processes' time to go


def _overrun_running(make: Make, tmp_path: Path, limit: float) -> tuple[Airflow2Sandbox, str, int, int, Path]:
    """A sandbox whose tasks have run-time limit ``limit``, with handover_overrun2's task running.

    :returns: the sandbox, the run, the task's process, its workload (its LocalTaskJob, which the
        executor launched) and the task's start mark
    """
    sandbox = make(
        {
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TASK_TIMEOUT": str(limit),
            "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE_PERIOD": str(OVERRUN_GRACE),
        }
    )
    sandbox.wait_for_dag(OVERRUN_DAG_ID, timeout=120)
    run_id = sandbox.trigger(OVERRUN_DAG_ID)
    poll("the task running", lambda: any(tmp_path.glob("overrun.try1.pid*.start")), guard=180)
    task = task_pid(tmp_path, "overrun.try1")
    workload = psutil.Process(task).ppid()
    assert psutil.Process(workload).ppid() == sandbox.pids["scheduler"], cmdline(workload)
    [mark] = tmp_path.glob("overrun.try1.pid*.start")
    return sandbox, run_id, task, workload, mark


def test_an_adopted_task_times_out_when_what_was_left_of_its_limit_runs_out(
    make: Make, tmp_path: Path
) -> None:
    sandbox, run_id, task, workload, mark = _overrun_running(make, tmp_path, OVERRUN_TIMEOUT)
    # Its workload was launched before the task wrote this (wall clock, as the file's time is).
    launched_by = mark.stat().st_mtime
    _stop(sandbox, 1)
    # Time passes with no scheduler at all: it counts against the limit as any other time it runs.
    poll(
        "the time without a scheduler to pass",
        lambda: time.time() > launched_by + WITHOUT_SCHEDULER,
        guard=WITHOUT_SCHEDULER + SLACK,
    )
    assert alive(workload)
    assert alive(task)
    restarted = time.time()
    offset = _restart(sandbox)
    poll(
        "the new scheduler to adopt it",
        lambda: "adopted 1 task instance(s)" in since(sandbox, offset),
        guard=120,
    )
    adopted_by = time.time()  # it was held (and its limit armed) before this
    poll(
        "its processes to be ended by the limit",
        lambda: not alive(workload) and not alive(task),
        guard=OVERRUN_TIMEOUT + OVERRUN_GRACE + SLACK,
    )
    ended = time.time()

    # Ended once its limit from its launch had run out, or at once if it had by the time the new scheduler
    # held it (a slow start), within the grace period; a limit counted from its adoption would have let it
    # run OVERRUN_TIMEOUT seconds past that.
    deadline = max(launched_by + OVERRUN_TIMEOUT, adopted_by)
    assert ended - deadline < OVERRUN_GRACE + SLACK, (ended - launched_by, adopted_by - launched_by)
    poll(
        "the run to end",
        lambda: sandbox.run_state(OVERRUN_DAG_ID, run_id) in ("success", "failed"),
        guard=120,
    )
    rows = sandbox.task_instances(OVERRUN_DAG_ID, run_id)
    assert sandbox.run_state(OVERRUN_DAG_ID, run_id) == "failed", rows
    assert [(r.state, r.try_number) for r in rows] == [("failed", 1)], rows
    # One execution, which never reached its end; nothing ran again.
    assert sorted(p.name for p in tmp_path.glob("overrun*")) == [mark.name]
    # On Airflow 2 the task process fails its task instance itself (SIGTERM: AirflowTaskTerminated), and
    # the run ends with it; the workload's exit, and the executor's event, come after.
    poll("its final event", lambda: final_events(since(sandbox, offset), OVERRUN_DAG_ID) != [], guard=60)
    text = since(sandbox, offset)
    found = re.search(r"overrun try 1 ran longer than its ([0-9.e+-]+)s timeout; terminating it", text)
    assert found is not None, text
    # The limit it was held to here was what was left of it at the restart at most.
    assert float(found[1]) < OVERRUN_TIMEOUT - (restarted - launched_by), found[0]
    assert f"workload {OVERRUN_DAG_ID}.overrun try 1 failed: timed out after {found[1]}s" in text, text
    # Its end is reported once, by the executor that adopted it. Airflow 2's own zombie purge adds a failure
    # of its own when it finds the task instance still running, its LocalTaskJob's heartbeat gone (the
    # termination ended that job before it failed the task instance): that one follows its log line.
    assert text.count(f"workload {OVERRUN_DAG_ID}.overrun try 1 failed:") == 1, text[-30000:]
    purged = len(re.findall(rf"Detected zombie job: .*'DAG Id': '{OVERRUN_DAG_ID}'", text))
    assert final_events(text, OVERRUN_DAG_ID) == [("failed", -1, 1)] * (1 + purged), text[-30000:]


TWICE_TIMEOUT = 150.0  # the executor's run-time limit per task, for a task adopted twice
# How long it runs before the stop: a limit counted twice would be over at TWICE_TIMEOUT - STOP_AFTER.
STOP_AFTER = 45.0
OPEN_AFTER = 115.0  # when its gate opens at the earliest: past that point, well inside its limit


def test_a_task_adopted_twice_after_its_adopter_crashed_finishes_inside_the_limit_counted_once(
    make: Make, tmp_path: Path
) -> None:
    # Handed over by a stop, adopted, then left behind by a crash of its adopter and adopted again: its
    # limit is the deadline its launch set, whatever happened since. Its gate opens once a limit counted
    # twice would have ended it, and well before its own deadline: it must end as it decides, at try 1.
    sandbox, run_id, task, workload, mark = _overrun_running(make, tmp_path, TWICE_TIMEOUT)
    launched_by = mark.stat().st_mtime
    poll("part of its limit to run", lambda: time.time() > launched_by + STOP_AFTER, guard=STOP_AFTER + 30)
    _stop(sandbox, 1)
    offset = _restart(sandbox)
    poll("the first adoption", lambda: "adopted 1 task instance(s)" in since(sandbox, offset), guard=120)
    sandbox.kill("scheduler")
    offset = _restart(sandbox)
    poll("the second adoption", lambda: "adopted 1 task instance(s)" in since(sandbox, offset), guard=120)
    text = since(sandbox, offset)
    assert "0 handed over by a stopped scheduler, 1 left running by a crashed one" in text, text
    poll("the point a limit counted twice is past", lambda: time.time() > launched_by + OPEN_AFTER, guard=120)
    assert time.time() < launched_by + TWICE_TIMEOUT - SLACK, "too slow to tell: its limit is nearly out"
    assert alive(task), since(sandbox, offset)
    assert alive(workload)
    (tmp_path / "gate").touch()
    poll(
        "the run to end",
        lambda: sandbox.run_state(OVERRUN_DAG_ID, run_id) in ("success", "failed"),
        guard=120,
    )
    rows = sandbox.task_instances(OVERRUN_DAG_ID, run_id)
    assert [(r.state, r.try_number) for r in rows] == [("success", 1)], rows
    poll("its final event", lambda: final_events(since(sandbox, offset), OVERRUN_DAG_ID) != [], guard=60)
    text = since(sandbox, offset)
    assert "timeout; terminating it" not in text
    assert final_events(text, OVERRUN_DAG_ID) == [("success", -1, 1)], final_events(text, OVERRUN_DAG_ID)
    # One execution, which reached its end; nothing ran again.
    ended = mark.name.replace(".start", ".end")
    assert sorted(p.name for p in tmp_path.glob("overrun*")) == sorted([mark.name, ended])


REPO = Path(__file__).resolve().parents[2]
# The executor under test through the subclass that injects one retried adoption (loaded by its module
# path, as Airflow 2 loads any executor), armed only in the scheduler started with ONCE_ENV=1.
INJECTING = {
    "AIRFLOW__CORE__EXECUTOR": "tests.e2e.dags.chaos_adoption.RetriedAdoptionExecutor",
    BASE_ENV: EXECUTOR,  # its base: the class path Airflow 2 configurations name
    ONCE_ENV: "",
    # The scheduler imports the subclass from this repository.
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
}
ADOPTED = re.compile(r"adopted (\d+) task instance\(s\)")


def test_a_retried_adoption_gets_the_same_answer(make: Make, tmp_path: Path) -> None:
    """Airflow 2 calls ``try_adopt_task_instances`` inside ``run_with_db_retries``: when its transaction
    fails (a deadlock with another scheduler, a dropped connection), it rolls back (the task instances'
    ``queued_by_job_id`` included) and asks again with the same task instances. The executor must adopt
    them again; refused, Airflow would reset task instances whose LocalTaskJobs still run, and run them
    twice.

    Injected: the restarted scheduler loads the executor through a subclass whose
    ``try_adopt_task_instances`` raises ``OperationalError`` once, right after the real call adopted
    something (tests/e2e/dags/chaos_adoption.py). A real deadlock at that point of Airflow's transaction
    cannot be staged reliably. Everything else is real.
    """
    sandbox = make(INJECTING)
    run_id, launched = _running(sandbox, tmp_path)
    before = _rows(sandbox, run_id)
    _stop(sandbox, TASKS)
    sandbox.reconfigure({ONCE_ENV: "1"})
    try:
        offset = _restart(sandbox)
    finally:
        sandbox.reconfigure({ONCE_ENV: ""})  # for the restarted scheduler alone

    def retried() -> bool:
        text = since(sandbox, offset)
        return INJECTED in text and ADOPTED.search(text, text.index(INJECTED)) is not None

    poll("Airflow to offer the task instances again after the injected error", retried, guard=180)
    text = since(sandbox, offset)
    assert text.count(INJECTED) == 1, text
    # The first call adopted both, the error followed it, and the retry adopted the same two again.
    calls = [(found.start(), found[1]) for found in ADOPTED.finditer(text)]
    injected = text.index(INJECTED)
    assert [n for at, n in calls if at < injected] == [str(TASKS)], text
    assert [n for at, n in calls if at > injected] == [str(TASKS)], text
    # The retried transaction names the new scheduler's job; each task ends once, at try 1, its one end
    # reported once; nothing is reset.
    _finish_after_adoption(sandbox, tmp_path, run_id, launched, before)
