"""Reclaim: kill what dead executor instances left running, found through their launch journals.

Every journal whose lock is free belonged to a dead instance (the kernel drops a ``flock`` when its
holder dies, however it dies), and every process still carrying that instance's mark, or still running
under a recorded pid (a launch's, or a descendant a running launch was seen with) with the recorded start
time (the kernel's, which a wall-clock step does not move; an older version's journal holds psutil's,
matched as that version did), is killed. See :mod:`async_local_executor.ops.journal` for why survivors
are killed rather than adopted.

Each is killed through a handle that checks its identity (pid and start time) when it signals: between
the listing and the kill, a process may exit and its pid go to another.

The directory is worked through one descriptor (:class:`~async_local_executor.ops.state_dir.StateDir`):
its journals are listed, opened and removed relative to it, never by resolving its path again, and only
journals of this process's user are acted on.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from async_local_executor.core.proc_identity import started_as
from async_local_executor.ops.journal_file import (
    CREATING,
    INSTANCE_ENV,
    SUFFIX,
    TMP_SUFFIX,
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


def reclaim(directory: Path | StateDir, *, timeout: float = 10.0) -> list[Survivor]:
    """Kill what dead executor instances left running, remove their journals, and say what was killed.

    Journals still locked belong to live executors (another scheduler on this host) and are left alone.
    A file that is not a journal (another version's lines, a link, a directory, another user's file) is
    skipped with a warning naming it: nothing in the directory makes this raise.

    :param directory: the state directory, best as opened and checked by
        :func:`~async_local_executor.ops.state_dir.secure`; a path is opened here (none there: nothing
        to reclaim)
    :param timeout: how long to wait for killed processes to be gone; what is still there is logged
    :raises StateDirIsLink: ``directory`` is a path that ends in a symbolic link
    """
    if isinstance(directory, StateDir):
        return _reclaim_in(directory, timeout)
    try:
        folder = StateDir.open(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    with folder:
        return _reclaim_in(folder, timeout)


def _reclaim_in(folder: StateDir, timeout: float) -> list[Survivor]:
    with contextlib.suppress(OSError):
        folder.tighten()
    # Writes cut short: a compaction (its journal still holds every record), or a new journal never
    # renamed into place (nothing was launched under it).
    for name in sorted(n for n in folder.names() if n.endswith(TMP_SUFFIX) or f"{SUFFIX}{CREATING}" in n):
        with _dead_owner(folder, name) as fd:
            if fd is not None:
                folder.unlink(name, missing_ok=True)
    killed: list[Survivor] = []
    for name in sorted(n for n in folder.names() if n.endswith(SUFFIX)):
        try:
            killed += _reclaim_one(folder, name, timeout)
        except OSError as exc:
            log.warning("cannot reclaim the launch journal %s: %s", folder.shown(name), exc)
    return killed


def _reclaim_one(folder: StateDir, name: str, timeout: float) -> list[Survivor]:
    with _dead_owner(folder, name) as fd:
        if fd is None:
            return []
        header, records, seen = read_all(fd, folder.shown(name))
        # Its own name, not what it says inside: the mark of no other instance's processes.
        instance = name.removesuffix(SUFFIX)
        found = _survivors(instance, str(header.get("owner", "?")), records, seen)
        _kill(found, timeout)
        folder.unlink(name)
        return [each.survivor for each in found]


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


def _survivors(instance: str, owner: str, records: Records, seen: Seen) -> list[_Found]:
    me = os.getpid()
    uid = os.getuid()
    ours: list[psutil.Process] = []
    leaders: dict[int, str] = {}  # recorded pids still running as the process that was recorded
    descendants: dict[int, str] = {}  # the same for the descendants seen: pid -> key of their launch
    seen_starts = {pid: (start, of) for of, found in seen.items() for pid, start in found.items()}
    for proc in psutil.process_iter(["pid", "uids"]):
        uids = proc.info["uids"]
        if proc.pid == me or uids is None or uids.real != uid:
            continue  # another user's processes are not ours, nor is their environment readable
        ours.append(proc)
        record = records.get(proc.pid)
        descendant = seen_starts.get(proc.pid)
        if record is not None and started_as(proc.pid, record[0]):
            leaders[proc.pid] = record[1]
        elif descendant is not None and started_as(proc.pid, descendant[0]):
            descendants[proc.pid] = records[descendant[1]][1]
    found: list[_Found] = []
    for proc in ours:
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
