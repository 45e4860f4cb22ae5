"""Adopted workloads and the crowd's CPU share (core/launchers/crowd.py, through ``base.adopted_by``).

An adopted workload competes for the CPU as any that runs: it counts in the crowd a start is measured
against. One that arrives still lowered (left by a crash, which cannot undo anything) gets its share
back when the successor takes it, unless the successor's own crowd is on then: it stays lowered until
that crowd ends.

Real processes: each predecessor's workload is started by the test in a session of its own and, where
it arrived lowered, put in ``SCHED_IDLE`` (or its cgroup weighed down) before it starts its child, as a
predecessor's crowd does; then it is taken as a successor takes it (:class:`AdoptedChild`). Each runs
until the test closes its stdin. Mocked: nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from async_local_executor.core import cpu_priority
from async_local_executor.core.cgroups import Containment, WorkloadCgroup
from async_local_executor.core.launchers.adopted import AdoptedChild
from async_local_executor.core.launchers.base import Child, Launcher, LaunchRequest, adopted_by
from async_local_executor.core.launchers.contained import ContainedLauncher
from async_local_executor.core.launchers.crowd import Choice, CrowdLauncher, How
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.proc_identity import start_ticks
from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import Scratch, read_line
from tests.core.helpers import GUARD, Recorder
from tests.core.helpers import payload_py as py
from tests.core.launchers.test_crowd import CROWDED, _cpu_share, _pids
from tests.core.test_supervisor import make_launcher

pytestmark = [pytest.mark.asyncio, pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux only")]

CLASS = Choice(How.CLASS, "SCHED_IDLE")
# A predecessor's workload: told to go once its share is set, it starts a child (which inherits the
# class), says both pids, and runs until its stdin closes.
WORKLOAD = (
    "import os, subprocess, sys\n"
    "sys.stdin.readline()\n"
    "child = subprocess.Popen(['sleep', '600'])\n"
    "print(os.getpid(), child.pid, flush=True)\n"
    "try:\n    sys.stdin.read()\nfinally:\n    child.kill()\n    child.wait()\n"
)


@dataclass
class Running:
    """A predecessor's workload process, and the pids it said: its own and its child's."""

    proc: subprocess.Popen[str]
    pids: list[int]

    def classes(self) -> list[int]:
        return [os.sched_getscheduler(pid) for pid in self.pids]


class Predecessor:
    """Workload processes a stopped executor left running, each the leader of its own session."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *, lowered: bool = False, cgroup: WorkloadCgroup | None = None) -> Running:
        """One workload, in ``SCHED_IDLE`` (``lowered``) and ``cgroup`` before it starts anything."""
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKLOAD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.procs.append(proc)
        if cgroup is not None:
            cgroup.join(proc.pid)
        if lowered:
            cpu_priority.lower(proc.pid)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        return Running(proc, [int(pid) for pid in read_line(proc).split()])

    def end(self, running: Running) -> None:
        assert running.proc.stdin is not None
        running.proc.stdin.close()

    def cleanup(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its child too
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


@pytest.fixture
def predecessor() -> Iterator[Predecessor]:
    made = Predecessor()
    try:
        yield made
    finally:
        made.cleanup()


IDLE, OTHER = [os.SCHED_IDLE] * 2, [os.SCHED_OTHER] * 2


async def take(launcher: Launcher, running: Running, cgroup_dir: Path | None = None) -> Child:
    """Taken over as a successor's supervisor takes an adopted workload: through its launch path."""
    start = start_ticks(running.proc.pid)
    assert start is not None
    child = AdoptedChild.take(running.proc.pid, start, lambda: 0, cgroup_dir)
    with anyio.fail_after(GUARD):
        return await adopted_by(launcher, child, None if cgroup_dir is None else str(cgroup_dir))


@asynccontextmanager
async def crowd_of(threshold: int, inner: Launcher | None = None) -> AsyncIterator[CrowdLauncher]:
    launcher = CrowdLauncher(inner or SubprocessLauncher(output=Recorder().output), CLASS, crowd=threshold)
    async with launcher:
        yield launcher


async def ended(child: Child) -> None:
    with anyio.fail_after(GUARD):
        assert await child.wait() == 0


async def test_one_that_arrives_in_sched_idle_outside_a_crowd_leaves_it_when_taken(
    predecessor: Predecessor,
) -> None:
    running = predecessor.start(lowered=True)
    assert running.classes() == IDLE
    async with crowd_of(2) as launcher:
        child = await take(launcher, running)
        assert running.classes() == OTHER
        predecessor.end(running)
        await ended(child)


async def test_one_that_arrives_in_sched_idle_in_a_crowd_keeps_it_until_the_crowd_ends(
    predecessor: Predecessor,
) -> None:
    first, second = predecessor.start(), predecessor.start()
    late = predecessor.start(lowered=True)
    assert late.classes() == IDLE
    async with crowd_of(2) as launcher:
        children = [await take(launcher, proc) for proc in (first, second)]
        lowered = await take(launcher, late)  # two adopted run: a crowd at threshold 2
        assert (first.classes(), second.classes(), late.classes()) == (OTHER, OTHER, IDLE)
        predecessor.end(first)
        await ended(children[0])
        assert late.classes() == IDLE  # two still run
        predecessor.end(second)
        await ended(children[1])
        assert late.classes() == OTHER  # the crowd ended
        predecessor.end(late)
        await ended(lowered)


async def test_adopted_workloads_count_in_the_crowd_a_start_is_measured_against(
    predecessor: Predecessor, kind: str
) -> None:
    recorder = Recorder()
    adopted = [predecessor.start(), predecessor.start()]
    statuses: list[int] = []
    async with crowd_of(2, make_launcher(kind, recorder)) as launcher:
        children = [await take(launcher, running) for running in adopted]
        started = await launcher.launch(LaunchRequest(key="x", argv=py(CROWDED)))

        async def reap() -> None:  # its wait() is what reads its output
            statuses.append(await started.wait())

        try:
            with anyio.fail_after(GUARD):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(reap)
                    await recorder.until(lambda: _pids(recorder, "crowded"))
                    workload, grandchild = _pids(recorder, "crowded")
                    assert workload == started.pid
                    # Started while two adopted ones ran: crowded.
                    assert [os.sched_getscheduler(pid) for pid in (workload, grandchild)] == IDLE
                    for running, child in zip(adopted, children, strict=True):
                        predecessor.end(running)
                        await ended(child)
                    # Fewer than two run: the crowd of adopted ones ended, and the start gets its share back.
                    assert [os.sched_getscheduler(pid) for pid in (workload, grandchild)] == OTHER
                    started.signal(signal.SIGKILL)
        finally:
            started.signal(signal.SIGKILL)  # a failed test leaves nothing running either
    assert statuses == [-signal.SIGKILL]


@pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())
async def test_one_whose_cgroup_arrives_weighed_down_gets_its_cpu_weight_back_when_taken(
    box: Scratch, predecessor: Predecessor
) -> None:
    containment: Containment = box.open()
    if not containment.weighs_cpu:
        pytest.skip(f"no cpu controller for workload cgroups here: {containment.describe()}")
    v1 = containment.controllers["cpu"] != "cgroup2"
    home, default = _cpu_share(os.getpid())
    cgroup = containment.create("w1", low_cpu=True)  # as a predecessor's crowd made it
    assert cgroup is not None
    running = predecessor.start(cgroup=cgroup)
    assert {_cpu_share(pid)[1] for pid in running.pids} == {"2" if v1 else "1"}
    async with crowd_of(
        2, ContainedLauncher(SubprocessLauncher(output=Recorder().output), containment)
    ) as launcher:
        child = await take(launcher, running, cgroup.path)
        for pid in running.pids:
            where, weight = _cpu_share(pid)
            # On v1 they move back beside the other workloads, into the scheduler's own cpu cgroup.
            assert (where, weight) == (home, default) if v1 else weight == "100"
        child.release()  # the box's cleanup ends it: its cgroup goes with the box


async def test_with_the_crowd_off_one_that_arrives_in_sched_idle_still_gets_its_share_back(
    predecessor: Predecessor,
) -> None:
    # workload_cpu_priority = normal (or a nice value) after a predecessor ran with auto: the wiring still
    # puts a crowd that lowers nothing in the launch path, for this (core/wiring.py).
    running = predecessor.start(lowered=True)
    launcher = CrowdLauncher(SubprocessLauncher(output=Recorder().output), Choice(How.NONE, "off"), crowd=0)
    async with launcher:
        child = await take(launcher, running)
        assert running.classes() == OTHER
        predecessor.end(running)
        await ended(child)
