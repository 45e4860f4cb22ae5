"""Switching a deployment from this executor back to the stock LocalExecutor, as docs/migrating.md says.

With ``on_stop = handover`` (the default) a stopped scheduler's running tasks live on for the next
scheduler of this executor to adopt; LocalExecutor adopts nothing. docs/migrating.md ("From this executor
back to LocalExecutor") therefore makes the last stop under this executor one that hands nothing over:
restart once with ``on_stop = terminate``, let that scheduler adopt what the previous stop handed over,
stop it (it waits ``shutdown_timeout``, then terminates what still runs), then switch. The terminated
tries report no end; the LocalExecutor scheduler resets their task instances and runs them again.

The tasks (dags/switch_back.py) record each execution with its try, pid, start and end, and whether it
found another execution of its task instance still alive (an exclusive ``flock`` each execution holds
until its process exits). The first test checks what the doc promises: no two executions of one task
instance ever overlap, every task instance ends ``success`` at its second try, and nothing of this
executor is left: no launch journal, custody file or status file in the state directory, no process with
its instance mark. The second shows the hazard the doc warns of, by switching straight after an ordinary
(handover) stop: second tries start beside the first ones, and the journal and custody files stay.

Nothing is mocked: a real Airflow 3.3 (scheduler, api-server, dag-processor) on SQLite, real task
processes.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from async_local_executor.ops import custody_dir, status_format
from async_local_executor.ops.journal_file import INSTANCE_ENV
from async_local_executor.ops.journal_file import SUFFIX as JOURNAL_SUFFIX
from harness.environment import SANDBOX_MARKER_ENV
from harness.sandbox import AirflowSandbox
from tests.core.helpers import alive
from tests.e2e.helpers import poll, since, stop_scheduler, stop_stock_scheduler

DAG = "switch_back"
TASKS = 3  # dags/switch_back.py
# Shortened from 60 s so that the terminate stop is quick; the tasks wait for a gate that stays shut.
SHUTDOWN_TIMEOUT = 5
# The default termination_grace_period. Airflow 3.3's task runner only calls the operator's on_kill on
# SIGTERM and runs on, so every terminated task waits for the SIGKILL that follows this grace.
GRACE = 10
ON_STOP = "AIRFLOW__ASYNC_LOCAL_EXECUTOR__ON_STOP"
LOCAL = {"AIRFLOW__CORE__EXECUTOR": "LocalExecutor"}
pytestmark = [pytest.mark.e2e]


@dataclass(frozen=True)
class Execution:
    """One execution of one task instance, as its marks tell it (dags/switch_back.py)."""

    task: str  # work<i>
    try_number: int
    pid: int  # its task process
    started: float  # wall clock
    instance: str | None  # this executor's instance mark in its environment; None under LocalExecutor
    overlap: bool  # it found another execution of its task instance alive as it started
    ended: float | None  # when it left its function; None: killed outright, or still running
    how: str | None  # "gate", or the exception that ended it

    @property
    def name(self) -> str:
        return f"{self.task}.try{self.try_number}"


def executions(folder: Path) -> list[Execution]:
    """Every execution that has started so far, ordered by task and start."""
    found: list[Execution] = []
    for start in folder.glob("work*.start"):
        stem = start.name.removesuffix(".start")
        task, tried, pid = stem.split(".")
        begun = json.loads(start.read_text())
        end = start.with_name(f"{stem}.end")
        left = json.loads(end.read_text()) if end.exists() else {}
        found.append(
            Execution(
                task=task,
                try_number=int(tried.removeprefix("try")),
                pid=int(pid.removeprefix("pid")),
                started=float(begun["at"]),
                instance=begun["instance"],
                overlap=bool(begun["overlap"]),
                ended=float(left["at"]) if left else None,
                how=left.get("how"),
            )
        )
    return sorted(found, key=lambda e: (e.task, e.started))


def state_dir_leftovers(sandbox: AirflowSandbox) -> list[str]:
    """What a stopped executor may leave in its state directory: launch journals (and compactions cut
    short), status files, custody files. The rest (the fork server's learned imports, its ``preloaded``
    report) describes no workload and no executor process."""
    state = sandbox.home / "async_local_executor"
    found = [p.name for p in state.glob(f"*{JOURNAL_SUFFIX}*")]
    found += [p.name for p in state.glob(f"{status_format.PREFIX}*{status_format.SUFFIX}")]
    custody = custody_dir.path(state)
    if custody.is_dir():
        found += [f"{custody_dir.DIRECTORY}/{p.name}" for p in custody.iterdir()]
    return sorted(found)


def marked_processes(sandbox: AirflowSandbox) -> dict[int, str]:
    """Live processes (zombies aside) of this sandbox with this executor's instance mark in their
    environment, ``{pid: instance}``: the doc's ``grep -lsz '^ASYNC_LOCAL_EXECUTOR_INSTANCE='
    /proc/[0-9]*/environ``, limited to this sandbox, since a test beside this one may run the executor."""
    ours = f"{SANDBOX_MARKER_ENV}={sandbox.marker}".encode()
    mark = f"{INSTANCE_ENV}=".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue  # gone meanwhile, or another user's
        if ours in env:
            for var in env:
                if var.startswith(mark):
                    found[int(entry.name)] = var[len(mark) :].decode(errors="replace")
    return found


def start_scheduler(sandbox: AirflowSandbox) -> int:
    """Start the scheduler again; where its log begins."""
    before = sandbox.process_logs["scheduler"].stat().st_size
    sandbox.restart("scheduler")
    return before


def first_tries_handed_over(sandbox: AirflowSandbox, folder: Path) -> tuple[str, list[Execution]]:
    """Trigger the DAG; once every task runs under this executor, the deployment's ordinary stop
    (``on_stop = handover``): the tasks live on. The run, and the first tries."""
    sandbox.wait_for_dag(DAG, timeout=120)
    run_id = sandbox.trigger(DAG)
    poll("every task running under this executor", lambda: len(executions(folder)) == TASKS)
    first = executions(folder)
    assert all(e.try_number == 1 and e.instance and not e.overlap for e in first), first
    stopped = stop_scheduler(sandbox, timeout=120)
    assert f"handed over {TASKS} running task workload(s)" in stopped, stopped
    assert all(alive(e.pid) for e in first), first
    return run_id, first


def test_switching_back_after_a_terminate_stop_runs_each_try_alone_and_leaves_nothing(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, first = first_tries_handed_over(sandbox, tmp_path)

    # The doc's "Terminate at the last stop": once more under this executor, with on_stop = terminate.
    sandbox.reconfigure(
        {ON_STOP: "terminate", "AIRFLOW__ASYNC_LOCAL_EXECUTOR__SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT)}
    )
    offset = start_scheduler(sandbox)
    poll(
        "the terminate scheduler to adopt the handed-over tasks",
        lambda: (
            f"adopted {TASKS} task instance(s) whose workloads were handed over to this scheduler"
            in since(sandbox, offset)
        ),
    )
    assert all(alive(e.pid) for e in first), first
    began = time.monotonic()
    stopped = stop_scheduler(sandbox, timeout=SHUTDOWN_TIMEOUT + GRACE + 60)
    took = time.monotonic() - began
    assert f"shutting down: waiting up to {SHUTDOWN_TIMEOUT}s for {TASKS} running workloads" in stopped, (
        stopped
    )
    assert stopped.count("executor shut down: terminated (") >= TASKS, stopped
    assert "handed over" not in stopped, stopped
    # Its bound: shutdown_timeout, then the grace; the margin is the scheduler's own exit.
    assert took < SHUTDOWN_TIMEOUT + GRACE + 20, took
    # Dead by the scheduler's exit: this only observes it (and takes the time try 1's end is bounded by).
    poll("the first tries' processes to be gone", lambda: not any(alive(e.pid) for e in first), guard=10)
    gone = time.time()
    assert not [e for e in executions(tmp_path) if e.how == "gate"]  # their gate never opened
    # The terminated tries never reported an end: Airflow still has them running.
    assert [(r.state, r.try_number) for r in sandbox.task_instances(DAG, run_id)] == [("running", 1)] * TASKS
    # Nothing of this executor is left, before the switch as the doc has the operator check it.
    assert state_dir_leftovers(sandbox) == [], sorted(
        str(p.relative_to(sandbox.home)) for p in (sandbox.home / "async_local_executor").rglob("*")
    )
    assert marked_processes(sandbox) == {}

    # The switch: [core] executor = LocalExecutor, the on_stop setting removed (handover is its default;
    # the sandbox changes variables, it does not unset them), the api-server restarted, the scheduler
    # started once the api-server answers. Started before, it resets the task instances and LocalExecutor
    # starts their second tries at once; a try whose task runner finds no api-server within its retries
    # (4 to 15 s with the defaults) fails, and with retries=1 so does its task instance.
    sandbox.reconfigure({**LOCAL, ON_STOP: "handover"})
    assert sandbox.signal_and_wait("api-server", signal.SIGTERM, timeout=60) == 0
    sandbox.restart("api-server")
    poll("the restarted api-server to answer", lambda: sandbox.health() is not None, guard=120)
    offset = start_scheduler(sandbox)
    sandbox.wait_healthy()
    poll("every task's second try running", lambda: len(executions(tmp_path)) == 2 * TASKS)
    restarted = since(sandbox, offset)
    assert f"Reset the following {TASKS} orphaned TaskInstances" in restarted, restarted[-3000:]
    (tmp_path / "gate").touch()
    assert sandbox.wait_for_run(DAG, run_id, timeout=180) == "success"
    rows = sandbox.task_instances(DAG, run_id)
    assert [(r.state, r.try_number) for r in rows] == [("success", 2)] * TASKS, rows

    done = executions(tmp_path)
    assert [e.name for e in done] == [f"work{i}.try{n}" for i in range(TASKS) for n in (1, 2)], done
    for earlier, later in zip(done[::2], done[1::2], strict=True):
        # LocalExecutor ran the second try, to its end, alone: its first try's process was gone as it
        # started (the lock says so), and by the times: the test saw it gone before it switched.
        assert (later.instance, later.how) == (None, "gate"), later
        assert not later.overlap, (earlier, later)
        assert earlier.ended is None or earlier.ended < later.started, (earlier, later)
        assert gone < later.started, (gone, later)
    assert state_dir_leftovers(sandbox) == []
    assert marked_processes(sandbox) == {}


# The first tries run on until their next heartbeat is refused, then up to 5 s more (the task SDK's
# SIGTERM, which a Python task only answers with on_kill, then SIGKILL). At the default interval of 5 s
# the second tries started inside that window on an idle machine, ~2 s after the reset; 15 s keeps them
# inside it on a loaded one.
HEARTBEAT_INTERVAL = 15


@pytest.mark.sandbox(config={"AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL)})
def test_switching_back_straight_after_a_handover_stop_runs_two_tries_at_once_and_leaves_files(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    run_id, first = first_tries_handed_over(sandbox, tmp_path)
    instance = {e.instance for e in first}
    handed_over = state_dir_leftovers(sandbox)
    assert f"{instance.pop()}{JOURNAL_SUFFIX}" in handed_over, handed_over

    sandbox.reconfigure(LOCAL)
    offset = start_scheduler(sandbox)
    poll("every task's second try running", lambda: len(executions(tmp_path)) == 2 * TASKS)
    restarted = since(sandbox, offset)
    assert f"Reset the following {TASKS} orphaned TaskInstances" in restarted, restarted[-3000:]
    second = [e for e in executions(tmp_path) if e.try_number == 2]
    # The hazard: each second try started while its first one still ran.
    assert all(e.overlap and e.instance is None for e in second), second
    poll(
        "the first tries to be stopped by their refused heartbeats",
        lambda: not any(alive(e.pid) for e in first),
        guard=HEARTBEAT_INTERVAL + 30,
    )
    for e in first:
        log = sandbox.task_log_path(DAG, run_id, "work", 1, int(e.task.removeprefix("work")))
        assert "shouldn't be running anymore" in log.read_text(errors="replace"), e
    (tmp_path / "gate").touch()
    assert sandbox.wait_for_run(DAG, run_id, timeout=180) == "success"
    rows = sandbox.task_instances(DAG, run_id)
    assert [(r.state, r.try_number) for r in rows] == [("success", 2)] * TASKS, rows
    # No executor of this kind starts again to read them: the journal and every workload's custody
    # files (owner, exit code, output) stay.
    left = state_dir_leftovers(sandbox)
    assert [n for n in left if n.endswith(JOURNAL_SUFFIX)] == [
        n for n in handed_over if n.endswith(JOURNAL_SUFFIX)
    ]
    assert len([n for n in left if n.startswith(f"{custody_dir.DIRECTORY}/")]) >= TASKS, left
    assert marked_processes(sandbox) == {}


OURS = {"AIRFLOW__CORE__EXECUTOR": "async_local_executor.AsyncLocalExecutor"}


def test_a_drain_before_the_switch_hands_nothing_over_and_back_the_drain_is_in_force_until_resumed(
    sandbox: AirflowSandbox, tmp_path: Path
) -> None:
    # docs/migrating.md's "Drain, then switch": no new start, the running tasks end on their own, a stop
    # with nothing to hand over; under LocalExecutor the waiting runs go on; back under this executor the
    # drain is still in force until an operator resumes.
    sandbox.wait_for_dag(DAG, timeout=120)
    first_run = sandbox.trigger(DAG)
    poll("every task running under this executor", lambda: len(executions(tmp_path)) == TASKS)
    drained = sandbox.airflow("async-local-executor", "drain")
    assert "drain: draining by" in drained.stdout, drained.stdout
    waiting_run = sandbox.trigger(DAG)  # made while draining: its tasks stay scheduled
    (tmp_path / "gate").touch()
    assert sandbox.wait_for_run(DAG, first_run, timeout=180) == "success"
    waited = sandbox.airflow("async-local-executor", "drain", "--wait")
    assert "drained: no task runs" in waited.stdout, waited.stdout
    assert [r.state for r in sandbox.task_instances(DAG, waiting_run)] == ["scheduled"] * TASKS
    assert len(executions(tmp_path)) == TASKS

    stopped = stop_scheduler(sandbox, timeout=120)
    assert "stopping: no workload runs, nothing to hand over" in stopped, stopped
    assert state_dir_leftovers(sandbox) == []
    assert marked_processes(sandbox) == {}

    sandbox.reconfigure(LOCAL)
    start_scheduler(sandbox)
    assert sandbox.wait_for_run(DAG, waiting_run, timeout=180) == "success"
    under_local = [e for e in executions(tmp_path) if e.instance is None]
    assert len(under_local) == TASKS, under_local
    stop_stock_scheduler(sandbox)

    sandbox.reconfigure(OURS)
    offset = start_scheduler(sandbox)
    poll("this executor's start", lambda: "AsyncLocalExecutor started" in since(sandbox, offset))
    assert "live control in force since before this start: draining by" in since(sandbox, offset)
    back = sandbox.trigger(DAG)
    poll(
        "the new run's tasks scheduled",
        lambda: [r.state for r in sandbox.task_instances(DAG, back)] == ["scheduled"] * TASKS,
    )
    assert len(executions(tmp_path)) == 2 * TASKS  # held back by the drain still in force
    resumed = sandbox.airflow("async-local-executor", "resume")
    assert "resume: running by" in resumed.stdout, resumed.stdout
    assert sandbox.wait_for_run(DAG, back, timeout=180) == "success"

    done = executions(tmp_path)
    assert len(done) == 3 * TASKS, done
    assert not any(e.overlap for e in done), done
    assert [
        r.try_number for run in (first_run, waiting_run, back) for r in sandbox.task_instances(DAG, run)
    ] == [1] * (3 * TASKS)
