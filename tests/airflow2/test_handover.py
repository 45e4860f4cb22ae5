"""A restart of a real Airflow 2.11 scheduler hands its running tasks over: they run on, the next adopts them.

With the defaults (``on_stop = handover``, ``handover_timeout = 300``), a stopped scheduler exits within
seconds and a killed one leaves its tasks running; the next scheduler adopts them, so every task runs
once, at try 1, and its end is reported once. Each task records every execution it starts and ends
(dags/handover2.py), so the tests count executions from the tasks themselves, not from the database
alone. Nothing is mocked: Airflow 2.11's scheduler (which parses the DAGs itself) on PostgreSQL, the
default fork-server launcher, real task processes.

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
  start (``_unshare_db_connections``); the crash test kills the scheduler at that worst moment.
"""

from __future__ import annotations

import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa

from harness.airflow2 import Airflow2Sandbox
from tests.core.helpers import alive
from tests.e2e.helpers import cmdline, poll

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

Make = Callable[[], Airflow2Sandbox]
# A task instance: its map index, state, try, LocalTaskJob and the scheduler job that queued it.
Row = tuple[int, str, int, int, int]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    made: list[Airflow2Sandbox] = []

    def build() -> Airflow2Sandbox:
        sb = Airflow2Sandbox(
            executor=EXECUTOR,
            dags_folder=DAGS,
            parallelism=4,
            extra_config={"ALE_HANDOVER_DIR": str(tmp_path), **QUICK_ORPHANS},
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


def _marks(tmp_path: Path, suffix: str) -> list[str]:
    return sorted(p.stem for p in tmp_path.glob(f"hold*{suffix}"))


def _running(sandbox: Airflow2Sandbox, tmp_path: Path) -> tuple[str, list[int]]:
    """Trigger the DAG; once both tasks run, the pids of their processes and of their workloads."""
    sandbox.wait_for_dag(DAG_ID, timeout=120)
    run_id = sandbox.trigger(DAG_ID)
    poll("both tasks running", lambda: len(_marks(tmp_path, ".start")) == TASKS, guard=180)
    scheduler = sandbox.pids["scheduler"]
    tasks = [int(mark.rsplit(".pid", 1)[1]) for mark in _marks(tmp_path, ".start")]
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


def _final_events(log: str) -> list[tuple[str, int]]:
    """The scheduler's executor events for this DAG's task instances that say how a try ended."""
    events = re.findall(
        rf"Received executor event with state (\w+) for task instance TaskInstanceKey\(dag_id='{DAG_ID}'"
        r".*?map_index=(\d+)\)",
        log,
    )
    return [(state, int(index)) for state, index in events if state not in ("queued", "running")]


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
    assert _marks(tmp_path, ".start") == _marks(tmp_path, ".end")
    assert [m.split(".")[1] for m in _marks(tmp_path, ".start")] == ["try1"] * TASKS
    # One final event per task instance, from the scheduler that adopted it. The run's state comes from
    # the task instances' own, so the events may still be on their way.
    poll("both final events", lambda: len(_final_events(log.read_text(errors="replace"))) >= TASKS, guard=60)
    text = log.read_text(errors="replace")
    assert sorted(_final_events(text)) == [("success", i) for i in range(TASKS)], _final_events(text)
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
    log = sandbox.process_logs["scheduler"]
    offset = log.stat().st_size
    started = time.monotonic()
    status = sandbox.signal_and_wait("scheduler", signal.SIGTERM, timeout=120)
    took = time.monotonic() - started
    assert status == 0
    assert took < EXIT_BOUND, f"the scheduler took {took:.1f}s to exit"
    stopped = log.read_bytes()[offset:].decode(errors="replace")
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
    assert _marks(tmp_path, ".end") == []

    sandbox.restart("scheduler")
    _finish_after_adoption(sandbox, tmp_path, run_id, launched, before)
