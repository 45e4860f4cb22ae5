"""Which process holds a pid: its start time as the kernel keeps it, which no wall-clock step moves.

A pid is reused once its process is reaped, so a process is recognised by its pid *and* its start. The
start that says so is ``starttime`` in ``/proc/<pid>/stat``: clock ticks since boot, fixed when the
process is made. psutil's ``create_time`` adds the boot time to it, which it derives from the wall clock
(``btime`` in ``/proc/stat``, re-read on each call): an NTP step, a VM resume or ``date -s`` moves every
process's ``create_time`` by the step, and a comparison of it against a recorded one then takes each
process for a later one under the same pid.
"""

from __future__ import annotations


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


def started_as(pid: int, start: int) -> bool:
    """Whether the process under ``pid`` is the one that started at ``start`` (a zombie included)."""
    return _matches(pid, start, zombie=True)


def runs_as(pid: int, start: int) -> bool:
    """Whether the process that started at ``start`` still runs under ``pid``: not a later one, no zombie."""
    return _matches(pid, start, zombie=False)


def _matches(pid: int, start: int, *, zombie: bool) -> bool:
    found = _stat(pid)
    return found is not None and found[1] == start and (zombie or found[0] != b"Z")
