"""Spawns through event loops are one at a time in the process (core/launchers/base.py ``open_process``).

Two threads, each with a uvloop event loop of its own, as a scheduler with two teams' executors runs,
spawn real processes at once. A Python before-fork hook that gives the GIL away (as logging's lock can
when another thread holds it) lets the other loop start a spawn inside the first one's: uvloop refuses
that with "Racing with another loop to spawn a process". Through ``open_process`` none is refused.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
import pytest

from async_local_executor.core.launchers.base import open_process

uvloop = pytest.importorskip("uvloop")
SPAWNS = 40
_hooked = {"on": False}


def _yield_the_gil() -> None:
    if _hooked["on"]:
        time.sleep(0.0005)


os.register_at_fork(before=_yield_the_gil)

Spawn = Callable[..., Awaitable[anyio.abc.Process]]


def _refusals(spawn: Spawn) -> list[str]:
    refused: list[str] = []

    async def spawn_many() -> None:
        for _ in range(SPAWNS):
            try:
                process = await spawn(
                    ["true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            except RuntimeError as exc:
                refused.append(str(exc))
                continue
            await process.wait()
            await process.aclose()

    def loop() -> None:
        anyio.run(spawn_many, backend="asyncio", backend_options={"use_uvloop": True})

    _hooked["on"] = True
    try:
        threads = [threading.Thread(target=loop) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        _hooked["on"] = False
    return refused


def test_two_loops_spawning_at_once_race_without_it() -> None:
    # What the lock is for: the race is real on this machine (so the test below can fail).
    assert "Racing with another loop to spawn a process." in _refusals(anyio.open_process)


def test_two_loops_spawning_at_once_through_it_are_never_refused() -> None:
    assert _refusals(open_process) == []
