"""A process is recognised by its start as the kernel keeps it, whatever its name or the wall clock does."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from async_local_executor.core.proc_identity import runs_as, start_ticks, started_as
from tests.core.clock_step import step_wall_clock
from tests.core.helpers import GUARD
from tests.processes import SLEEP, read_line

# Its name (stat's second field) holds what a naive split of /proc/<pid>/stat trips on.
RENAMED = "open('/proc/self/comm', 'w').write('x) y ) (z'); print('named', flush=True); input()"


@pytest.fixture
def renamed() -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", RENAMED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert read_line(proc) == "named\n"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(GUARD)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def _ticks_by_psutil(pid: int) -> int:
    # create_time is ticks / CLK_TCK + btime; both read now, so the step, if any, cancels out.
    since_boot = float(psutil.Process(pid).create_time()) - float(psutil.boot_time())
    return round(since_boot * os.sysconf("SC_CLK_TCK"))


def test_the_start_is_read_past_a_name_with_spaces_and_parentheses(renamed: int) -> None:
    assert psutil.Process(renamed).name() == "x) y ) (z"
    assert start_ticks(renamed) == _ticks_by_psutil(renamed)
    assert runs_as(renamed, _ticks_by_psutil(renamed))


def test_a_gone_process_has_no_start() -> None:
    proc = subprocess.Popen(SLEEP)
    proc.kill()
    proc.wait(GUARD)
    assert start_ticks(proc.pid) is None
    assert not started_as(proc.pid, 0)


def test_a_zombie_is_the_process_it_was_but_runs_no_more() -> None:
    proc = subprocess.Popen([sys.executable, "-c", ""])
    start = start_ticks(proc.pid)
    assert start is not None
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped
    try:
        assert started_as(proc.pid, start)
        assert not runs_as(proc.pid, start)
        assert not started_as(proc.pid, start + 1)  # a later process under that pid
    finally:
        proc.wait(GUARD)


@pytest.mark.parametrize("step", [1.0, -3600.0])
def test_a_wall_clock_step_moves_no_start(monkeypatch: pytest.MonkeyPatch, step: float) -> None:
    me, start = os.getpid(), start_ticks(os.getpid())
    assert start is not None
    step_wall_clock(monkeypatch, step)
    assert start_ticks(me) == start
    assert runs_as(me, start)
