"""Signalling a workload's whole process tree, including the process groups its descendants made.

A workload leads its own process group, but what it forks may start groups of their own (the task SDK
puts each task process in one), which a signal to the workload's group never reaches.

Every signal goes through a process whose identity was checked: a pid names a process only until it
is reaped, after which the kernel may give it (and so the group id it was) to an unrelated process.
So the signaller keeps :class:`psutil.Process` handles, which carry the process's start time and refuse
to signal a later process under the same pid, and it ``killpg``'s a group only while that group's
leader is one of them and still running (a group id stays reserved while its leader lives, even as a
zombie). A reaped leader's id is never passed to ``killpg``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

# SIGKILL rounds: a process found (and killed) by pid rather than by group may have forked between
# the listing and the kill; the next round's listing finds what it forked.
_KILL_ROUNDS = 3


@dataclass(frozen=True)
class Known:
    """A process the signaller holds a handle on, as one listing saw it."""

    pid: int
    running: bool  # the same process still exists (a zombie counts: its pid stays reserved)
    group: int | None  # its process group now; None when not running or unreadable
    start: float = 0.0  # its start time
    leads: bool = False  # it was seen leading a process group (the workload always does)
    session: int | None = None  # its session when it was seen leading its group


@dataclass(frozen=True)
class Listed:
    """One process of a listing of the host's processes."""

    pid: int
    ppid: int
    group: int | None
    start: float
    zombie: bool = False
    session: int | None = None  # read only for members of a group whose leader is gone


def targets(known: Iterable[Known]) -> tuple[list[int], list[int]]:
    """The groups to ``killpg`` and the processes to signal one by one, from what is known of each.

    A group is signalled as a whole only while its leader is a known process that still runs; the
    others' members are signalled one by one, and only the known ones. A process in a group that is
    signalled as a whole is not signalled again on its own: a second SIGTERM could cut short the
    clean-up the first one started.

    :returns: ``(groups, pids)``, each sorted
    """
    known = list(known)
    running = {k.pid for k in known if k.running}
    groups = {k.group for k in known if k.running and k.group in running}
    pids = [k.pid for k in known if k.running and k.group not in groups]
    return sorted(g for g in groups if g is not None), sorted(pids)


def to_adopt(known: Iterable[Known], listing: Iterable[Listed]) -> list[int]:
    """The listed processes that belong to the known tree and are not known yet.

    Two ways in: a descendant of a known process that still runs (through the parent links, each child
    started no earlier than its parent, or its pid was reused under a stale link), and a member of a
    group whose leader is known but gone, while no process holds the leader's pid (then the group id
    is still reserved by those members, so they are the leader's), in the leader's session and started
    no earlier than it. What those two found brings in its own descendants too. Zombies are never
    adopted.
    """
    known = list(known)
    listed = {p.pid: p for p in listing}
    running = {k.pid: k.start for k in known if k.running}
    orphaned = {k.pid: k for k in known if not k.running and k.leads and k.pid not in listed}
    children: dict[int, list[Listed]] = {}
    for proc in listed.values():
        children.setdefault(proc.ppid, []).append(proc)
    found: dict[int, float] = {}
    for proc in listed.values():
        leader = orphaned.get(proc.group) if proc.group is not None else None
        if leader is None or proc.zombie or proc.pid in running:
            continue
        if proc.start >= leader.start and proc.session is not None and proc.session == leader.session:
            found[proc.pid] = proc.start
    stack = [*running.items(), *found.items()]
    while stack:
        parent, parent_start = stack.pop()
        for child in children.get(parent, ()):
            if child.zombie or child.start < parent_start or child.pid in running or child.pid in found:
                continue
            found[child.pid] = child.start
            stack.append((child.pid, child.start))
    return sorted(found)


class GroupSignaller:
    """Signals a leader's tree: its group, its descendants, and the groups they were seen in.

    What it finds is remembered across calls: once the leader dies its descendants are reparented and
    can no longer be found from it, but they still are from those of them it already knows, and the
    members its group kept are found by their group id as long as no process took the leader's pid.
    """

    def __init__(self, leader: int) -> None:
        self._known: dict[int, psutil.Process] = {}
        self._starts: dict[int, float] = {}
        # Who was seen leading a group, and in which session. A workload leads its own by how it is
        # started, not by what it shows now: a fork server's child makes its group an instant after
        # it is forked. Its session is its own from the start.
        self._leads: dict[int, int | None] = {leader: _session(leader)}
        with contextlib.suppress(psutil.Error):
            # Not reaped yet (its launcher waits for it only later): this is the leader itself.
            proc = psutil.Process(leader)
            self._starts[leader] = float(proc.create_time())
            self._known[leader] = proc

    def send(self, sig: int) -> None:
        """Signal every known process of the tree, after looking for the ones not known yet.

        :param sig: the signal; a SIGKILL sent to processes one by one is sent again (a few rounds at
            most) while they may have forked before it landed
        """
        for _ in range(_KILL_ROUNDS if sig == signal.SIGKILL else 1):
            groups, pids = targets(self._refresh())
            for group in groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, sig)
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    self._known[pid].send_signal(sig)
            if not pids:
                break  # a killpg reaches even what a member forks meanwhile: nothing to go back for
        self._forget_gone()

    def _refresh(self) -> list[Known]:
        """What each known process is now, after adopting what a listing shows of the tree."""
        states = self._states(self._known)
        listing = _listing({k.pid for k in states if k.leads and not k.running})
        adopted: dict[int, psutil.Process] = {}
        for pid in to_adopt(states, listing.values()):
            try:
                proc = psutil.Process(pid)
                if proc.create_time() != listing[pid].start:
                    continue  # gone since the listing, and its pid taken by another process
            except psutil.Error:
                continue
            adopted[pid] = proc
            self._starts[pid] = listing[pid].start
            self._leads.pop(pid, None)  # a new process under a pid that led a group before
        self._known.update(adopted)  # replaces a known process by that pid only if that one is gone
        return [s for s in states if s.pid not in adopted] + self._states(adopted)

    def _states(self, procs: Mapping[int, psutil.Process]) -> list[Known]:
        states: list[Known] = []
        for pid, proc in procs.items():
            running = bool(proc.is_running())
            group = _group(pid) if running else None
            if group == pid and pid not in self._leads:
                self._leads[pid] = _session(pid)
            leads = pid in self._leads
            session = self._leads.get(pid)
            states.append(Known(pid, running, group, self._starts[pid], leads, session))
        return states

    def _forget_gone(self) -> None:
        # A gone group leader stays known: the members its group kept are found through it.
        for pid in [p for p, proc in self._known.items() if p not in self._leads and not proc.is_running()]:
            del self._known[pid]
            del self._starts[pid]


def _listing(orphaned: set[int]) -> Mapping[int, Listed]:
    """Every process on the host; the session only of members of the groups in ``orphaned``."""
    listing: dict[int, Listed] = {}
    for proc in psutil.process_iter(["ppid", "create_time", "status"]):
        info = proc.info
        if info["ppid"] is None or info["create_time"] is None:
            continue  # gone or unreadable since the listing began
        group = _group(proc.pid)
        listing[proc.pid] = Listed(
            proc.pid,
            int(info["ppid"]),
            group,
            float(info["create_time"]),
            info["status"] == psutil.STATUS_ZOMBIE,
            _session(proc.pid) if group in orphaned else None,
        )
    return listing


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None
