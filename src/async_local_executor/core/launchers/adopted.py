"""A workload process another executor launched and handed over: supervised here, though not our child.

Rule: a process we did not fork is taken only as the one that was recorded, pid *and* start (a pid
reused by another process is refused), and only through a pidfd opened before that check, so what the
check saw is what is watched. Not being its parent, we cannot read its exit status: the workload
records it itself (``core/custody.py``), and :meth:`AdoptedChild.wait` reads that record; without one
the exit is :class:`~async_local_executor.core.errors.ChildLost` and the caller decides the outcome.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable

import anyio

from async_local_executor.core.errors import ChildLost, LaunchError, Released
from async_local_executor.core.launchers.tree import GroupSignaller
from async_local_executor.core.outcome import Cleanup
from async_local_executor.core.proc_identity import runs_as


class AdoptedChild:
    """A handed-over workload process, watched through a pidfd; the :class:`Child` contract otherwise.

    Its signals reach its process groups; its cgroup, when it was contained, is the cgroup wrapper's
    (``core/launchers/contained.py`` re-attaches it, as for a process of ours).

    :param read_status: the exit status the workload recorded for itself, or None when it recorded none
    """

    releasable = True
    cgroup: None = None  # the cgroup wrapper's, around this child

    def __init__(self, pid: int, pidfd: int, read_status: Callable[[], int | None]) -> None:
        self._pid = pid
        self._pidfd: int | None = pidfd
        self._read_status = read_status
        self._signaller = GroupSignaller(pid)
        self._released = False
        self._waiting: anyio.CancelScope | None = None
        self._signalled: int | None = None  # the last signal we sent it, for an exit it could not record

    @classmethod
    def take(cls, pid: int, start: int, read_status: Callable[[], int | None]) -> AdoptedChild:
        """Watch the process that started at ``start`` under ``pid``.

        :raises LaunchError: it no longer runs as recorded (gone, or its pid reused), or this kernel has
            no pidfd to watch a process that is not our child
        """
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError as exc:
            raise LaunchError(f"process {pid} is gone") from exc
        except OSError as exc:
            if exc.errno == errno.ENOSYS:
                raise LaunchError("this kernel cannot watch a process that is not our child") from exc
            raise LaunchError(f"cannot watch process {pid}: {exc.strerror}") from exc
        # After the open: the pidfd holds whichever process had the pid then, and this says it is ours.
        if not runs_as(pid, start):
            os.close(pidfd)
            raise LaunchError(f"process {pid} no longer runs as the workload that was handed over")
        return cls(pid, pidfd, read_status)

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def cleanup(self) -> Cleanup | None:
        return None  # what its cgroup used and held: the cgroup wrapper's, when it was contained

    def signal(self, sig: int) -> None:
        if self._released:
            return
        self._signalled = sig
        self._signaller.send(sig)

    def release(self) -> None:
        """Stop watching it, untouched; a pending :meth:`wait` raises :class:`Released`."""
        self._released = True
        if self._waiting is not None:
            self._waiting.cancel()
        else:
            self._close()

    async def wait(self) -> int:
        if self._released or self._pidfd is None:
            raise Released(f"process {self._pid} was handed over")
        with anyio.CancelScope() as self._waiting:
            await anyio.wait_readable(self._pidfd)  # readable once the process has exited
        self._waiting = None
        if self._released:
            self._close()
            raise Released(f"process {self._pid} was handed over")
        self._close()
        # What it left in its process groups is killed, as for a workload we launched (its cgroup's, by
        # the cgroup wrapper). The leader is gone and reaped by whoever is its parent now: only its
        # remembered groups are signalled, each checked as still ours.
        self._signaller.send(signal.SIGKILL)
        status = self._read_status()
        if status is None and self._signalled is not None:
            # Ended by our signal before it could record anything (a stop's SIGKILL, say): that signal is
            # its end, as the exit status of a child we reaped would say.
            return -self._signalled
        if status is None:
            raise ChildLost("it exited without recording its exit status (killed outright, or it crashed)")
        return status

    def _close(self) -> None:
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            os.close(fd)
