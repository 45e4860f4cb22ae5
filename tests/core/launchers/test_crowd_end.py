"""A crowd that ends while a crowded start is still being launched still gives that start its share back.

The crowd gives back the shares it lowered when fewer than its threshold run; a start it lowered is on
that list only once its launch has returned. Real children under a real supervisor, on both launch
paths; the crowded start's launch is held (a slow fork server, say) until the crowd has ended. Mocked:
nothing.
"""

from __future__ import annotations

import os

import anyio
import pytest

from async_local_executor.core.launchers.base import Child, Launcher, LaunchRequest, Wrapper
from async_local_executor.core.launchers.crowd import Choice, CrowdLauncher, How
from tests.core.helpers import Recorder
from tests.core.helpers import payload_py as py
from tests.core.launchers.test_crowd import CROWDED, HOLDER, _pids
from tests.core.test_supervisor import make_launcher, serving

pytestmark = [pytest.mark.asyncio, pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux only")]


class Held(Wrapper):
    """Holds the launch of ``key`` until :attr:`go` is set."""

    def __init__(self, inner: Launcher, key: str) -> None:
        super().__init__(inner)
        self.key = key
        self.waiting = anyio.Event()
        self.go = anyio.Event()

    async def launch(self, request: LaunchRequest) -> Child:
        if request.key == self.key:
            self.waiting.set()
            await self.go.wait()
        return await self._inner.launch(request)


async def test_a_start_the_crowd_lowered_gets_its_share_back_when_the_crowd_ended_during_its_launch(
    kind: str,
) -> None:
    recorder = Recorder()
    held = Held(make_launcher(kind, recorder), "x")
    launcher = CrowdLauncher(held, Choice(How.CLASS, "SCHED_IDLE"), crowd=2)
    async with serving(recorder, launcher) as supervisor:
        for key in ("h1", "h2"):
            supervisor.submit(LaunchRequest(key=key, argv=py(HOLDER)))
        await recorder.until(lambda: len(_pids(recorder, "up")) == 2)
        supervisor.submit(LaunchRequest(key="x", argv=py(CROWDED)))  # two run: crowded
        with anyio.fail_after(10):
            await held.waiting.wait()
        for key in ("h1", "h2"):
            supervisor.stop(key, "test")
        await recorder.until(lambda: len(recorder.outcomes) == 2)  # the crowd has ended
        held.go.set()
        await recorder.until(lambda: _pids(recorder, "crowded"))
        workload, grandchild = _pids(recorder, "crowded")
        # Lowered as it started, and given back as its launch returned: the crowd had ended meanwhile.
        assert [os.sched_getscheduler(pid) for pid in (workload, grandchild)] == [os.SCHED_OTHER] * 2
        supervisor.stop("x", "test")
        await recorder.until(lambda: len(recorder.outcomes) == 3)
