"""A workload forked by a fork-server helper as the scheduler's own child: reaped here through a pidfd.

It honours the same :class:`~async_local_executor.core.launchers.base.Child` contract as a subprocess
child: its output is drained to EOF, its exit status is its own, and signals reach its whole tree.
"""

from __future__ import annotations

import contextlib
import os
import socket

import anyio
import anyio.to_thread

from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.errors import ChildLost, LaunchError
from async_local_executor.core.launchers.base import LaunchRequest, OutputSink, prepare
from async_local_executor.core.launchers.forkserver.protocol import GO
from async_local_executor.core.launchers.output import LineSplitter, drain_after_exit
from async_local_executor.core.launchers.tree import GroupSignaller


def _exit_status(result: os.waitid_result) -> int:
    """As :attr:`subprocess.Popen.returncode`: negative ``-N`` when signal N ended it."""
    if result.si_code == os.CLD_EXITED:
        return int(result.si_status)
    return -int(result.si_status)


class ForkServerChild:
    """A workload process forked by a helper as our own child; the same contract as a subprocess child."""

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
    ) -> None:
        self._pid = pid
        self._pidfd = pidfd
        self._read_fd = read_fd
        self._request = request
        self._output = output
        self._drained = anyio.Event()
        self._signaller = GroupSignaller(pid)
        self._clock = clock

    @classmethod
    async def adopt(
        cls,
        pid: int,
        control: socket.socket,
        read_fd: int,
        request: LaunchRequest,
        output: OutputSink,
        clock: Clock = SYSTEM,
    ) -> ForkServerChild:
        """Take charge of the child that reported ``pid``, then send it its payload (it runs after that)."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            # Told nothing, it exits by itself (EXIT_ORPHANED); reaped off the loop, it is quick.
            control.close()
            os.close(read_fd)
            await anyio.to_thread.run_sync(os.waitpid, pid, 0)
            raise LaunchError(f"cannot watch the workload process: {exc.strerror}") from exc
        try:
            await prepare(request, pid)  # before GO: it runs nothing of the workload until then
        except BaseException:
            # Told nothing, it exits by itself (EXIT_ORPHANED) when the control socket closes.
            with anyio.CancelScope(shield=True):
                control.close()
                os.close(read_fd)
                await anyio.to_thread.run_sync(os.waitid, os.P_PIDFD, pidfd, os.WEXITED)
                os.close(pidfd)
            raise
        child = cls(pid, pidfd, read_fd, request, output, clock)
        # Shielded: a child that got half its payload would run with a truncated workload.
        with anyio.CancelScope(shield=True):
            await _send_all(control, GO + request.stdin)
        return child

    @property
    def pid(self) -> int:
        return self._pid

    def signal(self, sig: int) -> None:
        self._signaller.send(sig)

    async def wait(self) -> int:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._drain)
                status = await self._reap()
                # Still a zombie (see _reap): its pid, and so its group's id, cannot be anyone else's.
                await drain_after_exit(self.signal, self._drained, self._clock)
                tg.cancel_scope.cancel()
        finally:
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)  # noqa: ASYNC222 - exited
            os.close(self._read_fd)
            os.close(self._pidfd)
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
                return _exit_status(result)
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


async def _send_all(sock: socket.socket, data: bytes) -> None:
    """Write ``data`` and close; a child that is gone already just misses it (its exit tells why)."""
    view = memoryview(data)
    try:
        while view:
            try:
                view = view[sock.send(view) :]
            except BlockingIOError:
                await anyio.wait_writable(sock)
    except OSError:
        pass
    finally:
        sock.close()
