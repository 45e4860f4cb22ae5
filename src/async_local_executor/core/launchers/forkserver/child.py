"""A workload forked by a fork-server helper as the scheduler's own child: reaped here through a pidfd.

It honours the same :class:`~async_local_executor.core.launchers.base.Child` contract as a subprocess
child, through the same :class:`~async_local_executor.core.launchers.pidfd_child.PidfdChild`: its
output is drained to EOF, its exit status is its own, signals reach its whole tree, and it can be
released alive.
"""

from __future__ import annotations

import os
import socket

import anyio
import anyio.to_thread

from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.errors import launch_error
from async_local_executor.core.launchers.base import LaunchRequest, OutputSink, prepare
from async_local_executor.core.launchers.forkserver.protocol import GO
from async_local_executor.core.launchers.pidfd_child import PidfdChild


class ForkServerChild(PidfdChild):
    """A workload process forked by a helper as our own child; the same contract as a subprocess child.

    Its input travels with GO on its control socket (see :meth:`adopt`), not through a stdin pipe.
    """

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
            raise launch_error("cannot watch the workload process", exc) from exc
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
