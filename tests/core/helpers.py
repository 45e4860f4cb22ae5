"""Test doubles for the supervisor's collaborators: a recording listener and a hand-driven clock."""

from __future__ import annotations

import sys
from collections.abc import Hashable

import anyio
import psutil

from async_local_executor.core.supervisor import Outcome

# Guards against a hang; never what a test waits for.
GUARD = 60.0


def alive(pid: int) -> bool:
    """Running; a zombie (exited, not yet reaped) runs nothing any more.

    One read of the process's status: a pid that exits between an existence check and a status read
    would otherwise raise instead of answering.
    """
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


class Recorder:
    """Listener and output sink in one; lets a test wait for a specific event instead of sleeping."""

    def __init__(self) -> None:
        self.pids: dict[Hashable, int] = {}
        self.outcomes: list[Outcome] = []
        self.lines: list[tuple[Hashable, str]] = []
        self._changed = anyio.Event()

    def started(self, key: Hashable, pid: int) -> None:
        self.pids[key] = pid
        self._poke()

    def finished(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        self._poke()

    def output(self, key: Hashable, line: str) -> None:
        self.lines.append((key, line))
        self._poke()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def until(self, predicate: object, guard: float = GUARD) -> None:
        assert callable(predicate)
        with anyio.fail_after(guard):
            while not predicate():
                await self._changed.wait()

    def outcome(self, key: Hashable) -> Outcome:
        [found] = [o for o in self.outcomes if o.key == key]
        return found


class ManualClock:
    """A sleep that returns only when the test advances time, so grace periods cost no real time."""

    def __init__(self) -> None:
        self.requested: list[float] = []
        self._advanced = anyio.Event()
        self._waiting = anyio.Event()

    async def sleep(self, seconds: float) -> None:
        self.requested.append(seconds)
        self._waiting.set()
        await self._advanced.wait()

    async def sleeper_waiting(self) -> None:
        with anyio.fail_after(GUARD):
            await self._waiting.wait()

    def advance(self) -> None:
        self._advanced.set()
