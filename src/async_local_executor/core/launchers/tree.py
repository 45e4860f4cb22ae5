"""Signalling a workload's whole process tree, including the process groups its descendants made.

A workload leads its own process group, but what it forks may start groups of their own (the task SDK
puts each task process in one), which a signal to the workload's group never reaches.
"""

from __future__ import annotations

import contextlib
import os

import psutil


def descendant_groups(pid: int) -> set[int]:
    """The process groups of ``pid``'s live descendants, other than ``pid``'s own."""
    try:
        descendants = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return set()
    groups: set[int] = set()
    for proc in descendants:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(proc.pid))
    groups.discard(pid)
    return groups


class GroupSignaller:
    """Signals a leader's group and every group its descendants were seen in.

    Groups are remembered across calls: once the leader dies its descendants are reparented and can no
    longer be found from it, but a group id stays reserved while any member lives.
    """

    def __init__(self, leader: int) -> None:
        self._leader = leader
        self._groups: set[int] = set()

    def send(self, sig: int) -> None:
        self._groups |= descendant_groups(self._leader)
        for group in (self._leader, *self._groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
