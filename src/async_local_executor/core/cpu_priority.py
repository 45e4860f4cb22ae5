"""The CPU priority of a workload's processes: a setting it applies to itself, or a crowd's class it can leave.

``idle``, ``normal`` or a nice increment are the operator's setting for every workload, applied by the
workload process itself, first thing, before it starts any thread or process (Linux priorities are per
thread and inherited), for its whole life. ``auto`` is decided per workload by the scheduler
(``core/launchers/crowd.py``): a workload that starts in a crowd is put in ``SCHED_IDLE`` from outside, with what
lets it leave that class again (:func:`lower`), and put back when the crowd ends, or when the workload is
handed over to a successor or taken over from a predecessor (:func:`idle`, :func:`restore`).
An unprivileged process may enter ``SCHED_IDLE`` but leave it only within its ``RLIMIT_NICE``.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterable, Iterator

AUTO = "auto"
IDLE = "idle"
NORMAL = "normal"
NICE_MAX = 19
_CAP_SYS_NICE = 23
# RLIMIT_NICE allows nice values down to 20 - its value.
_NICE_CEILING = 20
# A thread started while the others are put back is put back by the next pass.
_RESTORE_PASSES = 3


def parse(raw: str) -> str:
    """``auto``, ``idle``, ``normal`` or a nice increment 1..19, normalised.

    :raises ValueError: naming the accepted values
    """
    value = raw.strip().lower()
    if value in (AUTO, IDLE, NORMAL):
        return value
    try:
        nice = int(value)
    except ValueError:
        nice = 0
    if not 1 <= nice <= NICE_MAX:
        raise ValueError(f"must be auto, idle, normal or a nice increment from 1 to {NICE_MAX}, got {raw!r}")
    return str(nice)


def apply(priority: str) -> str | None:
    """Lower the calling thread's CPU priority (and so that of everything it starts after).

    :param priority: a value of :func:`parse`; ``auto`` changes nothing here (the scheduler decides)
    :return: why it could not be lowered (the workload runs anyway), or None
    """
    if priority in (NORMAL, AUTO):
        return None
    try:
        if priority == IDLE:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        else:
            current = os.getpriority(os.PRIO_PROCESS, 0)
            os.setpriority(os.PRIO_PROCESS, 0, min(NICE_MAX, current + int(priority)))
    except (OSError, AttributeError, ValueError) as exc:  # AttributeError: no SCHED_IDLE off Linux
        return f"could not lower the CPU priority to {priority!r}: {exc}"
    return None


def _has_cap_sys_nice() -> bool:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_NICE & 1)
    except (OSError, ValueError):
        pass
    return False


def _needed_rlimit() -> int:
    return _NICE_CEILING - os.getpriority(os.PRIO_PROCESS, 0)


def leave_problem() -> str | None:
    """Why a process started by this one could not leave ``SCHED_IDLE`` again, or None when it can.

    Children inherit capabilities and limits, so the scheduler asks this of itself once.
    """
    if not hasattr(os, "SCHED_IDLE"):
        return "this system has no SCHED_IDLE"
    if _has_cap_sys_nice():
        return None
    _, hard = resource.getrlimit(resource.RLIMIT_NICE)
    needed = _needed_rlimit()
    if hard == resource.RLIM_INFINITY or hard >= needed:
        return None
    return (
        f"an unprivileged process leaves SCHED_IDLE only within RLIMIT_NICE, whose hard limit here is {hard} "
        f"(it needs {needed}: systemd LimitNICE={needed}, or CAP_SYS_NICE)"
    )


def lower(pid: int) -> None:
    """Put process ``pid`` (a workload that has not started anything yet) in ``SCHED_IDLE``, leavably.

    Its soft ``RLIMIT_NICE`` is raised to the hard one where that is what lets :func:`restore` (or the
    process itself) return it to its nice value.

    :raises OSError: when the kernel refuses
    """
    if not _has_cap_sys_nice():
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NICE)
        if soft != resource.RLIM_INFINITY and soft < _needed_rlimit():
            resource.prlimit(pid, resource.RLIMIT_NICE, (hard, hard))
    os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))


def _idle_threads(pids: Iterable[int]) -> Iterator[int]:
    """Each thread of ``pids`` in ``SCHED_IDLE`` now (a process or thread gone meanwhile has none)."""
    for pid in pids:
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # exited
        for tid in map(int, threads):
            try:
                if os.sched_getscheduler(tid) == os.SCHED_IDLE:
                    yield tid
            except ProcessLookupError:
                continue


def idle(pids: Iterable[int]) -> bool:
    """Whether any thread of ``pids`` is in ``SCHED_IDLE``."""
    return next(_idle_threads(pids), None) is not None


def restore(pids: Iterable[int]) -> int:
    """Put every thread of ``pids`` that is in ``SCHED_IDLE`` back to ``SCHED_OTHER``.

    :returns: how many threads were put back
    :raises PermissionError: when the kernel refuses (neither capability nor limit allow it)
    """
    pids = list(pids)
    restored = 0
    for _ in range(_RESTORE_PASSES):
        changed = 0
        for tid in _idle_threads(pids):
            with contextlib.suppress(ProcessLookupError):  # the thread exited in between
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                changed += 1
        restored += changed
        if not changed:
            break
    return restored
