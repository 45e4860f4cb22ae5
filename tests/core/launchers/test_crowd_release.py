"""A workload handed over leaves with the CPU share it had before its crowd lowered it (core/launchers/crowd.py).

A release (a stopping executor letting its running workloads go alive, for the next scheduler to adopt)
undoes what the executor did to a workload from outside: the successor cannot tell a lowering of the old
crowd from one of its own, and would otherwise leave the workload at the lowest share to its end. Real
children under a real supervisor, on both launch paths and both means (the process class, the cgroup's
CPU weight), read through the kernel once ``Supervisor.release()`` has returned. Mocked: nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable

import anyio
import pytest

from async_local_executor.core.cgroups import Containment
from async_local_executor.core.launchers import crowd
from async_local_executor.core.launchers.base import Launcher, LaunchRequest
from async_local_executor.core.launchers.contained import ContainedLauncher
from async_local_executor.core.launchers.crowd import Choice, CrowdLauncher, How
from async_local_executor.core.supervisor import Supervisor
from tests.core.cgroups import helpers as cgroup_helpers
from tests.core.cgroups.helpers import Scratch
from tests.core.helpers import GUARD, Recorder
from tests.core.helpers import payload_py as py
from tests.core.launchers.test_crowd import CROWDED, HOLDER, _cpu_share, _pids
from tests.core.test_supervisor import make_launcher

pytestmark = [pytest.mark.asyncio, pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux only")]

Check = Callable[[list[int]], None]
CROWDED_KEYS = ("x1", "x2")


async def _crowd_handed_over(launcher: Launcher, recorder: Recorder, lowered: Check) -> list[int]:
    """A holder (the crowd, at threshold 1), then two crowded ones; all three handed over alive.

    With three running and a threshold of 1, the crowd lasts while the first two of them are let go,
    whichever they are: at least one crowded one is let go while the crowd is still on.

    :returns: the crowded workloads' pids and their children's, once the release has returned
    """
    supervisor = Supervisor(launcher, recorder, limit=None)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        try:
            supervisor.submit(LaunchRequest(key="h", argv=py(HOLDER)))
            await recorder.until(lambda: _pids(recorder, "up"))
            for key in CROWDED_KEYS:
                supervisor.submit(LaunchRequest(key=key, argv=py(CROWDED)))
            await recorder.until(lambda: len(_pids(recorder, "crowded")) == 4)
            crowded = _pids(recorder, "crowded")
            lowered(crowded)  # what the crowd did, for the release to undo
            with anyio.fail_after(GUARD):
                handovers = await supervisor.release(grace=0)
        except BaseException:
            with anyio.fail_after(GUARD):
                await supervisor.shutdown(wait=0)
            raise
    assert {h.key for h in handovers} == {"h", *CROWDED_KEYS}
    assert recorder.outcomes == []  # handed over, not ended
    return crowded


def _end(recorder: Recorder) -> None:
    """Kill and reap the workloads handed over (ours to reap: the supervisor's children)."""
    for pid in [recorder.pids[key] for key in ("h", *CROWDED_KEYS) if key in recorder.pids]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # a crowded one's child is in its group
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


async def test_a_crowded_workload_handed_over_leaves_sched_idle_first(kind: str) -> None:
    recorder = Recorder()
    launcher = CrowdLauncher(make_launcher(kind, recorder), Choice(How.CLASS, "SCHED_IDLE"), crowd=1)

    def lowered(crowded: list[int]) -> None:
        assert [os.sched_getscheduler(pid) for pid in crowded] == [os.SCHED_IDLE] * 4

    try:
        crowded = await _crowd_handed_over(launcher, recorder, lowered)
        assert [os.sched_getscheduler(pid) for pid in crowded] == [os.SCHED_OTHER] * 4
    finally:
        _end(recorder)


@pytest.mark.skipif(bool(cgroup_helpers.unusable()), reason=cgroup_helpers.unusable())
async def test_a_crowded_contained_workload_handed_over_gets_its_cgroup_cpu_weight_back_first(
    box: Scratch, kind: str
) -> None:
    recorder = Recorder()
    containment: Containment = box.open()
    if not containment.weighs_cpu:
        pytest.skip(f"no cpu controller for workload cgroups here: {containment.describe()}")
    choice = crowd.choose(containment.weighs_cpu)
    launcher = CrowdLauncher(ContainedLauncher(make_launcher(kind, recorder), containment), choice, crowd=1)
    v1 = containment.controllers["cpu"] != "cgroup2"
    home, default = _cpu_share(os.getpid())

    def lowered(crowded: list[int]) -> None:
        assert {_cpu_share(pid)[1] for pid in crowded} == {"2" if v1 else "1"}

    try:
        for pid in await _crowd_handed_over(launcher, recorder, lowered):
            where, weight = _cpu_share(pid)
            # On v1 they move back beside the other workloads, into the scheduler's own cpu cgroup.
            assert (where, weight) == (home, default) if v1 else weight == "100"
    finally:
        _end(recorder)
