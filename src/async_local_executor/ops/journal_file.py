"""The launch journal's file: its name, its lines, its lock, and reading it back.

One file per executor instance, ``<instance>.launches`` in the state directory, 0600, held under an
exclusive ``flock`` by its writer for the writer's whole life. It is JSON lines: a header naming the
instance and its owner, then ``{"+": pid, "start_ticks": ..., "key": ...}`` per launch, ``{"-": pid}``
per exit, and ``{"seen": pid, "start_ticks": ..., "of": pid}`` per descendant a launch was seen with (an
exit ends those too). Written by :class:`~async_local_executor.ops.journal.LaunchJournal`, read by
:func:`~async_local_executor.ops.reclaim.reclaim`.

A process's start is the kernel's, in clock ticks since boot, which no step of the wall clock moves
(:mod:`~async_local_executor.core.proc_identity`). Journals of older versions hold ``"start"``, psutil's
``create_time``, instead: read as a :class:`~async_local_executor.core.proc_identity.WallClockStart`,
so what a crashed scheduler of such a version left is still found after an upgrade.

A journal only ever appears under its name already locked: it is written under a fresh name
(``<instance>.launches.tmp-<random>``), locked, then renamed into place, the lock staying with the
file. A reclaimer that finds a journal it can lock therefore knows its writer is dead, never that it
has not locked it yet. Whoever only wants to know whether the writer lives takes a *shared* lock, for
an instant: a reclaimer that finds only shared locks knows the writer is dead and waits for them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from async_local_executor.core.proc_identity import Start, WallClockStart
from async_local_executor.ops.files import create_exclusive, fresh_name, open_regular, read_fd, write_all

log = logging.getLogger("async_local_executor.ops.journal")

INSTANCE_ENV = "ASYNC_LOCAL_EXECUTOR_INSTANCE"
SUFFIX = ".launches"
TMP_SUFFIX = ".launches.tmp"  # a compaction cut short, as versions before 0.2 named it
CREATING = ".tmp-"  # infix of a journal being written, before it is renamed into place, locked
# A new journal whose fresh name a reclaimer removed meanwhile is written again under another.
_ATTEMPTS = 5

START_KEY = "start_ticks"  # a process's start, in clock ticks since boot
LEGACY_START_KEY = "start"  # an older version's: psutil's create_time

Records = dict[int, tuple[Start, str]]  # the launches not ended: pid -> (process start, key)
# The descendants seen of the launches not ended: launch pid -> {descendant pid: its start}.
Seen = dict[int, dict[int, Start]]


def _lock_new(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def install_locked(final: Path, content: bytes) -> int:
    """Write ``content`` to a new file, lock it, and rename it to ``final``: the fd, locked, is ours.

    Between creating the file and locking it, a reclaimer (another scheduler starting) may lock it and
    remove it for a dead writer's: the rename then finds it gone, and it is written again.
    """
    for _ in range(_ATTEMPTS):
        tmp = fresh_name(final, CREATING)
        fd = create_exclusive(tmp, os.O_WRONLY | os.O_APPEND)
        try:
            _lock_new(fd)
            write_all(fd, content)
            os.rename(tmp, final)
            return fd
        except (BlockingIOError, FileNotFoundError):
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
    raise OSError(errno.EAGAIN, f"cannot create the journal {final}: removed {_ATTEMPTS} times meanwhile")


def holder_alive(path: Path) -> bool | None:
    """Whether a live writer holds the journal ``path``; None when there is no journal to ask.

    Takes a shared lock for an instant, which a live writer's exclusive lock refuses (in any pid
    namespace: the lock is the kernel's).
    """
    for _ in range(3):
        try:
            fd = open_regular(path)
        except OSError:
            return None  # gone, or not a journal
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            try:
                if os.fstat(fd).st_ino == path.stat().st_ino:
                    return False
            except FileNotFoundError:
                return None
            # Replaced since we opened it: its writer compacted it, so look again.
        finally:
            os.close(fd)
    return True  # compacted under us every time: its writer is busy, hence alive


def encode(entry: Mapping[str, object]) -> bytes:
    """One line of the journal."""
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def read(fd: int, path: Path | None = None) -> tuple[dict[str, object], Records]:
    """The header and the launches still open, from a journal's whole content (see :func:`read_all`)."""
    header, live, _ = read_all(fd, path)
    return header, live


def read_all(fd: int, path: Path | None = None) -> tuple[dict[str, object], Records, Seen]:
    """The header, the launches still open and the descendants they were seen with.

    Lines that are not this format's (a line cut short by a crash, another version's, garbage) are
    skipped; if any but a cut-short last line was, one warning names ``path``.
    """
    lines = read_fd(fd).splitlines()
    header: dict[str, object] = {}
    live: Records = {}
    seen: Seen = {}
    foreign = 0
    for number, raw in enumerate(lines):
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):
            foreign += number != len(lines) - 1  # the last line may have been cut short by a crash
            continue
        try:
            if not isinstance(entry, dict):
                raise TypeError(type(entry).__name__)
            if number == 0:
                header = entry
            elif "+" in entry:
                live[_pid(entry["+"])] = (_start(entry), str(entry["key"]))
            elif "-" in entry:
                ended = _pid(entry["-"])
                live.pop(ended, None)
                seen.pop(ended, None)
            elif "seen" in entry:
                of = _pid(entry["of"])
                if of in live:  # one of a launch that ended is not reclaimed, as the launch is not
                    seen.setdefault(of, {})[_pid(entry["seen"])] = _start(entry)
            else:
                raise KeyError("+")
        except (ValueError, TypeError, KeyError):
            foreign += 1
    if foreign:
        log.warning(
            "skipped %d line(s) of the launch journal %s that are not in this version's format",
            foreign,
            path or f"fd {fd}",
        )
    return header, live, seen


def _start(entry: Mapping[str, object]) -> Start:
    if START_KEY in entry:
        ticks = entry[START_KEY]
        if type(ticks) is not int or ticks < 0:
            raise ValueError(f"not a start in ticks: {ticks!r}")
        return ticks
    legacy = entry[LEGACY_START_KEY]
    if not isinstance(legacy, (int, float)):
        raise TypeError(type(legacy).__name__)
    return WallClockStart(float(legacy))


def _pid(value: object) -> int:
    if type(value) is not int or value <= 0:
        raise ValueError(f"not a pid: {value!r}")
    return value
