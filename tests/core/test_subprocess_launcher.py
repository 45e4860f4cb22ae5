"""The plain launch path's child, awaited the way nothing in the supervisor normally does."""

from __future__ import annotations

import os

import anyio
import psutil
import pytest

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
