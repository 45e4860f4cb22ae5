"""A launcher and its children with no processes behind them, for the supervisor's own logic.

They honour the contract of ``core/launchers/base.py``: a :class:`FakeChild` exits when the test says
so (:meth:`FakeChild.exit`) or when a signal it does not ignore reaches it, and records every signal
it got; a :class:`FakeLauncher` records every request, can refuse a launch or hold it until the test
lets it go, and reports what the test sets. Nothing here sleeps: a test waits for an event.
"""

from __future__ import annotations

import itertools
import signal
from collections.abc import Callable, Collection, Hashable
from types import TracebackType

import anyio
from typing_extensions import Self

from async_local_executor.core.cgroups.group import WorkloadCgroup
from async_local_executor.core.errors import ChildLost, Released
from async_local_executor.core.launchers.base import LauncherReport, LaunchRequest
from async_local_executor.core.outcome import Cleanup
from tests.core.helpers import GUARD

# Far above any real pid, so a fake one can never name a process of this host.
FIRST_PID = 4_000_000_000


class FakeChild:
    """A workload that runs until :meth:`exit`, or until a signal not in ``ignores`` ends it.

    :param ignores: signals it survives (SIGKILL is never among them)
    """

    def __init__(
        self, request: LaunchRequest, pid: int, changed: Callable[[], None], ignores: Collection[int] = ()
    ) -> None:
        self.request = request
        self._pid = pid
        self._changed = changed
        self._ignores = frozenset(ignores) - {signal.SIGKILL}
        self._exited = anyio.Event()
        self._status: int | ChildLost = 0
        self.signals: list[int] = []
        self.waits = 0  # times the supervisor awaited it
        self.cgroup: WorkloadCgroup | None = None
        self.cleanup: Cleanup | None = None
        self.cleanup_after_exit: Cleanup | None = None  # what ``cleanup`` becomes once it is awaited
        self.stuck = False  # no signal ends it, SIGKILL included (a process in D state, say)
        self.releasable = True  # False: as a child of a launch path that cannot let a process go
        self.released = False
        self._let_go = anyio.Event()

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def running(self) -> bool:
        return not self._exited.is_set()

    def exit(self, status: int) -> None:
        """End it with ``status`` (negative: killed by that signal), as a real exit would."""
        if self.running:
            self._status = status
            self._exited.set()
            self._changed()

    def lose(self, why: str) -> None:
        """End it with its status lost."""
        if self.running:
            self._status = ChildLost(why)
            self._exited.set()
            self._changed()

    def signal(self, sig: int) -> None:
        self.signals.append(sig)
        self._changed()
        if sig not in self._ignores and not self.stuck:
            self.exit(-sig)

    def release(self) -> None:
        self.released = True
        self._let_go.set()
        self._changed()

    async def wait(self) -> int:
        self.waits += 1
        if not self.released:
            async with anyio.create_task_group() as tg:

                async def let_go() -> None:
                    await self._let_go.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(let_go)
                await self._exited.wait()
                tg.cancel_scope.cancel()
        if self.released:
            raise Released(f"fake {self._pid} handed over")
        self.cleanup = self.cleanup_after_exit
        if isinstance(self._status, ChildLost):
            raise self._status
        return self._status


class FakeLauncher:
    """Launches :class:`FakeChild` workloads; what it does with each is the test's to set.

    :param ignores: signals every child it launches survives
    """

    def __init__(self, *, ignores: Collection[int] = ()) -> None:
        self.requests: list[LaunchRequest] = []
        self.children: dict[Hashable, FakeChild] = {}
        self.report_as = LauncherReport("fake launcher")
        self.refuse: dict[Hashable, BaseException] = {}  # key -> what its launch raises
        self.held: dict[Hashable, anyio.Event] = {}  # key -> set to let its launch return
        self.stuck: set[Hashable] = set()  # keys whose children no signal ends (see FakeChild.stuck)
        self.entered = self.exited = False
        self._ignores = ignores
        self._pids = itertools.count(FIRST_PID)
        self._changed = anyio.Event()

    async def __aenter__(self) -> Self:
        self.entered = True
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.exited = True

    def report(self) -> LauncherReport:
        return self.report_as

    def hold(self, key: Hashable) -> anyio.Event:
        """Make the launch of ``key`` wait (the process "being started") until the event is set."""
        self.held[key] = event = anyio.Event()
        return event

    async def launch(self, request: LaunchRequest) -> FakeChild:
        self.requests.append(request)
        self.poke()
        held = self.held.get(request.key)
        if held is not None:
            await held.wait()
        refused = self.refuse.get(request.key)
        if refused is not None:
            raise refused
        child = FakeChild(request, next(self._pids), self.poke, self._ignores)
        child.stuck = request.key in self.stuck
        self.children[request.key] = child
        self.poke()
        return child

    @property
    def running(self) -> list[Hashable]:
        """Keys of the children not exited yet, in launch order."""
        return [key for key, child in self.children.items() if child.running]

    def poke(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def until(self, predicate: Callable[[], bool], guard: float = GUARD) -> None:
        with anyio.fail_after(guard):
            while not predicate():
                await self._changed.wait()
