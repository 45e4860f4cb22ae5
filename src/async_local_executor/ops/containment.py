"""An executor's cgroups at start: opened, what dead predecessors left in theirs killed, said out loud.

Each instance's cgroup is named ``<pid>-<start>-<id>`` after the scheduler process that owns it (its pid
and start time in hundredths of a second), so a successor tells a live owner from a dead one, or from a
later process under the same pid, without reading anything else. Nothing here knows Airflow.
"""

from __future__ import annotations

import logging
import os
import re

from async_local_executor.core.cgroups import Containment, Limits, Mode
from async_local_executor.core.cgroups.discovery import MOUNTINFO
from async_local_executor.core.launchers.tree import start_time
from async_local_executor.ops.journal_file import same_process

log = logging.getLogger(__name__)

_OWNED = re.compile(r"^(\d+)-(\d+)-[0-9a-f]+$")
_CONTROLLER_OF = {"memory": "task_memory_limit", "cpu": "task_cpu_limit", "pids": "task_pids_limit"}


class LimitsUnavailable(ValueError):
    """An executor-wide limit asked for that this host cannot enforce: the executor must not start."""


def instance_name(instance: str, pid: int | None = None) -> str:
    """The cgroup name of instance ``instance`` owned by process ``pid`` (this one by default)."""
    pid = os.getpid() if pid is None else pid
    started = start_time(pid) or 0.0
    return f"{pid}-{round(started * 100)}-{instance[:12]}"


def owner_lives(name: str) -> bool:
    """Whether the process that owns the instance cgroup ``name`` still runs; True for a name not ours."""
    match = _OWNED.match(name)
    if match is None:
        return True  # not named by this scheme: left alone
    return same_process(int(match.group(1)), int(match.group(2)) / 100)


def open_containment(
    instance: str, *, enabled: bool, root: str, limits: Limits, mountinfo: str = MOUNTINFO
) -> Containment:
    """This instance's cgroups, after killing what dead instances left in theirs.

    :param instance: the executor instance (its journal's id)
    :param enabled: False for ``containment = off``: no cgroup is made or reclaimed
    :param root: ``cgroup_root``, or ``""`` for the scheduler's own cgroup
    :param limits: the executor-wide limits, which must be enforceable here
    :param mountinfo: where the mounts are listed
    :raises ContainmentError: ``root`` was set and cannot be used
    :raises LimitsUnavailable: a limit is set whose controller is not available
    """
    name = instance_name(instance)
    if not enabled:
        containment = Containment(name, Mode.NONE, "containment = off")
    else:
        containment = Containment.open(name, root=root or None, mountinfo=mountinfo)
        for found in containment.reclaim(owner_lives):
            log.warning(
                "killed %d process(es) left in cgroup %s of a stopped executor (instance %s)",
                found.killed,
                found.workload,
                found.instance,
            )
    try:
        _check(containment, limits)
    except LimitsUnavailable:
        containment.close()
        raise
    if containment.mode is Mode.NONE:
        log.warning(
            "containment: none (%s); a task's processes are tracked by process group, environment "
            "marker and launch journal, which a process that leaves all three escapes, and no task "
            "limits can be set (see docs/operations.md, Containment)",
            containment.why,
        )
    else:
        log.info("containment: %s", containment.describe())
    return containment


def _check(containment: Containment, limits: Limits) -> None:
    if missing := containment.missing(limits):
        controller = missing[0]
        option = _CONTROLLER_OF[controller]
        if containment.mode is Mode.NONE:
            raise LimitsUnavailable(
                f"{option} needs a cgroup per task, and there are none here: {containment.why}"
            )
        raise LimitsUnavailable(
            f"{option} needs the {controller} controller, which {containment.describe()} does not have: "
            "delegate it (systemd Delegate=yes with DelegateSubgroup=main and cgroup_root set to the "
            f"service's cgroup, see docs/operations.md) or mount the cgroup v1 {controller} hierarchy"
        )


def status_of(containment: Containment) -> dict[str, str]:
    """What the status file says about containment."""
    return {"mode": containment.mode.value, "detail": containment.describe()}
