"""A workload that runs until the test lets it go and records every signal it gets, for the tests of a
released child (test_pidfd_child.py, test_contained.py).

Each child records every catchable signal it gets in a file, and blocks on a shared lock the test holds
exclusively (:func:`gate`), so it runs exactly as long as the test says.
"""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import anyio
import pytest

from async_local_executor.core.errors import Released
from async_local_executor.core.launchers.base import Child, LaunchRequest
from tests.core.helpers import GUARD, Recorder

# Runs until the gate's exclusive lock is dropped, then says it ran on; nothing written to its output
# after "up" (its reader is gone once it is released).
HOLDER = """
import fcntl, os, signal, sys
where = sys.argv[1]
def record(sig, frame):
    with open(os.path.join(where, "signals"), "a") as out:
        out.write(f"{sig}\\n")
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
            signal.SIGPIPE, signal.SIGCONT):
    signal.signal(sig, record)
print("up", os.getpid(), flush=True)
with open(os.path.join(where, "gate")) as gate:
    fcntl.flock(gate, fcntl.LOCK_SH)
with open(os.path.join(where, "ran-on"), "w") as out:
    out.write("yes")
"""


def holder(where: Path) -> LaunchRequest:
    return LaunchRequest("held", [sys.executable, "-c", HOLDER, str(where)])


@contextmanager
def gate(where: Path) -> Iterator[IO[str]]:
    """Held exclusively until the block ends: a holder started meanwhile runs until then."""
    path = where / "gate"
    path.touch()
    with path.open() as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield held


def finish(where: Path, held: IO[str], pid: int) -> int:
    """Let the holder ``pid`` (our child) end, reap it, and return its exit code."""
    fcntl.flock(held, fcntl.LOCK_UN)
    pidfd = os.pidfd_open(pid)
    try:
        readable, _, _ = select.select([pidfd], [], [], GUARD)
        assert readable, f"process {pid} did not end within {GUARD}s of its gate opening"
    finally:
        os.close(pidfd)
    # A new Popen reaps what collected Popens left unreaped (subprocess._active): not a released child.
    subprocess.run(["true"], check=True)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def said(recorder: Recorder, word: str) -> int | None:
    """The number the child printed after ``word``, if it did."""
    found = [int(line.split()[1]) for _, line in recorder.lines if line.startswith(word + " ")]
    return found[0] if found else None


async def release_once_up(child: Child, recorder: Recorder) -> int:
    """Release ``child`` once it is up, while another task is inside its wait() (which reads its output):
    that wait raises Released, promptly. Returns the pid it said."""
    raised = anyio.Event()

    async def waiter() -> None:
        with pytest.raises(Released):
            await child.wait()
        raised.set()

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await recorder.until(lambda: said(recorder, "up") is not None)
            child.release()
            await raised.wait()
    pid = said(recorder, "up")
    assert pid is not None
    return pid
