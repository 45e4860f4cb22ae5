"""Run by tests/core/test_descriptors.py, in a process of its own: it changes its descriptor limit and fills
its table.

``fill <kind>``: a supervisor serves on launch path ``kind``; one workload runs; every free descriptor is
taken; a second workload is submitted (its launch finds the table full and is held back), then one with
the first stopped meanwhile; the descriptors are given back and the first workload stopped, and the
held one runs. Then, the table full again with nothing running, a last one is submitted: it fails.
``room <kind> <soft> <workloads>``: the soft limit is lowered to ``soft``, room is made for ``workloads``,
and a workload reports the soft limit it runs with.
``short <limit> <workloads>``: soft and hard limits at ``limit``, room is made for ``workloads``.
Each step prints one JSON line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
from collections.abc import Iterator

import anyio

from async_local_executor.core import descriptors
from async_local_executor.core.health import Thresholds, assess
from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.launchers.forkserver.launcher import ForkServerLauncher
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.supervisor import Supervisor
from tests.core.helpers import Recorder, Said, payload_py, say
from tests.core.supervising import TARGET

BLOCKER = payload_py("import time; print('blocking', flush=True); time.sleep(600)")
LIMIT = payload_py("import resource; print('nofile', *resource.getrlimit(resource.RLIMIT_NOFILE))")


def launcher(kind: str, recorder: Recorder) -> ForkServerLauncher | SubprocessLauncher:
    plain = SubprocessLauncher(output=recorder.output)
    if kind == "forkserver":
        return ForkServerLauncher(target=TARGET, output=recorder.output, fallback=plain)
    return plain


@contextlib.contextmanager
def table_full() -> Iterator[list[int]]:
    """Every free descriptor taken (the soft limit lowered first, so that is quick), given back after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors.open_count() + 64, hard))
    hoard: list[int] = []
    try:
        with contextlib.suppress(OSError):
            while True:
                hoard.append(os.open("/dev/null", os.O_RDONLY))
        yield hoard
    finally:
        for fd in hoard:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def fill(kind: str) -> None:
    said = Said()
    logger = logging.getLogger("async_local_executor.core.admission")
    logger.addHandler(said)
    logger.setLevel(logging.DEBUG)
    recorder = Recorder()
    supervisor = Supervisor(launcher(kind, recorder), recorder, limit=8)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        supervisor.submit(LaunchRequest(key="warm", argv=LIMIT))  # the fork server up before the fill
        await recorder.until(lambda: recorder.outcomes)
        supervisor.submit(LaunchRequest(key="blocker", argv=BLOCKER))
        await recorder.until(lambda: ("blocker", "blocking") in recorder.lines)
        with table_full():
            supervisor.submit(LaunchRequest(key="held", argv=LIMIT))
            held = await said.until("launches held back")
            supervisor.submit(LaunchRequest(key="dropped", argv=LIMIT))
            await said.until("workload dropped held back")
            supervisor.stop("dropped", "revoked")
            await recorder.until(lambda: any(o.key == "dropped" for o in recorder.outcomes))
            state = supervisor.state()
            health = assess(state, 0.0, Thresholds(), 0.0)
            say(
                held=held,
                full=state.descriptors_full is not None,
                health=list(health.reasons),
                codes=list(health.public_codes),
                dropped=recorder.outcome("dropped").kind.value,
                launched=sorted(str(k) for k in recorder.pids),
            )
            supervisor.stop("blocker", "done")  # before the table has room: nothing can get ahead of it
            await recorder.until(lambda: any(o.key == "blocker" for o in recorder.outcomes))
        await recorder.until(lambda: any(o.key == "held" for o in recorder.outcomes))
        again = await said.until("launching again")
        order = [o.key for o in recorder.outcomes]
        state = supervisor.state()
        say(
            again=again,
            held_ok=recorder.outcome("held").ok,
            after_blocker=order.index("held") > order.index("blocker"),
            full=state.descriptors_full is not None,
            waits=state.descriptor_waits_total,
        )
        with table_full():
            supervisor.submit(LaunchRequest(key="alone", argv=LIMIT))
            await recorder.until(lambda: any(o.key == "alone" for o in recorder.outcomes))
        alone = recorder.outcome("alone")
        say(alone_kind=alone.kind.value, alone_reason=alone.reason)
        supervisor.submit(LaunchRequest(key="after", argv=LIMIT))
        await recorder.until(lambda: any(o.key == "after" for o in recorder.outcomes))
        say(after_ok=recorder.outcome("after").ok)
        await supervisor.shutdown(5.0)
        tg.cancel_scope.cancel()


async def room(kind: str, soft: int, workloads: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    made = descriptors.make_room(workloads)
    say(before=made.before, after=made.after, needed=made.needed, enough=made.enough, said=made.describe())
    recorder = Recorder()
    inner = launcher(kind, recorder)
    supervisor = Supervisor(descriptors.GiveBackLimit(inner, made.before), recorder, limit=None)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        supervisor.submit(LaunchRequest(key="limit", argv=LIMIT))
        await recorder.until(lambda: recorder.outcomes)
        [line] = [line for key, line in recorder.lines if key == "limit"]
        say(workload=[int(n) for n in line.split()[1:]], own=list(resource.getrlimit(resource.RLIMIT_NOFILE)))
        await supervisor.shutdown(5.0)
        tg.cancel_scope.cancel()


def short(limit: int, workloads: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    made = descriptors.make_room(workloads)
    say(after=made.after, needed=made.needed, enough=made.enough, said=made.describe())


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "fill":
        anyio.run(fill, args[0])
    elif command == "room":
        anyio.run(room, args[0], int(args[1]), int(args[2]))
    else:
        short(int(args[0]), int(args[1]))


if __name__ == "__main__":
    main()
