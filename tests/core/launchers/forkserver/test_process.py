"""The helper process as the launcher sees it (``process.py``): its waits run on the launcher's clock, so a
fake one drives them and nothing waits real time."""

from __future__ import annotations

import subprocess
import sys

import anyio
import pytest

from async_local_executor.core.launchers.forkserver.channel import Channel
from async_local_executor.core.launchers.forkserver.process import HelperProcess
from tests.core.helpers import GUARD, FakeClock, Recorder

# Far longer than any test may take: only the fake clock can get there.
HOUR = 3600.0


async def fake_helper(code: str, clock: FakeClock, *, ping_interval: float) -> HelperProcess:
    """A helper process that runs ``python -c code <its channel's fd>``, seen as the launcher sees one."""
    channel, theirs = Channel.pair()
    process = await anyio.open_process(
        [sys.executable, "-c", code, str(theirs.fileno())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        pass_fds=[theirs.fileno()],
    )
    theirs.close()
    return HelperProcess(
        process,
        channel,
        Recorder().output,
        start_timeout=HOUR,
        ping_interval=ping_interval,
        ping_timeout=30.0,
        clock=clock,
    )


@pytest.mark.asyncio
async def test_a_helper_that_never_says_ready_times_out_on_the_launchers_clock() -> None:
    # A process that holds the helper's end of the channel and never speaks: a helper hung in its imports.
    clock = FakeClock()
    helper = await fake_helper("import signal; signal.pause()", clock, ping_interval=5.0)
    process = helper.process
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(helper.run)
            await clock.sleepers(1)  # the start timeout
            assert helper.start_error is None
            assert not helper.gone.is_set()
            clock.advance(HOUR)
            await helper.gone.wait()
    assert helper.start_error == "it was not ready within 3600s"
    assert not helper.ready
    assert process.returncode is not None  # killed and reaped, not left behind


@pytest.mark.asyncio
async def test_a_check_the_helper_does_not_answer_gives_no_answer_within_the_ping_timeout() -> None:
    # A helper that said ready and then reads nothing: the check is not worth waiting for longer than
    # the watchdog would wait for a ping (the launcher then starts the helper it would have started).
    clock = FakeClock()
    speak = (
        "import os, signal, socket, sys; from async_local_executor.core.launchers.forkserver import protocol; "
        "s = socket.socket(fileno=int(sys.argv[1])); s.send(protocol.encode(protocol.Ready(pid=os.getpid()))); "
        "signal.pause()"
    )
    helper = await fake_helper(speak, clock, ping_interval=HOUR)
    process = helper.process
    answers: list[object] = []
    answered = anyio.Event()

    async def ask() -> None:
        answers.append(await helper.check(["airflow.sdk"]))
        answered.set()

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            await tg.start(helper.run)
            tg.start_soon(ask)
            await clock.sleepers(2)  # the watchdog's tick and the check's bound
            assert answers == []
            clock.advance(30.0)
            await answered.wait()
            helper.close()
    assert answers == [None]
    assert process.returncode is not None
