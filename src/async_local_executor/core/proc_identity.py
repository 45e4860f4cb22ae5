"""Which process holds a pid: its start time as the kernel keeps it, which no wall-clock step moves.

A pid is reused once its process is reaped, so a process is recognised by its pid *and* its start. The
start that says so is ``starttime`` in ``/proc/<pid>/stat``: clock ticks since boot, fixed when the
process is made. psutil's ``create_time`` adds the boot time to it, which it derives from the wall clock
(``btime`` in ``/proc/stat``, re-read on each call): an NTP step, a VM resume or ``date -s`` moves every
process's ``create_time`` by the step, and a comparison of it against a recorded one then takes each
process for a later one under the same pid.

Versions before this one recorded ``create_time``; such a record (:class:`WallClockStart`) is still
matched the way they matched it, within 0.05 s, so it is recognised as before (and, like before, not
across a clock step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import psutil

# Two reads of one process's create_time agree to the tick (1/100 s); a later process differs by more.
WALL_CLOCK_TOLERANCE = 0.05


@dataclass(frozen=True)
class WallClockStart:
    """A start recorded by an older version: psutil's ``create_time``, in seconds since the epoch."""

    seconds: float


# A process's start as recorded: clock ticks since boot, or an older version's wall-clock start.
Start: TypeAlias = int | WallClockStart


def _stat(pid: int) -> tuple[bytes, int] | None:
    """The process's state letter and start ticks; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            raw = stat.read()
    except OSError:  # gone (ENOENT, or ESRCH for one exiting during the read), or no /proc
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and ')', but nothing follows the last ')' but
    # fields without either. After it, field 3 (the state) is the first and field 22 (starttime) the 20th.
    fields = raw[raw.rfind(b")") + 1 :].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """When the process under ``pid`` started, in clock ticks since boot; None when there is none."""
    found = _stat(pid)
    return None if found is None else found[1]


def started_as(pid: int, start: Start) -> bool:
    """Whether the process under ``pid`` is the one that started at ``start`` (a zombie included)."""
    return _matches(pid, start, zombie=True)


def runs_as(pid: int, start: Start) -> bool:
    """Whether the process that started at ``start`` still runs under ``pid``: not a later one, no zombie."""
    return _matches(pid, start, zombie=False)


def _matches(pid: int, start: Start, *, zombie: bool) -> bool:
    if isinstance(start, WallClockStart):
        try:
            proc = psutil.Process(pid)
            same = abs(proc.create_time() - start.seconds) < WALL_CLOCK_TOLERANCE
            return bool(same and (zombie or proc.status() != psutil.STATUS_ZOMBIE))
        except psutil.Error:
            return False
    found = _stat(pid)
    return found is not None and found[1] == start and (zombie or found[0] != b"Z")
