"""The process's descriptor table, a capacity like the workload limit: room made for it at start, and a
launch that finds it full told apart from one that failed.

Every running workload holds descriptors in the process that supervises it (its output pipe and the pidfd
it is reaped through), and a launch holds a few more while it starts it (the pipes, the fork server's
control socket, the cgroup's files). A table that fills up is a capacity reached, not a broken launch:
the supervisor holds the workload back until one that runs has ended (:class:`DescriptorsFull`).

At start, :func:`make_room` raises the soft ``RLIMIT_NOFILE`` toward the hard limit when it is below what
the workload limit needs, as long-running servers do; :class:`GiveBackLimit` then gives each workload the
soft limit the process started with before it runs anything, because code that uses ``select()`` breaks
on a descriptor numbered 1024 or more, and what a task inherits must not depend on its executor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import threading
from dataclasses import dataclass, replace
from typing import Final

from async_local_executor.core.launchers.base import Child, Launcher, LaunchRequest, Wrapper

# What one running workload holds in its supervisor's process on either launch path (its output pipe's
# read end and its pidfd), plus one for the descriptors a launch holds while it starts one (measured:
# docs/operations.md, Descriptors).
PER_WORKLOAD: Final[int] = 3
# Beside the workloads, for what the process holds itself and opens later: the scheduler's database
# connections, log files, the status writer, a fork server's channel.
HEADROOM: Final[int] = 256
UNLIMITED: Final[int] = resource.RLIM_INFINITY
# Launches wait while fewer are free than this, where the hard limit is below what parallelism needs: a
# table that stays full would starve what the scheduler itself opens (its journal's compaction, its
# database connections, its logs).
RESERVE_MAX: Final[int] = 64

log = logging.getLogger(__name__)


def reserve(soft: int) -> int:
    """The descriptors kept free for the process's own work under a soft limit of ``soft``."""
    return max(4, min(RESERVE_MAX, soft // 16))


class _Running:
    """Workloads with a process, over every supervisor in the process: they share one table (teams)."""

    lock = threading.Lock()
    count = 0


def running_changed(delta: int) -> None:
    """A supervisor's workload got a process (+1), or its process's descriptors were closed (-1)."""
    with _Running.lock:
        _Running.count += delta


def running() -> int:
    """Workloads with a process in this process, whichever supervisor's: their ends free descriptors."""
    return _Running.count


def open_count() -> int:
    """Descriptors this process has open now."""
    with os.scandir("/proc/self/fd") as entries:
        return sum(1 for _ in entries) - 1  # the listing's own


@dataclass(frozen=True)
class Table:
    """How full the descriptor table is: ``open`` of ``soft`` (``hard`` is as far as it may be raised)."""

    open: int
    soft: int
    hard: int

    def describe(self) -> str:
        return f"{self.open} open, limit {_shown(self.soft)}"


def table() -> Table:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        count = open_count()
    except OSError:  # no /proc, or the table is full: the limit is what is known
        count = soft
    return Table(count, soft, hard)


def needed(workloads: int, open_now: int) -> int:
    """Descriptors a process that has ``open_now`` needs to supervise ``workloads`` at once."""
    return open_now + HEADROOM + PER_WORKLOAD * workloads


@dataclass(frozen=True)
class Room:
    """What :func:`make_room` found and did.

    :param before: the soft limit the process started with, which its workloads get back
    :param after: the soft limit now
    :param hard: the hard limit, the most the soft limit can be raised to without privilege
    :param needed: what the workload limit needs
    """

    before: int
    after: int
    hard: int
    needed: int

    @property
    def raised(self) -> bool:
        return self.after != self.before

    @property
    def enough(self) -> bool:
        return self.after == UNLIMITED or self.after >= self.needed

    def describe(self) -> str:
        """For the start line: what was done and, when the hard limit is too low, by how much."""
        if not self.enough:
            return (
                f"descriptors: {self.needed} needed, the hard limit allows {_shown(self.hard)} (soft limit "
                f"{'raised from ' + _shown(self.before) + ' to ' if self.raised else ''}{_shown(self.after)}); "
                f"launches wait while the table is full: raise the hard limit (LimitNOFILE= in the systemd "
                f"unit, ulimit -Hn) to at least {self.needed}"
            )
        if self.raised:
            return (
                f"descriptors: soft limit raised from {_shown(self.before)} to {_shown(self.after)} "
                f"({self.needed} needed; workloads get {_shown(self.before)} back)"
            )
        return f"descriptors: limit {_shown(self.after)} ({self.needed} needed)"


class _Process:
    """What the process started with, and the workloads every executor in it made room for: the limit is
    the process's, and two executors of one scheduler (teams) each make room for their own."""

    started_with: tuple[int, int] | None = None  # the soft and hard limit before the first make_room
    open_then: int = 0
    workloads: int = 0


def make_room(workloads: int | None) -> Room:
    """Raise the soft ``RLIMIT_NOFILE`` to what ``workloads`` more running workloads need, beside those
    the process made room for before, or as close as the hard limit lets.

    :param workloads: None when there is no limit on them: as far as the hard limit goes

    Never lowers it; a limit that cannot be changed (a sandbox refusing it) is left as it was.
    """
    if _Process.started_with is None:
        _Process.started_with = resource.getrlimit(resource.RLIMIT_NOFILE)
        _Process.open_then = open_count()
    before = _Process.started_with[0]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if workloads is None:
        need = hard if hard != UNLIMITED else max(soft, needed(0, _Process.open_then))
    else:
        _Process.workloads += workloads
        need = needed(_Process.workloads, _Process.open_then)
    if soft != UNLIMITED and soft < need:
        target = need if hard == UNLIMITED else min(need, hard)
        if target > soft:
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return Room(before, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard, need)


class GiveBackLimit(Wrapper):
    """Gives each workload process the soft ``RLIMIT_NOFILE`` ``soft`` before it runs anything of the
    workload (``LaunchRequest.before_start``): what its supervisor's process had before :func:`make_room`.
    """

    def __init__(self, inner: Launcher, soft: int) -> None:
        super().__init__(inner)
        self._soft = soft
        self._refused = False  # said once

    async def launch(self, request: LaunchRequest) -> Child:
        earlier = request.before_start
        soft = self._soft

        async def give_back(pid: int) -> None:
            try:
                _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (min(soft, hard), hard))
            except ProcessLookupError:
                pass  # one that exited already runs nothing
            except OSError as exc:  # refused (a security module): it runs with the raised limit
                if not self._refused:
                    self._refused = True
                    log.warning("cannot give workloads their descriptor limit of %d back: %s", soft, exc)
            if earlier is not None:
                await earlier(pid)

        return await self._inner.launch(replace(request, before_start=give_back))


def _shown(limit: int) -> str:
    return "unlimited" if limit == UNLIMITED else str(limit)
