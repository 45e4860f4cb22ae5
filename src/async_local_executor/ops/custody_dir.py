"""The custody directory: who answers for a workload that outlives its scheduler, and what it left there.

``<state_dir>/custody/``, 0700, made by the executor at start. Each handed-over workload has files named
after it (:mod:`async_local_executor.core.custody_files` defines them): its owner's claim, which the
scheduler that hands it over writes naming itself as it is about to exit, and the one that takes it over
rewrites (:func:`name_owner`); its exit code, which it writes itself (:func:`read_exit`); its output
once the scheduler's pipe had no reader any more (:func:`out_path`), which no executor reads (a workload
that fails or kills itself after its owner's exit writes the last lines of it to its task's log itself).
The workload's watchdog reads the claim once its owner has died: while it names a live process other
than the dead one, the workload does not kill itself, for at most its ``handover_timeout`` without a live
owner in all (:mod:`async_local_executor.core.custody`).

Whoever finishes with a workload removes its files (:func:`remove`); an executor that starts removes
those of workloads no longer running that no live executor answers for (:func:`remove_stale`). Nothing
here knows Airflow.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from pathlib import Path

from async_local_executor.core import custody_files
from async_local_executor.core.custody_files import EXIT, OUT, OWNER, WORKLOAD_FILE, WRITING, Owner, name
from async_local_executor.core.files import open_regular, read_fd, replace_atomically
from async_local_executor.core.proc_identity import runs_as, start_ticks
from async_local_executor.ops.state_dir import StateDir, UnsafeStateDir

log = logging.getLogger(__name__)

__all__ = [
    "DIRECTORY",
    "ensure",
    "name",
    "name_owner",
    "out_path",
    "path",
    "read_exit",
    "read_owner",
    "remove",
    "remove_stale",
]

DIRECTORY = "custody"


def path(state_dir: Path) -> Path:
    """The custody directory of the state directory ``state_dir``."""
    return state_dir / DIRECTORY


def ensure(folder: StateDir) -> Path:
    """Make the custody directory in the state directory (0700) if missing, and make sure it is ours alone.

    :param folder: the state directory, as opened and checked by
        :func:`~async_local_executor.ops.state_dir.secure`
    :returns: the custody directory's path
    :raises UnsafeStateDir: what has its name is not a directory of this user's (a link, a file)
    """
    shown = folder.shown(DIRECTORY)
    with contextlib.suppress(FileExistsError):
        os.mkdir(DIRECTORY, 0o700, dir_fd=folder.fd)
    try:
        fd = os.open(DIRECTORY, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder.fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeStateDir(
                f"{shown} is not a directory (a link or a file): the executor keeps the custody of the "
                "workloads it hands over there. Remove it"
            ) from exc
        raise
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise UnsafeStateDir(
                f"{shown} is owned by uid {info.st_uid}, not by the scheduler's uid {os.geteuid()}: "
                "another user could keep handed-over workloads alive through it. Remove it"
            )
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return shown


def name_owner(
    custody: Path, pid: int, start: int, owner_pid: int | None = None, owner_start: int | None = None
) -> None:
    """Name the executor process that answers for the workload ``(pid, start)`` now (0600, atomically).

    :param owner_pid: that process; this one by default
    :param owner_start: its start in clock ticks since boot; read from ``/proc`` by default
    :raises OSError: it cannot be written
    """
    owner_pid = os.getpid() if owner_pid is None else owner_pid
    owner_start = start_ticks(owner_pid) if owner_start is None else owner_start
    if owner_start is None:
        raise OSError(errno.ESRCH, f"no process {owner_pid} to name as the owner of {name(pid, start)}")
    data = custody_files.encode_owner(Owner(owner_pid, owner_start))
    replace_atomically(custody_files.file(custody, pid, start, OWNER), data, WRITING)


def read_owner(custody: Path, pid: int, start: int) -> Owner | None:
    """The executor the workload's claim names; None: none, or unreadable."""
    raw = _read_small(custody_files.file(custody, pid, start, OWNER))
    return None if raw is None else custody_files.decode_owner(raw)


def read_exit(custody: Path, pid: int, start: int) -> int | None:
    """The exit code the workload ``(pid, start)`` wrote at its exit; None when it wrote none (or garbage)."""
    raw = _read_small(custody_files.file(custody, pid, start, EXIT))
    return None if raw is None else custody_files.decode_exit(raw)


def out_path(custody: Path, pid: int, start: int) -> Path:
    """Where the workload ``(pid, start)`` appends its output once its owner's pipe has no reader."""
    return custody_files.file(custody, pid, start, OUT)


def remove(custody: Path, pid: int, start: int) -> None:
    """Remove the workload's custody files (its ``.json``, ``.exit``, ``.out``, and any cut short)."""
    _remove_named(custody, name(pid, start))


def remove_stale(custody: Path) -> list[str]:
    """Remove the files of workloads that no longer run and that no live executor answers for.

    A workload that ended but whose ``.json`` names a live executor keeps its files: that executor
    adopted it and is yet to read its ``.exit``. Names that are not a workload's are left alone.

    :returns: the names (``<pid>-<start>``) whose files were removed
    """
    try:
        names = os.listdir(custody)
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("cannot list the custody directory %s: %s", custody, exc.strerror or exc)
        return []
    workloads: set[tuple[int, int]] = set()
    for each in names:
        match = WORKLOAD_FILE.match(each)
        if match is not None:
            workloads.add((int(match.group(1)), int(match.group(2))))
    removed: list[str] = []
    for pid, start in sorted(workloads):
        if runs_as(pid, start):
            continue
        owner = read_owner(custody, pid, start)
        if owner is not None and runs_as(*owner):
            continue
        _remove_named(custody, name(pid, start), names)
        removed.append(name(pid, start))
    return removed


def _remove_named(custody: Path, workload: str, names: list[str] | None = None) -> None:
    if names is None:
        try:
            names = os.listdir(custody)
        except FileNotFoundError:
            return
    for each in names:
        if each.startswith(f"{workload}."):
            try:
                (custody / each).unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("cannot remove %s: %s", custody / each, exc.strerror or exc)


def _read_small(path: Path) -> bytes | None:
    """At most one byte more than a custody record holds, from the regular file ``path``; None: missing,
    a link, not a regular file, unreadable."""
    try:
        fd = open_regular(path)
    except OSError:
        return None
    try:
        return read_fd(fd, custody_files.MAX_SIZE + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
