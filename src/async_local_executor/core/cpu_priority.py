"""Workloads in a crowd run below the CPU priority of the scheduler that launched them.

A burst of task starts (hundreds of supervisors and task processes, each reading its DAG file) is
runnable all at once. At the scheduler's own priority they share the CPU with its loop one for one, and
on a small host the loop then goes tens of seconds without a heartbeat: one share in five hundred. At
``idle`` (the kernel's ``SCHED_IDLE`` class) a workload gets every cycle the scheduler, the api-server
and the dag-processor do not want, and never keeps them waiting.

Always idle costs throughput at ordinary load, though: the scheduler, never kept waiting, turns its loop
for every single event, and those loops take the CPU the tasks would have used (200 no-op tasks at
parallelism 32 on 2 cores: its process used 22 s of CPU instead of 6 s, and the run took 1.11x as long).
So ``auto`` (the default) decides per workload, when it starts: at the scheduler's priority while the
scheduler has at most ``CROWD_PER_CORE`` children per CPU core, ``idle`` beyond, where starts pile up.

Applied by the workload process itself, first thing, before it starts any thread or process (Linux
priorities are per thread and inherited): nothing here runs in the scheduler.
"""

from __future__ import annotations

import os

AUTO = "auto"
IDLE = "idle"
NORMAL = "normal"
NICE_MAX = 19
# 32 no-op tasks per 2 cores ran best at the scheduler's priority; 256 starved its loop.
CROWD_PER_CORE = 24


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


def children(pid: int) -> int | None:
    """How many children ``pid`` has now (every thread's), or None where the kernel does not say."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # no such process, or not Linux
        return None
    total, counted = 0, False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                total += len(f.read().split())
        except FileNotFoundError:
            continue  # a thread that ended since the listing; or no CONFIG_PROC_CHILDREN
        except OSError:
            return None
        counted = True
    return total if counted else None


def resolve(priority: str, parent_pid: int) -> str:
    """``auto`` made concrete for a workload whose parent (the scheduler) is ``parent_pid``."""
    if priority != AUTO:
        return priority
    count = children(parent_pid) if parent_pid else None
    crowd = CROWD_PER_CORE * (os.cpu_count() or 1)
    return IDLE if count is not None and count > crowd else NORMAL


def apply(priority: str, parent_pid: int = 0) -> str | None:
    """Lower the calling thread's CPU priority (and so that of everything it starts after).

    :param parent_pid: the scheduler's pid, for ``auto``
    :return: why it could not be lowered (the workload runs anyway), or None
    """
    priority = resolve(priority, parent_pid)
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
