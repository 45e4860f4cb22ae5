"""Test doubles for the supervisor's collaborators: a recording listener and a hand-driven clock."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import sys
import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

import anyio
import psutil

from async_local_executor.core.launchers.base import Child, LaunchRequest, Takeover
from async_local_executor.core.outcome import Outcome

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


def payload_py(code: str) -> list[str]:
    """``code`` run after reading its stdin (its payload), as the real workload entry does: what it ran
    before that would run outside its cgroup on the plain launch path."""
    return py("import sys\nsys.stdin.read()\n" + code)


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


class FakeClock:
    """A :class:`~async_local_executor.core.clock.Clock` whose time moves only when the test advances it.

    Sleepers and ``move_on_after`` timeouts on any event loop (the executor's loop thread included) fire
    when an advance passes their deadline; a test waits for one to be parked before it advances, so
    nothing depends on timing.
    """

    def __init__(self, monotonic: float = 1_000.0, wall: float = 1_800_000_000.0) -> None:
        self._lock = threading.Condition()
        self._now = monotonic
        self._wall_offset = wall - monotonic
        # (deadline, loop, what to call on that loop when the deadline passes)
        self._sleepers: list[tuple[float, asyncio.AbstractEventLoop, Callable[[], object]]] = []

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def time(self) -> float:
        with self._lock:
            return self._now + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = self._park(seconds, loop, functools.partial(_resolve, future))
        try:
            await future
        finally:
            self._unpark(entry)

    @contextmanager
    def move_on_after(self, seconds: float, shield: bool = False) -> Iterator[anyio.CancelScope]:
        loop = asyncio.get_running_loop()
        with anyio.CancelScope(shield=shield) as scope:
            entry = self._park(seconds, loop, scope.cancel)
            try:
                yield scope
            finally:
                self._unpark(entry)

    @property
    def sleeping(self) -> int:
        """Sleepers and timeouts parked on this clock."""
        with self._lock:
            return len(self._sleepers)

    def remaining(self) -> list[float]:
        """How far each parked sleeper or timeout is from its deadline, soonest first."""
        with self._lock:
            return sorted(deadline - self._now for deadline, _, _ in self._sleepers)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
        self._wake_due()

    def wait_for_sleepers(self, count: int = 1, guard: float = GUARD) -> None:
        """Block (the calling thread) until ``count`` sleepers or timeouts are parked on this clock."""
        with self._lock:
            assert self._lock.wait_for(lambda: len(self._sleepers) >= count, guard), "no sleeper parked"

    async def sleepers(self, count: int = 1, guard: float = GUARD) -> None:
        """The same, from a coroutine: waits on a worker thread so the loop keeps running."""
        await anyio.to_thread.run_sync(self.wait_for_sleepers, count, guard)

    def _park(
        self, seconds: float, loop: asyncio.AbstractEventLoop, fire: Callable[[], object]
    ) -> tuple[float, asyncio.AbstractEventLoop, Callable[[], object]]:
        with self._lock:
            entry = (self._now + max(0.0, seconds), loop, fire)
            self._sleepers.append(entry)
            self._lock.notify_all()
        if seconds <= 0:
            self._wake_due()
        return entry

    def _unpark(self, entry: tuple[float, asyncio.AbstractEventLoop, Callable[[], object]]) -> None:
        with self._lock:
            if entry in self._sleepers:
                self._sleepers.remove(entry)

    def _wake_due(self) -> None:
        with self._lock:
            due = [s for s in self._sleepers if s[0] <= self._now]
            for entry in due:
                self._sleepers.remove(entry)
        for _, loop, fire in due:
            loop.call_soon_threadsafe(fire)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def is_dead(pid: int) -> bool:
    # Killed but not yet reaped by its new parent (init) still counts as dead.
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


async def until_dead(pid: int) -> None:
    # SIGTERM/SIGKILL are queued at once but take effect when the process next runs; on a loaded
    # machine that is not instantaneous, so wait for the effect (the guard only bounds a real failure).
    with anyio.fail_after(GUARD):
        while not is_dead(pid):  # noqa: ASYNC110 - a process's death has no event to await here
            await anyio.sleep(0.01)


class Said(logging.Handler):
    """Wakes the test's loop on each log line of the logger it is added to (the line must be emitted on
    that loop's thread, as the supervisor's and the launchers' are)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []
        self.changed = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.changed.set()
        self.changed = anyio.Event()

    async def until(self, part: str) -> str:
        """The last line logged that holds ``part``, once there is one."""
        with anyio.fail_after(GUARD):
            while not (found := [m for m in self.messages if part in m]):
                await self.changed.wait()
        return found[-1]


def say(**fields: object) -> None:
    """One JSON line on stdout: a driver process's report to the test that runs it."""
    print(json.dumps(fields), flush=True)


def taking_over(
    request: LaunchRequest, take: Callable[[], Child], launched: float, cgroup_dir: str | None = None
) -> LaunchRequest:
    """``request`` for a running process another executor launched: the launch path takes it with ``take``."""
    return dataclasses.replace(request, takeover=Takeover(take, launched, cgroup_dir))
