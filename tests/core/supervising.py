"""A supervisor serving on a real launcher, for the tests of the supervisor and of its launchers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.launchers.base import Launcher, LaunchRequest
from async_local_executor.core.launchers.forkserver.launcher import ForkServerLauncher
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.stopping import TerminationPolicy
from async_local_executor.core.supervisor import Supervisor
from tests.core.helpers import GUARD, Recorder

TARGET = "tests.core.launchers.forkserver.targets:python_c"


def make_launcher(kind: str, recorder: Recorder) -> Launcher:
    if kind == "forkserver":
        return ForkServerLauncher(target=TARGET, output=recorder.output)
    return SubprocessLauncher(output=recorder.output)


@asynccontextmanager
async def serving(
    recorder: Recorder,
    kind: str | Launcher = "subprocess",
    *,
    limit: int | None = None,
    clock: Clock = SYSTEM,
    grace: float = 10.0,
    **admission: Any,
) -> AsyncIterator[Supervisor]:
    supervisor = Supervisor(
        make_launcher(kind, recorder) if isinstance(kind, str) else kind,
        recorder,
        limit=limit,
        policy=TerminationPolicy(grace=grace),
        clock=clock,
        **admission,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        try:
            yield supervisor
        finally:
            try:
                # Longer than the shutdown's own wait, so its escalation runs before the guard trips.
                with anyio.fail_after(GUARD * 2 + grace):
                    await supervisor.shutdown(wait=GUARD)
            finally:
                tg.cancel_scope.cancel()  # a shutdown cut short must fail the test, not leave serve() running


def in_flight(supervisor: Supervisor) -> int:
    """Workloads accepted and not finished: running or waiting (loop thread only, as ``state()``)."""
    state = supervisor.state()
    return len(state.running) + state.waiting


def request(key: object, **fields: Any) -> LaunchRequest:
    return LaunchRequest(key, ["workload"], **fields)


def fork_server(recorder: Recorder, **kwargs: object) -> ForkServerLauncher:
    """A fork-server launcher on the test target, its output to ``recorder``."""
    options: dict[str, object] = {"target": TARGET, "output": recorder.output}
    options.update(kwargs)
    return ForkServerLauncher(**options)  # type: ignore[arg-type]


async def helper_replaced(launcher: ForkServerLauncher, dead: int) -> int:
    """The pid of the helper that replaced ``dead``, once the launcher has one."""
    with anyio.fail_after(GUARD):
        # The launcher publishes no event for a new helper; the guard bounds a real failure.
        while launcher.report().pid in (None, dead):  # noqa: ASYNC110
            await anyio.sleep(0.01)
    pid = launcher.report().pid
    assert pid is not None
    return pid
