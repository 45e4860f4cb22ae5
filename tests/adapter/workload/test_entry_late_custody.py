"""A workload whose scheduler is gone before it takes custody, and what a workload says once its scheduler is.

Real processes, no Airflow: a stand-in for the scheduler starts a workload through the real entry skeleton,
as a fresh interpreter (``main``) or as a fork-server child (``forked_main``: forked, in a process group of
its own, tied to the scheduler by the parent-death signal), then releases it and exits, as a stop does. The
workload is slow to start: it takes custody only once the test lets it (``main``: once its scheduler has
exited). Its task process waits for the test to release it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from async_local_executor.adapter.tasklog import TaskLogFile
from async_local_executor.adapter.workload import airflow2, airflow3, entry
from async_local_executor.core import custody, custody_files
from async_local_executor.core.proc_identity import start_ticks
from tests.adapter import workloads
from tests.core.helpers import GUARD
from tests.processes import exits
from tests.waits import poll

pytestmark = pytest.mark.skipif(not custody.supported(), reason="custody is Linux's")

WORKLOAD = """
import os, select, signal, sys, time
from pathlib import Path
from async_local_executor.adapter.tasklog import TaskLogFile
from async_local_executor.adapter.workload.entry import Entry, parse

def run(payload):
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.setpgid(0, 0)  # as the task SDK puts the task process
        while not os.path.exists(os.environ["RELEASE"]):
            time.sleep(0.02)
        os._exit(0)
    os.waitpid(pid, 0)
    if payload == b"crash":
        raise ValueError("the task's supervisor broke after the handover")
    return 9

entry = Entry("tests.workload", "payload", lambda raw: raw, run, lambda _: TaskLogFile(Path(os.environ["TASK_LOG"])))

def slow_start(parent):
    # Until the scheduler is gone (main), or until the test says so (forked: its scheduler waits for it).
    if os.environ["GO"] == "parent-exit":
        try:
            select.select([os.pidfd_open(parent)], [], [])
        except ProcessLookupError:  # exited and reaped already
            pass
    else:
        while not os.path.exists(os.environ["GO"]):
            time.sleep(0.02)

if __name__ == "__main__":
    slow_start(parse(None).parent_pid)
    sys.exit(entry.main())
"""

SCHEDULER = """
import os, signal, subprocess, sys
from async_local_executor.core import custody, lifeline
from async_local_executor.core.proc_identity import start_ticks

mode, code, payload, *flags = sys.argv[1:]
flags = ["--parent-pid", str(os.getpid()), *flags]
if mode == "main":
    workload = subprocess.Popen(
        [sys.executable, "-c", code, *flags], stdin=subprocess.PIPE, start_new_session=True
    )
    workload.stdin.write(payload.encode())
    workload.stdin.close()
    pid = workload.pid
else:
    pid = os.fork()
    if pid == 0:  # as the fork server makes a child: own group, tied to us, payload in memory
        os.setpgid(0, 0)
        if not lifeline.die_with_parent(int(flags[1]), signal.SIGKILL):
            os._exit(3)
        namespace = {"__name__": "forked"}
        exec(code, namespace)
        namespace["slow_start"](int(flags[1]))
        os._exit(namespace["entry"].forked_main(["python", "-m", "workload", *flags], payload.encode()))
print(pid, flush=True)
# Released, as a stop releases it: the executor waits until it is in custody, then exits.
if mode != "main":
    late = custody.await_custody([(pid, start_ticks(pid))], float(os.environ["GUARD"]))
    print("not in custody:", late, flush=True)
"""


class Released:
    """A workload its stand-in scheduler released and exited from; the test is its successor."""

    def __init__(self, mode: str, tmp_path: Path, payload: str = "run", timeout: float = 30.0) -> None:
        self.directory = tmp_path / "custody"
        self.release = tmp_path / "release"
        self.go = tmp_path / "go"
        self.task_log = tmp_path / "logs" / "task.log"
        flags = entry.argv_flags(0, "normal", handover_timeout=timeout, custody_dir=str(self.directory))[2:]
        env = {
            **os.environ,
            "RELEASE": str(self.release),
            "TASK_LOG": str(self.task_log),
            "GO": "parent-exit" if mode == "main" else str(self.go),
            "GUARD": str(GUARD),
        }
        self.scheduler = subprocess.Popen(
            [sys.executable, "-c", SCHEDULER, mode, WORKLOAD, payload, *flags],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.scheduler.stdout is not None
        self.pid = int(self.scheduler.stdout.readline())
        self.name = custody_files.name(self.pid, start_ticks(self.pid) or 0)

    def file(self, suffix: str) -> Path:
        return self.directory / f"{self.name}{suffix}"

    def claim(self) -> None:
        """Name this test's process as the workload's owner, as a successor does."""
        me = {"owner_pid": os.getpid(), "owner_start": start_ticks(os.getpid())}
        self.directory.mkdir(mode=0o700, exist_ok=True)
        self.file(".json").write_text(json.dumps(me))

    def cleanup(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        self.scheduler.kill()
        self.scheduler.wait(GUARD)
        assert self.scheduler.stdout is not None
        self.scheduler.stdout.close()


@pytest.fixture
def released(tmp_path: Path) -> Iterator[Callable[..., Released]]:
    made: list[Released] = []

    def start(mode: str, **kwargs: object) -> Released:
        made.append(Released(mode, tmp_path, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield start
    for each in made:
        each.cleanup()


@pytest.mark.parametrize("mode", ["main", "forked"])
def test_a_workload_released_before_it_took_custody_runs_on_for_its_successor(
    mode: str, released: Callable[..., Released]
) -> None:
    workload = released(mode)
    workload.claim()
    if mode == "forked":
        # Its scheduler waits for its custody before it exits: its exit would fire the parent-death signal.
        workload.go.touch()
        assert workload.scheduler.stdout is not None
        assert workload.scheduler.stdout.readline() == "not in custody: []\n"
    assert workload.scheduler.wait(GUARD) == 0
    workload.release.touch()  # only a task still running after its scheduler's exit can see it and end
    poll("the workload's recorded exit code", workload.file(".exit").exists, GUARD)
    assert json.loads(workload.file(".exit").read_text()) == {"status": 9}
    assert exits(workload.pid, GUARD)


def test_a_workload_that_crashes_after_its_handover_writes_its_traceback_to_its_task_log(
    released: Callable[..., Released],
) -> None:
    workload = released("main", payload="crash")
    workload.claim()
    assert workload.scheduler.wait(GUARD) == 0
    workload.release.touch()
    poll("the workload's recorded exit code", workload.file(".exit").exists, GUARD)
    assert json.loads(workload.file(".exit").read_text()) == {"status": entry.EXIT_CRASHED}
    records = [json.loads(line) for line in workload.task_log.read_text().splitlines()]
    assert {(r["level"], r["logger"]) for r in records} == {("error", "async_local_executor")}
    events = [r["event"] for r in records]
    assert events[0].startswith(f"async_local_executor: workload process {workload.pid} exited with code 1;")
    assert events[1] == "Traceback (most recent call last):"
    assert events[-1] == "ValueError: the task's supervisor broke after the handover"


def test_the_airflow3_workload_s_task_log_is_its_log_path_under_the_base_log_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__LOGGING__BASE_LOG_FOLDER", str(tmp_path / "logs"))
    task = workloads.task("ok", log_path="dag_id=d/run_id=r/task_id=t/attempt=1.log")
    found = airflow3._ENTRY.task_log
    assert found is not None
    assert found((task, {})) == TaskLogFile(tmp_path / "logs" / "dag_id=d/run_id=r/task_id=t/attempt=1.log")
    assert found((workloads.task("ok", log_path=None), {})) is None


class _TaskHandler(logging.Handler):
    """Airflow 2's FileTaskHandler as ``tasks run`` leaves it: ``handler`` is the file's own handler."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.handler = logging.FileHandler(path, delay=True)


@pytest.mark.parametrize("where", ["airflow.task", ""], ids=["task-logger", "moved-to-root"])
def test_the_airflow2_workload_s_task_log_is_the_file_its_task_handler_writes(
    tmp_path: Path, where: str
) -> None:
    found = airflow2._ENTRY.task_log
    assert found is not None
    command = (["airflow", "tasks", "run"], "")
    assert found(command) is None  # before `tasks run` has set its handler up
    handler = _TaskHandler(tmp_path / "attempt=1.log")
    logging.getLogger(where or None).addHandler(handler)
    try:
        assert found(command) == TaskLogFile(tmp_path / "attempt=1.log", text=True)
    finally:
        logging.getLogger(where or None).removeHandler(handler)
