"""Who answers for a workload process once its executor is gone, and what the workload does when nobody does.

A workload launched with a handover timeout outlives the executor that launched it: a scheduler that stops
(or dies) hands its running workloads over to the next one on the host instead of taking them down. In the
workload's entry process, :class:`Custody` takes the place of the parent-death signal with three things:

- an output relay: fds 1 and 2 write into a pipe of the process's own, which a thread copies to the
  executor's pipe, and to ``<custody>/<id>.out`` once that pipe's reader is gone. Nothing else in the
  workload's tree writes to the executor's pipe, so its reader going away never raises in the task nor
  kills a shell with SIGPIPE;
- a watchdog thread: it follows the process that answers for the workload (the executor that launched it,
  then whichever executor ``<custody>/<id>.json`` names) and, once none has for ``timeout`` seconds, kills
  the workload: its own cgroup, and its process group. Those seconds add up over every owner that exits
  within ``timeout`` of taking it (a successor that crash-loops renews nothing); an owner that kept it
  for ``timeout`` gives it the whole of them again;
- ``<custody>/<id>.exit`` at the exit of a workload that was handed over: a process that is not its parent
  has no other way to learn its exit status;
- :attr:`Custody.tell`, which the entry point sets: where the last lines the workload wrote after its
  owner's exit go when it fails or kills itself (its task's log), since nobody reads ``<id>.out``.

A workload whose executor is already gone when it takes custody (released, or crashed, while this process
started) waits for a successor as if its owner had just died: that executor recorded it for one.

The watchdog's thread is named ``ale-custody`` (``/proc/<pid>/task/<tid>/comm``), so anyone can tell a
process whose life a watchdog bounds (:func:`watched`) without knowing whose it is: a reclaim leaves it
to its watchdog and to whichever executor claims it.

``<id>`` is the workload's custody name, ``<pid>-<start ticks>``. Linux only (``supported()``): elsewhere
the entry point keeps the parent-death tie.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from async_local_executor.core import custody_files, lifeline
from async_local_executor.core.custody_files import EXIT, OUT, OWNER, WRITING, Owner
from async_local_executor.core.files import open_regular, replace_atomically, write_all
from async_local_executor.core.proc_identity import runs_as, start_ticks

WATCHDOG = "ale-custody"  # the watchdog thread's name, as the kernel shows it (15 bytes at most)
_PR_SET_NAME = 15
_NAMING_GUARD = 5.0  # seconds at most: the watchdog names itself before anything else
OUT_CAP = 8 * 1024 * 1024  # what <id>.out keeps at most: a runaway task must not fill the state directory
CLAIM_POLL = 0.5  # how often a workload without an owner looks for a successor's claim, in seconds
OWNER_POLL = 1.0  # how often the owner is looked at where pidfd_open is missing, in seconds
DRAIN = 1.0  # how long the exit waits for the relay to copy what is still in its pipe, in seconds
LATE_TAIL = 64 * 1024  # the last bytes written after the owner's exit kept for tell(), past OUT_CAP too
TELL_LINES = 100  # at most this many of them
TELL_GUARD = 5.0  # how long tell() may take before the workload exits (or kills itself) without it
CUSTODY_POLL = 0.02  # how often await_custody() looks at the workloads it waits for, in seconds
_UPSTREAM_WAIT_MS = 500  # how long the relay waits for room in the executor's pipe before it looks again
_CHUNK = 65536


def supported() -> bool:
    """Whether this platform has what custody needs (the parent-death signal to clear, /proc, pidfds)."""
    return sys.platform.startswith("linux")


class Custody:
    """Custody of the workload in this process; :meth:`start` it once, :meth:`record_exit` at the end."""

    def __init__(
        self, owner: Owner, pidfd: int | None, timeout: float, directory: Path, *, orphaned: bool = False
    ) -> None:
        self._pid = os.getpid()
        start = start_ticks(self._pid) or 0
        self.name = custody_files.name(self._pid, start)
        self._first = owner
        self._owner = owner
        self._pidfd = pidfd
        self._timeout = timeout
        self._claim = custody_files.file(directory, self._pid, start, OWNER)
        self._exit = custody_files.file(directory, self._pid, start, EXIT)
        self._out = custody_files.file(directory, self._pid, start, OUT)
        # Set once an owner died (from the start when it was gone already): output no longer goes to its pipe.
        self._orphaned = orphaned
        self._late = b""  # the last LATE_TAIL bytes of the output written since then
        # Given the last lines written since the owner's exit (the first says what happened) when the
        # workload fails or kills itself; never raises. Set by the entry point once it knows its task.
        self.tell: Callable[[list[str]], None] | None = None
        self._inbox: int | None = None  # the relay's read end of the internal pipe
        self._upstream: int | None = None  # the executor's pipe (the original fd 1); None once given up
        self._out_fd: int | None = None
        self._out_size = 0
        self._out_failed = False
        self._out_capped = False
        self._busy = False  # the relay holds bytes it read and has not delivered yet

    @classmethod
    def start(cls, parent_pid: int, timeout: float, directory: str) -> Custody | None:
        """Take custody of this process from the parent-death tie; None when ``parent_pid`` runs but is
        not our parent (named wrongly: nobody recorded this process for a successor).

        A parent that is gone already (it released us, or crashed, while this process started) is an
        owner that has just died: the countdown starts at once.

        :param parent_pid: the executor that launched us (our parent, also for a fork-server child)
        :param timeout: how long the workload waits for a new owner once its owner died, in seconds (> 0);
            over every owner that exits within ``timeout`` of taking it, in all
        :param directory: the custody directory (made 0700 when missing)
        """
        lifeline.outlive_parent()
        # Opened before the parent is checked: the check then proves the pidfd is the parent's own,
        # and the start read in between is its start (a dead parent would have changed our ppid first).
        pidfd = _pidfd(parent_pid)
        parent_start = start_ticks(parent_pid)
        gone = os.getppid() != parent_pid or parent_start is None
        if gone and parent_start is not None and runs_as(parent_pid, parent_start):
            # It runs, and is not our parent: named wrongly, not dead. Nobody recorded us for a successor.
            if pidfd is not None:
                os.close(pidfd)
            return None
        # Gone already: the executor released us (or crashed) while this process started, and recorded
        # us for a successor as it did; waiting for one is what it handed us over for.
        if gone and pidfd is not None:
            os.close(pidfd)
            pidfd = None
        place = Path(directory)
        with contextlib.suppress(OSError):  # without it only <id>.out and <id>.exit are lost, not the task
            place.mkdir(mode=0o700, parents=True, exist_ok=True)
        custody = cls(Owner(parent_pid, parent_start or 0), pidfd, timeout, place, orphaned=gone)
        custody._begin()
        return custody

    def _begin(self) -> None:
        # What Python buffered so far would otherwise reach the pipe after what the relay copies.
        _flush_python_streams()
        # An owner gone already left its pipe's reader to nobody: the output goes to <id>.out from the start.
        self._upstream = None if self._orphaned else _above_stdio_or_none(1)
        read, write = os.pipe()  # both close-on-exec: a program the task runs gets fds 1 and 2 only
        self._inbox = _above_stdio(read)
        write = _above_stdio(write)
        # The task's process (forked from this one) must hold neither the relay's end of the pipe nor the
        # executor's pipe: either would keep a pipe open for as long as the task or a daemon it left runs.
        os.register_at_fork(after_in_child=self._forget)
        try:
            threading.Thread(target=self._relay, name="custody-relay", daemon=True).start()
            named = threading.Event()
            threading.Thread(target=self._watch, args=(named,), name="custody-watchdog", daemon=True).start()
            # Custody is taken once the watchdog shows (watched()): what reads it from then on, an
            # executor waiting to exit or another deployment's reclaim, must not find it unnamed yet.
            named.wait(_NAMING_GUARD)
        except BaseException:
            # Nothing was re-pointed yet: closing the write end ends a relay that started (EOF), and the
            # caller can fall back on the parent-death tie.
            os.close(write)
            raise
        # Last, once the relay runs: from here on a write to fd 1 or 2 needs it.
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)

    def _forget(self) -> None:
        """In a forked child: close what is the relay's and the watchdog's; the child answers for nothing."""
        for name in ("_inbox", "_upstream", "_out_fd", "_pidfd"):
            fd = getattr(self, name)
            setattr(self, name, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    # The relay. Only os.read/os.write and its own attributes: the process forks the task while it
    # runs, and a lock it held at that moment (a Python file object's) would be inherited held.

    def _relay(self) -> None:
        inbox = self._inbox
        if inbox is None:
            return
        ready = select.poll()
        ready.register(inbox, select.POLLIN)
        while True:
            try:
                ready.poll()
                # Set before the read empties the pipe: the drain at the exit sees either bytes in the
                # pipe or a busy relay until they are delivered.
                self._busy = True
                chunk = os.read(inbox, _CHUNK)
            except OSError:
                chunk = b""
            if not chunk:  # every writer is gone (or the end was closed under us): nothing more comes
                self._busy = False
                return
            # A relay that stopped would block every writer once the pipe is full: a chunk is dropped instead.
            with contextlib.suppress(Exception):
                self._deliver(memoryview(chunk))
            self._busy = False

    def _deliver(self, data: memoryview) -> None:
        if self._upstream is not None:
            data = data[self._send(data) :]
        if data:
            self._append(data)

    def _send(self, data: memoryview) -> int:
        """Write ``data`` to the executor's pipe; how much of it went there before giving the pipe up."""
        upstream = self._upstream
        assert upstream is not None
        room = select.poll()
        room.register(upstream, select.POLLOUT)
        sent = 0
        while sent < len(data) and not self._orphaned:
            try:
                # A blocking write of at most PIPE_BUF into a pipe that polls writable does not block:
                # the relay stays free to notice the owner's death while a live reader is slow.
                if room.poll(_UPSTREAM_WAIT_MS):
                    sent += os.write(upstream, data[sent : sent + select.PIPE_BUF])
            except BlockingIOError:  # a pipe somebody made non-blocking: no room after all, wait again
                continue
            except OSError:  # EPIPE (Python ignores SIGPIPE), or anything else: the pipe is done for
                break
        if sent == len(data):
            return sent
        # Given up for good: after its owner's death, the pipe's reader (if any is left) is nobody's.
        self._upstream = None
        with contextlib.suppress(OSError):
            os.close(upstream)
        return sent

    def _append(self, data: memoryview) -> None:
        # The tail tell() gets: kept whole here, whatever the cap or the disk does to <id>.out.
        self._late = (self._late + bytes(data))[-LATE_TAIL:]
        if self._out_fd is None:
            if self._out_failed:
                return
            try:
                self._out_fd = open_regular(self._out, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            except OSError:
                self._out_failed = True  # no custody directory to write in (or not a file there): lost
                return
        kept = data[: max(0, OUT_CAP - self._out_size)]
        self._out_size += len(kept)
        with contextlib.suppress(OSError):  # a full disk loses output, never the task
            write_all(self._out_fd, kept)
            if len(kept) < len(data) and not self._out_capped:  # said once, where the output stops
                self._out_capped = True
                write_all(self._out_fd, memoryview(b"\n[async_local_executor: output past 8 MiB dropped]\n"))

    def _drain(self, guard: float = DRAIN) -> None:
        """Give the relay up to ``guard`` seconds to copy what is in its pipe now (not to wait for EOF:
        a daemon the task left may hold the write end for ever)."""
        inbox = self._inbox
        if inbox is None:
            return
        pending = select.poll()
        pending.register(inbox, select.POLLIN)
        deadline = time.monotonic() + guard
        with contextlib.suppress(OSError):
            # POLLIN alone: a pipe whose writers are all gone polls POLLHUP for ever, with nothing in it.
            while self._busy or any(event & select.POLLIN for _, event in pending.poll(0)):
                if time.monotonic() >= deadline:
                    return
                time.sleep(0.005)

    # The watchdog.

    def _watch(self, named: threading.Event) -> None:
        with contextlib.suppress(OSError):  # unnamed, it is only not spared by another's reclaim
            lifeline.prctl(_PR_SET_NAME, WATCHDOG.encode())
        named.set()
        owner, pidfd = self._owner, self._pidfd
        since = time.monotonic()  # when this owner began to answer for the workload
        left = self._timeout  # the seconds it may still spend without a live owner
        claims = 0  # successors that claimed it since it last had the whole timeout
        while True:
            _await_exit(owner, pidfd)
            died = time.monotonic()
            if pidfd is not None:
                self._pidfd = None  # before the close: a fork in between must not close a reused number
                with contextlib.suppress(OSError):
                    os.close(pidfd)
            self._orphaned = True
            if died - since >= self._timeout:
                # That owner kept it for a whole timeout: a scheduler that ran, not one that crashed
                # straight after its start's claim. A scheduler that crash-loops claims it on each start;
                # without this bound each claim would give it the whole timeout again, for ever.
                left, claims = self._timeout, 0
            successor = self._await_successor(owner, died + left)
            if successor is None:
                self._expire(claims)
                return
            owner, pidfd = successor
            self._owner = owner
            self._pidfd = pidfd
            since = time.monotonic()
            left -= since - died
            claims += 1

    def _await_successor(self, dead: Owner, deadline: float) -> tuple[Owner, int | None] | None:
        """The owner a claim names before ``deadline`` (monotonic; its pidfd, if any); None: none did."""
        while True:
            found = self._claimed(dead)
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(CLAIM_POLL, left))

    def _claimed(self, dead: Owner) -> tuple[Owner, int | None] | None:
        try:
            # Never through a link nor into a FIFO planted under its name: either would let a file
            # elsewhere keep the workload, or block this thread, and the countdown with it, for ever.
            fd = open_regular(self._claim)
        except OSError:  # none yet, or not a file
            return None
        try:
            owner = custody_files.decode_owner(os.read(fd, custody_files.MAX_SIZE + 1))
        except OSError:
            return None
        finally:
            os.close(fd)
        if owner is None or owner == dead:
            return None
        pidfd = _pidfd(owner.pid)
        # After the pidfd: one opened on a pid since reused would watch some other process.
        if runs_as(owner.pid, owner.start):
            return owner, pidfd
        if pidfd is not None:
            os.close(pidfd)
        return None

    def _expire(self, claims: int) -> None:
        if claims:
            why = (
                f"{self._timeout:g} s without a live owner in all, over {claims} scheduler(s) that claimed it "
                f"and exited within {self._timeout:g} s"
            )
        else:
            why = f"no scheduler adopted it within {self._timeout:g} s of its owner's exit"
        say = f"async_local_executor: workload process {self._pid} kills itself and its tree: {why}\n"
        with contextlib.suppress(OSError):
            os.write(2, say.encode())
        self._drain()  # so the line reaches <id>.out, and the tail told, before everything here dies
        self._tell(f"workload process {self._pid} killed itself")
        kill_workload()

    def _tell(self, what: str) -> None:
        """Give :attr:`tell` the last lines written since the owner's exit, for at most TELL_GUARD seconds.

        Bounded: a task log on a hung file system must not keep the workload, nor its exit, waiting.
        """
        tell = self.tell
        if tell is None:
            return
        lines = self._late.decode("utf-8", "replace").splitlines()[-TELL_LINES:]
        header = f"async_local_executor: {what}; its last {len(lines)} output line(s) since its owner's exit:"
        if not lines:
            header = f"async_local_executor: {what}; it wrote nothing since its owner's exit"

        def run() -> None:
            with contextlib.suppress(Exception):
                tell([header, *lines])

        with contextlib.suppress(RuntimeError):  # no thread left: told nothing
            teller = threading.Thread(target=run, name="custody-tell", daemon=True)
            teller.start()
            teller.join(TELL_GUARD)

    # The exit.

    def record_exit(self, code: int) -> None:
        """At the entry point's return, with its exit code: hand that code to whoever adopted the workload.

        The output still in the relay's pipe is copied first (for a moment at most), and this process's
        fds 1 and 2 then write where the relay did, directly: what the interpreter writes on its way out
        must not wait on a thread that dies with it.
        """
        if os.getpid() != self._pid:  # a forked child returning through the entry point answers for nothing
            return
        _flush_python_streams()
        # The watchdog may not have woken up to an owner that died just before (a busy host): asked
        # here, so the lines since its exit are told and the output goes where an orphan's goes.
        if not self._orphaned and not runs_as(*self._owner):
            self._orphaned = True
        self._drain()
        if self._orphaned and code != 0:
            # Before the code is recorded: an adopter reports the failure once it reads that, and the
            # task's log should hold the why (a traceback) by then.
            self._tell(f"workload process {self._pid} exited with code {code}")
        if self._claim.exists() or not runs_as(*self._first):
            try:
                replace_atomically(self._exit, custody_files.encode_exit(code), WRITING)
            except OSError as exc:
                say = f"async_local_executor: cannot record the exit code in {self._exit}: {exc}\n"
                with contextlib.suppress(OSError):
                    os.write(2, say.encode())
                self._drain()
        self._hand_back()

    def _hand_back(self) -> None:
        target = self._upstream if not self._orphaned else None
        if target is None and self._out_size < OUT_CAP:
            target = self._out_fd
        with contextlib.suppress(OSError):
            if target is None:
                target = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            os.dup2(target, 1)
            os.dup2(target, 2)


def watched(pid: int) -> bool:
    """Whether process ``pid`` runs a custody watchdog: its life is bounded by its handover timeout once
    nobody answers for it, and an executor that claims it answers for it."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/comm", "rb") as comm:
                if comm.read().rstrip(b"\n") == WATCHDOG.encode():
                    return True
        except OSError:  # a thread that ended meanwhile
            continue
    return False


def await_custody(workloads: Iterable[tuple[int, int]], guard: float) -> list[int]:
    """Wait until each workload ``(pid, start ticks)`` runs its watchdog (:func:`watched`) or is gone.

    For an executor that released them, before it exits: a workload that has not taken custody yet may
    still have its parent-death signal armed (a fork-server child has it from the helper), which that
    exit fires. One that took custody has cleared it.

    :param guard: seconds after which it returns anyway
    :returns: the pids of those that still run without a watchdog after ``guard``
    """
    pending = list(workloads)
    deadline = time.monotonic() + guard
    while True:
        pending = [(pid, start) for pid, start in pending if runs_as(pid, start) and not watched(pid)]
        if not pending or time.monotonic() >= deadline:
            return [pid for pid, _ in pending]
        time.sleep(CUSTODY_POLL)


def _flush_python_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, replaced, or writing to a broken pipe
            stream.flush()


def _above_stdio(fd: int) -> int:
    """``fd``, moved above 0-2 (close-on-exec) if it is one of them: 0 may be closed, and a pipe made then
    would take its place."""
    if fd > 2:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


def _above_stdio_or_none(fd: int) -> int | None:
    """A close-on-exec duplicate of ``fd`` above 0-2; None when ``fd`` is not open."""
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError:
        return None


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid``; None without one (no such process, or a kernel before 5.3)."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def _await_exit(owner: Owner, pidfd: int | None) -> None:
    """Return once ``owner`` no longer runs."""
    if pidfd is not None:
        exited = select.poll()
        exited.register(pidfd, select.POLLIN)  # readable once the process has exited
        with contextlib.suppress(OSError):
            exited.poll()
            return
    while runs_as(owner.pid, owner.start):
        time.sleep(OWNER_POLL)


def kill_workload() -> None:
    """Kill this workload: its own cgroup when it sits in one, and its process group; this process last."""
    me = os.getpid()
    # Not the leader of a group of its own (a workload launched by hand): the group is somebody else's.
    leader = os.getpgid(0) == me
    cgroup = workload_cgroup()
    if cgroup is not None:
        if leader:
            # One by one first: cgroup.kill ends this process with the rest, so the killpg below would
            # never run, and a member of the group outside the cgroup (moved out of it) would live on.
            kill_group(me, spare=me)
        kill_cgroup(cgroup, spare=me)
    if leader:
        os.killpg(me, signal.SIGKILL)
    os.kill(me, signal.SIGKILL)


def kill_group(pgid: int, spare: int) -> None:
    """SIGKILL every process of process group ``pgid`` but ``spare``, as /proc lists them."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == spare:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                raw = stat.read()
            # "pid (comm) state ppid pgrp ...": comm may hold anything but nothing after the last ')' does.
            if int(raw[raw.rfind(b")") + 1 :].split()[2]) == pgid:
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not readable: not ours to kill
            continue


def workload_cgroup(mountinfo: str = "", proc_cgroup: str = "") -> Path | None:
    """The directory of this process's cgroup2 cgroup when it is a workload cgroup of ours, else None.

    :param mountinfo: a file in the format of /proc/self/mountinfo (default: that one)
    :param proc_cgroup: a file in the format of /proc/self/cgroup (default: that one)
    """
    # Imported here: only a workload that expires needs it, and every workload would pay for the import.
    from async_local_executor.core.cgroups import discovery, names

    mount = discovery.cgroup2_entry(mountinfo or discovery.MOUNTINFO)
    path = discovery.own_cgroups(proc_cgroup or discovery.PROC_CGROUP).get("")
    if mount is None or not path:
        return None
    directory = discovery.directory_of(mount.point, mount.root, path)
    # Only a workload's own cgroup, as an executor instance named it: never the scheduler's, nor a unit's.
    if names.owned_workload(directory.parent.name, directory.name):
        return directory
    return None


def kill_cgroup(directory: Path, spare: int) -> None:
    """SIGKILL every process in the cgroup ``directory``: ``cgroup.kill`` where the kernel has it (5.14+;
    ``spare`` dies with the rest), else each pid of ``cgroup.procs`` but ``spare``.
    """
    try:
        kill = os.open(directory / "cgroup.kill", os.O_WRONLY | os.O_CLOEXEC)  # never created: the kernel's
    except OSError:
        pass
    else:
        try:
            os.write(kill, b"1")
            return
        except OSError:
            pass
        finally:
            os.close(kill)
    # Pid by pid races with forks: each pass kills what the last one missed, until only we are left.
    for _ in range(10):
        try:
            pids = {int(pid) for pid in (directory / "cgroup.procs").read_text().split()} - {spare}
        except (OSError, ValueError):
            return
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
