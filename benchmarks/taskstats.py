"""Every process that exits on the host, with its CPU time as the scheduler measured it: taskstats.

The kernel sends a ``taskstats`` record for each thread as it begins to exit, to every netlink socket
registered for the CPU it exits on; the record of a process's last thread says so (``AGROUP``). A
record carries ``cpu_run_virtual_total``: the thread's run time as the scheduler counts it, in
nanoseconds, up to its last time slice (filled whether or not ``kernel.task_delayacct`` is on: nothing
here changes a setting of the host, and any number of listeners may run at once). The process
accounting file (``acct(2)``) holds, in its place, the user and system time the clock tick sampled
(every 4 ms here), truncated to 10 ms units: a process that runs 25 ms in short wake-ups comes out at
10 or 20.

What no record holds is the exit's own work after it: the address space torn down (``exit_mm``), the
files closed, the parent told; and the last slice. A reaper's ``children`` times hold all of it.

A :class:`Listener` collects the records on a thread of its own, for as long as its block runs; what it
yields is one :class:`ExitedProcess` per process that exited (its threads summed, a pid reused later
being another process), in the order they exited. A socket buffer that overflowed, or a record it
could not read, loses records: the listener then says so (:attr:`Listener.lost`) rather than give a
short account. Root only (``CAP_NET_ADMIN`` in the host's namespaces registers a listener).
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

FAMILY = b"TASKSTATS"  # the generic netlink family's name (linux/taskstats.h)
_NETLINK_GENERIC: Final = 16
_GENL_ID_CTRL: Final = 0x10
_CTRL_CMD_GETFAMILY: Final = 3
_CTRL_ATTR_FAMILY_ID: Final = 1
_CTRL_ATTR_FAMILY_NAME: Final = 2
_NLM_F_REQUEST: Final = 0x1
_NLM_F_ACK: Final = 0x4
_NLMSG_ERROR: Final = 2
_NLA_TYPE_MASK: Final = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER

_CMD_GET: Final = 1
_ATTR_REGISTER_CPUMASK: Final = 3
_ATTR_DEREGISTER_CPUMASK: Final = 4
_TYPE_STATS: Final = 3
_TYPE_AGGR_PID: Final = 4

_NLMSGHDR: Final = struct.Struct("=IHHII")
_GENLMSGHDR: Final = struct.Struct("=BBH")
_NLATTR: Final = struct.Struct("=HH")
# struct taskstats (linux/taskstats.h): the fields read here, at their offsets; later versions only
# append fields. ac_uid is aligned to 8, so 4 bytes of padding sit before it.
_VERSION: Final = (0, "=H")
_FLAG: Final = (8, "=B")  # ac_flag
_RUN_VIRTUAL_TOTAL: Final = (72, "=Q")  # ns: the scheduler's exact run time
_COMM: Final = (80, "=32s")
_PID: Final = (128, "=I")  # ac_pid: the thread's
_PPID: Final = (132, "=I")
_TGID: Final = (368, "=I")  # ac_tgid (version 12 on)
_AGROUP: Final = 0x20  # ac_flag of the process's last thread (linux/acct.h; from version 12 on)
_MIN_VERSION: Final = 12
_MIN_SIZE: Final = _TGID[0] + struct.calcsize(_TGID[1])
_STRAGGLERS: Final = 256  # records after a process's end within which a thread's late one is still its
_RCVBUF: Final = 64 * 1024 * 1024


class TaskstatsUnavailable(Exception):
    """The kernel's taskstats cannot be had here (the message says why)."""


@dataclass(frozen=True)
class ExitedProcess:
    """A process that exited while the listener ran: its threads' CPU time summed."""

    pid: int
    ppid: int
    cpu_s: float
    comm: str


@dataclass
class _Group:
    cpu_ns: int = 0
    ppid: int = 0
    comm: str = ""
    last: int = 0  # the index of its last thread's record


def _field(stats: bytes, where: tuple[int, str]) -> Any:
    """One field of a ``struct taskstats``, by its offset and format."""
    offset, fmt = where
    return struct.unpack_from(fmt, stats, offset)[0]


def _attrs(data: bytes, offset: int, end: int) -> Iterator[tuple[int, bytes]]:
    while offset + _NLATTR.size <= end:
        length, kind = _NLATTR.unpack_from(data, offset)
        if length < _NLATTR.size:
            return
        yield kind & _NLA_TYPE_MASK, data[offset + _NLATTR.size : offset + length]
        offset += (length + 3) & ~3


def _attr(kind: int, value: bytes) -> bytes:
    raw = _NLATTR.pack(_NLATTR.size + len(value), kind) + value
    return raw + b"\0" * (-len(raw) % 4)


def _message(family: int, cmd: int, attrs: bytes, flags: int = _NLM_F_REQUEST) -> bytes:
    body = _GENLMSGHDR.pack(cmd, 1, 0) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), family, flags, 0, 0) + body


def _messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            return
        yield kind, data[offset + _NLMSGHDR.size : offset + length]
        offset += (length + 3) & ~3


def _check_ack(sock: socket.socket, what: str, other: Callable[[int, bytes], None] | None = None) -> bytes:
    """Read up to the kernel's answer to a request; raises on a netlink error in it.

    :param other: given every other message read before it (an exit record that came first)
    """
    while True:
        try:
            reply = sock.recv(65536)
        except OSError as exc:  # ENOBUFS among them: records were dropped before the answer came
            raise TaskstatsUnavailable(f"{what}: {exc}") from None
        answered = False
        for kind, payload in _messages(reply):
            if kind == _NLMSG_ERROR:
                (error,) = struct.unpack_from("=i", payload)
                if error:
                    raise TaskstatsUnavailable(f"{what}: {os.strerror(-error)}")
                answered = True
            elif other is None:
                answered = True  # a reply that is the answer itself (the family's)
            else:
                other(kind, payload)
        if answered:
            return reply


def _family(sock: socket.socket) -> int:
    sock.send(_message(_GENL_ID_CTRL, _CTRL_CMD_GETFAMILY, _attr(_CTRL_ATTR_FAMILY_NAME, FAMILY + b"\0")))
    reply = _check_ack(sock, "no taskstats family (CONFIG_TASKSTATS)")
    for kind, payload in _messages(reply):
        if kind == _GENL_ID_CTRL:
            for attr, value in _attrs(payload, _GENLMSGHDR.size, len(payload)):
                if attr == _CTRL_ATTR_FAMILY_ID:
                    return int(struct.unpack_from("=H", value)[0])
    raise TaskstatsUnavailable("the kernel named no taskstats family")


def _cpus() -> str:
    try:
        return Path("/sys/devices/system/cpu/possible").read_text().strip()
    except OSError:
        return f"0-{(os.cpu_count() or 1) - 1}"


@dataclass
class Listener:
    """The exits the kernel reports while the block runs (see the module docstring)."""

    _open: dict[int, _Group] = field(default_factory=dict)  # by tgid: processes with threads that exited
    _closed: list[tuple[int, _Group]] = field(default_factory=list)  # (pid, its threads) in exit order
    _last_closed: dict[int, _Group] = field(default_factory=dict)  # by pid: the last process that ended
    lost: str | None = None  # why the records are incomplete, when they are
    _count: int = 0

    @contextlib.contextmanager
    def listening(self) -> Iterator[Listener]:
        if os.geteuid() != 0:
            raise TaskstatsUnavailable("taskstats needs root")
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_GENERIC)
        except OSError as exc:
            raise TaskstatsUnavailable(f"no generic netlink socket: {exc}") from None
        with sock:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, 33, _RCVBUF)  # SO_RCVBUFFORCE: past rmem_max, as root
            sock.bind((0, 0))
            family = _family(sock)
            cpus = _cpus().encode() + b"\0"
            sock.send(
                _message(family, _CMD_GET, _attr(_ATTR_REGISTER_CPUMASK, cpus), _NLM_F_REQUEST | _NLM_F_ACK)
            )
            _check_ack(sock, "cannot register for exits", functools.partial(self._dispatch, family))
            stop = threading.Event()
            reader = threading.Thread(
                target=self._read, args=(sock, family, stop), name="taskstats", daemon=True
            )
            reader.start()
            try:
                yield self
            finally:
                stop.set()
                with contextlib.suppress(OSError):
                    sock.send(_message(family, _CMD_GET, _attr(_ATTR_DEREGISTER_CPUMASK, cpus)))
                reader.join(10.0)
                if reader.is_alive() and self.lost is None:
                    self.lost = "the taskstats reader did not stop: its records may be incomplete"

    def _read(self, sock: socket.socket, family: int, stop: threading.Event) -> None:
        sock.settimeout(0.2)
        while True:
            try:
                data = sock.recv(1 << 20)
            except TimeoutError:
                if stop.is_set():
                    return
                continue
            except OSError as exc:  # ENOBUFS: the kernel dropped records it had no room for
                if self.lost is None:
                    self.lost = f"taskstats records were lost ({exc})"
                if stop.is_set():
                    return
                continue
            for kind, payload in _messages(data):
                self._dispatch(family, kind, payload)

    def _dispatch(self, family: int, kind: int, payload: bytes) -> None:
        if kind != family:
            return
        try:
            self._take(payload)
        except Exception as exc:  # noqa: BLE001 - a record not read is a record lost, said as such
            if self.lost is None:
                self.lost = f"a taskstats record could not be read: {exc!r}"

    def _take(self, payload: bytes) -> None:
        for kind, nested in _attrs(payload, _GENLMSGHDR.size, len(payload)):
            if kind != _TYPE_AGGR_PID:  # a thread's record; the group's (AGGR_TGID) adds nothing to them
                continue
            stats = b""
            for inner, value in _attrs(nested, 0, len(nested)):
                if inner == _TYPE_STATS:
                    stats = value
            if not stats:
                continue
            version = _field(stats, _VERSION)
            if version < _MIN_VERSION or len(stats) < _MIN_SIZE:
                raise ValueError(f"taskstats version {version} ({len(stats)} bytes): 12 or later needed")
            self._count += 1
            tgid = _field(stats, _TGID)
            pid = _field(stats, _PID)
            group = self._open.get(tgid)
            if group is None:
                late = self._last_closed.get(tgid)
                # A thread's record can come after the one its process ended with: it left the group
                # first but was slower to send. Not the leader, soon after that end: it is that process's.
                if pid != tgid and late is not None and self._count - late.last <= _STRAGGLERS:
                    group = late
                else:
                    group = self._open[tgid] = _Group()
            group.cpu_ns += _field(stats, _RUN_VIRTUAL_TOTAL)
            if pid == tgid:  # the leader: the process's parent and name
                group.ppid = _field(stats, _PPID)
                group.comm = _field(stats, _COMM).split(b"\0", 1)[0].decode(errors="replace")
            if _field(stats, _FLAG) & _AGROUP and self._open.get(tgid) is group:
                group.last = self._count  # its last thread: the process is gone
                self._closed.append((tgid, self._open.pop(tgid)))
                self._last_closed[tgid] = group

    @property
    def timeless(self) -> bool:
        """Whether records came but none carried a run time (a kernel built without delay accounting
        fills none): an account from them would put every exited process's time elsewhere."""
        return bool(self._closed) and not any(group.cpu_ns for _, group in self._closed)

    def exited(self) -> list[ExitedProcess]:
        """One record per process that exited, in exit order (a process whose leader's record was not
        had has no parent, and is left out; one still running holds no record)."""
        return [
            ExitedProcess(pid, group.ppid, group.cpu_ns / 1e9, group.comm)
            for pid, group in self._closed
            if group.ppid
        ]
