"""A scheduler restart hands running tasks over: they run on and the next scheduler adopts them.

With the defaults (``on_stop = handover``, ``handover_timeout = 300``), a stopped scheduler exits within
seconds and a killed one leaves its tasks running; the next scheduler adopts them, so every task runs
once, at try 1, and its end is reported. Without a successor, the tasks kill themselves once
``handover_timeout`` has passed. An adopted task's run-time limit counts from its launch, not from its
adoption, also when its adopter crashes and the next scheduler adopts it again. A handed-over task whose process is gone by the restart, or whose recorded pid another process
runs now, is not adopted: the scheduler resets it and it runs again, and the other process is left alone.
Each task records every execution it starts and ends (dags/handover.py, dags/handover_overrun.py), so the
tests count executions from the tasks themselves, not from Airflow's database alone.

Nothing is mocked: a real Airflow 3.3 (scheduler, api-server, dag-processor) on SQLite, the default
fork-server launcher, real task processes.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from async_local_executor.core.proc_identity import start_ticks
from harness.sandbox import AirflowSandbox
from tests.core.helpers import alive
from tests.e2e.dags.chaos_adoption import BASE_ENV, INJECTED, ONCE_ENV
from tests.e2e.helpers import (
    QUICK_ORPHANS,
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

TASKS = 2
pytestmark = [pytest.mark.e2e, pytest.mark.sandbox(parallelism=4, config=QUICK_ORPHANS)]
# The bound: a stopped scheduler exits within 10 s of the signal.
EXIT_BOUND = 10.0


def _running(sandbox: AirflowSandbox, tmp_path: Path) -> tuple[str, list[int]]:
    """Trigger the DAG; once both tasks run, the pids of what the scheduler launched for them."""
    sandbox.wait_for_dag("handover", timeout=120)
    run_id = sandbox.trigger("handover")
    poll("both tasks running", lambda: len(marks(tmp_path, ".start")) == TASKS)
    scheduler = psutil.Process(sandbox.pids["scheduler"])
    # Each task process and the workload process that supervises it, which the scheduler launched.
    tasks = [int(mark.rsplit(".pid", 1)[1]) for mark in marks(tmp_path, ".start")]
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
    assert marks(tmp_path, ".start") == marks(tmp_path, ".end")
    assert [m.split(".")[1] for m in marks(tmp_path, ".start")] == ["try1"] * TASKS


def test_a_stopped_scheduler_hands_its_running_tasks_to_the_next_which_adopts_them(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, launched = _running(sandbox, tmp_path)
    started = time.monotonic()
    stopped = stop_scheduler(sandbox)
    took = time.monotonic() - started
    assert took < EXIT_BOUND, f"the scheduler took {took:.1f}s to exit"
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
    assert marks(tmp_path, ".end") == []


def _stop(sandbox: AirflowSandbox) -> None:
    """SIGTERM the scheduler, which hands both running tasks over."""
    stopped = stop_scheduler(sandbox)
    assert f"handed over {TASKS} running task workload(s)" in stopped, stopped


def _restart(sandbox: AirflowSandbox) -> int:
    """Start the scheduler again; where its log begins."""
    before = sandbox.process_logs["scheduler"].stat().st_size
    sandbox.restart("scheduler")
    return before


def _rerun_after_reset(
    sandbox: AirflowSandbox, tmp_path: Path, run_id: str, gone: tuple[int, int], adopted: tuple[int, int]
) -> None:
    """hold0 was reset and runs again (try 2), hold1 was adopted; both end once the gate opens, and
    nothing any of their executions started is left running.

    :param gone: hold0's first workload and task processes
    :param adopted: hold1's workload and task processes
    """
    poll("hold0 to run again", lambda: any(tmp_path.glob("hold0.try2.pid*.start")))
    assert all(alive(pid) for pid in adopted), {pid: alive(pid) for pid in adopted}
    assert not any(alive(pid) for pid in gone), {pid: cmdline(pid) for pid in gone}
    retried = task_pid(tmp_path, "hold0.try2")
    launched = [*gone, *adopted, retried, psutil.Process(retried).ppid()]
    (tmp_path / "gate").write_text("")
    poll("the run to end", lambda: sandbox.run_state("handover", run_id) in ("success", "failed"))
    rows = sandbox.task_instances("handover", run_id)
    assert sandbox.run_state("handover", run_id) == "success", rows
    assert [(r.map_index, r.state, r.try_number) for r in rows] == [(0, "success", 2), (1, "success", 1)]
    # hold0's first execution ended with its process; its second and hold1's one ran to their end.
    first, kept = f"hold0.try1.pid{gone[1]}", f"hold1.try1.pid{adopted[1]}"
    again = f"hold0.try2.pid{retried}"
    assert marks(tmp_path, ".start") == [first, again, kept]
    assert marks(tmp_path, ".end") == [again, kept]
    poll("every process of every execution to end", lambda: not any(alive(pid) for pid in launched))


def test_a_handed_over_task_whose_process_vanished_before_the_restart_is_reset_and_runs_again(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, _ = _running(sandbox, tmp_path)
    (task0, workload0), (task1, workload1) = first_tries(tmp_path)
    _stop(sandbox)
    # While no scheduler runs, hold0's workload and its task vanish (the task leads a group of its own).
    for group in {os.getpgid(workload0), os.getpgid(task0)}:
        os.killpg(group, signal.SIGKILL)
    poll("hold0's processes to be gone", lambda: not alive(workload0) and not alive(task0))

    offset = _restart(sandbox)
    poll(
        "the new scheduler to adopt hold1 only",
        lambda: "adopted 1 task instance(s)" in since(sandbox, offset),
    )
    started = since(sandbox, offset)
    assert (
        f"1 handed over by a stopped scheduler, 0 left running by a crashed one (pid {workload1})" in started
    )
    assert "1 others are left for the scheduler to reset" in started, started
    _rerun_after_reset(sandbox, tmp_path, run_id, (workload0, task0), (workload1, task1))


HANDOVER_TIMEOUT_REUSED = 60.0


@pytest.mark.sandbox(config={"AIRFLOW__ASYNC_LOCAL_EXECUTOR__HANDOVER_TIMEOUT": str(HANDOVER_TIMEOUT_REUSED)})
def test_a_recorded_pid_another_process_runs_now_is_neither_adopted_nor_killed(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, _ = _running(sandbox, tmp_path)
    (task0, workload0), (task1, workload1) = first_tries(tmp_path)
    _stop(sandbox)
    stopped = time.monotonic()
    # Another process runs under the pid the journal records for hold0's workload (a pid reuse).
    with bystander_at_recorded_pid(sandbox, workload0) as (other, other_start):
        offset = _restart(sandbox)
        poll(
            "the new scheduler to adopt hold1 only",
            lambda: "adopted 1 task instance(s)" in since(sandbox, offset),
        )
        started = since(sandbox, offset)
        assert (
            f"1 handed over by a stopped scheduler, 0 left running by a crashed one (pid {workload1})"
            in started
        )
        assert "1 others are left for the scheduler to reset" in started, started
        # hold0's real workload is no handed-over workload any more, only a process the stopped
        # executor left running: killed as any such survivor (found by its cgroup or its mark), or,
        # if none finds it, by itself once nobody claimed it within its handover_timeout.
        poll(
            "hold0's processes to be gone",
            lambda: not alive(workload0) and not alive(task0),
            guard=HANDOVER_TIMEOUT_REUSED + 10.0 - (time.monotonic() - stopped),
        )
        _rerun_after_reset(sandbox, tmp_path, run_id, (workload0, task0), (workload1, task1))
        # The process under the recorded pid was neither taken for the workload nor touched.
        assert other.poll() is None
        assert start_ticks(other.pid) == other_start


OVERRUN_TIMEOUT = 40.0  # the executor's run-time limit per task (task_timeout)
OVERRUN_GRACE = 5.0  # termination_grace_period: SIGTERM, then SIGKILL this much later
# How long after its launch the task is left without a scheduler at least: a limit counted from the
# adoption would end it at least this much later than one counted from the launch.
WITHOUT_SCHEDULER = 20.0
SLACK = 10.0  # the polls', and the killed processes' time to go


def _overrun_handed_over(sandbox: AirflowSandbox, tmp_path: Path) -> tuple[str, int, int, Path]:
    """Trigger handover_overrun, and once its task runs, SIGTERM the scheduler, which hands it over.

    :returns: the run, the task's process, its workload process, and the task's start mark, written
        after its workload's launch (wall clock, as the file's time is)
    """
    sandbox.wait_for_dag("handover_overrun", timeout=120)
    run_id = sandbox.trigger("handover_overrun")
    poll("the task running", lambda: any(tmp_path.glob("overrun.try1.pid*.start")))
    task = task_pid(tmp_path, "overrun.try1")
    workload = psutil.Process(task).ppid()
    assert psutil.Process(workload).ppid() == sandbox.pids["scheduler"]
    [mark] = tmp_path.glob("overrun.try1.pid*.start")
    assert "handed over 1 running task workload(s)" in stop_scheduler(sandbox)
    return run_id, task, workload, mark


def _ended_by_its_limit_from_launch(
    sandbox: AirflowSandbox,
    offset: int,
    run_id: str,
    processes: tuple[int, int],
    launched_by: float,
    limit: float,
) -> None:
    """The scheduler whose log begins at ``offset`` adopts the overrunning task and ends its processes
    once ``limit`` from its launch has run out, or at once if it had by the time the new scheduler held
    it (a slow start), within the grace period: a limit counted from its adoption would have let it run
    ``limit`` seconds past that. Then the run ends."""
    poll("the new scheduler to adopt it", lambda: "adopted 1 task instance(s)" in since(sandbox, offset))
    adopted_by = time.time()  # it was held (and its limit armed) before this
    poll("its processes to be ended by the limit", lambda: not any(alive(pid) for pid in processes))
    ended = time.time()
    deadline = max(launched_by + limit, adopted_by)
    assert ended - deadline < OVERRUN_GRACE + SLACK, (ended - launched_by, adopted_by - launched_by)
    poll("the run to end", lambda: sandbox.run_state("handover_overrun", run_id) in ("success", "failed"))


@pytest.mark.sandbox(
    config={
        "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TASK_TIMEOUT": str(OVERRUN_TIMEOUT),
        "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE_PERIOD": str(OVERRUN_GRACE),
    }
)
def test_an_adopted_task_times_out_when_what_was_left_of_its_limit_runs_out(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, task, workload, mark = _overrun_handed_over(sandbox, tmp_path)
    launched_by = mark.stat().st_mtime
    # Time passes with no scheduler at all: it counts against the limit as any other time it runs.
    poll("the time without a scheduler to pass", lambda: time.time() > launched_by + WITHOUT_SCHEDULER)
    restarted = time.time()
    offset = _restart(sandbox)
    _ended_by_its_limit_from_launch(sandbox, offset, run_id, (task, workload), launched_by, OVERRUN_TIMEOUT)
    text = since(sandbox, offset)
    found = re.search(r"overrun try 1 ran longer than its ([0-9.e+-]+)s timeout; terminating it", text)
    assert found is not None, text
    # The limit it was held to here was what was left of it at the restart at most.
    assert float(found[1]) < OVERRUN_TIMEOUT - (restarted - launched_by), found[0]
    assert "workload handover_overrun.overrun try 1 failed: " in text, text
    rows = sandbox.task_instances("handover_overrun", run_id)
    assert sandbox.run_state("handover_overrun", run_id) == "failed", rows
    assert [(r.state, r.try_number) for r in rows] == [("failed", 1)], rows
    # One execution, which never reached its end; nothing ran again.
    assert sorted(p.name for p in tmp_path.glob("overrun*")) == [mark.name]


TWICE_TIMEOUT = 120.0  # the executor's run-time limit per task, for a task adopted twice
# How long it runs before the stop: a limit counted twice would be over at TWICE_TIMEOUT - STOP_AFTER.
STOP_AFTER = 45.0
OPEN_AFTER = 85.0  # when its gate opens at the earliest: past that point, well inside its limit


@pytest.mark.sandbox(
    config={
        "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TASK_TIMEOUT": str(TWICE_TIMEOUT),
        "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE_PERIOD": str(OVERRUN_GRACE),
    }
)
def test_a_task_adopted_twice_after_its_adopter_crashed_finishes_inside_the_limit_counted_once(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    # Handed over by a stop, adopted, then left behind by a crash of its adopter and adopted again: its
    # limit is the deadline its launch set, whatever happened since. Its gate opens once a limit counted
    # twice would have ended it, and well before its own deadline: it must end as it decides, at try 1.
    sandbox.wait_for_dag("handover_overrun", timeout=120)
    run_id = sandbox.trigger("handover_overrun")
    poll("the task running", lambda: any(tmp_path.glob("overrun.try1.pid*.start")))
    task = task_pid(tmp_path, "overrun.try1")
    workload = psutil.Process(task).ppid()
    [mark] = tmp_path.glob("overrun.try1.pid*.start")
    launched_by = mark.stat().st_mtime
    poll("part of its limit to run", lambda: time.time() > launched_by + STOP_AFTER, guard=STOP_AFTER + 30)
    assert "handed over 1 running task workload(s)" in stop_scheduler(sandbox)
    offset = _restart(sandbox)
    poll("the first adoption", lambda: "adopted 1 task instance(s)" in since(sandbox, offset))
    sandbox.kill("scheduler")
    offset = _restart(sandbox)
    poll("the second adoption", lambda: "adopted 1 task instance(s)" in since(sandbox, offset))
    text = since(sandbox, offset)
    assert "0 handed over by a stopped scheduler, 1 left running by a crashed one" in text, text
    poll("the point a limit counted twice is past", lambda: time.time() > launched_by + OPEN_AFTER)
    assert time.time() < launched_by + TWICE_TIMEOUT - SLACK, "too slow to tell: its limit is nearly out"
    assert alive(task), since(sandbox, offset)
    assert alive(workload)
    (tmp_path / "gate").touch()
    poll("the run to end", lambda: sandbox.run_state("handover_overrun", run_id) in ("success", "failed"))
    rows = sandbox.task_instances("handover_overrun", run_id)
    assert [(r.state, r.try_number) for r in rows] == [("success", 1)], rows
    assert "timeout; terminating it" not in since(sandbox, offset)
    # One execution, which reached its end; nothing ran again.
    assert sorted(p.name for p in tmp_path.glob("overrun*")) == sorted(
        [mark.name, mark.name.replace(".start", ".end")]
    )


REPO = Path(__file__).resolve().parents[2]
# The executor under test through the subclass that injects one retried adoption; armed only in the
# scheduler started with ONCE_ENV=1.
INJECTING = {
    "AIRFLOW__CORE__EXECUTOR": "tests.e2e.dags.chaos_adoption.RetriedAdoptionExecutor",
    BASE_ENV: "",  # its base: this executor's default class path
    ONCE_ENV: "",
    # The scheduler imports the subclass from this repository.
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
}
ADOPTED = re.compile(r"adopted (\d+) task instance\(s\)")
ANSWERED = re.compile(
    r"adopted (\d+) task instance\(s\) whose workloads were handed over to this scheduler; (\d+) others"
)
OFFER_GUARD = 180.0  # the restart to Airflow's retried offer: the scheduler's start and its first loop


def _queued_by(sandbox: AirflowSandbox, run_id: str) -> list[int | None]:
    """The scheduler job each of the run's task instances names, by map index."""
    rows = sandbox.query(
        "SELECT queued_by_job_id FROM task_instance WHERE dag_id = 'handover' AND run_id = :run_id "
        "ORDER BY map_index",
        run_id=run_id,
    )
    return [None if r[0] is None else int(r[0]) for r in rows]


def _last_scheduler_job(sandbox: AirflowSandbox) -> int:
    """The job of the scheduler started last."""
    return int(sandbox.query("SELECT max(id) FROM job WHERE job_type = 'SchedulerJob'")[0][0])


def _restart_armed(sandbox: AirflowSandbox) -> int:
    """Start the scheduler again with the injected error armed (for it alone); where its log begins."""
    sandbox.reconfigure({ONCE_ENV: "1"})
    try:
        return _restart(sandbox)
    finally:
        sandbox.reconfigure({ONCE_ENV: ""})


# PostgreSQL, the database whose deadlocks and dropped connections make Airflow retry the transaction.
@pytest.mark.sandbox(database="postgres", config=INJECTING)
def test_a_retried_adoption_gets_the_same_answer(sandbox: AirflowSandbox, tmp_path: Path) -> None:
    """Airflow calls ``try_adopt_task_instances`` inside ``run_with_db_retries``: when its transaction
    fails (a deadlock with another scheduler, a dropped connection), it rolls back (the task instances'
    ``queued_by_job_id`` included) and asks again with the same task instances. The executor must adopt
    them again; refused, Airflow would reset task instances whose workloads still run, and run them twice.

    Injected: the restarted scheduler loads the executor through a subclass whose
    ``try_adopt_task_instances`` raises ``OperationalError`` once, right after the real call adopted
    something (tests/e2e/dags/chaos_adoption.py). A real deadlock at that point of Airflow's transaction
    cannot be staged reliably. Everything else is real.
    """
    run_id, launched = _running(sandbox, tmp_path)
    _stop(sandbox)
    offset = _restart_armed(sandbox)

    def offered_again() -> list[tuple[int, int]]:
        """(adopted, refused) of each offer after the injected error."""
        text = since(sandbox, offset)
        if INJECTED not in text:
            return []
        return [(int(found[1]), int(found[2])) for found in ANSWERED.finditer(text, text.index(INJECTED))]

    poll(
        "Airflow to offer both task instances again after the injected error",
        lambda: sum(adopted for adopted, _ in offered_again()) >= TASKS,
        guard=OFFER_GUARD,
    )
    text = since(sandbox, offset)
    assert text.count(INJECTED) == 1, text
    # The first call adopted both, the error followed it, and the retry adopted the same two again: in
    # one offer, or in two when Airflow's query (FOR UPDATE SKIP LOCKED, on PostgreSQL) skipped a row the
    # api-server held at that instant, which the next orphan check offers. None was refused.
    calls = [(found.start(), found[1]) for found in ADOPTED.finditer(text)]
    injected = text.index(INJECTED)
    assert [n for at, n in calls if at < injected] == [str(TASKS)], text
    again = offered_again()
    assert sum(adopted for adopted, _ in again) == TASKS, text
    assert all(refused == 0 for _, refused in again), text
    # The retried transaction is the one that committed: both task instances name the new scheduler's job.
    poll(
        "the adopted task instances to name the new scheduler's job",
        lambda: _queued_by(sandbox, run_id) == [_last_scheduler_job(sandbox)] * TASKS,
        guard=30,
    )
    _finish_after_adoption(sandbox, tmp_path, run_id, launched)
    # Each end is reported once, by the scheduler that adopted it; the run's state comes from the task
    # instances' own, so the events may still be on their way.
    poll(
        "both final events", lambda: len(final_events(since(sandbox, offset), "handover")) >= TASKS, guard=60
    )
    text = since(sandbox, offset)
    events = final_events(text, "handover")
    assert sorted(events) == [("success", i, 1) for i in range(TASKS)], events
    assert "Reset the following" not in text, text
