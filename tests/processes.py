"""Real processes a test starts and must not leave behind: a long sleep, one line read under a guard, the
exit of a process that is not ours to wait for."""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.core.helpers import GUARD

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        assert selector.select(GUARD), "no line from the child within the guard"
    return proc.stdout.readline()


def exits(pid: int, guard: float = GUARD) -> bool:
    """Whether ``pid`` exits within ``guard`` seconds.

    Not our child, so not waited for: the kernel makes a pidfd readable when its process exits.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # exited and already reaped by its new parent
    try:
        readable, _, _ = select.select([fd], [], [], guard)
        return bool(readable)
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
