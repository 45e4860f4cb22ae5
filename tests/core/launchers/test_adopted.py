"""A handed-over workload supervised by a successor that did not fork it (core/launchers/adopted.py).

Real processes. The test process is their parent here, which an adopter is not; nothing below reads
their status through that (the status is the recorded one), and each is reaped at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator

import anyio
import pytest

from async_local_executor.core.errors import ChildLost, LaunchError, Released
from async_local_executor.core.launchers.adopted import AdoptedChild
from async_local_executor.core.proc_identity import start_ticks
from tests.core.helpers import GUARD, py

pytestmark = pytest.mark.asyncio


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(py("import time; time.sleep(600)"), start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def gone_pid() -> int:
    gone = subprocess.Popen(py("pass"))
    gone.wait()
    return gone.pid


def _start(pid: int) -> int:
    start = start_ticks(pid)
    assert start is not None
    return start


async def test_a_pid_that_runs_another_process_or_none_is_refused(
    sleeper: subprocess.Popen[bytes], gone_pid: int
) -> None:
    with pytest.raises(LaunchError, match="no longer runs as the workload"):
        AdoptedChild.take(sleeper.pid, _start(sleeper.pid) + 1, lambda: None)
    with pytest.raises(LaunchError, match="gone"):
        AdoptedChild.take(gone_pid, 1, lambda: None)


@pytest.mark.parametrize(("recorded", "signalled", "expected"), [(3, None, 3), (None, signal.SIGKILL, -9)])
async def test_its_end_is_what_it_recorded_or_the_signal_that_ended_it(
    sleeper: subprocess.Popen[bytes], recorded: int | None, signalled: int | None, expected: int
) -> None:
    child = AdoptedChild.take(sleeper.pid, _start(sleeper.pid), lambda: recorded)
    if signalled is not None:
        child.signal(signalled)
    else:
        os.kill(sleeper.pid, signal.SIGTERM)  # it ends by itself, as far as the adopter knows
    with anyio.fail_after(GUARD):
        assert await child.wait() == expected


async def test_an_end_it_did_not_record_and_we_did_not_cause_is_lost(
    sleeper: subprocess.Popen[bytes],
) -> None:
    child = AdoptedChild.take(sleeper.pid, _start(sleeper.pid), lambda: None)
    os.kill(sleeper.pid, signal.SIGKILL)  # killed by someone else: the OOM killer, say
    with anyio.fail_after(GUARD), pytest.raises(ChildLost, match="without recording"):
        await child.wait()


async def test_a_released_one_is_neither_awaited_nor_signalled(sleeper: subprocess.Popen[bytes]) -> None:
    child = AdoptedChild.take(sleeper.pid, _start(sleeper.pid), lambda: 0)
    async with anyio.create_task_group() as tg:
        raised: list[BaseException] = []

        async def wait() -> None:
            try:
                await child.wait()
            except Released as exc:
                raised.append(exc)

        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        child.release()
    assert len(raised) == 1
    child.signal(signal.SIGKILL)
    assert sleeper.poll() is None  # still running: a released child is not ours to signal
