"""Kernel containment of workloads: one cgroup each, killed, limited and accounted as a whole.

Nothing a task starts leaves its cgroup (``setsid``, ``env -i``, a double fork or a change of uid all
stay inside), so ``cgroup.kill`` ends all of it and the memory, CPU and pids limits hold for all of it.
cgroup2 is required; on hybrid hosts whose controllers are on cgroup v1 the limits use those. Every call
is blocking filesystem I/O, for a worker thread.
"""

from async_local_executor.core.cgroups.containment import (
    Containment,
    ContainmentError,
    LimitUnavailable,
    Mode,
    Reclaimed,
    workload_cgroup_of,
)
from async_local_executor.core.cgroups.discovery import cgroup2_mount, cgroup_of, own_cgroups, v1_mounts
from async_local_executor.core.cgroups.group import Usage, WorkloadCgroup
from async_local_executor.core.cgroups.limits import Limits, format_bytes, parse_cpu, parse_memory, parse_pids

__all__ = [
    "Containment",
    "ContainmentError",
    "LimitUnavailable",
    "Limits",
    "Mode",
    "Reclaimed",
    "Usage",
    "WorkloadCgroup",
    "cgroup2_mount",
    "cgroup_of",
    "format_bytes",
    "own_cgroups",
    "parse_cpu",
    "parse_memory",
    "parse_pids",
    "v1_mounts",
    "workload_cgroup_of",
]
