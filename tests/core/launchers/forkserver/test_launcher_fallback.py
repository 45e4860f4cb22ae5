"""Launches the fork server (``launcher.py``) cannot take go to the fallback launcher, and say why.

A request too large for the channel is the request's fault: the helper stays. A helper that is not
single-threaded (a preload started a thread) must not fork at all: no helper from then on, rather than
a loop of helpers that would all refuse.
"""

from __future__ import annotations

import logging
import os
import signal

import anyio
import psutil
import pytest

from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from tests.core.helpers import GUARD, Recorder, py, until_dead
from tests.core.supervising import fork_server, helper_replaced, serving

pytestmark = pytest.mark.asyncio

LOGGER = "async_local_executor.core.launchers.forkserver"
# Says whether the fork server ran it: a forked child has the target's module, a fresh interpreter not.
FORKED = py(
    "import sys; print('forked' if 'tests.core.launchers.forkserver.targets' in sys.modules else 'fresh')"
)
# Far below the 1 MiB the channel asks for, and below what any host grants: the limit the tests meet.
SMALL_BUFFER = 64 * 1024


def ran(recorder: Recorder, key: str) -> str:
    [line] = [line for k, line in recorder.lines if k == key]
    return line


def messages(caplog: pytest.LogCaptureFixture, part: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if part in r.getMessage()]


async def test_a_request_larger_than_the_granted_buffer_falls_back_and_the_helper_stays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What a host at the kernel's default net.core.wmem_max meets with requests of 416 KB to 1 MiB;
    # the test asks for a small buffer instead, so it does not depend on the host's setting.
    caplog.set_level(logging.WARNING, logger=LOGGER)
    recorder = Recorder()
    fallback = SubprocessLauncher(output=recorder.output)
    launcher = fork_server(recorder, fallback=fallback, channel_buffer=SMALL_BUFFER)
    async with serving(recorder, launcher) as supervisor:
        helper = await helper_replaced(launcher, -1)
        # Each argument within exec's own limit per argument (128 KiB), all of them past the channel's.
        supervisor.submit(LaunchRequest("big", [*FORKED, *["a" * SMALL_BUFFER] * 4]))
        await recorder.until(lambda: recorder.outcomes)
        assert recorder.outcome("big").ok, recorder.outcome("big").reason
        supervisor.submit(LaunchRequest("small", FORKED))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        assert launcher.report().pid == helper
        assert launcher.problem is None
    assert recorder.outcome("small").ok
    assert ran(recorder, "big") == "fresh"
    assert ran(recorder, "small") == "forked"
    assert launcher.helpers_started == 1
    [warning] = messages(caplog, "workload big")
    assert "exceeds the fork-server channel's limit" in warning
    assert warning.endswith("starting it as a fresh interpreter instead")


async def test_a_preload_that_starts_a_thread_keeps_the_fork_server_from_forking(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    recorder = Recorder()
    fallback = SubprocessLauncher(output=recorder.output)
    launcher = fork_server(
        recorder, preload=["decimal", "tests.core.launchers.forkserver.threaded"], fallback=fallback
    )
    async with serving(recorder, launcher) as supervisor:
        for key in ("a", "b"):
            supervisor.submit(LaunchRequest(key, FORKED))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        problem = launcher.problem
    assert all(o.ok for o in recorder.outcomes)
    assert [ran(recorder, key) for key in ("a", "b")] == ["fresh", "fresh"]
    # Said as a warning once, naming the module and its thread; it is tried again after a backoff (a
    # thread a preload starts may be a race), not on every launch.
    warnings = [
        r for r in caplog.records if r.levelno == logging.WARNING and "could not start" in r.getMessage()
    ]
    [warning] = [r.getMessage() for r in warnings]
    assert "preloading tests.core.launchers.forkserver.threaded started 1 thread (sdk-exporter)" in warning
    assert "decimal" not in warning
    assert warning.endswith(
        "workloads start fresh interpreters meanwhile, the fork server is tried again in 1s"
    )
    assert problem is not None
    assert "tests.core.launchers.forkserver.threaded" in problem
    assert launcher.helpers_started == 0
    assert not messages(caplog, "starting a new fork server")


async def _threads(pid: int, count: int) -> None:
    with anyio.fail_after(GUARD):
        # The thread starts when the helper handles the signal; its thread count is the only sign.
        while psutil.Process(pid).num_threads() != count:  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def test_a_helper_that_gains_a_thread_after_startup_forks_nothing_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    recorder = Recorder()
    fallback = SubprocessLauncher(output=recorder.output)
    launcher = fork_server(
        recorder, preload=["tests.core.launchers.forkserver.late_thread"], fallback=fallback
    )
    async with serving(recorder, launcher) as supervisor:
        helper = await helper_replaced(launcher, -1)
        supervisor.submit(LaunchRequest("before", FORKED))
        await recorder.until(lambda: recorder.outcomes)
        os.kill(helper, signal.SIGUSR1)  # the preload starts its thread now
        await _threads(helper, 2)
        supervisor.submit(LaunchRequest("refused", FORKED))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        assert ran(recorder, "refused") == "fresh"
        await until_dead(helper)  # stopped, and not replaced
        supervisor.submit(LaunchRequest("later", FORKED))
        await recorder.until(lambda: len(recorder.outcomes) == 3)
        assert launcher.report().pid is None
    assert all(o.ok for o in recorder.outcomes)
    assert [ran(recorder, k) for k in ("before", "refused", "later")] == ["forked", "fresh", "fresh"]
    [warning] = messages(caplog, "stopped forking")
    assert "other threads are running (late-exporter)" in warning
    assert launcher.helpers_started == 1
    assert not messages(caplog, "starting a new fork server")
