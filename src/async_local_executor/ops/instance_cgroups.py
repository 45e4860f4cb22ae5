"""An executor's cgroups at start: opened, what dead predecessors left in theirs killed, said out loud.

Each instance's cgroup is named ``<pid>-t<start>-<id>`` after the scheduler process that owns it (its pid
and its start in clock ticks since boot) and the start of its launch journal's id. Whether an instance
still runs is its journal's lock's to say: its executor holds it for its whole life, the kernel drops
it however that ends, and it answers the same whatever the clock did or whichever pid namespace the
owner runs in. Only an instance with no journal in the state directory (a crashed one's, reclaimed
before its cgroups are looked at) is judged by its name: dead once no process runs under its pid with
its start. The cgroups of workloads a dead instance handed over (held by the journals' reclaim, which
runs first) are spared, processes and all, with their instance's directory. So is a workload cgroup that
holds a process in custody (:func:`~async_local_executor.core.custody.watched`) when its instance was
not judged by the journals' reclaim here: another deployment's handed-over workload (its journal is in a
state directory of its own), which its own successor may adopt and its own watchdog ends otherwise. A
workload of an instance reclaimed here that the reclaim did not hold is not ours to keep: it is killed.
Nothing here knows Airflow.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Collection
from pathlib import Path

from async_local_executor.core import custody
from async_local_executor.core.cgroups import Containment, Limits, Mode
from async_local_executor.core.cgroups.discovery import MOUNTINFO
from async_local_executor.core.cgroups.names import InstanceName, named_id
from async_local_executor.core.proc_identity import runs_as, start_ticks
from async_local_executor.ops import custody_dir
from async_local_executor.ops.journal_file import SUFFIX as JOURNAL_SUFFIX
from async_local_executor.ops.journal_file import holder_alive
from async_local_executor.ops.status_format import ContainmentFields

log = logging.getLogger(__name__)

_CONTROLLER_OF = {"memory": "task_memory_limit", "cpu": "task_cpu_limit", "pids": "task_pids_limit"}


class LimitsUnavailable(ValueError):
    """An executor-wide limit asked for that this host cannot enforce: the executor must not start."""


def instance_name(instance: str, pid: int | None = None) -> str:
    """The cgroup name of instance ``instance`` owned by process ``pid`` (this one by default)."""
    pid = os.getpid() if pid is None else pid
    return str(InstanceName.of(pid, start_ticks(pid) or 0, instance))


def owner_lives(name: str) -> bool:
    """Whether the process that owns the instance cgroup ``name`` still runs; True for a name not ours."""
    owner = InstanceName.parse(name)
    if owner is None:
        return True  # not named by this scheme: left alone
    return runs_as(owner.pid, owner.start)


# Every instance whose journal an executor of this process reclaimed: another team's executor, started
# after the one that reclaimed it, finds its cgroups without a journal, and that is no news either. For
# what is said only; what is killed is judged by the starting executor's own reclaim.
_RECLAIMED_IN_THIS_PROCESS: set[str] = set()


def instance_lives(name: str, journals: Path, *, reclaimed: Collection[str] = ()) -> bool:
    """Whether the instance that owns the cgroup ``name`` still runs: its journal's lock, else its owner.

    True for a name not ours, and for a journal that is there but cannot be asked (not a regular file,
    unreadable): what cannot be told dead is left alone.

    :param journals: the directory of the instances' launch journals (the state directory)
    :param reclaimed: the instances whose journals this executor has just reclaimed (as in
        :func:`open_containment`): that theirs is gone is no news
    """
    owner = InstanceName.parse(name)
    if owner is None:
        return True  # not named by this scheme: left alone
    # The name holds the start of the journal's id: any journal it could be is asked.
    verdicts: list[bool] = []
    for path in sorted(journals.glob(f"{owner.journal}*{JOURNAL_SUFFIX}")):
        held = holder_alive(path)
        if held is None and os.path.lexists(path):
            log.warning(
                "cannot take the lock of the launch journal %s to tell whether the executor instance of "
                "cgroup %s still runs: its cgroups are left alone",
                path,
                name,
            )
            return True
        if held is not None:
            verdicts.append(held)
    if verdicts:
        return any(verdicts)
    lives = owner_lives(name)
    # A live one is another deployment's (its journal is in a state directory of its own) and is left
    # alone: nothing to act on. A dead one is reclaimed here: that is said, unless its journal was just
    # reclaimed here too (a predecessor's, after every restart), which said what it found.
    known = {named_id(instance) for instance in (*reclaimed, *_RECLAIMED_IN_THIS_PROCESS)}
    expected = owner.journal in known
    log.log(
        logging.DEBUG if lives or expected else logging.INFO,
        "no launch journal in %s for the executor instance of cgroup %s: judged by its owner process, "
        "pid %s, which %s",
        journals,
        name,
        owner.pid,
        "still runs" if lives else "runs no more",
    )
    return lives


def handed_over_by_this_process(custody: Path) -> Callable[[int], bool]:
    """Whether a process is a workload this process handed over: its custody file names this process.

    A stopping executor names itself there for each workload it hands over (``custody_dir.name_owner``),
    before it closes its cgroups; a successor that takes one over names itself instead.

    :param custody: the custody directory (``<state_dir>/custody``)
    """

    def handed_over(pid: int) -> bool:
        start = start_ticks(pid)
        if start is None:
            return False
        me = os.getpid()
        return custody_dir.read_owner(custody, pid, start) == (me, start_ticks(me))

    return handed_over


def open_containment(
    instance: str,
    *,
    enabled: bool,
    root: str,
    limits: Limits,
    journals: Path,
    mountinfo: str = MOUNTINFO,
    spare: frozenset[str] = frozenset(),
    reclaimed: frozenset[str] = frozenset(),
) -> Containment:
    """This instance's cgroups, after killing what dead instances left in theirs.

    :param instance: the executor instance (its journal's id)
    :param journals: where the instances' launch journals are, whose locks tell which instances live (the
        state directory: its custody directory says which workloads this process hands over at its stop,
        whose cgroups :meth:`~async_local_executor.core.cgroups.Containment.close` leaves alone)
    :param enabled: False for ``containment = off``: no cgroup is made or reclaimed
    :param root: ``cgroup_root``, or ``""`` for the scheduler's own cgroup
    :param limits: the executor-wide limits, which must be enforceable here
    :param mountinfo: where the mounts are listed
    :param spare: the cgroup2 directories (or ``/proc/<pid>/cgroup`` paths) of workloads a dead instance
        handed over (:attr:`~async_local_executor.ops.reclaim.Held.cgroup`): what is in them runs on, and
        they and their instance's directory stay
    :param reclaimed: the instances whose journals this executor has just reclaimed
        (:attr:`~async_local_executor.ops.reclaim.ReclaimResult.instances`): what the reclaim did not
        hold of theirs is killed, in custody or not
    :raises ContainmentError: ``root`` was set and cannot be used
    :raises LimitsUnavailable: a limit is set whose controller is not available
    """
    name = instance_name(instance)
    _RECLAIMED_IN_THIS_PROCESS.update(reclaimed)
    if not enabled:
        containment = Containment(name, Mode.NONE, "containment = off")
    else:
        containment = Containment.open(
            name,
            root=root or None,
            mountinfo=mountinfo,
            # What a stop hands over keeps its cgroup: the close at the end leaves it to the adopter.
            handed_over=handed_over_by_this_process(custody_dir.path(journals)),
        )
        lives = functools.partial(instance_lives, journals=journals, reclaimed=reclaimed)
        judged = {named_id(instance) for instance in reclaimed}

        def answered_for(name: str, pid: int) -> bool:
            owner = InstanceName.parse(name)
            return owner is not None and owner.journal not in judged and custody.watched(pid)

        for found in containment.reclaim(lives, spare=spare, answered_for=answered_for):
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


def status_of(containment: Containment) -> ContainmentFields:
    """What the status file says about containment."""
    return {"mode": containment.mode.value, "detail": containment.describe()}
