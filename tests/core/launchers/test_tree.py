"""A workload's tree is signalled group by group, and never a group whose id a later process holds.

The kernel's reuse of a pid cannot be produced on demand, so where a test needs "a later process under
the same number", it gives the signaller the start time the number had when it was seen, shifted: to the
signaller that is exactly what a reused pid looks like. Everything else is real processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from async_local_executor.core.launchers.tree import GroupSignaller, descendant_groups, held_by_another
from async_local_executor.core.proc_identity import start_ticks
from tests.core.cgroups.helpers import read_line, wait_gone
from tests.core.clock_step import step_wall_clock
from tests.core.helpers import GUARD, alive

# A leader in a session of its own whose child leads a group of its own, as a task SDK supervisor's is.
TREE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], process_group=0)
print(child.pid, flush=True)
time.sleep(600)
"""


@pytest.fixture
def tree() -> Iterator[tuple[subprocess.Popen[str], int]]:
    leader = subprocess.Popen(
        [sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    children: list[int] = []
    try:
        children.append(int(read_line(leader)))
        yield leader, children[0]
    finally:
        for pid in (leader.pid, *children):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        leader.wait(GUARD)
        if leader.stdout is not None:
            leader.stdout.close()


def test_the_leader_s_group_and_its_descendants_groups_are_signalled(
    tree: tuple[subprocess.Popen[str], int],
) -> None:
    leader, child = tree
    assert descendant_groups(leader.pid) == {child}
    GroupSignaller(leader.pid).send(signal.SIGTERM)
    assert leader.wait(GUARD) == -signal.SIGTERM
    assert wait_gone(child)


def test_a_group_whose_id_a_later_process_holds_is_left_alone(
    tree: tuple[subprocess.Popen[str], int],
) -> None:
    leader, child = tree
    signaller = GroupSignaller(leader.pid)
    signaller.send(0)  # finds the child's group
    start = start_ticks(child)
    assert start is not None
    signaller._groups[child] = start - 10  # the number was another process's when it was seen
    assert held_by_another(child, start - 10)
    assert not held_by_another(child, start)
    signaller.send(signal.SIGTERM)
    assert leader.wait(GUARD) == -signal.SIGTERM
    assert alive(child)  # a later process under that id: not ours to signal


def test_a_later_process_under_the_leader_s_pid_is_not_walked(
    tree: tuple[subprocess.Popen[str], int],
) -> None:
    leader, child = tree
    start = start_ticks(leader.pid)
    assert start is not None
    assert descendant_groups(leader.pid, start) == {child}
    assert descendant_groups(leader.pid, start - 10) == set()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_wall_clock_step_does_not_stop_the_signals(monkeypatch: pytest.MonkeyPatch, sig: int) -> None:
    # A task timeout, a revoke or a shutdown that comes after an NTP step must still reach the workload.
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        signaller = GroupSignaller(sleeper.pid)
        step_wall_clock(monkeypatch, 1.0)
        signaller.send(sig)
        assert sleeper.wait(GUARD) == -sig
    finally:
        with contextlib.suppress(OSError):
            sleeper.kill()
        sleeper.wait(GUARD)


def test_a_wall_clock_step_leaves_the_descendants_groups_signalled(
    tree: tuple[subprocess.Popen[str], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, child = tree
    signaller = GroupSignaller(leader.pid)
    signaller.send(0)  # finds the child's group before the step
    step_wall_clock(monkeypatch, -1.0)
    signaller.send(signal.SIGTERM)
    assert leader.wait(GUARD) == -signal.SIGTERM
    assert wait_gone(child)


def test_an_exited_leader_is_not_walked_and_its_remembered_groups_still_are_signalled(
    tree: tuple[subprocess.Popen[str], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Real: the zombie is the kernel's. The walk of a process's children reads every process's stat;
    # done once per exit, 1,500 exits at once cost 42 s on the loop instead of half a second.
    leader, child = tree
    signaller = GroupSignaller(leader.pid)
    signaller.send(0)  # seen while the leader runs: the child's group is remembered
    os.kill(leader.pid, signal.SIGKILL)
    os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie

    def no_walk(*args: object, **kwargs: object) -> list[object]:
        raise AssertionError("a zombie's children were walked")

    monkeypatch.setattr("psutil.Process.children", no_walk)
    assert descendant_groups(leader.pid) == set()
    signaller.send(signal.SIGKILL)
    assert wait_gone(child)
