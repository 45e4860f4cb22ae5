"""A restarted scheduler adopts the tasks its predecessor handed over, on Airflow 3 and on Airflow 2: the
steps and checks both majors' tests share (tests/e2e/test_handover.py, tests/airflow2/test_handover.py).

Each step takes either major's sandbox (:class:`~harness.airflow2.Airflow2Sandbox` is an
:class:`~harness.sandbox.AirflowSandbox`) and its :class:`Major`: the DAGs it runs, and where its runs or
its checks differ. The tasks record every execution they start and end in the test's folder
(``hold<i>.try<N>.pid<P>.start`` and ``.end``, ``overrun.try<N>.pid<P>.start``), so the steps count
executions from the tasks themselves, not from Airflow's database alone. A task's process is a child of
its workload process, which the scheduler's executor launched (on Airflow 2 the workload is the task
instance's LocalTaskJob, which forked the task).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psutil

from async_local_executor.core.proc_identity import start_ticks
from harness.sandbox import AirflowSandbox
from tests.core.helpers import alive
from tests.e2e.dags.chaos_adoption import BASE_ENV, INJECTED, ONCE_ENV
from tests.e2e.helpers import cmdline, final_events, marks, poll, since, stop_scheduler, task_pid

TASKS = 2  # the handover DAGs' mapped hold tasks
# A stopped scheduler exits within seconds of the signal; 10 s bounds it with room for a loaded host.
EXIT_BOUND = 10.0
# A task's processes, as the tests hold them: its own (the one that leaves the marks) and its workload.
Processes = tuple[int, int]


@dataclass(frozen=True)
class Major:
    """What the handover scenarios run and read on one Airflow major."""

    dag_id: str
    """Two mapped ``hold`` tasks (retries=1) that run until the test's gate opens."""
    overrun_dag_id: str
    """One ``overrun`` task (not retried) that only the executor's run-time limit or the gate ends."""
    awaits_reset: bool
    """Whether the test waits for the line with which the scheduler resets hold0, whose try 1 the
    executor did not hold, in the adoption's pass (``Reset the following 1 orphaned TaskInstances``).
    Airflow 3.3's scheduler logs the same line; only the Airflow 2 tests wait for it."""
    split_offers: bool
    """Whether the retried adoption's answer may come in two offers: on Airflow 3, Airflow's query (``FOR
    UPDATE SKIP LOCKED``, on PostgreSQL) skips a row the api-server holds at that instant, and the next
    orphan check offers it. Otherwise the retry offers both task instances at once."""


def running(sandbox: AirflowSandbox, folder: Path, major: Major) -> tuple[str, list[int]]:
    """Trigger the DAG; once both tasks run, its run and the pids of their workloads and task processes,
    the workloads first (each a child of the scheduler)."""
    sandbox.wait_for_dag(major.dag_id, timeout=120)
    run_id = sandbox.trigger(major.dag_id)
    poll("both tasks running", lambda: len(marks(folder, ".start")) == TASKS)
    tasks = [int(mark.rsplit(".pid", 1)[1]) for mark in marks(folder, ".start")]
    assert len(tasks) == TASKS, tasks
    workloads = [psutil.Process(pid).ppid() for pid in tasks]
    assert [psutil.Process(pid).ppid() for pid in workloads] == [sandbox.pids["scheduler"]] * TASKS, {
        pid: cmdline(pid) for pid in workloads
    }
    return run_id, [*workloads, *tasks]


def stop_within_the_bound(sandbox: AirflowSandbox, launched: Sequence[int]) -> None:
    """SIGTERM the scheduler: it exits within :data:`EXIT_BOUND`, handing both tasks over, whose
    processes (``launched``) run on."""
    started = time.monotonic()
    stopped = stop_scheduler(sandbox)
    took = time.monotonic() - started
    assert took < EXIT_BOUND, f"the scheduler took {took:.1f}s to exit"
    assert f"handed over {TASKS} running task workload(s)" in stopped, stopped
    assert all(alive(pid) for pid in launched), {pid: alive(pid) for pid in launched}


def stop(sandbox: AirflowSandbox, running: int) -> None:
    """SIGTERM the scheduler, which hands its ``running`` task workloads over and exits."""
    stopped = stop_scheduler(sandbox)
    assert f"handed over {running} running task workload(s)" in stopped, stopped


def restart(sandbox: AirflowSandbox) -> int:
    """Start the scheduler again; where its log begins."""
    offset = sandbox.process_logs["scheduler"].stat().st_size
    sandbox.restart("scheduler")
    return offset


def adopted(sandbox: AirflowSandbox, launched: Sequence[int]) -> None:
    """The new scheduler adopts both task instances; their processes (``launched``) still run."""
    log = sandbox.process_logs["scheduler"]
    poll(
        "the new scheduler to adopt both task instances",
        lambda: f"adopted {TASKS} task instance(s)" in log.read_text(errors="replace"),
    )
    assert all(alive(pid) for pid in launched), {pid: alive(pid) for pid in launched}


def last_scheduler_job(sandbox: AirflowSandbox) -> int:
    """The job of the scheduler started last."""
    return int(sandbox.query("SELECT max(id) FROM job WHERE job_type = 'SchedulerJob'")[0][0])


def queued_by(sandbox: AirflowSandbox, major: Major, run_id: str) -> list[int | None]:
    """The scheduler job each of the run's task instances names, by map index."""
    rows = sandbox.query(
        "SELECT queued_by_job_id FROM task_instance WHERE dag_id = :dag_id AND run_id = :run_id "
        "ORDER BY map_index",
        dag_id=major.dag_id,
        run_id=run_id,
    )
    return [None if r[0] is None else int(r[0]) for r in rows]


def name_the_new_scheduler_s_job(sandbox: AirflowSandbox, major: Major, run_id: str) -> None:
    """The adopted task instances name the new scheduler's job: the transaction of the adoption that
    committed wrote it (the executor says it adopted them before Airflow does)."""
    poll(
        "the adopted task instances to name the new scheduler's job",
        lambda: queued_by(sandbox, major, run_id) == [last_scheduler_job(sandbox)] * TASKS,
        guard=30,
    )


def finish_at_try_1(sandbox: AirflowSandbox, folder: Path, major: Major, run_id: str) -> None:
    """Open the gate: the run succeeds, each task at try 1, in one execution that ran to its end."""
    (folder / "gate").write_text("")
    poll("the run to end", lambda: sandbox.run_state(major.dag_id, run_id) in ("success", "failed"))
    rows = sandbox.task_instances(major.dag_id, run_id)
    assert sandbox.run_state(major.dag_id, run_id) == "success", rows
    assert [(r.state, r.try_number) for r in rows] == [("success", 1)] * TASKS, rows
    # One execution per task, which ran to its end: nothing was killed and nothing ran again.
    assert marks(folder, ".start") == marks(folder, ".end")
    assert [m.split(".")[1] for m in marks(folder, ".start")] == ["try1"] * TASKS


def reported_once(
    sandbox: AirflowSandbox, major: Major, offset: int, expected: list[tuple[str, int, int]]
) -> str:
    """The scheduler whose log begins at ``offset`` got one final event per task instance, ``expected``
    ((state, map index, try), sorted). The run's state comes from the task instances' own, so the events
    may still be on their way when it ends.

    :returns: the scheduler's log from ``offset`` on
    """
    poll(
        "both final events",
        lambda: len(final_events(since(sandbox, offset), major.dag_id)) >= TASKS,
        guard=60,
    )
    text = since(sandbox, offset)
    events = final_events(text, major.dag_id)
    assert sorted(events) == expected, events
    return text


def vanish(task: int, workload: int) -> None:
    """While no scheduler runs, a task's workload and its task process vanish: SIGKILL to their process
    groups (the task process leads one of its own)."""
    for group in {os.getpgid(workload), os.getpgid(task)}:
        os.killpg(group, signal.SIGKILL)
    poll("hold0's processes to be gone", lambda: not alive(workload) and not alive(task))


def adopts_hold1_only(sandbox: AirflowSandbox, major: Major, offset: int, workload1: int) -> None:
    """The scheduler whose log begins at ``offset`` adopts hold1 and leaves hold0, whose try 1 it does
    not hold, for Airflow to reset."""
    poll(
        "the new scheduler to adopt hold1 only",
        lambda: "adopted 1 task instance(s)" in since(sandbox, offset),
    )
    started = since(sandbox, offset)
    assert (
        f"1 handed over by a stopped scheduler, 0 left running by a crashed one (pid {workload1})" in started
    )
    assert "1 others are left for the scheduler to reset" in started, started
    if major.awaits_reset:
        # Reset in the same pass (state None), it is scheduled again. Its line follows the executor's in
        # that pass, so it may not be in the log yet.
        hold = re.escape(f"{major.dag_id}.hold")
        reset = rf"Reset the following 1 orphaned TaskInstances:\s+<TaskInstance: {hold} \S+ map_index=0 "
        poll("Airflow to reset hold0", lambda: re.search(reset, since(sandbox, offset)) is not None, guard=60)


def runs_again(sandbox: AirflowSandbox, folder: Path, gone: Processes, adopted: Processes) -> Processes:
    """hold0 was reset and runs again, at try 2, while hold1's adopted processes run on.

    :param gone: hold0's first task and workload processes
    :param adopted: hold1's task and workload processes
    :returns: hold0's second task process and its workload, which the new scheduler launched
    """
    poll("hold0 to run again", lambda: any(folder.glob("hold0.try2.pid*.start")))
    assert all(alive(pid) for pid in adopted), {pid: alive(pid) for pid in adopted}
    assert not any(alive(pid) for pid in gone), {pid: cmdline(pid) for pid in gone}
    retried = task_pid(folder, "hold0.try2")
    return retried, psutil.Process(retried).ppid()


def rerun_ends(
    sandbox: AirflowSandbox,
    folder: Path,
    major: Major,
    run_id: str,
    gone: Processes,
    adopted: Processes,
    retried: Processes,
) -> None:
    """After :func:`runs_again`: both tasks end once the gate opens, hold0 at try 2, and nothing any of
    their executions started is left running."""
    launched = [*gone, *adopted, *retried]
    (folder / "gate").write_text("")
    poll("the run to end", lambda: sandbox.run_state(major.dag_id, run_id) in ("success", "failed"))
    rows = sandbox.task_instances(major.dag_id, run_id)
    assert sandbox.run_state(major.dag_id, run_id) == "success", rows
    assert [(r.map_index, r.state, r.try_number) for r in rows] == [(0, "success", 2), (1, "success", 1)]
    # hold0's first execution ended with its process; its second and hold1's one ran to their end.
    first, kept = f"hold0.try1.pid{gone[0]}", f"hold1.try1.pid{adopted[0]}"
    again = f"hold0.try2.pid{retried[0]}"
    assert marks(folder, ".start") == [first, again, kept]
    assert marks(folder, ".end") == [again, kept]
    poll("every process of every execution to end", lambda: not any(alive(pid) for pid in launched))


# The pid reuse's handover_timeout: how long hold0's real workload may wait for a claim that never comes.
HANDOVER_TIMEOUT_REUSED = 60.0


def unrecorded_workload_ends(gone: Processes, stopped: float) -> None:
    """hold0's real workload, whose recorded pid another process runs now, is no handed-over workload any
    more, only a process the stopped executor left running: killed as any such survivor (found by its
    cgroup or its mark), or, if none finds it, by itself once nobody claimed it within its
    handover_timeout (:data:`HANDOVER_TIMEOUT_REUSED`, from ``stopped``, a monotonic time).

    :param gone: hold0's task and workload processes
    """
    task, workload = gone
    poll(
        "hold0's processes to be gone",
        lambda: not alive(workload) and not alive(task),
        guard=HANDOVER_TIMEOUT_REUSED + 10.0 - (time.monotonic() - stopped),
    )


def untouched(other: subprocess.Popen[bytes], start: int) -> None:
    """The process under the recorded pid was neither taken for the workload nor touched."""
    assert other.poll() is None
    assert start_ticks(other.pid) == start


OVERRUN_TIMEOUT = 40.0  # the executor's run-time limit per task (task_timeout)
OVERRUN_GRACE = 5.0  # termination_grace_period: SIGTERM, then SIGKILL this much later
# How long after its launch the task is left without a scheduler at least: a limit counted from the
# adoption would end it at least this much later than one counted from the launch.
WITHOUT_SCHEDULER = 20.0
SLACK = 10.0  # the polls', and the killed processes' time to go
# How long the task adopted twice runs before the stop: a limit counted twice would be over at its limit
# less this.
STOP_AFTER = 45.0


def overrun_config(limit: float) -> dict[str, str]:
    """The executor's options for the overrun DAG: tasks held to run-time limit ``limit``."""
    return {
        "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TASK_TIMEOUT": str(limit),
        "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE_PERIOD": str(OVERRUN_GRACE),
    }


class Overrun(NamedTuple):
    """The overrun DAG's run, once its task runs."""

    run_id: str
    task: int  # the task's process
    workload: int  # its workload process, a child of the scheduler
    mark: Path  # the task's start mark, written after its workload's launch
    launched_by: float  # the mark's time: the workload had been launched by then (wall clock)


def overrun_running(sandbox: AirflowSandbox, folder: Path, major: Major) -> Overrun:
    """Trigger the overrun DAG and wait until its task runs."""
    sandbox.wait_for_dag(major.overrun_dag_id, timeout=120)
    run_id = sandbox.trigger(major.overrun_dag_id)
    poll("the task running", lambda: any(folder.glob("overrun.try1.pid*.start")))
    task = task_pid(folder, "overrun.try1")
    workload = psutil.Process(task).ppid()
    assert psutil.Process(workload).ppid() == sandbox.pids["scheduler"], cmdline(workload)
    [mark] = folder.glob("overrun.try1.pid*.start")
    return Overrun(run_id, task, workload, mark, mark.stat().st_mtime)


def without_a_scheduler(overrun: Overrun) -> None:
    """Time passes with no scheduler at all: it counts against the limit as any other time it runs."""
    _no_scheduler_until(overrun.launched_by + WITHOUT_SCHEDULER, "the time without a scheduler to pass")


def _no_scheduler_until(moment: float, what: str) -> None:
    """Wait, with no scheduler running, until ``moment`` (wall clock): the test's own timing."""
    poll(what, lambda: time.time() > moment, guard=max(0.0, moment - time.time()) + SLACK)


def _overrun_ended(sandbox: AirflowSandbox, major: Major, overrun: Overrun) -> None:
    poll(
        "the run to end",
        lambda: sandbox.run_state(major.overrun_dag_id, overrun.run_id) in ("success", "failed"),
    )


def ended_by_its_limit_from_launch(
    sandbox: AirflowSandbox, major: Major, offset: int, overrun: Overrun, limit: float
) -> None:
    """The scheduler whose log begins at ``offset`` adopts the overrunning task and ends its processes
    once ``limit`` from its launch has run out, or at once if it had by the time the new scheduler held
    it (a slow start), within the grace period: a limit counted from its adoption would have let it run
    ``limit`` seconds past that. Then the run ends."""
    poll("the new scheduler to adopt it", lambda: "adopted 1 task instance(s)" in since(sandbox, offset))
    adopted_by = time.time()  # it was held (and its limit armed) before this
    poll(
        "its processes to be ended by the limit",
        lambda: not alive(overrun.workload) and not alive(overrun.task),
    )
    ended = time.time()
    deadline = max(overrun.launched_by + limit, adopted_by)
    assert ended - deadline < OVERRUN_GRACE + SLACK, (
        ended - overrun.launched_by,
        adopted_by - overrun.launched_by,
    )
    _overrun_ended(sandbox, major, overrun)


def failed_in_its_one_execution(
    sandbox: AirflowSandbox, folder: Path, major: Major, overrun: Overrun
) -> None:
    """The run and its task failed, at try 1, in one execution that never reached its end."""
    rows = sandbox.task_instances(major.overrun_dag_id, overrun.run_id)
    assert sandbox.run_state(major.overrun_dag_id, overrun.run_id) == "failed", rows
    assert [(r.state, r.try_number) for r in rows] == [("failed", 1)], rows
    assert sorted(p.name for p in folder.glob("overrun*")) == [overrun.mark.name]


def held_to_what_was_left(text: str, overrun: Overrun, restarted: float) -> str:
    """The limit the new scheduler (its log: ``text``) held the task to was what was left of it at the
    restart (``restarted``, wall clock) at most; or it was spent by the time it held it (a slow start).

    :returns: the reason its failure gives (``timed out after <what was left>s``, or ``timed out <n>s
        before its adoption``)
    """
    found = re.search(r"overrun try 1 ran longer than its ([0-9.e+-]+)s timeout; terminating it", text)
    if found is not None:
        assert float(found[1]) < OVERRUN_TIMEOUT - (restarted - overrun.launched_by), found[0]
        return f"timed out after {found[1]}s"
    spent = re.search(r"overrun try 1 ran longer than its timeout, which ran out ([0-9.]+)s before", text)
    assert spent is not None, text
    return f"timed out {spent[1]}s before its adoption"


SPENT_TIMEOUT = 40.0  # the limit of a task whose limit and grace period run out around a stop
# Its grace period: long, so that the stop lands inside it on any host, and so that an adopter giving it a
# whole one again could not be mistaken for one that kills it at once (within SLACK).
SPENT_GRACE = 25.0


def spent_config() -> dict[str, str]:
    """The executor's options for a task whose limit runs out before a stop, and its grace after it."""
    return {
        "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TASK_TIMEOUT": str(SPENT_TIMEOUT),
        "AIRFLOW__ASYNC_LOCAL_EXECUTOR__TERMINATION_GRACE_PERIOD": str(SPENT_GRACE),
    }


def limit_ran_out(sandbox: AirflowSandbox, overrun: Overrun) -> float:
    """Wait until the scheduler says the task's limit ran out (its SIGTERM sent, its grace period begun);
    when that was seen (wall clock). The task goes on: Airflow 3's task answers SIGTERM with its
    operator's ``on_kill`` and runs on, and this one waits for a gate nobody opens."""
    line = f"overrun try 1 ran longer than its {SPENT_TIMEOUT:g}s timeout; terminating it"
    log = sandbox.process_logs["scheduler"]
    poll("its limit to run out", lambda: line in log.read_text(errors="replace"), guard=SPENT_TIMEOUT + 60)
    seen = time.time()
    assert alive(overrun.task), "ended by its SIGTERM: the grace period cannot be told from its end"
    return seen


def grace_spent_without_a_scheduler(overrun: Overrun, terminating: float) -> None:
    """With no scheduler, time passes until the grace period begun at ``terminating`` is spent; the task
    still runs (its custody countdown, ``handover_timeout``, is far longer)."""
    _no_scheduler_until(terminating + SPENT_GRACE + 1, "its grace period to be spent")
    assert alive(overrun.task)
    assert alive(overrun.workload)


def killed_once_held(sandbox: AirflowSandbox, major: Major, offset: int, overrun: Overrun) -> str:
    """The scheduler whose log begins at ``offset`` kills the task as soon as it holds it, its grace
    period spent; not a whole grace period later. Then the run ends.

    :returns: its log from ``offset`` on
    """
    poll("the new scheduler to hold it", lambda: "holding 1 running workload(s)" in since(sandbox, offset))
    held = time.time()
    poll(
        "its processes to be killed",
        lambda: not alive(overrun.workload) and not alive(overrun.task),
        guard=SPENT_GRACE + SLACK,
    )
    took = time.time() - held
    text = since(sandbox, offset)
    assert took < SLACK, f"killed {took:.1f}s after its hold, its grace period long spent:\n{text[-5000:]}"
    assert "overrun try 1 ran longer than its timeout, which ran out " in text, text
    _overrun_ended(sandbox, major, overrun)
    return text


def adopted_twice_then_succeeds(
    sandbox: AirflowSandbox, folder: Path, major: Major, overrun: Overrun, limit: float, open_after: float
) -> int:
    """Handed over by a stop, adopted, then left behind by a crash of its adopter and adopted again: its
    limit (``limit``) is the deadline its launch set, whatever happened since. Its gate opens once a limit
    counted twice would have ended it (``open_after`` its launch), and well before its own deadline: it
    ends as it decides, at try 1.

    :returns: where the log of the scheduler that adopted it last begins
    """
    poll(
        "part of its limit to run",
        lambda: time.time() > overrun.launched_by + STOP_AFTER,
        guard=STOP_AFTER + 30,
    )
    stop(sandbox, 1)
    offset = restart(sandbox)
    poll("the first adoption", lambda: "adopted 1 task instance(s)" in since(sandbox, offset))
    sandbox.kill("scheduler")
    offset = restart(sandbox)
    poll("the second adoption", lambda: "adopted 1 task instance(s)" in since(sandbox, offset))
    text = since(sandbox, offset)
    assert "0 handed over by a stopped scheduler, 1 left running by a crashed one" in text, text
    poll("the point a limit counted twice is past", lambda: time.time() > overrun.launched_by + open_after)
    assert time.time() < overrun.launched_by + limit - SLACK, "too slow to tell: its limit is nearly out"
    assert alive(overrun.task), since(sandbox, offset)
    assert alive(overrun.workload)
    (folder / "gate").touch()
    _overrun_ended(sandbox, major, overrun)
    rows = sandbox.task_instances(major.overrun_dag_id, overrun.run_id)
    assert [(r.state, r.try_number) for r in rows] == [("success", 1)], rows
    return offset


def not_timed_out(sandbox: AirflowSandbox, folder: Path, offset: int, overrun: Overrun) -> str:
    """The scheduler whose log begins at ``offset`` did not end the task adopted twice, which ran once, to
    its end.

    :returns: the scheduler's log from ``offset`` on
    """
    text = since(sandbox, offset)
    assert "timeout; terminating it" not in text
    ended = overrun.mark.name.replace(".start", ".end")
    assert sorted(p.name for p in folder.glob("overrun*")) == sorted([overrun.mark.name, ended])
    return text


REPO = Path(__file__).resolve().parents[1]
ADOPTED = re.compile(r"adopted (\d+) task instance\(s\)")
ANSWERED = re.compile(
    r"adopted (\d+) task instance\(s\) whose workloads were handed over to this scheduler; (\d+) others"
)
OFFER_GUARD = 180.0  # the restart to Airflow's retried offer: the scheduler's start and its first loop


def injecting(base: str) -> dict[str, str]:
    """The configuration that loads the executor under test through the subclass that injects one retried
    adoption (tests/e2e/dags/chaos_adoption.py), armed only in the scheduler :func:`restart_armed` starts.

    :param base: the subclass's base, the class path of the executor under test ("": the default one)
    """
    return {
        "AIRFLOW__CORE__EXECUTOR": "tests.e2e.dags.chaos_adoption.RetriedAdoptionExecutor",
        BASE_ENV: base,
        ONCE_ENV: "",
        # The scheduler imports the subclass from this repository.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
    }


def restart_armed(sandbox: AirflowSandbox) -> int:
    """Start the scheduler again with the injected error armed (for it alone); where its log begins."""
    sandbox.reconfigure({ONCE_ENV: "1"})
    try:
        return restart(sandbox)
    finally:
        sandbox.reconfigure({ONCE_ENV: ""})


def adopted_again_after_the_injected_error(sandbox: AirflowSandbox, major: Major, offset: int) -> None:
    """Airflow calls ``try_adopt_task_instances`` inside ``run_with_db_retries``: when its transaction
    fails (a deadlock with another scheduler, a dropped connection), it rolls back (the task instances'
    ``queued_by_job_id`` included) and asks again with the same task instances. The scheduler whose log
    begins at ``offset`` loaded the executor through a subclass whose ``try_adopt_task_instances`` raises
    ``OperationalError`` once, right after the real call adopted something: its first call adopted both,
    the error followed, and the retry adopted the same two again, refusing none (refused, Airflow would
    reset task instances whose workloads still run, and run them twice).
    """

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
    calls = [(found.start(), found[1]) for found in ADOPTED.finditer(text)]
    injected = text.index(INJECTED)
    assert [n for at, n in calls if at < injected] == [str(TASKS)], text
    if major.split_offers:
        again = offered_again()
        assert sum(adopted for adopted, _ in again) == TASKS, text
        assert all(refused == 0 for _, refused in again), text
    else:
        assert [n for at, n in calls if at > injected] == [str(TASKS)], text
