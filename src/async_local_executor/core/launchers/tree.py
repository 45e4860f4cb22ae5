"""Signalling a workload's whole process tree, including the process groups its descendants made.

A workload leads its own process group, but what it forks may start groups of their own (the task SDK
puts each task process in one), which a signal to the workload's group never reaches.

A group id is a pid: once a group's leader has been reaped, the kernel may give that number to another
process, which may then lead a group of its own under it. So each group is remembered with the start
time of the process that held its id when it was seen (none if its leader was already gone), and a
group whose id a *later* process holds now is never signalled: it is no longer ours. While the id is
free, or held by the same process (a zombie included), the group can only be ours: a number stays
reserved while any process uses it as its group id. The leader's own tree is walked only while the
leader is the process it was, so a later process under its pid is never taken for it.

Start times are the kernel's ticks since boot (:mod:`~async_local_executor.core.proc_identity`): a
wall-clock start would make a stepped clock look like a later process under every id, and no timeout,
revoke or shutdown would reach a workload any more.
"""

from __future__ import annotations

import contextlib
import os

import psutil

from async_local_executor.core.proc_identity import start_ticks


def held_by_another(pid: int, start: int | None) -> bool:
    """Whether a process other than the one seen with ``start`` (None: none was) holds ``pid`` now."""
    now = start_ticks(pid)
    return now is not None and now != start


def descendant_groups(pid: int, start: int | None = None) -> set[int]:
    """The process groups of ``pid``'s live descendants, other than ``pid``'s own.

    :param start: the start ticks ``pid`` had; a later process under that pid has none of its descendants
    """
    try:
        proc = psutil.Process(pid)
        if start is not None and start_ticks(pid) != start:
            return set()
        # A zombie's children were reparented when it exited, so none is found from it; and the walk
        # reads every process's stat, which once per exit made an exit storm quadratic on the loop.
        if proc.status() == psutil.STATUS_ZOMBIE:
            return set()
        descendants = proc.children(recursive=True)
    except (psutil.Error, OSError):  # OSError: a full descriptor table; the groups already known still get it
        return set()
    groups: set[int] = set()
    for child in descendants:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(child.pid))
    groups.discard(pid)
    return groups


class GroupSignaller:
    """Signals a leader's group and every group its descendants were seen in, each while it is still ours.

    Groups are remembered across calls: once the leader dies its descendants are reparented and can no
    longer be found from it, but a group id stays reserved while any member lives.
    """

    def __init__(self, leader: int) -> None:
        self._leader = leader
        # Not reaped yet when this is made (its launcher waits for it only later): this is the leader.
        self._groups: dict[int, int | None] = {leader: start_ticks(leader)}

    def send(self, sig: int) -> None:
        leader_start = self._groups[self._leader]
        found = descendant_groups(self._leader, leader_start) if leader_start is not None else set()
        for group in found - self._groups.keys():
            self._groups[group] = start_ticks(group)
        for group, start in self._groups.items():
            if held_by_another(group, start):
                continue  # its leader was reaped and a later process has the number: not ours
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
