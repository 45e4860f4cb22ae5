"""A workload process started by the plain subprocess launcher dies with the executor, its task too.

Real processes, no Airflow: a stand-in for the scheduler starts a workload through the real entry
skeleton; the workload forks a task process that ignores SIGTERM and, like Airflow 3's task supervisor,
answers SIGTERM by passing it on to the task and waiting. Then the scheduler is killed outright.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys

import psutil
import pytest

from tests.core.helpers import GUARD
from tests.processes import exits

WORKLOAD = """
import os, signal, sys
from async_local_executor.adapter.workload.entry import Entry

task = {"pid": 0}

def forward(signum, frame):
    if task["pid"]:
        os.kill(task["pid"], signal.SIGTERM)

def run(payload):
    # Installed before the fork, so a SIGTERM at any moment finds the supervisor's answer in place.
    signal.signal(signal.SIGTERM, forward)
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.setpgid(0, 0)  # as the task SDK puts the task process
        print(os.getppid(), os.getpid(), flush=True)
        while True:
            signal.pause()
    task["pid"] = pid
    os.waitpid(pid, 0)
    return 0

sys.exit(Entry("tests.workload", "payload", lambda raw: raw, run).main())
"""

SCHEDULER = """
import os, signal, subprocess, sys
subprocess.Popen([sys.executable, "-c", sys.argv[1], "--parent-pid", str(os.getpid())], stdin=subprocess.DEVNULL)
while True:
    signal.pause()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_workload_and_its_sigterm_ignoring_task_die_with_a_killed_scheduler() -> None:
    scheduler = subprocess.Popen(
        [sys.executable, "-c", SCHEDULER, WORKLOAD], stdout=subprocess.PIPE, text=True
    )
    assert scheduler.stdout is not None
    workload, task = (int(x) for x in scheduler.stdout.readline().split())
    try:
        scheduler.kill()
        assert scheduler.wait(GUARD) == -signal.SIGKILL
        assert exits(workload, GUARD), "the workload process outlived the scheduler"
        assert exits(task, GUARD), "the task process outlived the scheduler"
    finally:
        for pid in (workload, task):
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        scheduler.stdout.close()
