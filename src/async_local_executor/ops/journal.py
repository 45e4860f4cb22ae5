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

Except what was handed over: a workload started to outlive its scheduler (``handover_timeout`` on its
launch line) that a stopping scheduler released writes a handover line (:meth:`LaunchJournal.handed_over`),
and the journal then stays behind, unlocked, when it is closed; a crash leaves it too. The next
executor's reclaim holds those workloads instead of killing them (:mod:`~async_local_executor.ops.reclaim`
says which), and records each in its own journal as a launch of its own (:meth:`LaunchJournal.hold`).
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

from async_local_executor.core.files import write_all
from async_local_executor.core.outcome import Outcome
from async_local_executor.core.proc_identity import runs_as, start_ticks
from async_local_executor.core.supervisor import Listener
from async_local_executor.ops.journal_file import (
    INSTANCE_ENV,
    SUFFIX,
    Companion,
    Ended,
    HandoverLine,
    Header,
    HeldFrom,
    Launch,
    SeenLine,
    encode_line,
    install_locked,
)
from async_local_executor.ops.reclaim import Held, ReclaimResult, Survivor, reclaim

__all__ = [
    "INSTANCE_ENV",
    "SUFFIX",
    "Companion",
    "Held",
    "LaunchJournal",
    "ReclaimResult",
    "RecordingListener",
    "Survivor",
    "reclaim",
]

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
        self._starts: dict[int, int] = {}  # launch pid -> its start in ticks, as its line recorded it
        self._handovers: dict[int, bytes] = {}  # launch pid -> its handover line, once handed over
        self._seen: dict[int, dict[tuple[int, int], bytes]] = {}  # launch pid -> its descendants' lines
        self._seen_lines = 0
        self._lines = 1
        self._broken = False
        self._compact_failed = False  # said once until a compaction works again
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
    def open(
        cls, directory: Path, *, owner: str, owner_key: str = "", companions: Sequence[Companion] = ()
    ) -> LaunchJournal:
        """Create and lock a new journal in ``directory`` (made 0700 if missing).

        :param owner: who this is, for the log lines of whoever reclaims it
        :param owner_key: whose workloads it records (a deployment and a team): only an executor of the
            same key holds what it hands over (see :func:`~async_local_executor.ops.reclaim.reclaim`)
        :param companions: the owner's processes that whoever reclaims the journal stops if they still run
        """
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        instance = uuid.uuid4().hex
        header = Header(
            instance, owner, owner_key, os.getpid(), start_ticks(os.getpid()), time.time(), tuple(companions)
        ).encode()
        # Appears under its name already locked: a reclaimer never takes it for a dead writer's.
        fd = install_locked(directory / f"{instance}{SUFFIX}", header)
        return cls(directory, fd, instance, header)

    def child_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` plus the mark that makes every process of this instance findable after a crash."""
        return {**base, INSTANCE_ENV: self.instance}

    def started(
        self, pid: int, label: str, *, handover_timeout: float = 0.0, info: Mapping[str, object] | None = None
    ) -> None:
        """Record a launch.

        :param handover_timeout: how long the workload outlives its scheduler (0: it dies with it); more
            than 0 makes it one a crash hands over to the next executor
        :param info: the adapter's data for whoever adopts it after a crash (JSON)

        A workload already on record here under the same pid and start (one :meth:`hold` recorded,
        whose supervision starts now) keeps its line: it says when the workload really started and
        what was left of its limit then, which a line written at its adoption would not.
        """
        start = start_ticks(pid)
        if start is None:
            return  # already gone: nothing could survive it
        with self._lock:
            if self._starts.get(pid) == start and pid in self._live:
                return
        timeout = max(handover_timeout, 0.0)
        launch = Launch(pid, start, label, timeout, info=dict(info) if info and timeout > 0 else None)
        self._open_launch(pid, start, encode_line(launch))

    def hold(self, held: Held) -> None:
        """Record a workload taken over from a dead instance (its reclaim held it) as a launch of this one.

        Its line keeps what the dead journal said (``"held"``) and its ``handover_timeout``: the workload's
        own countdown, which the crash of this instance starts again. Its :attr:`Held.at` is not carried
        as a handover: that one was the dead instance's, and only :meth:`handed_over` makes another. The
        descendants seen of it are journalled again.
        """
        source = HeldFrom(held.info, held.cgroup, held.at, held.boot, held.instance)
        launch = Launch(held.pid, held.start, held.key, held.timeout, held=source)
        self._open_launch(held.pid, held.start, encode_line(launch))
        if held.descendants:  # what the dead journal had seen of it, for this one's reclaim in turn
            self.seen({held.pid: held.descendants})

    def _open_launch(self, pid: int, start: int, line: bytes) -> None:
        with self._lock:
            self._live[pid] = line
            self._starts[pid] = start
            self._handovers.pop(pid, None)  # a later process under the pid: not the one handed over
            self._append(line)

    def handed_over(self, pid: int, info: Mapping[str, object], cgroup: str | None, timeout: float) -> None:
        """Record that the launch ``pid``, still open, is handed over to the next executor on this host.

        Its time runs from now (``CLOCK_BOOTTIME``, which neither a wall-clock step nor a suspend
        stops): the next executor's reclaim holds it while ``timeout`` has not passed since. A pid that
        is no open launch is ignored. Never raises.

        :param info: the adapter's data for whoever adopts it (JSON)
        :param cgroup: the workload's own cgroup2 directory, or None (the next reclaim reads where it is)
        :param timeout: how long the workload outlives its owner before it kills itself, in seconds
        """
        with self._lock:
            start = self._starts.get(pid)
            if start is None or pid not in self._live:
                log.debug("pid %d handed over is no launch still open: not journalled", pid)
                return
            record = HandoverLine(
                pid,
                start,
                info=dict(info),
                cgroup=cgroup,
                at=time.time(),
                boot=time.clock_gettime(time.CLOCK_BOOTTIME),
                timeout=timeout,
            )
            self._handovers[pid] = encoded = encode_line(record)
            self._append(encoded)

    def ended(self, pid: int) -> None:
        with self._lock:
            if self._live.pop(pid, None) is not None:
                self._starts.pop(pid, None)
                self._handovers.pop(pid, None)
                self._seen_lines -= len(self._seen.pop(pid, {}))
                self._append(encode_line(Ended(pid)))

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
                    known[ident] = encoded = encode_line(SeenLine(pid, start, launch))
                    self._seen_lines += 1
                    self._append(encoded)

    def _crowded(self, launch: int, descendants: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """The recorded descendants of ``launch`` if the new ones would not all fit beside them."""
        known = self._seen.get(launch, {})
        if launch not in self._live or len(known) + len(set(descendants) - known.keys()) <= _SEEN_PER_LAUNCH:
            return []
        return list(known)

    def close(self) -> None:
        """Remove the journal, unless a launch still open was handed over: then it stays, as :meth:`hand_on`."""
        self._let_go(keep=False)

    def hand_on(self) -> None:
        """Let go of the journal without removing it, for the next executor's reclaim.

        That one holds what was handed over (:meth:`handed_over`) or started to outlive this scheduler,
        and kills what else is still open in it, as after a crash. The lock goes with the descriptor.
        """
        self._let_go(keep=True)

    def _let_go(self, *, keep: bool) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
            if fd is None:
                return
            if not keep and not self._handovers:
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
        except OSError as exc:
            self._broken = True
            log.warning(
                "cannot write the launch journal %s (%s): after a crash, survivors of this scheduler's "
                "tasks will not be found",
                self.path,
                exc.strerror,
            )
            return
        if self._lines > len(self._live) + len(self._handovers) + self._seen_lines + _COMPACT_SLACK:
            try:
                self._compact()
            except OSError as exc:
                # The journal as it is still holds every record (a full descriptor table, say): it grows,
                # and the next line tries again.
                if not self._compact_failed:
                    self._compact_failed = True
                    log.warning(
                        "cannot compact the launch journal %s (%s); trying again", self.path, exc.strerror
                    )
            else:
                self._compact_failed = False

    def _compact(self) -> None:
        assert self._fd is not None
        # Locked before it replaces the journal, so there is no moment the name is unlocked.
        # Each launch's line before its handover's and its descendants': a reader drops those of launches
        # it does not know.
        content = [self._header]
        for pid, line in self._live.items():
            handover = self._handovers.get(pid)
            content += [
                line,
                *([handover] if handover is not None else []),
                *self._seen.get(pid, {}).values(),
            ]
        fd = install_locked(self.path, b"".join(content))
        os.close(self._fd)
        self._fd = fd
        self._lines = len(content)


class RecordingListener:
    """Journals each launch and exit, then passes the event on to ``inner``.

    :param handover_timeout: journalled with each launch (see :meth:`LaunchJournal.started`)
    :param info: the data journalled with each launch for its adoption after a crash, by key; None for
        a key makes its launch one a crash does not hand over (nothing could adopt it)
    """

    def __init__(
        self,
        inner: Listener,
        journal: LaunchJournal,
        describe: Callable[[Hashable], str],
        *,
        handover_timeout: float = 0.0,
        info: Callable[[Hashable], Mapping[str, object] | None] | None = None,
    ) -> None:
        self._inner = inner
        self._journal = journal
        self._describe = describe
        self._handover_timeout = handover_timeout
        self._info = info
        self._pids: dict[Hashable, int] = {}

    def started(self, key: Hashable, pid: int) -> None:
        self._pids[key] = pid
        timeout, info = self._handover_timeout, None
        if timeout > 0 and self._info is not None:
            info = self._info(key)
            timeout = timeout if info is not None else 0.0
        self._journal.started(pid, self._describe(key), handover_timeout=timeout, info=info)
        self._inner.started(key, pid)

    def finished(self, outcome: Outcome) -> None:
        pid = self._pids.pop(outcome.key, None)
        if pid is not None:
            self._journal.ended(pid)
        self._inner.finished(outcome)
