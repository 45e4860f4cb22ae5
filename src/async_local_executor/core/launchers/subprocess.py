"""The plain launch path: a fresh ``exec`` per workload.

Simple and safe from a multi-threaded parent, at the price of a fresh interpreter per workload.

The child is spawned with :class:`subprocess.Popen` on the loop thread (what asyncio itself does
inside), not through the event loop: asyncio's and uvloop's subprocess transports SIGKILL a child still
running when the transport is closed or collected, so a workload handed over alive
(:meth:`~async_local_executor.core.launchers.base.Child.release`) would die with them. It is then
watched and reaped through a pidfd, as a fork-server child is. Where the kernel has no pidfds (before
5.4), the event loop's transport remains, and such a child cannot be released.
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
import anyio.to_thread
from typing_extensions import Self

from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.errors import DescriptorsFull, LaunchError, is_full, launch_error
from async_local_executor.core.launchers.base import (
    LauncherReport,
    LaunchRequest,
    OutputSink,
    open_process,
    prepare,
    refuse_takeover,
)
from async_local_executor.core.launchers.output import LineSplitter, discard, drain_after_exit, drain_stream
from async_local_executor.core.launchers.pidfd_child import PidfdChild, pidfds_work
from async_local_executor.core.launchers.tree import GroupSignaller

# What a released child's Popen holds as its returncode: none was read, but one is set so that Popen never
# waits for the child (in ``__del__``, or later through ``subprocess._active``), which would reap a workload
# that is no longer ours to reap, nor warns at its collection that the child still runs.
_NOT_OURS_TO_REAP = 0


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
    :param pidfds: watch children through pidfds (releasable) or the event loop's transport (not);
        ``None``: pidfds where the kernel has them
    """

    def __init__(
        self,
        output: OutputSink | None = None,
        env: Mapping[str, str] | None = None,
        clock: Clock = SYSTEM,
        *,
        pidfds: bool | None = None,
    ) -> None:
        self._output = output or discard
        self._env = env
        self._clock = clock
        self._pidfds = pidfds

    async def __aenter__(self) -> Self:
        if self._pidfds is None:
            self._pidfds = pidfds_work()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def report(self) -> LauncherReport:
        # No problem, ever: nothing lives between launches that could break.
        return LauncherReport("subprocess: every workload starts a fresh interpreter")

    async def launch(self, request: LaunchRequest) -> SubprocessChild | TransportChild:
        refuse_takeover(request)
        if self._pidfds is None:
            self._pidfds = pidfds_work()
        if not self._pidfds:
            return await self._launch_transport(request)
        env = request.env if request.env is not None else self._env
        child = await _spawn(request, env, self._output, self._clock)
        try:
            await prepare(request, child.pid)  # before its stdin
        except BaseException:
            # Shielded: it has not read a byte of its workload yet, and must not live on unsupervised.
            with anyio.CancelScope(shield=True):
                await child.abort()
            raise
        child.feed_now()
        return child

    async def _launch_transport(self, request: LaunchRequest) -> TransportChild:
        try:
            process = await open_process(
                request.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=request.env if request.env is not None else self._env,
                start_new_session=True,
            )
        except OSError as exc:
            if is_full(exc):
                raise DescriptorsFull(f"cannot start {request.argv[0]!r}: {exc.strerror}") from exc
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
        return TransportChild(process, request, self._output, self._clock)


async def _spawn(
    request: LaunchRequest, env: Mapping[str, str] | None, output: OutputSink, clock: Clock
) -> SubprocessChild:
    """Start ``request``'s program in a session of its own, with its pipes and pidfd: nothing in between
    can fail without the process being killed and reaped.

    Our ends of its pipes are non-blocking raw fds of our own (the loop polls them); its ends go to it
    and are closed here. Blocks the loop thread until the program has been exec'd, as asyncio's own
    spawn does.
    """
    program = request.argv[0]
    ours: list[int] = []
    try:
        stdin_read, stdin_write = os.pipe2(os.O_CLOEXEC)
        ours += [stdin_write]
        try:
            out_read, out_write = os.pipe2(os.O_CLOEXEC)
        except OSError:
            os.close(stdin_read)
            raise
        ours += [out_read]
        try:
            process = subprocess.Popen(  # noqa: ASYNC220 - on the loop thread, as asyncio spawns
                list(request.argv),
                stdin=stdin_read,
                stdout=out_write,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(stdin_read)
            os.close(out_write)
    except OSError as exc:
        for fd in ours:
            os.close(fd)
        if is_full(exc):
            raise DescriptorsFull(f"cannot start {program!r}: {exc.strerror}") from exc
        raise LaunchError(f"cannot start {program!r}: {_why(program, exc)}") from exc
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    try:
        pidfd = os.pidfd_open(process.pid)
    except OSError as exc:
        # Running its program already: it must not run on unsupervised. Reaped off the loop: its group's
        # id stays ours until then, and a process stuck in the kernel may take a while to die.
        GroupSignaller(process.pid).send(signal.SIGKILL)
        for fd in ours:
            os.close(fd)
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(process.wait)
        raise launch_error("cannot watch the workload process", exc) from exc
    os.set_blocking(stdin_write, False)
    os.set_blocking(out_read, False)
    return SubprocessChild(process, pidfd, out_read, stdin_write, request, output, clock)


class SubprocessChild(PidfdChild):
    """A workload started by :class:`SubprocessLauncher`: our child, watched and reaped through a pidfd.

    Its :class:`subprocess.Popen` is held until it is reaped, and its ``returncode`` then set, so that
    Popen never calls waitpid on it (which would take its status); one released alive gets a returncode
    too (:data:`_NOT_OURS_TO_REAP`), for the same reason.
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        pidfd: int,
        read_fd: int,
        stdin_fd: int,
        request: LaunchRequest,
        output: OutputSink,
        clock: Clock = SYSTEM,
    ) -> None:
        super().__init__(process.pid, pidfd, read_fd, request, output, clock, stdin_fd=stdin_fd)
        self._process: subprocess.Popen[bytes] | None = process

    def _closed_with(self, status: int | None) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if status is not None:
            process.returncode = status  # reaped here: Popen must never wait for it
        elif self._released:
            process.returncode = _NOT_OURS_TO_REAP
        # Otherwise not reaped yet after a kill: Popen's own waitpid reaps it once collected.


class TransportChild:
    """A workload started through the event loop's subprocess transport, where the kernel has no pidfds.

    Cannot be released: the transport SIGKILLs it when closed, so :meth:`release` does nothing and the
    supervisor terminates it instead.
    """

    releasable = False
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

    def release(self) -> None:
        """Nothing: it stays supervised (see :attr:`releasable`)."""

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
