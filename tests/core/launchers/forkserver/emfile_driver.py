"""Run by test_launcher_start_failures.py beside it, in a process of its own: its descriptor limit is
lowered.

A supervisor with a fork server (and the plain launcher as its fallback) serves; the helper is killed
while the process has no descriptor left, so its replacement cannot start; a workload is submitted
then, the descriptors are given back, and another workload is submitted once the helper is back. Each
step prints one JSON line.
"""

from __future__ import annotations

import logging
import os
import resource
import signal

import anyio

from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.launchers.forkserver.launcher import ForkServerLauncher
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.supervisor import Supervisor
from tests.core.helpers import GUARD, Recorder, Said, py, say
from tests.core.supervising import TARGET

FORKED = py(
    "import sys; print('forked' if 'tests.core.launchers.forkserver.targets' in sys.modules else 'fresh')"
)


async def main() -> None:
    said = Said()
    logger = logging.getLogger("async_local_executor.core.launchers.forkserver")
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    recorder = Recorder()
    launcher = ForkServerLauncher(
        target=TARGET,
        output=recorder.output,
        fallback=SubprocessLauncher(output=recorder.output),
        restart_delay=0.2,
    )
    supervisor = Supervisor(launcher, recorder, limit=4)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        await said.until("fork server ready")
        helper = launcher.report().pid
        assert helper is not None
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
        hoard: list[int] = []
        try:
            while True:
                hoard.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        os.kill(helper, signal.SIGKILL)
        down = await said.until("tried again in")
        supervisor.submit(LaunchRequest("during", FORKED))
        await recorder.until(lambda: recorder.outcomes)
        during = recorder.outcome("during")
        say(down=down, problem=launcher.problem, during_ok=during.ok, during_reason=during.reason)
        for fd in hoard:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        back = await said.until("fork server back")
        supervisor.submit(LaunchRequest("after", FORKED))
        await recorder.until(lambda: len(recorder.outcomes) == 2)
        after = recorder.outcome("after")
        line = [text for key, text in recorder.lines if key == "after"]
        say(back=back, problem=launcher.problem, after_ok=after.ok, after_ran=line)
        await supervisor.shutdown(GUARD)
    say(served=True)


if __name__ == "__main__":
    anyio.run(main)
