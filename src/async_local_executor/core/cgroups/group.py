"""One workload's cgroup: join, signal, kill as a whole, wait until empty, account, remove.

A cgroup holds every process a workload ever starts, whatever session, environment or uid it gives
itself, so killing the cgroup is the only kill nothing escapes. Signals other than SIGKILL go to each
member through a pidfd, after checking the member is still in this cgroup: a pid read from
cgroup.procs may have exited and been reused elsewhere by the time it is signalled. All calls block on
filesystem I/O; callers run them in a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal as signals
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from async_local_executor.core.cgroups.discovery import cgroup_of
from async_local_executor.core.cgroups.limits import Limits

log = logging.getLogger(__name__)

# How long a cgroup gets to report itself frozen before it is killed anyway.
FREEZE_GUARD = 1.0
# Without change notification, how often cgroup.events is read again.
POLL_INTERVAL = 0.01
# A notification is never lost, but a bounded wait costs nothing and survives a kernel that forgets.
_MAX_WAIT = 0.5
_GONE = (errno.ENOENT, errno.ENODEV)
# Linux 5.14 and later: one write kills every member, those forking meanwhile included.
KILL_FILE = "cgroup.kill"
# CPU weights: cgroup2 cpu.weight runs 1..10000 around 100, cgroup v1 cpu.shares 2..262144 around 1024.
LOWEST_WEIGHT, DEFAULT_WEIGHT = 1, 100
LOWEST_SHARES, DEFAULT_SHARES = 2, 1024
# A member forked while the others are moved is moved by the next pass; a fork bomb is not waited out.
_MOVE_PASSES = 5

# What a wait is for, given the text of cgroup.events (None once it cannot be read: the cgroup is gone).
_Check = Callable[[str | None], bool]


@dataclass(frozen=True)
class Usage:
    """What a workload's cgroup used; None where this host does not account it."""

    memory_current: int | None
    """Bytes charged now."""
    memory_peak: int | None
    """The most bytes ever charged."""
    cpu_seconds: float | None
    """CPU time of every process that was in the cgroup."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _keyed(text: str | None, key: str) -> int | None:
    # "key value" lines: cgroup.events, memory.events, cpu.stat, memory.oom_control.
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def _number(path: Path) -> int | None:
    text = (_read(path) or "").strip()
    return int(text) if text.isdigit() else None


class WorkloadCgroup:
    """One workload's cgroup: a cgroup2 directory, plus cgroup v1 directories for the controllers that only v1 offers here."""

    def __init__(
        self,
        name: str,
        path: Path,
        v1: Mapping[str, Path],
        limits: Limits,
        relative: str,
        *,
        cpu_home: Path | None = None,
    ) -> None:
        self.name = name
        self.path = path
        """The cgroup2 directory."""
        self.v1: Mapping[str, Path] = dict(v1)
        """Controller -> its cgroup v1 directory (may be empty)."""
        self.limits = limits
        self.relative = relative
        """The cgroup2 path as /proc/<pid>/cgroup shows it, e.g. ``/ale-x/w-3``."""
        self.cpu_home = cpu_home
        """The cgroup v1 cpu directory of workloads without one of their own (the scheduler's)."""

    def __repr__(self) -> str:
        return f"WorkloadCgroup({self.name!r}, {str(self.path)!r})"

    def _v1_dirs(self) -> list[Path]:
        # A combined v1 mount (cpu,cpuacct) gives two controllers one directory.
        return list(dict.fromkeys(self.v1.values()))

    def join(self, pid: int) -> None:
        """Move process ``pid`` into this cgroup, in every hierarchy; what it starts afterwards is born inside.

        :param pid: the process
        :raises OSError: when a hierarchy refuses it (the process is gone, the directory removed)
        """
        for directory in [self.path, *self._v1_dirs()]:
            (directory / "cgroup.procs").write_text(str(pid))

    def members(self) -> list[int]:
        """The processes in the cgroup now.

        :returns: their pids; [] when the directory is gone
        """
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError as exc:
            if exc.errno in _GONE:
                return []
            raise
        return [int(pid) for pid in text.split()]

    def populated(self) -> bool:
        """Whether any process is in the cgroup (or a cgroup below it).

        :returns: False when the directory is gone
        """
        return bool(_keyed(_read(self.path / "cgroup.events"), "populated"))

    def signal(self, sig: int) -> int:
        """Send ``sig`` to every member that is still a member when it is signalled.

        :param sig: the signal number
        :returns: how many processes were signalled
        """
        sent = 0
        for pid in self.members():
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue  # gone since cgroup.procs was read
            try:
                # The pidfd pins the process; if the pid was reused, the new one is elsewhere (or ours).
                if cgroup_of(pid) != self.relative:
                    continue
                signals.pidfd_send_signal(fd, sig)
                sent += 1
            except OSError:
                continue  # exited between the check and the signal: nothing to do
            finally:
                os.close(fd)
        return sent

    @property
    def kills_at_once(self) -> bool:
        """Whether :meth:`kill` is one write that never waits (a kernel with ``cgroup.kill``)."""
        return (self.path / KILL_FILE).exists()

    def kill(self) -> int:
        """SIGKILL every process in the cgroup, those started meanwhile included.

        Without ``cgroup.kill`` (before Linux 5.14) this freezes the cgroup first and waits for the
        freeze, up to :data:`FREEZE_GUARD`: call it from a worker thread then (see :attr:`kills_at_once`).

        :returns: how many members there were
        :raises OSError: when the cgroup refuses the kill
        """
        count = len(self.members())
        try:
            if self.kills_at_once:
                (self.path / KILL_FILE).write_text("1")
            elif self.path.is_dir():
                self._freeze_and_kill()
        except OSError as exc:
            if exc.errno not in _GONE:
                raise
        return count

    def _freeze_and_kill(self) -> None:
        # Before cgroup.kill (Linux 5.14) a member could fork between reading the list and the kill;
        # frozen, none can, and a fatal signal still ends a frozen process.
        freeze = self.path / "cgroup.freeze"
        freeze.write_text("1")
        try:
            self._wait_events(lambda events: _keyed(events, "frozen") == 1, FREEZE_GUARD)
            self.signal(signals.SIGKILL)
        finally:
            with contextlib.suppress(OSError):
                freeze.write_text("0")

    def wait_empty(self, timeout: float) -> bool:
        """Wait until no process is in the cgroup.

        :param timeout: seconds at most
        :returns: True when it is empty (or gone), False when ``timeout`` passed first
        """
        return self._wait_events(lambda events: not _keyed(events, "populated"), timeout)

    def _wait_events(self, done: _Check, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        try:
            events = open(self.path / "cgroup.events", "rb", buffering=0)  # noqa: SIM115 - held across polls
        except OSError as exc:
            if exc.errno in _GONE:
                return done(None)
            return self._poll_slowly(done, deadline)
        with events:
            poller = select.poll()
            poller.register(events, select.POLLPRI)
            while True:
                try:
                    events.seek(0)
                    text: str | None = events.read().decode()
                except OSError:
                    text = None  # removed while open: nothing is in it any more
                if done(text):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                # The kernel wakes POLLPRI on every change of cgroup.events.
                poller.poll(max(1, int(min(left, _MAX_WAIT) * 1000)))

    def _poll_slowly(self, done: _Check, deadline: float) -> bool:
        while not done(_read(self.path / "cgroup.events")):
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_INTERVAL)
        return True

    def lower_cpu(self) -> None:
        """Give the cgroup the lowest CPU weight the kernel takes (v1 ``cpu.shares`` where v1 has the cpu controller).

        :raises OSError: when the weight cannot be written (no cpu controller here)
        """
        if "cpu" in self.v1:
            (self.v1["cpu"] / "cpu.shares").write_text(str(LOWEST_SHARES))
        else:
            (self.path / "cpu.weight").write_text(str(LOWEST_WEIGHT))

    def restore_cpu(self) -> None:
        """Give the cgroup back the CPU share of a workload that never had it lowered.

        On cgroup2 that is the default weight. On cgroup v1 a default ``cpu.shares`` is not enough: every
        v1 cgroup of the instance shares one weight against the scheduler's own cgroup, where the other
        workloads run, so the members move back there (unless a CPU limit keeps them in their own).

        :raises OSError: when the weight cannot be written
        """
        v1 = self.v1.get("cpu")
        if v1 is None:
            (self.path / "cpu.weight").write_text(str(DEFAULT_WEIGHT))
            return
        (v1 / "cpu.shares").write_text(str(DEFAULT_SHARES))
        if self.limits.cpu is None and self.cpu_home is not None:
            self._move_members(v1, self.cpu_home)

    @staticmethod
    def _move_members(source: Path, target: Path) -> None:
        for _ in range(_MOVE_PASSES):
            try:
                pids = (source / "cgroup.procs").read_text().split()
            except OSError as exc:
                if exc.errno in _GONE:
                    return
                raise
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # exited since the listing
                    (target / "cgroup.procs").write_text(pid)
        log.warning("members of cgroup %s kept forking while they were moved to %s", source, target)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for exceeding this cgroup's memory.

        :returns: the count; 0 when this host does not say
        """
        events = self.path / "memory.events"
        if events.exists():
            return _keyed(_read(events), "oom_kill") or 0
        if "memory" in self.v1:
            return _keyed(_read(self.v1["memory"] / "memory.oom_control"), "oom_kill") or 0
        return 0

    def usage(self) -> Usage:
        """Memory and CPU the cgroup used, from cgroup2 where it accounts them, else cgroup v1.

        :returns: the usage; None for what neither accounts here
        """
        current, peak = _number(self.path / "memory.current"), _number(self.path / "memory.peak")
        if current is None and "memory" in self.v1:
            current = _number(self.v1["memory"] / "memory.usage_in_bytes")
            peak = _number(self.v1["memory"] / "memory.max_usage_in_bytes")
        usec = _keyed(_read(self.path / "cpu.stat"), "usage_usec")
        cpu = usec / 1e6 if usec is not None else None
        if cpu is None and "cpuacct" in self.v1:
            nsec = _number(self.v1["cpuacct"] / "cpuacct.usage")
            cpu = nsec / 1e9 if nsec is not None else None
        return Usage(memory_current=current, memory_peak=peak, cpu_seconds=cpu)

    def remove(self) -> bool:
        """Remove the cgroup's directories, cgroup2 and v1; a populated one stays.

        :returns: True when every directory is gone
        """
        gone = True
        for directory in [self.path, *self._v1_dirs()]:
            gone = remove_directory(directory) and gone
        return gone


def remove_directory(directory: Path) -> bool:
    """rmdir one cgroup directory, logging why it could not be removed.

    :param directory: the directory
    :returns: True when it is gone (or was already)
    """
    try:
        directory.rmdir()
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.warning("cannot remove cgroup %s: %s", directory, exc.strerror or exc)
        return False
    return True


def remove_tree(top: Path) -> bool:
    """rmdir ``top`` and every cgroup below it, deepest first, logging what stays.

    :param top: the directory
    :returns: True when it is gone
    """
    gone = True
    for directory, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
        gone = remove_directory(Path(directory)) and gone
    return gone and not top.exists()


def subdirectories(directory: Path) -> list[Path]:
    """The directories (child cgroups) in ``directory``; [] when it cannot be read."""
    try:
        return sorted(entry for entry in directory.iterdir() if entry.is_dir())
    except OSError:
        return []
