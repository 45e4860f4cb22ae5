"""Releasing a running workload: it runs on untouched, on both launch paths and both event loops.

Real processes: what is tested is that nothing of ours (an event-loop transport closed or collected, a
waiter, a signal, a cgroup's cleanup) reaches a process once it has been handed over. Each child records
every catchable signal it gets in a file, and blocks on a shared lock the test holds exclusively, so it
runs exactly as long as the test says.
"""

from __future__ import annotations

import asyncio
import fcntl
import gc
import os
import select
import signal
import subprocess
import sys
import warnings
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import anyio
import psutil
import pytest
import uvloop

from async_local_executor.core.errors import Released
from async_local_executor.core.launchers.base import Child, Launcher, LaunchRequest
from async_local_executor.core.launchers.contained import ContainedLauncher
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import Scratch
from tests.core.helpers import GUARD, Recorder, alive
from tests.core.supervising import make_launcher

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

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


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


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


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


@pytest.mark.asyncio
async def test_without_pidfds_a_child_is_not_releasable_and_stays_supervised() -> None:
    # The event loop's transport kills what it watches when it is closed: such a child says so, and its
    # release does nothing (the supervisor terminates it instead).
    recorder = Recorder()
    async with SubprocessLauncher(output=recorder.output, pidfds=False) as launcher:
        child = await launcher.launch(
            LaunchRequest("k", [sys.executable, "-c", "import sys; print(sys.stdin.read())"], stdin=b"in")
        )
        assert not child.releasable
        child.release()
        with anyio.fail_after(GUARD):
            assert await child.wait() == 0
    assert recorder.lines == [("k", "in")]


@pytest.mark.asyncio
@pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())
async def test_a_released_contained_child_keeps_its_cgroup_and_everything_in_it(
    box: Scratch, tmp_path: Path, kind: str
) -> None:
    # It leaves a process of its own in its cgroup: a cgroup settled on release would kill it. It reads
    # its input first, as a workload does: on the plain path, what it ran before would run outside.
    code = (
        "import subprocess, sys\n"
        "sys.stdin.read()\n"
        "left = subprocess.Popen(['sleep', '600'], stdout=subprocess.DEVNULL, start_new_session=True)\n"
        "print('left', left.pid, flush=True)\n" + HOLDER
    )
    recorder = Recorder()
    launcher: Launcher = ContainedLauncher(make_launcher(kind, recorder), box.open())
    with gate(tmp_path) as held:
        async with launcher:
            child = await launcher.launch(LaunchRequest("held", [sys.executable, "-c", code, str(tmp_path)]))
            assert child.cgroup is not None
            assert child.releasable
            pid = await release_once_up(child, recorder)
            left = said(recorder, "left")
            assert left is not None
            child.signal(signal.SIGKILL)  # neither its cgroup nor its group gets anything
            assert child.cleanup is None  # never settled
        path = child.cgroup.path
        assert path.is_dir()
        members = {int(p) for p in (path / "cgroup.procs").read_text().split()}
        assert {pid, left} <= members
        assert alive(pid)
        assert alive(left)
        assert finish(tmp_path, held, pid) == 0
    assert alive(left)  # the box's cleanup kills it, with the cgroup
    assert not (tmp_path / "signals").exists()
