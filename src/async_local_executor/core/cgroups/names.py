"""The names of this executor's cgroups: one per executor instance, and one per workload inside it.

An instance's cgroup is ``ale-<instance>`` (:func:`instance_dir`) under its parent, on cgroup2 and in
each cgroup v1 hierarchy alike; a workload's is ``w<N>`` (:func:`workload`) inside its instance's. The
executor names its instance ``<owner pid>-t<owner start ticks>-<journal id>`` (:class:`InstanceName`),
so that whoever finds the cgroup can tell whose it is and whether that process still runs. The
containment itself takes any safe name (:func:`check`); what it did not name this way (the scheduler's
own cgroup, a systemd unit, a test's) is not this executor's to reclaim or kill.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

__all__ = [
    "NAMED_ID",
    "PREFIX",
    "InstanceName",
    "check",
    "instance_dir",
    "instance_of",
    "is_safe",
    "is_workload",
    "named_id",
    "owned_workload",
    "workload",
]

PREFIX: Final = "ale-"
# How much of the journal's id an instance's name holds: enough to find the journal, short for a path.
NAMED_ID: Final = 12
_SAFE = re.compile(r"^[A-Za-z0-9._-]+$")
_WORKLOAD = re.compile(r"^w\d+$")
_INSTANCE = re.compile(r"^(\d+)-t(\d+)-([0-9a-f]+)$")


class InstanceName(NamedTuple):
    """An executor instance's name, as its cgroups carry it."""

    pid: int
    """The process that owns the instance (the scheduler)."""
    start: int
    """That process's start, in clock ticks since boot."""
    journal: str
    """The start of the instance's launch journal id (:data:`NAMED_ID` hex digits at most)."""

    @classmethod
    def of(cls, pid: int, start: int, journal_id: str) -> InstanceName:
        return cls(pid, start, named_id(journal_id))

    def __str__(self) -> str:
        return f"{self.pid}-t{self.start}-{self.journal}"

    @classmethod
    def parse(cls, name: str) -> InstanceName | None:
        """The instance ``name`` names; None for a name not made this way."""
        match = _INSTANCE.match(name)
        return None if match is None else cls(int(match.group(1)), int(match.group(2)), match.group(3))


def named_id(journal_id: str) -> str:
    """What an instance's name holds of its journal's id (:attr:`InstanceName.journal`)."""
    return journal_id[:NAMED_ID]


def is_safe(name: str) -> bool:
    """Whether ``name`` can be a cgroup of ours: letters, digits, '.', '_' or '-', and not '.' or '..'."""
    return _SAFE.match(name) is not None and name not in (".", "..")


def check(kind: str, name: str) -> None:
    """:raises ValueError: ``name`` is not :func:`is_safe`"""
    if not is_safe(name):
        raise ValueError(f"{kind} name must be letters, digits, '.', '_' or '-', got '{name}'")


def instance_dir(instance: str) -> str:
    """The cgroup directory's name of the instance ``instance``."""
    return f"{PREFIX}{instance}"


def instance_of(directory: str) -> str | None:
    """The instance whose cgroup directory is named ``directory``; None for a directory not one's."""
    if not directory.startswith(PREFIX):
        return None
    instance = directory[len(PREFIX) :]
    return instance if is_safe(instance) else None


def workload(number: int) -> str:
    """The cgroup name of an instance's ``number``-th workload."""
    return f"w{number}"


def is_workload(name: str) -> bool:
    return _WORKLOAD.match(name) is not None


def owned_workload(instance_directory: str, name: str) -> bool:
    """Whether ``<instance_directory>/<name>`` is a workload's cgroup made by an executor instance named as
    :class:`InstanceName` says: the only cgroups a workload may kill on its own (its watchdog's expiry)."""
    instance = instance_of(instance_directory)
    return instance is not None and InstanceName.parse(instance) is not None and is_workload(name)
