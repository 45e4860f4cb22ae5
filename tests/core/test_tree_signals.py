"""Signalling a workload's tree only through processes whose identity was checked, with real processes."""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from async_local_executor.core.launchers.tree import GroupSignaller, Known, Listed, targets, to_adopt
from tests.core.helpers import GUARD, alive

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]

# A workload whose child starts a session of its own (as a BashOperator's shell does) and a grandchild
# there. With "stubborn" as argument both ignore SIGTERM, which stays ignored across their exec.
LEADER = f"""
import signal, subprocess, sys
sleep = {SLEEP!r}
child_code = '''
import signal, subprocess, sys, time
g = subprocess.Popen({SLEEP!r})
print(g.pid, flush=True)
time.sleep(600)
'''
if sys.argv[1:] == ["stubborn"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", child_code], start_new_session=True, stdout=subprocess.PIPE)
grandchild = int(child.stdout.readline())
signal.signal(signal.SIGTERM, signal.SIG_DFL)
print(child.pid, grandchild, flush=True)
sys.stdin.read()
"""

# A workload that leaves a process in its own group behind when it exits (its stdin closed).
LEAVING = f"""
import subprocess, sys
member = subprocess.Popen({SLEEP!r})
print(member.pid, flush=True)
sys.stdin.read()
"""


def read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        assert selector.select(GUARD), "no line from the child within the guard"
    return proc.stdout.readline()


def until_dead(*pids: int) -> None:
    """Wait for each to exit: a pidfd, of any process, turns readable when it does."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            assert select.select([fd], [], [], GUARD)[0], f"pid {pid} still running"
        finally:
            os.close(fd)


@pytest.fixture
def spawned() -> Iterator[list[int]]:
    """Pids to kill after the test, whatever it asserted; our own children are reaped too."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


@pytest.fixture
def killpgs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every group id the signaller passes to ``killpg`` (which still signals it)."""
    calls: list[int] = []
    real: Callable[[int, int], None] = os.killpg

    def recording(group: int, sig: int) -> None:
        calls.append(group)
        real(group, sig)

    monkeypatch.setattr(os, "killpg", recording)
    return calls


def start(spawned: list[int], code: str, *args: str) -> subprocess.Popen[str]:
    # As the launchers start a workload: leading a group (and a session) of its own.
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    spawned.append(proc.pid)
    return proc


def take_pid(pid: int, spawned: list[int]) -> subprocess.Popen[bytes] | None:
    """A stranger leading a group of its own under ``pid``, or None where the kernel cannot be asked.

    Root may tell the kernel the last pid it gave out; the next fork then gets the one after, unless
    another process on the host forks first, hence a few attempts.
    """
    for _ in range(20):
        try:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        except OSError:
            return None
        stranger = subprocess.Popen(SLEEP, start_new_session=True)
        spawned.append(stranger.pid)
        if stranger.pid == pid:
            return stranger
        stranger.kill()
        stranger.wait()
    return None


def test_sigterm_reaches_the_leader_a_child_in_its_own_session_and_its_grandchild(
    spawned: list[int],
) -> None:
    leader = start(spawned, LEADER)
    child, grandchild = map(int, read_line(leader).split())
    spawned += [child, grandchild]
    assert os.getsid(child) == child != os.getpgid(leader.pid)

    GroupSignaller(leader.pid).send(signal.SIGTERM)

    assert leader.wait(GUARD) == -signal.SIGTERM
    until_dead(child, grandchild)


def test_after_the_leader_is_reaped_its_known_descendants_are_still_reached_and_its_id_never_signalled(
    spawned: list[int], killpgs: list[int]
) -> None:
    leader = start(spawned, LEADER, "stubborn")
    child, grandchild = map(int, read_line(leader).split())
    spawned += [child, grandchild]
    signaller = GroupSignaller(leader.pid)
    signaller.send(signal.SIGTERM)  # the leader dies of it; its child and grandchild ignore it
    assert leader.wait(GUARD) == -signal.SIGTERM
    assert alive(child)
    assert alive(grandchild)
    assert psutil.Process(child).ppid() != leader.pid  # reparented: no longer found from the leader
    # Where the kernel lets us, an unrelated process now holds the leader's pid and leads a group with
    # it: a killpg of the leader's id would kill it.
    stranger = take_pid(leader.pid, spawned)
    killpgs.clear()

    signaller.send(signal.SIGKILL)

    until_dead(child, grandchild)
    if stranger is not None:
        assert stranger.poll() is None, "the process that took the leader's pid was signalled"
    assert leader.pid not in killpgs


def test_what_the_leader_left_in_its_group_is_killed_after_it_was_reaped(
    spawned: list[int], killpgs: list[int]
) -> None:
    # As after a workload's exit: the first signal comes only once its leader was reaped.
    leader = start(spawned, LEAVING)
    member = int(read_line(leader))
    spawned.append(member)
    signaller = GroupSignaller(leader.pid)
    assert leader.stdin is not None
    leader.stdin.close()
    assert leader.wait(GUARD) == 0
    assert os.getpgid(member) == leader.pid  # the group outlives its leader

    signaller.send(signal.SIGKILL)

    until_dead(member)
    assert leader.pid not in killpgs


# The leader L (pid 10, its own group) started C (11) in a session of its own, and C started G (12).
L, C, G = 10, 11, 12


@pytest.mark.parametrize(
    ("known", "groups", "pids"),
    [
        pytest.param(
            [Known(L, True, L), Known(C, True, C), Known(G, True, C)], [L, C], [], id="all running: by group"
        ),
        pytest.param(
            [Known(L, False, None), Known(C, True, C), Known(G, True, C)],
            [C],
            [],
            id="leader reaped: its group never signalled",
        ),
        pytest.param(
            [Known(L, False, None), Known(13, True, L), Known(G, True, C)],
            [],
            [G, 13],
            id="group leaders gone: members one by one",
        ),
        pytest.param(
            [Known(L, True, L), Known(13, True, L)], [L], [], id="a zombie leader still reserves its id"
        ),
        pytest.param([Known(C, True, 99)], [], [C], id="a group led by an unknown process: not signalled"),
        pytest.param([Known(C, True, None)], [], [C], id="group unreadable: the process alone"),
        pytest.param([Known(L, False, None), Known(C, False, None)], [], [], id="nothing running"),
    ],
)
def test_which_groups_and_processes_are_signalled(
    known: list[Known], groups: list[int], pids: list[int]
) -> None:
    assert targets(known) == (groups, pids)


STRANGER = 500


@pytest.mark.parametrize(
    ("known", "listing", "adopted"),
    [
        pytest.param(
            [Known(L, True, L, 100.0, True)],
            [Listed(C, L, C, 101.0), Listed(G, C, C, 102.0), Listed(STRANGER, 1, STRANGER, 50.0)],
            [C, G],
            id="descendants of a running leader",
        ),
        pytest.param(
            [Known(L, True, L, 100.0, True)],
            [Listed(C, L, C, 99.0), Listed(G, C, C, 102.0)],
            [],
            id="a child older than its parent holds a reused pid under a stale link",
        ),
        pytest.param(
            [Known(L, True, L, 100.0, True)],
            [Listed(C, L, L, 101.0, zombie=True)],
            [],
            id="zombies are never adopted",
        ),
        pytest.param(
            [Known(L, False, None, 100.0, True, session=L)],
            [Listed(13, 1, L, 101.0, session=L), Listed(14, 13, L, 103.0, session=L)],
            [13, 14],
            id="a reaped leader's group members while no process holds its pid",
        ),
        pytest.param(
            [Known(L, False, None, 100.0, True, session=L)],
            [Listed(L, 1, L, 200.0), Listed(13, L, L, 201.0, session=L)],
            [],
            id="a reaped leader's pid held by another process: its group is not ours",
        ),
        pytest.param(
            [Known(L, False, None, 100.0, True, session=L)],
            [Listed(13, 1, L, 99.0, session=L), Listed(14, 1, L, 101.0, session=77)],
            [],
            id="older than the leader, or in another session: not its group's",
        ),
        pytest.param(
            [Known(C, False, None, 100.0, False)],
            [Listed(13, 1, C, 101.0, session=C)],
            [],
            id="a gone process never seen leading a group: its id is nothing to go by",
        ),
        pytest.param(
            [Known(L, False, None, 100.0, True), Known(C, True, C, 101.0)],
            [Listed(C, 1, C, 101.0), Listed(G, C, C, 102.0)],
            [G],
            id="grandchildren found through their living parent once the leader is gone",
        ),
    ],
)
def test_which_processes_are_adopted_into_the_tree(
    known: list[Known], listing: list[Listed], adopted: list[int]
) -> None:
    assert to_adopt(known, listing) == adopted
