"""A workload started with a handover timeout outlives the executor, through both entry points.

Real processes, no Airflow: a stand-in for the scheduler starts a workload through the real entry
skeleton, as a fresh interpreter (``main``) or as a fork-server child would be (``forked_main``: forked,
in a process group of its own, tied to the scheduler by the parent-death signal). The workload forks a
task process that ignores SIGTERM, in a process group of its own as the task SDK puts it, and waits for
the test to release it. Then the scheduler is killed outright.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from async_local_executor.adapter.workload import entry
from async_local_executor.core import custody, custody_files
from async_local_executor.core.proc_identity import start_ticks
from tests.core.helpers import GUARD
from tests.processes import exits
from tests.waits import poll

WORKLOAD = """
import os, signal, sys, time
from async_local_executor.adapter.workload.entry import Entry

def run(payload):
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.setpgid(0, 0)  # as the task SDK puts the task process
        print(os.getppid(), os.getpid(), flush=True)
        while not os.path.exists(os.environ["RELEASE"]):
            time.sleep(0.02)
        os._exit(0)
    os.waitpid(pid, 0)
    return 9

entry = Entry("tests.workload", "payload", lambda raw: raw, run)
if __name__ == "__main__":
    sys.exit(entry.main())
"""

SCHEDULER = """
import os, signal, subprocess, sys
from async_local_executor.core import lifeline

mode, code, *flags = sys.argv[1:]
flags = ["--parent-pid", str(os.getpid()), *flags]
if mode == "main":
    subprocess.Popen(
        [sys.executable, "-c", code, *flags], stdin=subprocess.DEVNULL, start_new_session=True
    )
elif os.fork() == 0:  # as the fork server makes a child: own group, tied to us, payload in memory
    os.setpgid(0, 0)
    if not lifeline.die_with_parent(int(flags[1]), signal.SIGKILL):
        os._exit(3)
    namespace = {"__name__": "forked"}
    exec(code, namespace)
    os._exit(namespace["entry"].forked_main(["python", "-m", "workload", *flags], b"payload"))
while True:
    signal.pause()
"""


class Scheduler:
    def __init__(self, mode: str, flags: tuple[str, ...], release: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SCHEDULER, mode, WORKLOAD, *flags],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "RELEASE": str(release)},
        )
        assert self.proc.stdout is not None
        self.workload, self.task = (int(x) for x in self.proc.stdout.readline().split())

    def kill(self) -> None:
        self.proc.kill()
        assert self.proc.wait(GUARD) == -signal.SIGKILL

    def cleanup(self) -> None:
        for pid in (self.workload, self.task):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait(GUARD)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def schedulers() -> Iterator[list[Scheduler]]:
    started: list[Scheduler] = []
    yield started
    for scheduler in started:
        scheduler.cleanup()


def flags(directory: Path, timeout: float) -> tuple[str, ...]:
    every = entry.argv_flags(0, "normal", handover_timeout=timeout, custody_dir=str(directory))
    return every[2:]  # the scheduler stand-in puts its own --parent-pid first


def test_the_handover_flags_make_the_round_trip_and_are_absent_when_off() -> None:
    on = entry.argv_flags(12, "low", "/learn", "/first", handover_timeout=300, custody_dir="/state/custody")
    assert on[-4:] == ("--handover-timeout", "300.0", "--custody-dir", "/state/custody")
    args = entry.parse(["python", "-m", "x", *on])
    assert (args.parent_pid, args.cpu_priority, args.learn_imports, args.path0) == (
        12,
        "low",
        "/learn",
        "/first",
    )
    assert (args.handover_timeout, args.custody_dir, args.hands_over) == (300.0, "/state/custody", True)
    off = entry.argv_flags(12, "low", "/learn", "/first")  # the four arguments as before, positional
    assert off == (
        "--parent-pid",
        "12",
        "--cpu-priority",
        "low",
        "--learn-imports",
        "/learn",
        "--path0",
        "/first",
    )
    args = entry.parse(off)
    assert (args.handover_timeout, args.custody_dir, args.hands_over) == (0.0, "", False)
    assert (
        entry.parse(entry.argv_flags(12, "low", handover_timeout=0.25, custody_dir="/c")).handover_timeout
        == 0.25
    )


@pytest.mark.parametrize(
    ("parent", "timeout", "directory"),
    [(0, 300.0, "/c"), (12, 0.0, "/c"), (12, 300.0, "")],
    ids=["parent-unknown", "timeout-0", "no-custody-dir"],
)
def test_without_a_parent_a_timeout_and_a_custody_dir_there_is_no_handover(
    parent: int, timeout: float, directory: str
) -> None:
    flags = entry.argv_flags(parent, "normal", handover_timeout=timeout, custody_dir=directory)
    assert not entry.parse(flags).hands_over


@pytest.mark.skipif(not custody.supported(), reason="custody is Linux's")
@pytest.mark.parametrize("mode", ["main", "forked"])
def test_a_workload_and_its_task_outlive_a_killed_scheduler_and_record_their_exit_code(
    mode: str, tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    release = tmp_path / "release"
    scheduler = Scheduler(mode, flags(tmp_path, 30.0), release)
    schedulers.append(scheduler)
    scheduler.kill()
    release.touch()  # only a task still running after the kill can see it and end
    name = custody_files.name(scheduler.workload, start_ticks(scheduler.workload) or 0)
    exit_file = tmp_path / f"{name}.exit"
    poll("the workload's recorded exit code", exit_file.exists, GUARD)
    assert json.loads(exit_file.read_text()) == {"status": 9}
    assert exits(scheduler.workload, GUARD)


@pytest.mark.skipif(not custody.supported(), reason="custody is Linux's")
@pytest.mark.parametrize("mode", ["main", "forked"])
def test_an_unadopted_workload_and_its_sigterm_ignoring_task_die_after_the_timeout(
    mode: str, tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    scheduler = Scheduler(mode, flags(tmp_path, 1.5), tmp_path / "never")
    schedulers.append(scheduler)
    killed = time.monotonic()
    scheduler.kill()
    assert exits(scheduler.workload, GUARD), "the workload outlived its handover timeout"
    assert time.monotonic() - killed >= 1.5, "the workload did not wait to be adopted"
    assert exits(scheduler.task, GUARD), "the task process outlived its workload process"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_fork_server_child_without_a_handover_still_dies_with_the_scheduler(
    tmp_path: Path, schedulers: list[Scheduler]
) -> None:
    scheduler = Scheduler("forked", ("--cpu-priority", "normal"), tmp_path / "never")
    schedulers.append(scheduler)
    scheduler.kill()
    assert exits(scheduler.workload, GUARD), "the fork-server child outlived the scheduler"
    assert exits(scheduler.task, GUARD), "the task process outlived the scheduler"
    assert list(tmp_path.iterdir()) == []
