"""Reclaim: kill what dead executor instances left running, found through their launch journals.

Every journal whose lock is free belonged to a dead instance (the kernel drops a ``flock`` when its
holder dies, however it dies), and every process still carrying that instance's mark, or still running
under a recorded pid (a launch's, or a descendant a running launch was seen with) with the recorded start
time (the kernel's, which a wall-clock step does not move), is killed. See
:mod:`async_local_executor.ops.journal` for why survivors are killed rather than adopted.

Except the workloads handed over, which are *held* for the next executor to adopt. A launch of a dead
journal is held when its process still runs as the one recorded (pid and start ticks, no zombie) and

- a handover line says its scheduler released it when it stopped, less than the line's ``timeout`` ago
  (``CLOCK_BOOTTIME``, which neither a wall-clock step nor a suspend stops); or
- there is none, but its launch line says it was started (or held) to outlive its scheduler
  (``handover_timeout``): its scheduler crashed, and a crash hands over too. When the writer died is
  in no journal (its last write, the file's mtime, may be hours before the death), so the death is
  taken to be now. That errs on the side of holding, and the workload bounds it itself: its watchdog
  counts down from its owner's death and kills it once the timeout has passed, unless a live executor
  named itself in its custody file meanwhile.

An expired handover is killed like any survivor; one whose pid runs another process now is gone. With a
workload held go what is in its process group, the descendants seen of it, the processes whose parent
chain reaches it and what is in its cgroup, whichever dead journal names them. Every dead journal is
locked before anything is decided, the held ones are given to ``hold`` (the new journal records them)
before the dead journals are unlinked, still locked: a second reclaimer meanwhile finds them locked and
takes nothing. If this process dies between the two, both journals stay behind, and the next reclaim
holds each workload once, from either.

Each is killed through a handle that checks its identity (pid and start time) when it signals: between
the listing and the kill, a process may exit and its pid go to another.

The directory is worked through one descriptor (:class:`~async_local_executor.ops.state_dir.StateDir`):
its journals are listed, opened and removed relative to it, never by resolving its path again, and only
journals of this process's user are acted on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import psutil

from async_local_executor.core.cgroups import names as cgroup_names
from async_local_executor.core.cgroups.discovery import (
    Mount,
    cgroup2_entry,
    cgroup_of,
    cgroup_path,
    directory_of,
)
from async_local_executor.core.proc_identity import runs_as, started_as
from async_local_executor.ops.journal_file import (
    CREATING,
    INSTANCE_ENV,
    SUFFIX,
    Companion,
    Handovers,
    Records,
    Seen,
    read_all,
)
from async_local_executor.ops.state_dir import StateDir

# The logger its lines had before it left the journal module, so logging set-ups that name it still apply.
log = logging.getLogger("async_local_executor.ops.journal")

# How long a dead writer's journal may stay share-locked by readers before it is left for next time.
_READERS_WAIT = 1.0


@dataclass(frozen=True)
class Survivor:
    """A process a dead executor instance left behind, and what :func:`reclaim` did about it."""

    pid: int
    label: str  # the workload's key as recorded, or "" for a descendant found by its mark alone
    instance: str
    owner: str  # who held the journal, as it said when it opened it
    command: str
    recorded: bool = False  # the journal names it: a workload's own process, leading its group


@dataclass(frozen=True)
class Held:
    """A workload a dead executor instance handed over (or left when it crashed), held for adoption."""

    pid: int
    start: int
    """Its start, in clock ticks since boot."""
    key: str
    """The workload's key as its launch line recorded it."""
    info: Mapping[str, object]
    """The adapter's data, from the handover line (or the launch line, after a crash)."""
    cgroup: str | None
    """Its own cgroup2 directory (what is in it is held with it), or None when it has none of its own."""
    at: float
    """Wall time it was handed over; after a crash, when the reclaim found it."""
    boot: float
    """``CLOCK_BOOTTIME`` seconds at :attr:`at`: its countdown ran from then (see the module docstring)."""
    timeout: float
    """How long it outlives its owner's death before it kills itself, in seconds."""
    instance: str
    """The dead instance whose journal named it."""
    owner: str = ""
    """Who held that journal, as it said when it opened it."""
    crashed: bool = False
    """No handover line: its scheduler died without handing it over (a crash)."""
    descendants: tuple[tuple[int, int], ...] = ()
    """``(pid, start ticks)`` of the descendants seen of it that still run, for the new journal."""


@dataclass(frozen=True)
class ReclaimResult:
    """What :func:`reclaim` did: the processes it killed, the workloads it held, the instances it reclaimed
    (their journals' ids: the instances whose processes it judged)."""

    killed: list[Survivor] = field(default_factory=list)
    held: list[Held] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)


def reclaim(
    directory: Path | StateDir,
    *,
    timeout: float = 10.0,
    hold: Callable[[list[Held]], None] | None = None,
    owner_key: str = "",
    wanted: Callable[[Mapping[str, object]], bool] | None = None,
) -> ReclaimResult:
    """Kill what dead executor instances left running, hold what they handed over, remove their journals.

    Journals still locked belong to live executors (another scheduler on this host) and are left alone.
    A file that is not a journal (another version's lines, a link, a directory, another user's file) is
    skipped with a warning naming it: nothing in the directory makes this raise.

    :param directory: the state directory, best as opened and checked by
        :func:`~async_local_executor.ops.state_dir.secure`; a path is opened here (none there: nothing
        to reclaim)
    :param timeout: how long to wait for killed processes to be gone; what is still there is logged
    :param hold: given the held workloads while the dead journals are still there and locked, to record
        them where a crash of this process leaves them for the next reclaim (its own journal); what it
        raises is logged
    :param owner_key: whose workloads this executor may hold (its deployment and team): a dead journal
        of another key is left to its own executor while anything in it could still be handed over
        (its workloads kill themselves once ``handover_timeout`` has passed without an owner), and is
        reclaimed like any once nothing in it could
    :param wanted: given, only a dead journal one of whose handed-over workloads' data it accepts is
        taken (a running executor's, for the task instances Airflow offered it); the others stay
    :raises StateDirIsLink: ``directory`` is a path that ends in a symbolic link
    """
    if isinstance(directory, StateDir):
        return _reclaim_in(directory, timeout, hold, owner_key, wanted)
    try:
        folder = StateDir.open(directory)
    except (FileNotFoundError, NotADirectoryError):
        return ReclaimResult()
    with folder:
        return _reclaim_in(folder, timeout, hold, owner_key, wanted)


@dataclass(frozen=True)
class _Dead:
    """A dead instance's journal, locked by us, as read."""

    name: str
    instance: str
    owner: str
    records: Records
    seen: Seen
    handovers: Handovers


def _reclaim_in(
    folder: StateDir,
    timeout: float,
    hold: Callable[[list[Held]], None] | None,
    owner_key: str,
    wanted: Callable[[Mapping[str, object]], bool] | None = None,
) -> ReclaimResult:
    with contextlib.suppress(OSError):
        folder.tighten()
    # Writes cut short: a compaction (its journal still holds every record), or a new journal never
    # renamed into place (nothing was launched under it).
    for name in sorted(n for n in folder.names() if f"{SUFFIX}{CREATING}" in n):
        with _dead_owner(folder, name) as fd:
            if fd is not None:
                folder.unlink(name, missing_ok=True)
    # Every dead journal locked before anything is decided: a process one of them holds is not killed
    # for another, and no other reclaimer takes any of them until they are gone.
    with contextlib.ExitStack() as locked:
        dead: list[_Dead] = []
        stopped: set[tuple[int, int]] = set()
        for name in sorted(n for n in folder.names() if n.endswith(SUFFIX)):
            with contextlib.ExitStack() as this:
                try:
                    fd = this.enter_context(_dead_owner(folder, name))
                    if fd is None:
                        continue
                    header, records, seen, handovers = read_all(fd, folder.shown(name))
                except OSError as exc:
                    log.warning("cannot reclaim the launch journal %s: %s", folder.shown(name), exc)
                    continue
                # Its own name, not what it says inside: the mark of no other instance's processes.
                instance = name.removesuffix(SUFFIX)
                owner = header.owner
                # Whoever's journal it is: they are its owner's, which every executor in it shared. Not while
                # that owner runs (a stop hands its journal on before its process exits): its own to stop.
                pid, start = header.pid, header.pid_start
                if not (pid is not None and start is not None and runs_as(pid, start)):
                    _stop_companions(header.companions, owner, instance, stopped)
                journal = _Dead(name, instance, owner, records, seen, handovers)
                theirs = header.owner_key
                if theirs is not None and theirs != owner_key and _any_holdable(journal):
                    # Another team's or deployment's: Airflow offers its task instances to its executor
                    # alone, which holds them when it starts. Unlocked again as this block ends.
                    log.debug("left %s to its own executor (%s)", folder.shown(name), owner)
                    continue
                if wanted is not None and not any(wanted(each.info) for each in handovers.values()):
                    continue  # nothing in it was offered to this executor: another scheduler's to take
                locked.enter_context(this.pop_all())
                dead.append(journal)
        if not dead:
            return ReclaimResult()
        found, held = _survey(dead)
        _kill(found, timeout)
        if held and hold is not None:
            try:
                hold(held)
            except Exception:
                log.exception("cannot record the %d workload(s) held from a stopped executor", len(held))
        for each in dead:
            try:
                folder.unlink(each.name)
            except OSError as exc:
                log.warning("cannot remove the launch journal %s: %s", folder.shown(each.name), exc)
    return ReclaimResult([each.survivor for each in found], held, [each.instance for each in dead])


def _stop_companions(
    companions: Sequence[Companion], owner: str, instance: str, stopped: set[tuple[int, int]]
) -> None:
    """SIGKILL the companions a dead journal names that still run as themselves, and their descendants.

    A service's helper that outlived the process that started it still holds what it inherited: a
    scheduler's log server keeps that scheduler's database connection, with the transaction a crash cut
    short and its row locks, which stop the next scheduler from ever queueing, and it keeps the log
    server's port (so do its workers, where it has some). Nothing in it is worth a graceful stop.

    :param stopped: ``(pid, start)`` of the companions stopped in this reclaim so far (every team's
        journal names the same ones)
    """
    for companion in companions:
        if companion.pid == os.getpid() or (companion.pid, companion.start) in stopped:
            continue
        try:
            # The handle first: checked as the recorded process, it refuses any later one under the pid.
            proc = psutil.Process(companion.pid)
            if not runs_as(companion.pid, companion.start) or proc.uids().real != os.getuid():
                continue  # gone, or not ours to stop, as no other user's process is
            tree = [proc, *proc.children(recursive=True)]
        except psutil.Error:
            continue
        stopped.add((companion.pid, companion.start))
        survivor = Survivor(companion.pid, companion.what, instance, owner, companion.what)
        _kill([_Found(dataclasses.replace(survivor, pid=one.pid), one, leads=False) for one in tree], 0.0)
        log.warning(
            "stopped %s (pid %d)%s, which %s had started and which outlived it holding what it inherited "
            "(its database connections, its port)",
            companion.what,
            companion.pid,
            f" and {len(tree) - 1} process(es) it started" if len(tree) > 1 else "",
            owner,
        )


@contextlib.contextmanager
def _dead_owner(folder: StateDir, name: str) -> Iterator[int | None]:
    """Yield an fd of ``name`` locked by us, or None while its owner lives (or it is gone, or not ours)."""
    path = folder.shown(name)  # for messages only
    try:
        fd = folder.open_regular(name, owned=True)
    except FileNotFoundError:
        yield None
        return
    except OSError as exc:
        log.warning("skipped %s in the state directory: %s", path, exc.strerror or exc)
        yield None
        return
    try:
        # Otherwise its owner closed it or compacted it since we opened it: alive, or done with it.
        yield fd if _lock_if_dead(fd, path) and _still_named(fd, folder, name) else None
    finally:
        os.close(fd)


def _lock_if_dead(fd: int, path: Path) -> bool:
    """Lock ``fd`` exclusively if its writer is dead; False while it lives."""
    deadline = time.monotonic() + _READERS_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # locked exclusively: by its live writer (or by another reclaimer)
        fcntl.flock(fd, fcntl.LOCK_UN)
        # Shared locks only: whoever holds them is asking, for an instant, whether the writer lives.
        if time.monotonic() > deadline:
            log.warning("%s stayed locked by readers for %.0fs: skipped", path, _READERS_WAIT)
            return False
        _pause()


def _pause() -> None:
    time.sleep(0.005)  # a reader holds its shared lock for a few microseconds


def _still_named(fd: int, folder: StateDir, name: str) -> bool:
    try:
        mine, named = os.fstat(fd), folder.lstat(name)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (named.st_dev, named.st_ino)


@dataclass(frozen=True)
class _Found:
    survivor: Survivor
    proc: psutil.Process  # the handle it is killed through, which checks its identity
    leads: bool  # it leads a process group that is its own: a recorded workload, or a seen one


@dataclass(frozen=True)
class _Listing:
    ours: list[psutil.Process]  # this user's processes, this one left out
    parents: dict[int, int]  # every process's parent pid


def _listing() -> _Listing:
    me = os.getpid()
    uid = os.getuid()
    ours: list[psutil.Process] = []
    parents: dict[int, int] = {}
    for proc in psutil.process_iter(["pid", "uids", "ppid"]):
        if proc.info["ppid"] is not None:
            parents[proc.pid] = proc.info["ppid"]
        uids = proc.info["uids"]
        if proc.pid == me or uids is None or uids.real != uid:
            continue  # another user's processes are not ours, nor is their environment readable
        ours.append(proc)
    return _Listing(ours, parents)


def _survey(dead: list[_Dead]) -> tuple[list[_Found], list[Held]]:
    """What to kill and what to hold, over every dead journal at once."""
    listing = _listing()
    mount = cgroup2_entry()
    held: list[Held] = []
    taken: set[tuple[int, int]] = set()
    for journal in dead:
        for one in _holdable(journal, mount):
            # Named by two journals when a reclaimer died between recording it and removing the old one.
            if (one.pid, one.start) not in taken:
                taken.add((one.pid, one.start))
                held.append(one)
    spared = _spared(held, dead, listing, mount)
    found: list[_Found] = []
    for journal in dead:
        for each in _survivors(journal, listing):
            if each.survivor.pid not in spared:
                spared.add(each.survivor.pid)  # once, if two journals name it
                found.append(each)
    return found, held


def _any_holdable(journal: _Dead) -> bool:
    """Whether a workload of ``journal`` could still be held (as :func:`_holdable` would, without a word)."""
    boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    for pid, handover in journal.handovers.items():
        record = journal.records.get(pid)
        if record is None or handover.start != record[0] or not runs_as(pid, handover.start):
            continue
        if handover.boot is None or 0 <= boot - handover.boot < handover.timeout:
            return True
    return False


def _holdable(journal: _Dead, mount: Mount | None) -> Iterator[Held]:
    now, boot = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
    for pid, handover in journal.handovers.items():
        record = journal.records.get(pid)
        if record is None:
            continue
        start, key = record
        if handover.start != start or not runs_as(pid, handover.start):
            continue  # another process runs under the pid now, or none (a zombie is killed as a survivor)
        if handover.boot is None:
            # A crash: its owner died no later than now, and its own countdown bounds the rest.
            at, since, crashed = now, boot, True
        else:
            age = boot - handover.boot
            if not 0 <= age < handover.timeout:
                log.warning(
                    "pid %d (%s) was handed over by a stopped executor (%s) %.0fs ago, more than its "
                    "handover_timeout of %gs: it is not held",
                    pid,
                    key,
                    journal.owner,
                    age,
                    handover.timeout,
                )
                continue
            at = handover.at if handover.at is not None else now
            since, crashed = handover.boot, False
        # Where it is: a line may name none (a crash) or be wrong, and its adopter kills what is in it.
        cgroup = _own_cgroup(pid, mount)
        yield Held(
            pid,
            start,
            key,
            dict(handover.info),
            cgroup,
            at,
            since,
            handover.timeout,
            journal.instance,
            journal.owner,
            crashed,
            tuple(
                (seen, since)
                for seen, since in journal.seen.get(pid, {}).items()
                if isinstance(since, int) and runs_as(seen, since)
            ),
        )


def _own_cgroup(pid: int, mount: Mount | None) -> str | None:
    """The cgroup2 directory of ``pid`` if it is a workload's own (in an instance's ``ale-`` directory)."""
    if mount is None:
        return None
    try:
        path = cgroup_of(pid)
    except OSError:
        return None
    if path is None or cgroup_names.instance_of(PurePosixPath(path).parent.name) is None:
        return None  # the scheduler's own cgroup, say (containment off): not the workload's alone
    if PurePosixPath(mount.root) not in PurePosixPath(path).parents:
        return None  # outside what is mounted here (another cgroup namespace's)
    return str(directory_of(mount.point, mount.root, path))


def _spared(held: list[Held], dead: list[_Dead], listing: _Listing, mount: Mount | None) -> set[int]:
    """The pids held with ``held``: each workload, and what goes with it (see the module docstring)."""
    if not held:
        return set()
    roots = {each.pid for each in held}
    spared = set(roots)
    journals = {journal.instance: journal for journal in dead}
    for each in held:
        for pid, start in journals[each.instance].seen.get(each.pid, {}).items():
            if started_as(pid, start):
                spared.add(pid)
    cgroups = {path for each in held if (path := _relative(each.cgroup, mount)) is not None}
    for proc in listing.ours:
        pid = proc.pid
        if pid in spared:
            continue
        if _reaches(pid, roots, listing.parents) or _in_cgroups(pid, cgroups):
            spared.add(pid)
            continue
        with contextlib.suppress(OSError):
            if os.getpgid(pid) in roots:  # a held workload leads its own group, and is running
                spared.add(pid)
    return spared


def _reaches(pid: int, roots: set[int], parents: Mapping[int, int]) -> bool:
    """Whether a parent of ``pid``'s, or theirs, and so on, is one of ``roots``."""
    visited = {pid}
    parent = parents.get(pid, 0)
    while parent > 1 and parent not in visited:
        if parent in roots:
            return True
        visited.add(parent)
        parent = parents.get(parent, 0)
    return False


def _relative(directory: str | None, mount: Mount | None) -> str | None:
    """The cgroup path of a cgroup2 directory as ``/proc/<pid>/cgroup`` shows it; None if not under the mount."""
    if directory is None or mount is None:
        return None
    try:
        return cgroup_path(mount.point, mount.root, Path(directory))
    except ValueError:
        return None


def _in_cgroups(pid: int, cgroups: set[str]) -> bool:
    if not cgroups:
        return False
    try:
        path = cgroup_of(pid)
    except OSError:
        return False
    return path is not None and any(path == each or path.startswith(f"{each}/") for each in cgroups)


def _survivors(journal: _Dead, listing: _Listing) -> list[_Found]:
    instance, owner, records = journal.instance, journal.owner, journal.records
    leaders: dict[int, str] = {}  # recorded pids still running as the process that was recorded
    descendants: dict[int, str] = {}  # the same for the descendants seen: pid -> key of their launch
    seen_starts = {pid: (start, of) for of, found in journal.seen.items() for pid, start in found.items()}
    for proc in listing.ours:
        record = records.get(proc.pid)
        descendant = seen_starts.get(proc.pid)
        if record is not None and started_as(proc.pid, record[0]):
            leaders[proc.pid] = record[1]
        elif descendant is not None and started_as(proc.pid, descendant[0]):
            descendants[proc.pid] = records[descendant[1]][1]
    found: list[_Found] = []
    for proc in listing.ours:
        label = leaders.get(proc.pid)
        leads = label is not None
        try:
            group = os.getpgid(proc.pid)
            if label is None and proc.pid in descendants:
                label = f"started by {descendants[proc.pid]}"
                leads = group == proc.pid  # it left the workload's group for one of its own
            elif label is None:
                marked = proc.environ().get(INSTANCE_ENV) == instance
                if group in leaders and group != proc.pid:
                    # A workload leads its own group; what stays in it is its own, marked or not.
                    label = f"in the process group of {leaders[group]}"
                elif marked:
                    label = ""
        except (OSError, psutil.Error):
            continue  # gone since the listing
        if label is not None:
            survivor = Survivor(proc.pid, label, instance, owner, _command(proc), proc.pid in leaders)
            found.append(_Found(survivor, proc, leads))
    return found


def _command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:200] or proc.name()
    except psutil.Error:
        return "?"


def _kill(found: list[_Found], timeout: float) -> None:
    for each in found:
        # What a group leader forked after we looked is caught by its group. The group first, while
        # its leader surely lives: once killed, the leader may be reaped at once by its new parent and
        # its pid, the group's id, go to another process.
        if each.leads and each.proc.is_running():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(each.survivor.pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            each.proc.send_signal(signal.SIGKILL)  # refuses a later process under the same pid
    if timeout <= 0:
        return  # not waited for: whoever asked cannot wait, and the next start finds any still there
    deadline = time.monotonic() + timeout
    while pending := [each.survivor.pid for each in found if _running(each.proc)]:
        if time.monotonic() > deadline:
            log.error("processes still running %.0fs after SIGKILL: %s", timeout, pending)
            return
        time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    # A killed orphan stays a zombie until its new parent reaps it; it runs nothing any more.
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
