"""Starting one fork-server helper: its command line, its channel, and what its startup said.

The helper imports the target's module, the explicit preloads and, when given a plan, the learned
modules one by one (:mod:`~async_local_executor.core.launchers.forkserver_preload`). A helper that
could not start because of a learned module (it said which one started a thread, or it crashed or
hung while importing one) raises :class:`LearnedModuleFailed`, naming the module, so the launcher can
refuse that module and keep everything else.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import anyio
import anyio.abc

from async_local_executor.core.clock import Clock
from async_local_executor.core.errors import LaunchError
from async_local_executor.core.launchers.base import OutputSink
from async_local_executor.core.launchers.forkserver_channel import Channel
from async_local_executor.core.launchers.forkserver_process import HelperProcess


class LearnedModuleFailed(LaunchError):
    """The helper could not start because of one learned module."""

    def __init__(self, module: str, reason: str) -> None:
        super().__init__(f"{module}: {reason}")
        self.module = module
        self.reason = reason


@dataclass(frozen=True)
class HelperSpec:
    """How every helper of one launcher is started."""

    python: str
    target: str
    preload: Sequence[str]
    output: OutputSink
    env: Mapping[str, str] | None
    channel_buffer: int
    start_timeout: float
    ping_interval: float
    ping_timeout: float
    clock: Clock
    memory_budget: int = 0  # bytes the learned modules may add to a helper; 0: no limit


async def start_helper(
    tg: anyio.abc.TaskGroup, spec: HelperSpec, learned: Sequence[str] | None = None
) -> HelperProcess:
    """A ready helper, served in ``tg``.

    :param learned: learned modules for it to try (``None``: it is told of none)
    :raises LearnedModuleFailed: a learned module kept it from starting
    :raises LaunchError: it could not start for another reason
    """
    channel, theirs = Channel.pair(buffer=spec.channel_buffer)
    argv = [
        spec.python,
        "-m",
        "async_local_executor.core.launchers.forkserver_helper",
        "--fd",
        str(theirs.fileno()),
        "--parent-pid",
        str(os.getpid()),
        "--target",
        spec.target,
    ]
    for module in spec.preload:
        argv += ["--preload", module]
    plan = None
    if learned is not None:
        argv.append("--learned")
        plan = {"op": "plan", "modules": list(learned), "budget": spec.memory_budget}
    try:
        process = await anyio.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=[theirs.fileno()],
            env=spec.env,
        )
    except OSError as exc:
        channel.close()
        raise LaunchError(f"cannot start the fork server: {exc.strerror}") from exc
    except BaseException:  # cancelled (the loop is going away): nothing owns the channel yet
        channel.close()
        raise
    finally:
        theirs.close()
    helper = HelperProcess(
        process,
        channel,
        spec.output,
        start_timeout=spec.start_timeout,
        ping_interval=spec.ping_interval,
        ping_timeout=spec.ping_timeout,
        clock=spec.clock,
        learned=plan,
    )
    try:
        await tg.start(helper.run)
    except BaseException:
        # Cancelled before run() took charge of the helper: it is ours to stop.
        helper.kill()
        channel.close()
        raise
    if helper.start_error is not None:
        await helper.gone.wait()
        blamed = helper.blame or helper.importing
        if blamed is not None:
            raise LearnedModuleFailed(blamed, helper.start_error)
        raise LaunchError(f"the fork server could not start: {helper.start_error}")
    return helper
