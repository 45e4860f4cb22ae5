"""The plain launch path: a fresh ``exec`` per workload.

Simple and safe from a multi-threaded parent, at the price of a fresh interpreter per workload.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from types import TracebackType

import anyio
import anyio.abc
from typing_extensions import Self

from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.errors import LaunchError
from async_local_executor.core.launchers.base import LauncherReport, LaunchRequest, OutputSink, prepare
from async_local_executor.core.launchers.output import LineSplitter, discard, drain_after_exit, drain_stream
from async_local_executor.core.launchers.tree import GroupSignaller


def _why(program: str, exc: OSError) -> str:
    """The cause of a failed spawn, in words.

    uvloop reports every spawn failure as ``OSError(-1, 'Unknown error -1')``; the usual causes are
    then checked for directly, so the task's log says more than "unknown".
    """
    if exc.errno and exc.errno > 0:
        return exc.strerror or errno.errorcode.get(exc.errno, str(exc))
    path = shutil.which(program)
    if path is None:
        return "No such file or directory (or not executable)"
    try:
        read_end, write_end = os.pipe()
    except OSError as probe:
        return probe.strerror or str(probe)
    os.close(read_end)
    os.close(write_end)
    return f"{exc} (the event loop gave no cause; not a missing program nor a full file table)"


class SubprocessLauncher:
    """Starts each workload with ``exec`` in a new session (so it leads its own process group).

    The child's stdout and stderr share one pipe that is read until EOF for the child's whole life, so
    the child can never block on a full pipe.

    :param output: receives each output line; by default output is read and discarded
    :param env: the environment of a child whose request names none; ``None`` to inherit ours
    :param clock: what the bound on draining a child's output after its exit waits on
    """

    def __init__(
        self, output: OutputSink | None = None, env: Mapping[str, str] | None = None, clock: Clock = SYSTEM
    ) -> None:
        self._output = output or discard
        self._env = env
        self._clock = clock

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def report(self) -> LauncherReport:
        # No problem, ever: nothing lives between launches that could break.
        return LauncherReport("subprocess: every workload starts a fresh interpreter")

    async def launch(self, request: LaunchRequest) -> SubprocessChild:
        try:
            process = await anyio.open_process(
                list(request.argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=request.env if request.env is not None else self._env,
                start_new_session=True,
            )
        except OSError as exc:
            raise LaunchError(f"cannot start {request.argv[0]!r}: {_why(request.argv[0], exc)}") from exc
        try:
            await prepare(request, process.pid)  # before its stdin, which wait() writes
        except BaseException:
            # Shielded: it has not read a byte of its workload yet, and must not live on unsupervised.
            with anyio.CancelScope(shield=True):
                GroupSignaller(process.pid).send(signal.SIGKILL)
                await process.wait()
                await process.aclose()
            raise
        return SubprocessChild(process, request, self._output, self._clock)


class SubprocessChild:
    cgroup: None = None  # uncontained: a contained launcher wraps it to give it one
    cleanup: None = None

    def __init__(
        self, process: anyio.abc.Process, request: LaunchRequest, output: OutputSink, clock: Clock = SYSTEM
    ) -> None:
        self._process = process
        self._clock = clock
        self._request = request
        self._output = output
        self._drained = anyio.Event()
        self._signaller = GroupSignaller(process.pid)

    @property
    def pid(self) -> int:
        return self._process.pid

    def signal(self, sig: int) -> None:
        self._signaller.send(sig)

    async def wait(self) -> int:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._feed_stdin)
                tg.start_soon(self._drain)
                status = await self._process.wait()
                await drain_after_exit(self.signal, self._drained, self._clock)
                tg.cancel_scope.cancel()
        except BaseException:
            # Cut short (a bug, or cancelled): nobody will wait for it again, so it must not run on
            # with nothing left to read its output.
            self.signal(signal.SIGKILL)
            raise
        finally:
            await self._process.aclose()  # closes its pipes and transport, whatever happened above
        return status

    async def _feed_stdin(self) -> None:
        stdin = self._process.stdin
        if stdin is None:
            return
        try:
            if self._request.stdin:
                await stdin.send(self._request.stdin)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass  # the child exited without reading its input; its exit status tells the story
        finally:
            await stdin.aclose()

    async def _drain(self) -> None:
        try:
            await drain_stream(
                self._process.stdout, LineSplitter(self._request.key, self._output, self._request.label)
            )
        finally:
            self._drained.set()
