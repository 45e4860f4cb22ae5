"""What the end-to-end tests share: waiting on Airflow's state, and reading processes from /proc."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops.status_read import read_all
from harness.sandbox import AirflowSandbox, SandboxError
from tests import waits
from tests.core.helpers import alive

GUARD = 600.0
DAGS = Path(__file__).with_name("dags")
# Where the tasks of dags/ (switch.py, escapers.py, handover*.py, chaos.py) and of
# dags_descriptors/ leave their marks and wait for their gate.
TEST_DIR_ENVS = (
    "ALE_SWITCH_DIR",
    "ALE_ESCAPERS_DIR",
    "ALE_HANDOVER_DIR",
    "ALE_CHAOS_DIR",
    "ALE_DESCRIPTORS_DIR",
    "ALE_CONTROL_DIR",
)
SWITCH_TASKS = 4  # the switch DAG's mapped tasks (dags/switch.py)
# A restarted scheduler resets a dead one's task instances within seconds, not minutes.
QUICK_ORPHANS = {
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
    "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
}


def poll(what: str, done: Callable[[], bool], guard: float = GUARD) -> None:
    """:func:`tests.waits.poll` at this suite's guard: Airflow's state lives in the database and in /proc."""
    waits.poll(what, done, guard, interval=0.2)


def cmdline(pid: int) -> list[str]:
    try:
        return list(psutil.Process(pid).cmdline())
    except psutil.Error:
        return []


def marks(folder: Path, suffix: str) -> list[str]:
    """The marks the handover DAGs' ``hold`` tasks left in ``folder`` (``.start`` or ``.end``), sorted:
    ``hold<i>.try<N>.pid<P>``, one per execution."""
    return sorted(p.stem for p in folder.glob(f"hold*{suffix}"))


def since(sandbox: AirflowSandbox, offset: int) -> str:
    """The scheduler's log from byte ``offset`` on."""
    return sandbox.process_logs["scheduler"].read_bytes()[offset:].decode(errors="replace")


def stop_scheduler(sandbox: AirflowSandbox, timeout: float = 120.0) -> str:
    """SIGTERM the scheduler, as a service manager's stop does, and wait for it to exit 0.

    :returns: what it logged from the signal on, which the failure shows when it exits otherwise
    """
    before = sandbox.process_logs["scheduler"].stat().st_size
    status = sandbox.signal_and_wait("scheduler", signal.SIGTERM, timeout=timeout)
    stopped = since(sandbox, before)
    assert status == 0, f"the scheduler exited with {status} after SIGTERM; it logged:\n{stopped[-20000:]}"
    return stopped


def log_size(sandbox: AirflowSandbox) -> int:
    """Where the scheduler's log ends now: a test on a shared deployment reads it from there on (:func:`since`)."""
    return sandbox.process_logs["scheduler"].stat().st_size


def launched_workloads(sandbox: AirflowSandbox) -> dict[str, int]:
    """Every workload the sandbox's executors launched, from their launch journals: ``{label: pid}``."""
    found: dict[str, int] = {}
    for journal in (sandbox.home / "async_local_executor").glob("*.launches"):
        for line in journal.read_text().splitlines():
            entry = json.loads(line)
            if "+" in entry:
                found[str(entry["key"])] = int(entry["+"])
    return found


def task_pid(folder: Path, execution: str) -> int:
    """The task process's pid of one execution (``hold0.try1``), from the start mark it left in ``folder``
    (``<execution>.pid<P>.start``, as the handover DAGs write it)."""
    [mark] = folder.glob(f"{execution}.pid*.start")
    return int(mark.name.removesuffix(".start").rsplit(".pid", 1)[1])


def first_tries(folder: Path) -> tuple[tuple[int, int], tuple[int, int]]:
    """The handover DAG's two tasks' first tries as ``(task pid, workload pid)``: each task process and its
    parent, the workload process the executor launched (Airflow 2: the LocalTaskJob that forked it)."""
    task0, task1 = task_pid(folder, "hold0.try1"), task_pid(folder, "hold1.try1")
    return (task0, psutil.Process(task0).ppid()), (task1, psutil.Process(task1).ppid())


def move_record(journal: Path, recorded: int, to: int) -> int:
    """Rewrite a stopped scheduler's journal so that launch ``recorded`` names pid ``to`` instead, its
    start ticks left as they were: what the journal says when the workload is gone and its pid reused.

    :return: how many lines it changed
    """
    lines = journal.read_text().splitlines()
    moved = 0
    for number, line in enumerate(lines):
        entry = json.loads(line)
        for field in ("+", "handover", "of"):  # its launch line, its handover line, its descendants'
            if entry.get(field) == recorded:
                entry[field] = to
                lines[number] = json.dumps(entry)
                moved += 1
    journal.write_text("".join(f"{line}\n" for line in lines))
    return moved


@contextmanager
def bystander_at_recorded_pid(
    sandbox: AirflowSandbox, recorded: int
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Another process, nothing of Airflow's nor of any executor's, under the pid the stopped scheduler's
    journal records for workload ``recorded``: the record is moved to its pid, as a pid reuse leaves it
    (the same pid, another start). The workload itself is no longer what the record names.

    :returns: that process, running until the block ends, and its start ticks
    """
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],  # runs until its stdin closes
        stdin=subprocess.PIPE,
        start_new_session=True,
    ) as other:
        try:
            start = start_ticks(other.pid)
            assert start is not None
            [journal] = (sandbox.home / "async_local_executor").glob("*.launches")
            assert move_record(journal, recorded, other.pid) >= 2  # at least its launch and its handover
            yield other, start
        finally:
            other.kill()


@contextmanager
def stopped_outside_a_transaction(sandbox: AirflowSandbox, pid: int) -> Iterator[None]:
    """SIGSTOP ``pid`` (a process of a SQLite sandbox) at a moment it holds no lock on the database.

    A process stopped inside a write transaction locks every other writer out of a SQLite file: the
    api-server's own writes then fail with "database is locked" (HTTP 500). After each stop the database
    is probed with ``BEGIN EXCLUSIVE``, which succeeds only when nobody holds a lock; if the stopped
    process held one, it is continued and stopped again.
    """
    assert sandbox.sql_alchemy_conn.startswith("sqlite:///"), "only a SQLite sandbox is probed"
    database = sandbox.sql_alchemy_conn.removeprefix("sqlite:///")
    deadline = time.monotonic() + GUARD
    while True:
        os.kill(pid, signal.SIGSTOP)
        probe = sqlite3.connect(database, timeout=2.0, isolation_level=None)
        try:
            probe.execute("BEGIN EXCLUSIVE")
            probe.execute("ROLLBACK")
            break
        except sqlite3.OperationalError:
            os.kill(pid, signal.SIGCONT)
            if time.monotonic() > deadline:
                raise
        finally:
            probe.close()
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def open_the_gate(
    sandbox: AirflowSandbox, folder: Path, run_id: str, offset: int = 0
) -> tuple[list[tuple[str | None, int]], str]:
    """Let the switch DAG's tasks finish; the run must succeed. Returns (state, try) per task and the
    scheduler log (from byte ``offset`` on)."""
    (folder / "gate").touch()
    poll("the run to finish", lambda: sandbox.run_state("switch", run_id) in ("success", "failed"))
    rows = sandbox.task_instances("switch", run_id)
    assert sandbox.run_state("switch", run_id) == "success", rows
    return [(r.state, r.try_number) for r in rows], since(sandbox, offset)


def preload(sandbox: AirflowSandbox) -> dict[str, Any]:
    """The running executor's ``preload`` entry of its status file (empty until it has one)."""
    for found in read_all(sandbox.home / "async_local_executor"):
        if not found.stale and isinstance(found.data.get("preload"), dict):
            return dict(found.data["preload"])
    return {}


def preloaded(sandbox: AirflowSandbox) -> set[str]:
    return {p["module"] for p in preload(sandbox).get("preloaded", [])}


def refused(sandbox: AirflowSandbox) -> dict[str, str]:
    return {r["module"]: r["reason"] for r in preload(sandbox).get("refused", [])}


# A DAG file that imports a library (markdown-it-py) and a module of the DAGs folder at its top, and whose
# task imports another library (termcolor) inside its function; both Airflow majors parse it.
LEARNED_DAG_ID = "learned_imports"
LEARNED_DAG = """
from datetime import datetime

import markdown_it
from learned_helper import helper_value

try:
    from airflow.sdk import dag, task
except ImportError:  # Airflow 2
    from airflow.decorators import dag, task

FILE_VALUE = {value}


@dag(dag_id="learned_imports", schedule=None, start_date=datetime(2024, 1, 1), catchup=False)
def learned_imports():
    @task(retries=0)
    def show():
        import termcolor

        return f"{{FILE_VALUE}}-{{helper_value()}}-{{termcolor.__name__}}"

    show()


learned_imports()
"""


def write_learned_dag(dags: Path, value: int) -> None:
    """The DAG file and its DAGs-folder module, both returning ``value`` (edited by writing again)."""
    (dags / "learned_helper.py").write_text(f"def helper_value():\n    return {value}\n")
    (dags / "learned_dag.py").write_text(LEARNED_DAG.format(value=value))


# The revoke of adopted tries: the stuck-in-queued check of the scheduler that adopted them.
# Its [scheduler] task_queued_timeout. Long enough for a requeued try to start once whatever held the
# first ones back lets go, so that only the adopted tries are revoked (they were queued before the first
# scheduler's stop and the second one's start, so they reach it first).
QUEUED_TIMEOUT = 15


def revoking(dag_id: str) -> re.Pattern[str]:
    """The executor's line for each revoke of a ``hold`` try of ``dag_id``."""
    return re.compile(rf"revoking {re.escape(dag_id)}\.hold\S* try \d+: stopping it if it started")


def adopted_while_queued_then_revoked(sandbox: AirflowSandbox, dag_id: str, run_id: str, tries: int) -> int:
    """With ``tries`` tries of the run launched and held back before they mark themselves running: stop
    the scheduler, which hands them over; start the next with a short ``task_queued_timeout``; wait until
    it has adopted them, revoked each (still queued) and the executor has stopped each workload.

    :returns: where the new scheduler's log begins
    """
    poll("the tries launched", lambda: len(launched_workloads(sandbox)) == tries)
    workloads = sorted(launched_workloads(sandbox).values())

    def states() -> list[str | None]:
        return [r.state for r in sandbox.task_instances(dag_id, run_id)]

    assert states() == ["queued"] * tries
    log = sandbox.process_logs["scheduler"]
    assert f"handed over {tries} running task workload(s)" in stop_scheduler(sandbox)
    assert all(alive(pid) for pid in workloads), {pid: alive(pid) for pid in workloads}

    sandbox.reconfigure(
        {
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(QUEUED_TIMEOUT),
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "2",
        }
    )
    offset = log.stat().st_size
    sandbox.restart("scheduler")
    poll(
        "the new scheduler to adopt them",
        lambda: f"adopted {tries} task instance(s)" in since(sandbox, offset),
    )
    assert all(alive(pid) for pid in workloads), {pid: alive(pid) for pid in workloads}
    assert states() == ["queued"] * tries
    # Still queued past task_queued_timeout: the scheduler revokes each adopted try and requeues it.
    revoked = revoking(dag_id)
    poll("the adopted tries revoked", lambda: len(revoked.findall(since(sandbox, offset))) == tries)
    poll("the adopted workloads stopped", lambda: not any(alive(pid) for pid in workloads))
    return offset


def requeued_tries_run_once(
    sandbox: AirflowSandbox, folder: Path, dag_id: str, run_id: str, offset: int, tries: int
) -> None:
    """After :func:`adopted_while_queued_then_revoked`, once nothing holds the tries back any more: each
    requeued try runs to its end once, the run succeeds, and the revoked tries got no executor event."""
    poll("the requeued tries running", lambda: len(marks(folder, ".start")) == tries)
    (folder / "gate").write_text("")
    poll("the run to end", lambda: sandbox.run_state(dag_id, run_id) in ("success", "failed"))
    rows = sandbox.task_instances(dag_id, run_id)
    assert sandbox.run_state(dag_id, run_id) == "success", rows
    assert [r.state for r in rows] == ["success"] * tries, rows
    assert marks(folder, ".start") == marks(folder, ".end")
    # Each revoked try's end was the executor's to note, not to report: no executor event for it. On a
    # loaded host a requeued try can sit in queued past task_queued_timeout again (its first call to the
    # api-server is slow), and the scheduler revokes it too: each revoke is noted once all the same.
    text = since(sandbox, offset)
    revokes = len(revoking(dag_id).findall(text))
    assert revokes >= tries, text
    assert (
        len(re.findall(rf"revoked workload {re.escape(dag_id)}\.hold\S* try \d+ ended", text)) == revokes
    ), text
    assert "Received executor event with state failed" not in text, text
    # The requeued tries were launched here, not handed over: none is reported as an adopted one.
    assert "adopted workload" not in text, text


# The escapers DAG (dags/escapers.py): tasks that leave processes behind, which escape the parent-death
# chain; shared by the tests of what the containment and the fallback reclaim do with them.
ORPHAN_DEADLINE = 10.0


def escaped_sleepers(folder: Path, try_number: int) -> dict[str, int]:
    """The processes the escapers DAG's tasks left at try ``try_number``, by task, from their marks in ``folder``."""
    found = {}
    for path in folder.iterdir():
        task, _, rest = path.name.partition(".")
        tried, _, pid = rest.partition(".")
        if task in ("detach", "shell") and tried == str(try_number):
            found[task] = int(pid)
    return found


def run_to_the_sleepers(sandbox: AirflowSandbox, folder: Path) -> tuple[str, dict[str, int]]:
    """Trigger the escapers DAG; its run and the sleepers its tasks' first tries left, once both did."""
    sandbox.wait_for_dag("escapers", timeout=120)
    run_id = sandbox.trigger("escapers")
    poll("both tasks to leave a sleeper behind", lambda: len(escaped_sleepers(folder, 1)) == 2)
    return run_id, escaped_sleepers(folder, 1)


def kill_and_restart(sandbox: AirflowSandbox, folder: Path, run_id: str, escaped: dict[str, int]) -> str:
    """``kill -9`` the scheduler while ``escaped`` run, restart it, let the run finish; its log after.

    Asserts that the escaped processes outlive the dead scheduler (nothing of it reaches them: its task
    processes die with it, by the parent-death chain) and that none is alive once the run succeeded.
    """
    sandbox.kill("scheduler")
    deadline = time.monotonic() + ORPHAN_DEADLINE
    while any(not alive(pid) for pid in escaped.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(alive(pid) for pid in escaped.values()), escaped

    (folder / "gate").touch()  # the retries do not wait
    sandbox.restart("scheduler")
    poll("the run to finish", lambda: sandbox.run_state("escapers", run_id) in ("success", "failed"))
    rows = sandbox.task_instances("escapers", run_id)
    assert sandbox.run_state("escapers", run_id) == "success", rows
    assert {task: pid for task, pid in escaped.items() if alive(pid)} == {}
    return sandbox.process_logs["scheduler"].read_text(errors="replace")


def final_events(log: str, dag_id: str) -> list[tuple[str, int, int]]:
    """The scheduler's executor events for a DAG's task instances that say how a try ended: (state, map
    index, try)."""
    events = re.findall(
        rf"Received executor event with state (\w+) for task instance TaskInstanceKey\(dag_id='{dag_id}'"
        r".*?try_number=(\d+), map_index=(-?\d+)\)",
        log,
    )
    return [
        (state, int(index), int(attempt))
        for state, attempt, index in events
        if state not in ("queued", "running")
    ]


def call(
    sandbox: AirflowSandbox, path: str, token: str | None = None, body: object | None = None
) -> tuple[int, Any]:
    """(HTTP status, decoded JSON) of a GET, or of a POST of ``body`` as JSON, on the sandbox's own
    api-server."""
    headers = {"Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        headers["Content-Type"] = "application/json"
        data = json.dumps(body).encode()
    # Always the sandbox's own http://127.0.0.1 api-server.
    request = urllib.request.Request(f"{sandbox.api_url}{path}", data=data, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def get(sandbox: AirflowSandbox, path: str, token: str | None = None) -> tuple[int, Any]:
    return call(sandbox, path, token)


def health(sandbox: AirflowSandbox) -> dict[str, Any]:
    """The plugin's public health document."""
    code, body = get(sandbox, "/async-local-executor/health")
    assert code == 200
    assert isinstance(body, dict)
    return body


# How long a stock scheduler gets to exit after SIGTERM once its tasks have ended.
STOCK_STOP_WAIT = 60.0


def stop_stock_scheduler(sandbox: AirflowSandbox) -> None:
    """Stop a scheduler running the stock LocalExecutor whose tasks have all ended: SIGTERM, exit 0.

    Its ``end()`` joins its worker processes without a bound, and on a loaded host a worker can stay
    blocked on its result queue (the pipe this project's executor does away with), so the scheduler may
    not exit at all. Its stop is not what the tests that call this observe: past the wait, its whole
    process group (the scheduler and its workers) is killed.
    """
    try:
        assert sandbox.signal_and_wait("scheduler", signal.SIGTERM, STOCK_STOP_WAIT) == 0
    except SandboxError:
        os.killpg(sandbox.pids["scheduler"], signal.SIGKILL)
        sandbox.kill("scheduler")
