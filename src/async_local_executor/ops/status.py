"""The status file each executor keeps current (read back by :mod:`~async_local_executor.ops.status_read`).

One JSON file per executor instance, ``status.<instance>.json`` in the state directory, of the format
:class:`~async_local_executor.ops.status_format.StatusFile` defines, 0600, replaced
atomically (write a fresh temporary file, then rename) so a reader never sees half of one. It is written in a
worker thread of the event loop, never on the scheduler's thread, and it is where the per-workload
memory and CPU are read (a contained workload's from its cgroup, an adopted one's too, from the cgroup its
first executor made for it; any other's from ``/proc``: file reads for every running workload do not
belong on the loop either). Nothing here knows Airflow.

A workload a stopped predecessor handed over is ``held`` until its task instance is claimed, then
``adopted`` (the row's ``adoption``, :data:`ADOPTION_HELD` or :data:`ADOPTION_ADOPTED`). Which ones are
claimed, the writer is told (``claimed``); a writer not told marks every one adopted.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import psutil

from async_local_executor.core import descriptors
from async_local_executor.core.admission import MB
from async_local_executor.core.cgroups.containment import workload_cgroup_of
from async_local_executor.core.cgroups.group import Usage, WorkloadCgroup
from async_local_executor.core.descriptors import Table
from async_local_executor.core.files import replace_atomically
from async_local_executor.core.health import Report
from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.core.state import RunningWorkload
from async_local_executor.ops.status_format import (
    ADOPTION_ADOPTED,
    ADOPTION_HELD,
    PREFIX,
    START_TICKS_KEY,
    SUFFIX,
    Adoption,
    ContainmentFields,
    ControlFields,
    DescriptorFields,
    RunningRow,
    StatusFile,
)
from async_local_executor.ops.status_read import STALE_AFTER, Found, read_all

__all__ = [
    "ADOPTION_ADOPTED",
    "ADOPTION_HELD",
    "PREFIX",
    "STALE_AFTER",
    "START_TICKS_KEY",
    "SUFFIX",
    "Found",
    "Meta",
    "StatusWriter",
    "document",
    "read_all",
    "status_path",
    "tree_rss",
    "walk_trees",
]

TMP_INFIX = ".tmp-"  # status.<instance>.json.tmp-<random>: a write not yet renamed into place
# How far back the file's history of running and waiting workloads reaches, in seconds: enough for the
# dashboard's chart of the last minutes, little enough to keep the file small (a sample per write).
HISTORY_SPAN = 600.0


def status_path(directory: Path, instance: str) -> Path:
    return directory / f"{PREFIX}{instance}{SUFFIX}"


# What the walk saw under each workload: its pid -> the (pid, start ticks) of each of its descendants.
Descendants = Mapping[int, Sequence[tuple[int, int]]]


@dataclass(frozen=True)
class Trees:
    """One walk of the process trees of some workloads."""

    rss: dict[int, int | None]  # each workload's and its descendants' resident memory; None: gone
    descendants: dict[int, list[tuple[int, int]]]  # each workload's descendants, with start ticks


def walk_trees(pids: Iterable[int]) -> Trees:
    """Each pid's tree: its memory with its descendants', and who those descendants are.

    One pass over ``/proc`` for all of them: walking each workload's children separately rescans every
    process on the host per workload, a cost that grows with parallelism times the host's processes
    (docs/design.md, "Why these choices", has the figures). Start times
    are read for the trees' members only, as the kernel's ticks: the journal records them to recognise
    the descendants after a crash, whatever the wall clock did meanwhile.
    """
    wanted = list(pids)
    if not wanted:
        return Trees({}, {})  # an idle executor writes its status every 2 s too: no /proc scan for nothing
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for proc in psutil.process_iter(["ppid", "memory_info"]):
        info = proc.info
        if info["memory_info"] is None or info["ppid"] is None:
            continue  # gone or unreadable since the listing
        children.setdefault(int(info["ppid"]), []).append(proc.pid)
        rss[proc.pid] = int(info["memory_info"].rss)
    starts: dict[int, int | None] = {}

    def start(pid: int) -> int | None:
        if pid not in starts:
            starts[pid] = start_ticks(pid)
        return starts[pid]

    trees = Trees({}, {})
    for pid in wanted:
        if pid not in rss:
            trees.rss[pid] = None
            continue
        total, stack, found = 0, [pid], trees.descendants.setdefault(pid, [])
        while stack:
            member = stack.pop()
            total += rss.get(member, 0)
            for child in children.get(member, ()):
                # A child that started before its parent is a later process under a reused pid that the
                # listing caught with a stale parent link: not of this tree. One gone since: neither.
                born, parent_born = start(child), start(member)
                if born is not None and parent_born is not None and born >= parent_born:
                    found.append((child, born))
                    stack.append(child)
        trees.rss[pid] = total
    return trees


def tree_rss(pids: Iterable[int]) -> dict[int, int | None]:
    """Resident memory of each pid and its descendants, in bytes; None for one that is gone."""
    return walk_trees(pids).rss


def _mb(amount: int | None) -> float | None:
    return None if amount is None else round(amount / MB, 1)


def _usage(cgroup: WorkloadCgroup) -> _Numbers:
    try:
        usage = cgroup.usage()
    except OSError:  # a cgroup removed under the read: no numbers, and the status file is still written
        usage = Usage(None, None, None)
    cpu = usage.cpu_seconds
    return _Numbers(
        _mb(usage.memory_current), _mb(usage.memory_peak), None if cpu is None else round(cpu, 1), "cgroup"
    )


# Where a running workload's memory and CPU are read: its cgroup, or None for the /proc fallback.
CgroupOf = Callable[[RunningWorkload], WorkloadCgroup | None]


def cgroup_of(workload: RunningWorkload) -> WorkloadCgroup | None:
    """The cgroup a running workload is accounted from: its own, or, for an adopted one (whose child knows
    none, not having made it), the workload cgroup its process is in."""
    if workload.cgroup is not None:
        return workload.cgroup
    if workload.adopted:
        return workload_cgroup_of(workload.pid)
    return None


@dataclass(frozen=True)
class _Numbers:
    memory_mb: float | None
    peak_mb: float | None
    cpu_s: float | None
    memory_from: Literal["cgroup", "proc"]


def _numbers(cgroup: WorkloadCgroup | None, pid: int, rss: Mapping[int, int | None]) -> _Numbers:
    if cgroup is not None:
        return _usage(cgroup)
    return _Numbers(_mb(rss[pid]), None, None, "proc")


def _row(
    workload: RunningWorkload, now: float, numbers: _Numbers, claimed: Callable[[int], bool] | None
) -> RunningRow:
    adoption: Adoption | None = None
    if workload.adopted:
        held = claimed is not None and not claimed(workload.pid)
        adoption = ADOPTION_HELD if held else ADOPTION_ADOPTED
    return {
        "key": workload.label,
        "pid": workload.pid,
        "queue": workload.group,
        "age_s": round(now - workload.launched, 1),
        "adoption": adoption,
        "memory_mb": numbers.memory_mb,
        "peak_mb": numbers.peak_mb,
        "cpu_s": numbers.cpu_s,
        "memory_from": numbers.memory_from,
    }


@dataclass(frozen=True)
class Meta:
    """Who writes the status file, beside what each report says (see :class:`StatusFile`)."""

    instance: str
    hostname: str
    team: str | None
    executor: str
    parallelism: int
    launcher: str
    containment: ContainmentFields | None
    pid: int = field(default_factory=os.getpid)
    pid_start_ticks: int | None = None  # None: read from /proc for ``pid``


def document(
    report: Report,
    meta: Meta,
    now: float | None = None,
    on_seen: Callable[[Descendants], None] | None = None,
    history: Sequence[Sequence[float]] = (),
    claimed: Callable[[int], bool] | None = None,
    cgroups: CgroupOf = cgroup_of,
    control: ControlFields | None = None,
) -> StatusFile:
    """What the status file holds, from one health report plus who wrote it.

    :param on_seen: given the descendants the walk found under each workload it walked, if any
    :param history: earlier ``[time, running, waiting]`` samples, oldest first (see :class:`StatusWriter`)
    :param claimed: whether the adopted workload of that pid has had its task instance claimed; None
        when that is not known (see the module docstring)
    :param cgroups: where each running workload is accounted (:func:`cgroup_of`)
    :param control: the live control the executor applied (see :mod:`~async_local_executor.ops.control`)
    """
    now = time.time() if now is None else now
    state = report.state
    accounted = {w: cgroups(w) for w in state.running}
    # A cgroup counts the memory of everything the workload started (page cache included), even what left
    # its process tree; the /proc scan, the fallback, sees only live descendants (and counts each page
    # shared with the fork server or a parent once per process), so it runs only for the workloads
    # without a cgroup.
    trees = walk_trees(w.pid for w in state.running if accounted[w] is None)
    rss = trees.rss
    if on_seen is not None and trees.descendants:
        on_seen(trees.descendants)
    oldest = state.oldest_waiting_since
    return {
        "pid": meta.pid,
        START_TICKS_KEY: meta.pid_start_ticks,
        "written_at": now,
        "instance": meta.instance,
        "hostname": meta.hostname,
        "team": meta.team,
        "executor": meta.executor,
        "parallelism": meta.parallelism,
        "launcher": meta.launcher,
        "containment": meta.containment,
        "health": report.health.as_dict(),
        "loop_lag_ms": round(report.lag * 1000, 1),
        "peak_loop_lag_ms": round(report.peak_lag * 1000, 1),
        "running": [
            _row(workload, now, _numbers(accounted[workload], workload.pid, rss), claimed)
            for workload in sorted(state.running, key=lambda w: w.launched)
        ],
        "waiting": state.waiting,
        "oldest_wait_s": None if oldest is None else round(now - oldest, 1),
        "memory": {
            "guard_holding": state.memory_low,
            "floor_mb": state.memory_floor // MB,
            "available_mb": None if state.available_memory is None else state.available_memory // MB,
        },
        "descriptors": _descriptors(state.descriptors_full),
        "launcher_problem": state.launcher_problem,
        "launcher_state": state.launcher_state,
        "launcher_pid": state.launcher_pid,
        "preload": state.preload,
        "recent_finished": [
            {
                "at": f.at,
                "key": f.label,
                "outcome": f.outcome,
                "returncode": f.returncode,
                "reason": f.reason,
                "ran_s": f.ran_s,
            }
            for f in reversed(state.recent_finished)  # the latest first
        ],
        "history": [list(sample) for sample in history],
        "recent_launch_failures": [
            {"at": f.at, "key": f.label, "reason": f.reason} for f in state.recent_failures[-5:]
        ],
        "totals": {
            "launched": state.launched_total,
            "memory_waits": state.memory_waits_total,
            "descriptor_waits": state.descriptor_waits_total,
            **state.outcomes_total,
        },
        "control": control,
    }


def _descriptors(full: Table | None) -> DescriptorFields:
    """The scheduler's descriptor table now (read in the writer's thread, off the loop), and whether
    launches are held back for it."""
    table = descriptors.table()
    return {
        "open": table.open,
        "limit": None if table.soft == descriptors.UNLIMITED else table.soft,
        "holding": full is not None,
    }


class StatusWriter:
    """Writes one instance's status file; :meth:`write` runs in a worker thread.

    ``meta`` says who writes; its pid's start (in clock ticks since boot) is read here unless it names
    one: a reader tells by both whether the writer still runs (see
    :mod:`~async_local_executor.ops.status_read`).
    ``on_seen``, if given, is called from :meth:`write` (in its thread) with the descendants each
    workload's tree showed (see :func:`document`): the launch journal records them, so that a later
    executor can find them even once they left the workload's tree. Each write adds a ``[time,
    running, waiting]`` sample to the file's ``history``, which keeps the last ``HISTORY_SPAN`` seconds
    (in memory only: a new executor starts a new history).
    ``claimed``, if given, says whether the adopted workload of a pid has had its task instance claimed
    (called from :meth:`write`'s thread; see the module docstring): until then it is shown held.
    ``control``, if given, gives the live control the executor applied (called from :meth:`write`'s
    thread).
    """

    def __init__(
        self,
        path: Path,
        meta: Meta,
        on_seen: Callable[[Descendants], None] | None = None,
        claimed: Callable[[int], bool] | None = None,
        control: Callable[[], ControlFields] | None = None,
    ) -> None:
        self.path = path
        self._control = control
        self._on_seen = on_seen
        self._claimed = claimed
        # An adopted workload's cgroup, found once from where its process is: it never moves, and a
        # lookup per workload per write would reread the mount table every time.
        self._adopted_cgroups: dict[int, WorkloadCgroup] = {}
        if meta.pid_start_ticks is None:
            meta = dataclasses.replace(meta, pid_start_ticks=start_ticks(meta.pid))
        self._meta = meta
        # Only write() touches it, and the probe never runs two writes at once.
        self._history: collections.deque[tuple[float, int, int]] = collections.deque()

    def write(self, report: Report) -> None:
        state, now = report.state, time.time()
        history = self._history
        history.append((round(now, 1), len(state.running), state.waiting))
        while history[0][0] < now - HISTORY_SPAN:
            history.popleft()
        adopted = {w.pid for w in state.running if w.adopted}
        for gone in self._adopted_cgroups.keys() - adopted:
            del self._adopted_cgroups[gone]
        data = json.dumps(
            document(
                report,
                self._meta,
                now=now,
                on_seen=self._on_seen,
                history=history,
                claimed=self._claimed,
                cgroups=self._cgroup_of,
                control=None if self._control is None else self._control(),
            ),
            indent=1,
        ).encode()
        # A fresh name each time, created exclusively: nothing planted under a predictable name (a link
        # to another file, say) is followed or overwritten.
        replace_atomically(self.path, data, TMP_INFIX)

    def _cgroup_of(self, workload: RunningWorkload) -> WorkloadCgroup | None:
        if workload.cgroup is not None or not workload.adopted:
            return workload.cgroup
        found = self._adopted_cgroups.get(workload.pid)
        if found is None:
            # Not found is asked again: one /proc read when the process is in no workload cgroup.
            found = cgroup_of(workload)
            if found is not None:
                self._adopted_cgroups[workload.pid] = found
        return found

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
