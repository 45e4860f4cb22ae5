"""A workload process that is our own child, watched and reaped through a pidfd: both launch paths' child.

Nothing here kills the process behind our back: no event-loop transport (asyncio's and uvloop's SIGKILL a
child still running when they are closed or collected) and no waiter of anyone else's. That is what
lets :meth:`PidfdChild.release` hand a running workload over: our fds for it are closed and it runs on.

Its output pipe and stdin pipe are raw non-blocking fds, read and written as the loop says they are
ready; its exit is seen when its pidfd turns readable, and read with ``WNOWAIT``, so it stays a zombie,
and its pid (so its group's id) stays ours, until what it left in its group has been killed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal

import anyio

from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.errors import ChildLost, Released
from async_local_executor.core.launchers.base import LaunchRequest, OutputSink
from async_local_executor.core.launchers.output import LineSplitter, drain_after_exit
from async_local_executor.core.launchers.tree import GroupSignaller

log = logging.getLogger(__name__)

# Seconds a wait cut short gives its child, just sent SIGKILL, to exit so it is reaped and not left a
# zombie. SIGKILL cannot be ignored: only a process stuck in the kernel (D state) takes longer.
KILLED_EXIT_GUARD = 5.0


@functools.cache
def pidfds_work() -> bool:
    """Whether this kernel watches a child through a pidfd (``pidfd_open``: 5.3) and reaps it through one
    (``waitid(P_PIDFD)``: 5.4). Asked once: the answer is the kernel's."""
    try:
        pidfd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError):
        return False
    try:
        # Ourselves, who are not our own child: ECHILD says the kernel understood the question.
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except ChildProcessError:
        return True
    except (AttributeError, OSError):
        return False  # EINVAL: P_PIDFD unknown
    finally:
        os.close(pidfd)
    return True


def exit_status(result: os.waitid_result) -> int:
    """As :attr:`subprocess.Popen.returncode`: negative ``-N`` when signal N ended it."""
    if result.si_code == os.CLD_EXITED:
        return int(result.si_status)
    return -int(result.si_status)


class PidfdChild:
    """A launched workload process, our own child, watched through ``pidfd``; the Child contract.

    Owns ``pidfd``, ``read_fd`` (the read end of its stdout and stderr pipe, non-blocking) and, when
    given, ``stdin_fd`` (the write end of its stdin pipe, non-blocking, through which it gets its
    request's ``stdin``): each is closed once it is reaped or released.
    """

    releasable = True
    cgroup: None = None  # uncontained: a contained launcher wraps it to give it one
    cleanup: None = None

    def __init__(
        self,
        pid: int,
        pidfd: int,
        read_fd: int,
        request: LaunchRequest,
        output: OutputSink,
        clock: Clock = SYSTEM,
        *,
        stdin_fd: int | None = None,
    ) -> None:
        self._pid = pid
        self._pidfd = pidfd
        self._read_fd = read_fd
        self._stdin_fd = stdin_fd
        self._input = memoryview(request.stdin if stdin_fd is not None else b"")
        self._request = request
        self._output = output
        self._drained = anyio.Event()
        self._signaller = GroupSignaller(pid)  # before it can be reaped: the leader is this process
        self._clock = clock
        self._released = False
        self._closed = False
        self._status: int | None = None  # once reaped
        self._waiting: anyio.CancelScope | None = None

    @property
    def pid(self) -> int:
        return self._pid

    def signal(self, sig: int) -> None:
        if self._released:
            return  # handed over: whoever adopts it decides what it gets
        self._signaller.send(sig)

    def feed_now(self) -> None:
        """Write what of its input the stdin pipe takes right now; :meth:`wait` writes the rest.

        Called once it may run its workload (after ``before_start``): an input that fits the pipe (64 KiB)
        is then all written at launch, so a child released before anyone waited for it still got it.
        """
        if self._stdin_fd is None:
            return
        try:
            while self._input:
                self._input = self._input[os.write(self._stdin_fd, self._input) :]
        except BlockingIOError:
            return  # the pipe is full until it reads: the rest is wait()'s
        except OSError:
            self._input = memoryview(b"")  # EPIPE: it exited without reading; its status tells why
        self._close_stdin()

    async def abort(self) -> None:
        """Kill it and reap it, for a launch that fails once it has been spawned (it never got its input).

        Unbounded: a launcher shields this, so the failed launch ends only once the process is gone.
        """
        self.signal(signal.SIGKILL)
        await anyio.wait_readable(self._pidfd)
        self._close()

    def release(self) -> None:
        """Stop supervising it without touching it: see :meth:`~.base.Child.release`."""
        if self._released or self._closed:
            return  # already handed over, or already reaped: nothing left to hand over
        self._released = True
        if self._input:
            log.warning(
                "workload %s (pid %d) is handed over with %d bytes of its input unwritten",
                self._request.label or self._request.key,
                self._pid,
                len(self._input),
            )
        if self._waiting is not None:
            # wait() closes our fds as it unwinds (not under a task that still polls them), then
            # raises Released.
            self._waiting.cancel()
        else:
            self._close()

    async def wait(self) -> int:
        if self._released:
            raise Released(f"process {self._pid} was handed over")
        if self._closed:  # awaited again: what the first wait reaped
            if self._status is None:
                raise ChildLost(f"process {self._pid} was awaited before, and not reaped then")
            return self._status
        scope = self._waiting = anyio.CancelScope()
        try:
            with scope:
                async with anyio.create_task_group() as tg:
                    if self._stdin_fd is not None:
                        tg.start_soon(self._feed)
                    tg.start_soon(self._drain)
                    status = await self._reap()
                    # Still a zombie (see _reap): its pid, and so its group's id, cannot be anyone else's.
                    await drain_after_exit(self.signal, self._drained, self._clock)
                    tg.cancel_scope.cancel()
        except BaseException:
            if not self._released:
                # Cut short (a bug, or cancelled): nobody will wait for it again, so it must not run on
                # with nothing left to read its output; reaped below once it is gone.
                self.signal(signal.SIGKILL)
                with self._clock.move_on_after(KILLED_EXIT_GUARD, shield=True):
                    await anyio.wait_readable(self._pidfd)
            raise
        finally:
            self._waiting = None
            self._close()
        if self._released:
            raise Released(f"process {self._pid} was handed over")
        return status

    async def _reap(self) -> int:
        while True:
            try:
                # WNOHANG: returns at once; the pidfd being readable is what says the exit happened.
                # WNOWAIT: left a zombie until wait() has signalled what it left in its group.
                flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
                result = os.waitid(os.P_PIDFD, self._pidfd, flags)  # noqa: ASYNC222
            except ChildProcessError as exc:
                raise ChildLost(f"its exit status was taken by another waiter ({exc})") from exc
            if result is not None:
                return exit_status(result)
            await anyio.wait_readable(self._pidfd)

    async def _drain(self) -> None:
        splitter = LineSplitter(self._request.key, self._output, self._request.label)
        try:
            while True:
                try:
                    chunk = os.read(self._read_fd, 65536)
                except BlockingIOError:
                    await anyio.wait_readable(self._read_fd)
                    continue
                if not chunk:
                    return
                splitter.feed(chunk)
        finally:
            splitter.close()
            self._drained.set()

    async def _feed(self) -> None:
        assert self._stdin_fd is not None
        try:
            while self._input:
                try:
                    self._input = self._input[os.write(self._stdin_fd, self._input) :]
                except BlockingIOError:
                    await anyio.wait_writable(self._stdin_fd)
        except OSError:
            self._input = memoryview(b"")  # EPIPE: it exited without reading; its status tells why
        self._close_stdin()  # not on cancellation: _close() does it then, once no task polls it

    def _close_stdin(self) -> None:
        if self._stdin_fd is not None:
            os.close(self._stdin_fd)  # EOF: it has all its input
            self._stdin_fd = None

    def _close(self) -> None:
        """Reap it if it has exited, and close our fds for it; once, when no task polls them any more."""
        if self._closed:
            return
        self._closed = True
        status: int | None = None
        with contextlib.suppress(ChildProcessError):
            # Not blocking: only a child that has exited is reaped here. One released alive runs on.
            result = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)
            if result is not None:
                status = self._status = exit_status(result)
        self._close_stdin()
        os.close(self._read_fd)
        os.close(self._pidfd)
        self._closed_with(status)

    def _closed_with(self, status: int | None) -> None:
        """Called once our fds for it are closed: ``status`` is its exit status if it was reaped here,
        None if it was not (released alive, or not gone in time after a kill)."""
