"""Workload processes apply the operator's CPU priority setting to themselves, and everything they start inherits it.

Plain child processes: each applies a setting, starts a grandchild, says so on stdout and waits on
stdin; the test reads both processes' scheduling policy and nice value from outside, through the kernel.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from async_local_executor.core import cpu_priority

CHILD = """
import subprocess, sys
from async_local_executor.core import cpu_priority
problem = cpu_priority.apply(sys.argv[1])
grandchild = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
print(grandchild.pid, problem, flush=True)
sys.stdin.read()
grandchild.stdin.close()
grandchild.wait()
"""


@contextmanager
def _applied(setting: str) -> Iterator[tuple[int, int, str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, setting], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdin is not None
    try:
        grandchild, problem = child.stdout.readline().split(" ", 1)
        yield child.pid, int(grandchild), problem.strip()
    finally:
        child.stdin.close()
        child.wait(timeout=30)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
def test_idle_puts_the_workload_and_its_descendants_in_sched_idle() -> None:
    with _applied("idle") as (child, grandchild, problem):
        assert problem == "None"
        assert os.sched_getscheduler(child) == os.SCHED_IDLE
        assert os.sched_getscheduler(grandchild) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller is never touched


def test_a_nice_increment_is_relative_to_the_launcher() -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    with _applied("7") as (child, grandchild, problem):
        assert problem == "None"
        assert os.getpriority(os.PRIO_PROCESS, child) == min(19, ours + 7)
        assert os.getpriority(os.PRIO_PROCESS, grandchild) == min(19, ours + 7)


def test_normal_changes_nothing() -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    with _applied("normal") as (child, _, problem):
        assert problem == "None"
        assert os.sched_getscheduler(child) == os.SCHED_OTHER
        assert os.getpriority(os.PRIO_PROCESS, child) == ours


def test_a_refused_change_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)  # what a seccomp profile may do
    assert (
        cpu_priority.apply("idle")
        == "could not lower the CPU priority to 'idle': [Errno 1] Operation not permitted"
    )


@pytest.mark.parametrize("raw", ["", "low", "0", "20", "-5", "1.5"])
def test_parse_refuses_anything_else(raw: str) -> None:
    with pytest.raises(ValueError, match="must be auto, idle, normal or a nice increment from 1 to 19"):
        cpu_priority.parse(raw)


def test_parse_normalises() -> None:
    assert [cpu_priority.parse(v) for v in (" IDLE", "Normal", " 19 ", "03", "Auto")] == [
        "idle",
        "normal",
        "19",
        "3",
        "auto",
    ]


def test_auto_changes_nothing_in_the_workload() -> None:
    # The scheduler decides a crowded start's class from outside (core/crowd.py), so it can undo it.
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    with _applied("auto") as (child, grandchild, problem):
        assert problem == "None"
        assert os.sched_getscheduler(child) == os.SCHED_OTHER
        assert os.getpriority(os.PRIO_PROCESS, grandchild) == ours
