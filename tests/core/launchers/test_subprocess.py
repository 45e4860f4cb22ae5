"""The plain launch path's child, awaited the way nothing in the supervisor normally does."""

from __future__ import annotations

import os
import sys

import anyio
import psutil
import pytest

from async_local_executor.core.errors import LaunchError
from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from tests.core.helpers import GUARD, Recorder, py

pytestmark = pytest.mark.asyncio


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def test_a_wait_cut_short_kills_the_process_and_closes_its_pipes() -> None:
    recorder = Recorder()
    async with SubprocessLauncher(output=recorder.output) as launcher:
        # A first child opens what the event loop keeps for every later one (uvloop opens /dev/null).
        await (await launcher.launch(LaunchRequest("warm", py("pass")))).wait()
        before = open_fds()
        child = await launcher.launch(
            LaunchRequest("k", py("import time; print('up', flush=True); time.sleep(600)"))
        )
        with anyio.fail_after(GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(child.wait)
                await recorder.until(lambda: ("k", "up") in recorder.lines)
                tg.cancel_scope.cancel()
    # Nobody will await it again: it must not run on, and what held its output must be closed.
    with pytest.raises(psutil.NoSuchProcess):
        psutil.Process(child.pid)
    assert open_fds() == before


async def test_a_program_that_cannot_start_fails_the_launch_naming_it_and_the_cause() -> None:
    # A real spawn: the cause in words comes from the OS (or, on uvloop, from the launcher's own probe).
    async with SubprocessLauncher() as launcher:
        with pytest.raises(LaunchError) as failed:
            await launcher.launch(LaunchRequest("missing", ["/nonexistent/python3"]))
        child = await launcher.launch(LaunchRequest("fine", py("pass")))
        assert await child.wait() == 0  # the next launch is not hurt
    assert "/nonexistent/python3" in str(failed.value)
    assert "No such file" in str(failed.value)


async def test_the_report_names_the_path_and_never_a_problem() -> None:
    report = SubprocessLauncher().report()
    assert (report.description, report.problem, report.preload) == (
        "subprocess: every workload starts a fresh interpreter",
        None,
        None,
    )


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
