"""Workloads run below the CPU priority of the scheduler that launched them.

A burst of task starts (hundreds of supervisors and task processes, each reading its DAG file) is
runnable all at once. At the scheduler's own priority they share the CPU with its loop one for one, and
on a small host the loop then goes tens of seconds without a heartbeat: one share in five hundred. At
``idle`` (the kernel's ``SCHED_IDLE`` class) a workload gets every cycle the scheduler, the api-server
and the dag-processor do not want, and never keeps them waiting; a task still runs at full speed
whenever they are idle, which is nearly always outside such bursts.

Applied by the workload process itself, first thing, before it starts any thread or process (Linux
priorities are per thread and inherited): nothing here runs in the scheduler.
"""

from __future__ import annotations

import os

IDLE = "idle"
NORMAL = "normal"
NICE_MAX = 19


def parse(raw: str) -> str:
    """``idle``, ``normal`` or a nice increment 1..19, normalised.

    :raises ValueError: naming the accepted values
    """
    value = raw.strip().lower()
    if value in (IDLE, NORMAL):
        return value
    try:
        nice = int(value)
    except ValueError:
        nice = 0
    if not 1 <= nice <= NICE_MAX:
        raise ValueError(f"must be idle, normal or a nice increment from 1 to {NICE_MAX}, got {raw!r}")
    return str(nice)


def apply(priority: str) -> str | None:
    """Lower the calling thread's CPU priority (and so that of everything it starts after).

    :return: why it could not be lowered (the workload runs anyway), or None
    """
    if priority == NORMAL:
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
