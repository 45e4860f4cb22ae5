"""Adopted workloads beyond the free slots take them on credit, on every anyio pyproject allows.

``core/admission.py``: a process that already runs (adopted from a stopped executor) never waits for a
slot; where the limit is full it takes one on credit, and what waits to launch goes only once the count
is back under the limit. anyio 4.7 to 4.11 (which ``anyio>=4.7`` allows, and older Airflow constraints
pin) refuse a ``CapacityLimiter`` limit below 1 and over-grant when a limit is raised, so this module
is meant to pass there too: in a venv with that anyio, psutil, pytest, pytest-asyncio, pytest-timeout
and uvloop, without Airflow, ``PYTHONPATH=src:. python -m pytest tests/core/test_admission.py
--confcutdir=tests/core`` (the suite's own conftest reads Airflow's version).

The supervisor test adopts real processes (``sys.executable -c``) through :class:`AdoptedChild`, as a
successor takes them; the test ends each by closing its stdin. The admission test needs no process,
nor does the check of the limit.
"""

from __future__ import annotations

import fcntl
import functools
import subprocess
import sys
from collections.abc import Hashable, Iterator
from pathlib import Path

import anyio
import anyio.abc
import pytest

from async_local_executor.core.admission import Admission
from async_local_executor.core.launchers.adopted import AdoptedChild
from async_local_executor.core.launchers.base import Child, Launcher, LaunchRequest, TakesOver, Wrapper
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.core.supervisor import Supervisor
from tests.core.helpers import Recorder, py, taking_over
from tests.core.supervising import serving

# Runs until its stdin is closed: the test says when each adopted workload ends.
UNTIL_STDIN_CLOSES = "import sys\nsys.stdin.read()\n"
# Runs until the gate file's exclusive lock (held by the test) is dropped.
UNTIL_GATE_OPENS = (
    "import fcntl, sys\nfcntl.flock(open(sys.argv[1]), fcntl.LOCK_SH)\nprint('ran', flush=True)\n"
)


class Admitted(Wrapper):
    """Records each request the moment admission lets it through to the launch."""

    def __init__(self, inner: Launcher) -> None:
        super().__init__(inner)
        self.keys: list[Hashable] = []

    async def launch(self, request: LaunchRequest) -> Child:
        self.keys.append(request.key)
        return await self._inner.launch(request)


@pytest.fixture
def predecessors() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Three running workload processes, each the leader of its own session as a launched one is."""
    procs = [
        subprocess.Popen(py(UNTIL_STDIN_CLOSES), stdin=subprocess.PIPE, start_new_session=True)
        for _ in range(3)
    ]
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()
        if proc.stdin is not None:
            proc.stdin.close()


def _end(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()


@pytest.mark.asyncio
async def test_three_adopted_into_one_slot_all_run_and_a_new_launch_waits_until_the_credit_is_repaid(
    predecessors: list[subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    recorder = Recorder()
    launcher = Admitted(SubprocessLauncher(output=recorder.output))
    gate = tmp_path / "gate"
    gate.touch()
    # Adopted processes are taken before Admitted sees them: it records the launches admission let through.
    async with serving(recorder, TakesOver(launcher), limit=1) as supervisor:
        for index, proc in enumerate(predecessors):
            start = start_ticks(proc.pid)
            assert start is not None
            take = functools.partial(AdoptedChild.take, proc.pid, start, lambda: 0)
            supervisor.adopt(taking_over(LaunchRequest(f"adopted-{index}", ("adopted",)), take, 1.0))
        supervisor.submit(LaunchRequest("new", py("print('new ran', flush=True)")))
        await recorder.until(lambda: len(recorder.pids) == 3 or recorder.outcomes)
        # Every adopted one is supervised: none failed for want of a slot.
        assert recorder.outcomes == []
        assert sorted(w.pid for w in supervisor.state().running) == sorted(p.pid for p in predecessors)
        for ended, proc in enumerate(predecessors):
            await anyio.wait_all_tasks_blocked()
            assert launcher.keys == [], f"launched with {3 - ended} adopted running, limit 1"
            _end(proc)
            await recorder.until(lambda ended=ended: len(recorder.outcomes) == ended + 1)
        await recorder.until(lambda: len(recorder.outcomes) == 4)
        assert launcher.keys == ["new"]
        assert ("new", "new ran") in recorder.lines

        # The credit is repaid, no more: the limit is 1 again, so of two new ones one runs at a time.
        with gate.open() as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            for key in ("first", "second"):
                supervisor.submit(LaunchRequest(key, [sys.executable, "-c", UNTIL_GATE_OPENS, str(gate)]))
            await recorder.until(lambda: "first" in recorder.pids)
            await anyio.wait_all_tasks_blocked()
            assert launcher.keys == ["new", "first"]
        await recorder.until(lambda: len(recorder.outcomes) == 6)
    assert launcher.keys == ["new", "first", "second"]
    assert [o.ok for o in recorder.outcomes] == [True] * 6, recorder.outcomes


@pytest.mark.asyncio
async def test_a_limit_back_up_as_credit_is_repaid_lets_through_only_what_fits_under_it() -> None:
    # Limit 2: an ordinary workload holds a slot, two adopted ones take the other and one on credit,
    # and two ordinary ones wait. Each slot held is a task the test ends when it says.
    admission = Admission(limit=2)
    inside: list[str] = []
    ends: dict[str, anyio.Event] = {}

    async def hold(key: str, running: bool) -> None:
        ends[key] = anyio.Event()
        async with admission.slot(LaunchRequest(key, ("x",)), running=running):
            inside.append(key)
            await ends[key].wait()
            inside.remove(key)

    async def end(key: str) -> list[str]:
        ends[key].set()
        await anyio.wait_all_tasks_blocked()
        return sorted(inside)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold, "ordinary", False)
            await anyio.wait_all_tasks_blocked()
            for key, running in (("adopted-1", True), ("adopted-2", True), ("w1", False), ("w2", False)):
                tg.start_soon(hold, key, running)
            await anyio.wait_all_tasks_blocked()
            assert sorted(inside) == ["adopted-1", "adopted-2", "ordinary"]
            assert await end("adopted-2") == ["adopted-1", "ordinary"]  # the credit repaid, nothing freed
            assert await end("ordinary") == ["adopted-1", "w1"]
            assert await end("adopted-1") == ["w1", "w2"]
            assert await end("w1") == ["w2"]
            assert await end("w2") == []


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="limit must be >= 1"):
        Supervisor(SubprocessLauncher(), Recorder(), limit=0)


class _Holding:
    """Tasks that each hold a slot of ``admission`` until the test ends them; ``inside`` lists who holds one."""

    def __init__(self, admission: Admission, tg: anyio.abc.TaskGroup) -> None:
        self.admission = admission
        self.inside: list[str] = []
        self._ends: dict[str, anyio.Event] = {}
        self._tg = tg

    def start(self, key: str, *, pausable: bool = True, group: str = "") -> None:
        self._ends[key] = anyio.Event()

        async def hold() -> None:
            async with self.admission.slot(LaunchRequest(key, ("x",), pausable=pausable, group=group)):
                self.inside.append(key)
                await self._ends[key].wait()
                self.inside.remove(key)

        self._tg.start_soon(hold)

    async def now(self) -> list[str]:
        await anyio.wait_all_tasks_blocked()
        return sorted(self.inside)

    async def end(self, key: str) -> list[str]:
        self._ends[key].set()
        return await self.now()


@pytest.mark.asyncio
async def test_a_pause_holds_new_starts_back_but_not_what_holds_a_slot_nor_what_is_not_pausable() -> None:
    admission = Admission(limit=3)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            held = _Holding(admission, tg)
            held.start("running")
            assert await held.now() == ["running"]
            admission.pause()
            assert admission.paused
            held.start("task")
            held.start("callback", pausable=False)
            # What runs goes on; a callback is not held; the task waits, holding no slot.
            assert await held.now() == ["callback", "running"]
            assert admission.held == 2
            admission.resume()
            assert await held.now() == ["callback", "running", "task"]
            for key in ("running", "callback", "task"):
                await held.end(key)


@pytest.mark.asyncio
async def test_a_task_handed_a_slot_while_paused_gives_it_to_the_next_in_line() -> None:
    # Limit 1: a task and then a callback wait for the one slot; the pause comes; the slot frees. The task
    # (first in line) is handed it, gives it back, and the callback gets it.
    admission = Admission(limit=1)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            held = _Holding(admission, tg)
            held.start("first")
            assert await held.now() == ["first"]
            held.start("task")
            held.start("callback", pausable=False)
            await held.now()
            admission.pause()
            assert await held.end("first") == ["callback"]
            admission.resume()
            assert await held.end("callback") == ["task"]
            await held.end("task")


@pytest.mark.asyncio
async def test_a_resize_up_lets_waiters_through_and_down_stops_nothing_that_holds_a_slot() -> None:
    admission = Admission(limit=2, group_limits={"q": 1})
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            held = _Holding(admission, tg)
            for key in ("a", "b", "c", "d"):
                held.start(key)
            assert await held.now() == ["a", "b"]
            admission.resize(4, {})
            assert await held.now() == ["a", "b", "c", "d"]
            assert admission.limit == 4
            # Down to 1: all four go on; the next starts only once fewer than 1 hold a slot.
            admission.resize(1, {"q": 2})
            held.start("e")
            assert await held.now() == ["a", "b", "c", "d"]
            for key in ("a", "b", "c"):
                await held.end(key)
            assert await held.now() == ["d"]
            assert await held.end("d") == ["e"]
            assert admission.group_limits == {"q": 2}
            # A group's limit, raised live, lets its waiters through.
            held.start("q1", group="q")
            held.start("q2", group="q")
            held.start("q3", group="q")
            admission.resize(None, {})
            assert await held.now() == ["e", "q1", "q2"]
            admission.resize(None, {"q": 3})
            assert await held.now() == ["e", "q1", "q2", "q3"]
            for key in ("e", "q1", "q2", "q3"):
                await held.end(key)


def test_a_resize_below_one_is_refused_and_changes_nothing() -> None:
    admission = Admission(limit=2, group_limits={"q": 1})
    with pytest.raises(ValueError, match="must be >= 1"):
        admission.resize(0, {})
    with pytest.raises(ValueError, match="group 'q' must be >= 1"):
        admission.resize(3, {"q": -1})
    assert (admission.limit, admission.group_limits) == (2, {"q": 1})
