"""A record, on disk, of the processes an executor launched, so that its successor can clean up after it.

The parent-death chain (:mod:`async_local_executor.core.lifeline`) ends a killed scheduler's task processes
within seconds. A process that left both our process groups and that chain runs on, though: a daemon a
task started with ``setsid``, or the shell of a BashOperator (Airflow starts it in a session of its
own). If it outlives a crash, a restarted scheduler would start the same try again beside it. So each
executor instance

- marks every process it launches with ``ASYNC_LOCAL_EXECUTOR_INSTANCE=<instance id>`` in the
  environment, which descendants inherit;
- appends a line per launch (pid, process start time, key) and per exit to a journal file, 0600, that it
  holds an exclusive ``flock`` on for its whole life (the kernel drops the lock when the process dies,
  however it dies);

and an executor that starts calls :func:`reclaim` before it launches anything: every journal whose lock
is free belonged to a dead instance, and every process still carrying that instance's mark, or still
running under a recorded pid with the recorded start time, is killed. Nothing of this knows Airflow.

Survivors are killed, not adopted: by the time a successor starts, whatever ran in the dead instance's
tree has lost its supervisor (the parent-death chain killed it), so a survivor is a fragment of a task,
not a task that can report back; and a process we did not fork cannot be waited on or have its output
read. The scheduler then resets the task instance and its retries decide what happens next.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import time
import uuid
import weakref
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from async_local_executor.core.supervisor import Listener, Outcome

log = logging.getLogger(__name__)

INSTANCE_ENV = "ASYNC_LOCAL_EXECUTOR_INSTANCE"
SUFFIX = ".launches"
_TMP_SUFFIX = ".launches.tmp"
# /proc's start times have clock-tick resolution; two reads of the same process agree exactly, a
# different process under a reused pid differs by far more than this.
_SAME_START = 0.05
# A compaction rewrites the journal once it holds this many lines more than it has live launches.
_COMPACT_SLACK = 4096


@dataclass(frozen=True)
class Survivor:
    """A process a dead executor instance left behind, and what :func:`reclaim` did about it."""

    pid: int
    label: str  # the workload's key as recorded, or "" for an unrecorded descendant
    instance: str
    owner: str  # who held the journal, as it said when it opened it
    command: str
    recorded: bool = False  # the journal names it: a workload's own process, leading its group


def _start_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


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

    Written on the event loop's thread: each write is one small ``write(2)`` into the page cache, far
    cheaper than handing it to a worker thread, and it needs no ``fsync``, since what it guards against
    is a crash of the process, not of the host (a host crash takes every task process with it).
    """

    def __init__(self, directory: Path, fd: int, instance: str, header: bytes) -> None:
        self.directory = directory
        self.instance = instance
        self.path = directory / f"{instance}{SUFFIX}"
        self._fd: int | None = fd
        self._header = header
        self._live: dict[int, bytes] = {}
        self._lines = 1
        self._broken = False
        _open_journals.add(self)

    def _forget_in_fork(self) -> None:
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
        header = _line({"instance": instance, "owner": owner, "pid": os.getpid(), "opened": time.time()})
        fd = _create_locked(directory / f"{instance}{SUFFIX}")
        os.write(fd, header)
        return cls(directory, fd, instance, header)

    def child_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` plus the mark that makes every process of this instance findable after a crash."""
        return {**base, INSTANCE_ENV: self.instance}

    def started(self, pid: int, label: str) -> None:
        start = _start_time(pid)
        if start is None:
            return  # already gone: nothing could survive it
        line = _line({"+": pid, "start": start, "key": label})
        self._live[pid] = line
        self._append(line)

    def ended(self, pid: int) -> None:
        if self._live.pop(pid, None) is not None:
            self._append(_line({"-": pid}))

    def close(self) -> None:
        """Remove the journal: every launch ended, nothing is left to reclaim."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        # Unlinked while still locked: a reclaimer that opened it meanwhile sees it gone and skips it.
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(fd)

    def _append(self, line: bytes) -> None:
        if self._fd is None or self._broken:
            return
        try:
            os.write(self._fd, line)
            self._lines += 1
            if self._lines > len(self._live) + _COMPACT_SLACK:
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
        tmp = self.directory / f"{self.instance}{_TMP_SUFFIX}"
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = _create_locked(tmp)
        try:
            os.write(fd, self._header + b"".join(self._live.values()))
            # Locked before it replaces the journal, so there is no moment the name is unlocked.
            os.replace(tmp, self.path)
        except OSError:
            os.close(fd)
            raise
        os.close(self._fd)
        self._fd = fd
        self._lines = 1 + len(self._live)


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


def reclaim(directory: Path, *, timeout: float = 10.0) -> list[Survivor]:
    """Kill what dead executor instances left running, remove their journals, and say what was killed.

    Journals still locked belong to live executors (another scheduler on this host) and are left alone.

    :param timeout: how long to wait for killed processes to be gone; what is still there is logged
    """
    if not directory.is_dir():
        return []
    with contextlib.suppress(OSError):
        directory.chmod(0o700)
    killed: list[Survivor] = []
    for path in sorted(directory.glob(f"*{_TMP_SUFFIX}")):
        with _dead_owner(path) as fd:
            if fd is not None:
                path.unlink()  # a compaction cut short; its journal still holds every record
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        with _dead_owner(path) as fd:
            if fd is None:
                continue
            header, records = _read(fd)
            instance = str(header.get("instance", path.name.removesuffix(SUFFIX)))
            found = _survivors(instance, str(header.get("owner", "?")), records)
            _kill(found, timeout)
            killed += found
            path.unlink()
    return killed


@contextlib.contextmanager
def _dead_owner(path: Path) -> Iterator[int | None]:
    """Yield an fd of ``path`` locked by us, or None while its owner lives (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        try:
            same = os.fstat(fd).st_ino == path.stat().st_ino
        except FileNotFoundError:
            same = False
        # Otherwise its owner closed it or compacted it since we opened it: alive, or done with it.
        yield fd if same else None
    finally:
        os.close(fd)


def _read(fd: int) -> tuple[dict[str, object], dict[int, tuple[float, str]]]:
    with os.fdopen(os.dup(fd), "rb") as stream:
        lines = stream.read().splitlines()
    header: dict[str, object] = {}
    live: dict[int, tuple[float, str]] = {}
    for number, raw in enumerate(lines):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue  # a line cut short by the crash
        if number == 0:
            header = entry
        elif "+" in entry:
            live[int(entry["+"])] = (float(entry["start"]), str(entry["key"]))
        elif "-" in entry:
            live.pop(int(entry["-"]), None)
    return header, live


def _survivors(instance: str, owner: str, records: dict[int, tuple[float, str]]) -> list[Survivor]:
    me = os.getpid()
    uid = os.getuid()
    ours: list[psutil.Process] = []
    leaders: dict[int, str] = {}  # recorded pids still running as the process that was recorded
    for proc in psutil.process_iter(["pid", "uids", "create_time"]):
        uids = proc.info["uids"]
        if proc.pid == me or uids is None or uids.real != uid:
            continue  # another user's processes are not ours, nor is their environment readable
        ours.append(proc)
        record = records.get(proc.pid)
        if record is not None and abs(record[0] - float(proc.info["create_time"])) < _SAME_START:
            leaders[proc.pid] = record[1]
    found: list[Survivor] = []
    for proc in ours:
        label = leaders.get(proc.pid)
        recorded = label is not None
        if label is None:
            try:
                group = os.getpgid(proc.pid)
                marked = proc.environ().get(INSTANCE_ENV) == instance
            except (OSError, psutil.Error):
                continue
            if group in leaders and group != proc.pid:
                # A workload leads its own group; what stays in it is its own, marked or not.
                label = f"in the process group of {leaders[group]}"
            elif marked:
                label = ""
            else:
                continue
        found.append(Survivor(proc.pid, label, instance, owner, _command(proc), recorded))
    return found


def _command(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())[:200] or proc.name()
    except psutil.Error:
        return "?"


def _kill(survivors: list[Survivor], timeout: float) -> None:
    starts = {s.pid: _start_time(s.pid) for s in survivors}
    for survivor in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(survivor.pid, signal.SIGKILL)
            if survivor.recorded:
                # A recorded workload leads its group: catch what it forked after we looked.
                os.killpg(survivor.pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while pending := [pid for pid, start in starts.items() if _running(pid, start)]:
        if time.monotonic() > deadline:
            log.error("processes still running %.0fs after SIGKILL: %s", timeout, pending)
            return
        time.sleep(0.05)


def _running(pid: int, start: float | None) -> bool:
    # A killed orphan stays a zombie until its new parent reaps it; it runs nothing any more.
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and start is not None and proc.create_time() == start
    except psutil.Error:
        return False


def _create_locked(path: Path) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise OSError(errno.EAGAIN, f"cannot lock new journal {path}") from exc
    return fd


def _line(entry: Mapping[str, object]) -> bytes:
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"
