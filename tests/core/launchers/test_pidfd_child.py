"""The child both launch paths return (``pidfd_child.py``), released: it runs on untouched, on both launch
paths and both event loops.

Real processes: what is tested is that nothing of ours (an event-loop transport closed or collected, a
waiter, a signal) reaches a process once it has been handed over. Each child
(tests/core/launchers/releasing.py) records every catchable signal it gets in a file, and blocks on a
shared lock the test holds exclusively, so it runs exactly as long as the test says. A released child
without pidfds is test_subprocess.py's, a contained one's test_contained.py's.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import psutil
import pytest
import uvloop

from async_local_executor.core.errors import Released
from async_local_executor.core.launchers.base import LaunchRequest
from tests.core.helpers import GUARD, Recorder, alive
from tests.core.launchers.releasing import HOLDER, finish, gate, holder, release_once_up
from tests.core.supervising import make_launcher

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def run_on(loop_name: str, main: Callable[[], Awaitable[int]]) -> int:
    """``main()`` on a fresh loop of that kind, which is closed (and its leftovers collected) after it.

    Warnings are not errors here, as in production: one raised in a finalizer (a collected Popen's
    "still running") would cut that finalizer short, and hide what it does to the child.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        loop = LOOPS[loop_name]()
        try:
            return loop.run_until_complete(main())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            del loop
            gc.collect()  # whatever held the child and kills or reaps it when collected does it now


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_a_released_child_outlives_its_launcher_and_the_event_loop(
    tmp_path: Path, kind: str, loop_name: str
) -> None:
    async def main() -> int:
        recorder = Recorder()
        async with make_launcher(kind, recorder) as launcher:
            # A first child opens what the launch path keeps for every later one.
            await (await launcher.launch(LaunchRequest("warm", [sys.executable, "-c", "pass"]))).wait()
            before = open_fds()
            child = await launcher.launch(holder(tmp_path))
            assert child.releasable
            pid = await release_once_up(child, recorder)
            assert pid == child.pid
            assert open_fds() == before  # its pipes and pidfd: closed once its wait raised
            with pytest.raises(Released):
                await child.wait()  # and any later wait
            for sig in (signal.SIGTERM, signal.SIGKILL):
                child.signal(sig)  # reaches nothing any more
            child.release()  # twice is once
        assert alive(pid)
        return pid

    with gate(tmp_path) as held:
        pid = run_on(loop_name, main)
        # The launcher is gone, the loop closed and collected: it still runs, untouched.
        assert alive(pid)
        assert psutil.Process(pid).ppid() == os.getpid()  # still ours to reap, as the test does
        assert finish(tmp_path, held, pid) == 0
    assert (tmp_path / "ran-on").read_text() == "yes"
    assert not (tmp_path / "signals").exists()


@pytest.mark.asyncio
async def test_a_child_released_before_anyone_waited_got_its_input_and_keeps_no_fd_of_ours(
    tmp_path: Path, kind: str
) -> None:
    # Its output pipe has no reader once it is released: it says what it read in a file, and nothing on
    # its output (the real workload's output relay takes over there).
    reader = (
        "import os, sys\n"
        "data = sys.stdin.read()\n"
        "open(os.path.join(sys.argv[1], 'input'), 'w').write(data)\n"
        "sys.stdout = open(os.devnull, 'w')\n" + HOLDER
    )
    recorder = Recorder()
    with gate(tmp_path) as held:
        async with make_launcher(kind, recorder) as launcher:
            # A first child opens what the launch path keeps for every later one.
            await (await launcher.launch(LaunchRequest("warm", [sys.executable, "-c", "pass"]))).wait()
            before = open_fds()
            request = LaunchRequest("held", [sys.executable, "-c", reader, str(tmp_path)], stdin=b"x" * 1000)
            child = await launcher.launch(request)
            child.release()  # never awaited
            assert open_fds() == before
            with pytest.raises(Released):
                await child.wait()
            pid = child.pid
        assert alive(pid)
        assert finish(tmp_path, held, pid) == 0
    assert (tmp_path / "input").read_text() == "x" * 1000
    assert (tmp_path / "ran-on").read_text() == "yes"
    assert not (tmp_path / "signals").exists()


@pytest.mark.asyncio
async def test_releasing_a_child_that_already_exited_reaps_it(kind: str) -> None:
    async with make_launcher(kind, Recorder()) as launcher:
        child = await launcher.launch(LaunchRequest("quick", [sys.executable, "-c", "pass"]))
        pidfd = os.pidfd_open(child.pid)
        try:
            with anyio.fail_after(GUARD):
                await anyio.wait_readable(pidfd)  # it has exited: a zombie of ours, not yet reaped
        finally:
            os.close(pidfd)
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
        child.release()
        with pytest.raises(psutil.NoSuchProcess):
            psutil.Process(child.pid)  # nothing left to hand over, and no zombie left behind
        with pytest.raises(Released):
            await child.wait()


@pytest.mark.asyncio
async def test_release_after_wait_returned_changes_nothing(kind: str) -> None:
    async with make_launcher(kind, Recorder()) as launcher:
        child = await launcher.launch(LaunchRequest("quick", [sys.executable, "-c", "raise SystemExit(3)"]))
        assert await child.wait() == 3
        child.release()
        assert await child.wait() == 3
