"""A record, on disk, of the processes an executor launched, so that its successor can clean up after it.

Rule: every process a launch starts is accounted for by a dead instance's successor, even one that left
our process groups and the parent-death chain (a daemon started with ``setsid``, a BashOperator's shell).
So each executor instance

- marks every process it launches with ``ASYNC_LOCAL_EXECUTOR_INSTANCE=<instance id>`` in the
  environment, which descendants inherit;
- appends a line per launch (pid, process start in clock ticks since boot, key) and per exit to a
  journal file, 0600, that it holds an exclusive ``flock`` on for its whole life (the kernel drops the
  lock when the process dies, however it dies);
- appends a line per descendant of a running launch that the status file's walk of the process trees
  sees (pid and start time, see :meth:`LaunchJournal.seen`), so one that drops the mark and leaves the
  launch's session is still named;

and an executor that starts calls :func:`reclaim` before it launches anything, which kills what a dead
instance left (docs/design.md, "Survivors are killed, not adopted", says why). Nothing here knows Airflow.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path

from async_local_executor.core.outcome import Outcome
from async_local_executor.core.proc_identity import runs_as, start_ticks
from async_local_executor.core.supervisor import Listener
from async_local_executor.ops.files import write_all
from async_local_executor.ops.journal_file import (
    INSTANCE_ENV,
    START_KEY,
    SUFFIX,
    encode,
    install_locked,
)
from async_local_executor.ops.reclaim import Survivor, reclaim

__all__ = ["INSTANCE_ENV", "SUFFIX", "LaunchJournal", "RecordingListener", "Survivor", "reclaim"]

log = logging.getLogger(__name__)

# A compaction rewrites the journal once it holds this many lines more than it has live records.
_COMPACT_SLACK = 4096
# Descendants recorded per launch at most (a task running a pool of worker processes has dozens).
_SEEN_PER_LAUNCH = 256


# Journals open in this process. A process the scheduler forks (Airflow 2's DAG file processor, for
# one) would share each journal's open file and so its lock, and keep it locked after the scheduler
# died: a restarted scheduler would take a dead one for alive and reclaim nothing. Forks close them.
_open_journals: weakref.WeakSet[LaunchJournal] = weakref.WeakSet()


def _close_in_fork() -> None:
    for journal in list(_open_journals):
        journal._forget_in_fork()


os.register_at_fork(after_in_child=_close_in_fork)


class LaunchJournal:
    """This instance's journal. Opened with :meth:`open`; writes never raise (a full disk only warns).

    Launches and exits are written on the event loop's thread: each write is one small ``write(2)``
    into the page cache, far cheaper than handing it to a worker thread, and it needs no ``fsync``,
    since what it guards against is a crash of the process, not of the host (a host crash takes every
    task process with it). Descendants are written from the status writer's thread; a lock keeps the
    two from interleaving lines or compactions, held for a few writes at most.
    """

    def __init__(self, directory: Path, fd: int, instance: str, header: bytes) -> None:
        self.directory = directory
        self.instance = instance
        self.path = directory / f"{instance}{SUFFIX}"
        self._fd: int | None = fd
        self._header = header
        self._live: dict[int, bytes] = {}
        self._seen: dict[int, dict[tuple[int, int], bytes]] = {}  # launch pid -> its descendants' lines
        self._seen_lines = 0
        self._lines = 1
        self._broken = False
        self._lock = threading.Lock()
        _open_journals.add(self)

    def _forget_in_fork(self) -> None:
        # Another thread may have held the lock at the fork; nothing in the child writes any more.
        self._lock = threading.Lock()
        # Closing our copy leaves the lock with the process that took it.
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    @classmethod
    def open(cls, directory: Path, *, owner: str) -> LaunchJournal:
        """Create and lock a new journal in ``directory`` (made 0700 if missing).

        :param owner: who this is, for the log lines of whoever reclaims it
        """
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        instance = uuid.uuid4().hex
        header = encode({"instance": instance, "owner": owner, "pid": os.getpid(), "opened": time.time()})
        # Appears under its name already locked: a reclaimer never takes it for a dead writer's.
        fd = install_locked(directory / f"{instance}{SUFFIX}", header)
        return cls(directory, fd, instance, header)

    def child_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` plus the mark that makes every process of this instance findable after a crash."""
        return {**base, INSTANCE_ENV: self.instance}

    def started(self, pid: int, label: str) -> None:
        start = start_ticks(pid)
        if start is None:
            return  # already gone: nothing could survive it
        line = encode({"+": pid, START_KEY: start, "key": label})
        with self._lock:
            self._live[pid] = line
            self._append(line)

    def ended(self, pid: int) -> None:
        with self._lock:
            if self._live.pop(pid, None) is not None:
                self._seen_lines -= len(self._seen.pop(pid, {}))
                self._append(encode({"-": pid}))

    def seen(self, found: Mapping[int, Sequence[tuple[int, int]]]) -> None:
        """Record the descendants not recorded yet of each running launch, as ``(pid, start ticks)``.

        Pids that are not launches still running are ignored (one that ended since the walk, say);
        past :data:`_SEEN_PER_LAUNCH` of one launch, those no longer running make room, then the rest is
        left out. Never raises.

        :param found: launch pid -> its descendants, as the status file's walk saw them
        """
        with self._lock:
            full = [ident for launch, new in found.items() for ident in self._crowded(launch, new)]
        # Checked outside the lock: the event loop's thread may be waiting for it to journal a launch.
        gone = {ident for ident in full if not runs_as(*ident)}
        with self._lock:
            for launch, descendants in found.items():
                if launch not in self._live:
                    continue  # ended since the walk
                known = self._seen.setdefault(launch, {})
                for ident in gone.intersection(known):
                    # Its line stays in the file until a compaction; a reclaim finds it gone too.
                    del known[ident]
                    self._seen_lines -= 1
                for ident in descendants:
                    if ident in known:
                        continue
                    if len(known) >= _SEEN_PER_LAUNCH:
                        break
                    pid, start = ident
                    known[ident] = line = encode({"seen": pid, START_KEY: start, "of": launch})
                    self._seen_lines += 1
                    self._append(line)

    def _crowded(self, launch: int, descendants: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """The recorded descendants of ``launch`` if the new ones would not all fit beside them."""
        known = self._seen.get(launch, {})
        if launch not in self._live or len(known) + len(set(descendants) - known.keys()) <= _SEEN_PER_LAUNCH:
            return []
        return list(known)

    def close(self) -> None:
        """Remove the journal: every launch ended, nothing is left to reclaim."""
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is None:
                return
            # Unlinked while still locked: a reclaimer that opened it meanwhile sees it gone, skips it.
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            os.close(fd)

    def _append(self, line: bytes) -> None:
        if self._fd is None or self._broken:
            return
        try:
            write_all(self._fd, line)
            self._lines += 1
            if self._lines > len(self._live) + self._seen_lines + _COMPACT_SLACK:
                self._compact()
        except OSError as exc:
            self._broken = True
            log.warning(
                "cannot write the launch journal %s (%s): after a crash, survivors of this scheduler's "
                "tasks will not be found",
                self.path,
                exc.strerror,
            )

    def _compact(self) -> None:
        assert self._fd is not None
        # Locked before it replaces the journal, so there is no moment the name is unlocked.
        # Each launch's line before its descendants': a reader drops those of launches it does not know.
        content = [self._header]
        for pid, line in self._live.items():
            content += [line, *self._seen.get(pid, {}).values()]
        fd = install_locked(self.path, b"".join(content))
        os.close(self._fd)
        self._fd = fd
        self._lines = len(content)


class RecordingListener:
    """Journals each launch and exit, then passes the event on to ``inner``."""

    def __init__(self, inner: Listener, journal: LaunchJournal, describe: Callable[[Hashable], str]) -> None:
        self._inner = inner
        self._journal = journal
        self._describe = describe
        self._pids: dict[Hashable, int] = {}

    def started(self, key: Hashable, pid: int) -> None:
        self._pids[key] = pid
        self._journal.started(pid, self._describe(key))
        self._inner.started(key, pid)

    def finished(self, outcome: Outcome) -> None:
        pid = self._pids.pop(outcome.key, None)
        if pid is not None:
            self._journal.ended(pid)
        self._inner.finished(outcome)
