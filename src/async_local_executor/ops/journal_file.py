"""The launch journal's file: its name, its lines, its lock, and reading it back.

One file per executor instance, ``<instance>.launches`` in the state directory, 0600, held under an
exclusive ``flock`` by its writer for the writer's whole life. It is JSON lines: a header naming the
instance and its owner, then ``{"+": pid, "start_ticks": ..., "key": ...}`` per launch, ``{"-": pid}``
per exit, and ``{"seen": pid, "start_ticks": ..., "of": pid}`` per descendant a launch was seen with (an
exit ends those too). Written by :class:`~async_local_executor.ops.journal.LaunchJournal`, read by
:func:`~async_local_executor.ops.reclaim.reclaim`.

Each kind of line is one type here (:class:`Header`, :class:`Launch`, :class:`Ended`, :class:`SeenLine`,
:class:`HandoverLine`), which the writer encodes and the reader decodes.

Handover (workloads that outlive their scheduler, for the next one to adopt) adds:

- on a launch line, ``"handover_timeout": <s>`` when the workload was started to outlive its scheduler
  by that long (a crash hands it over too), and optionally ``"info": {...}``, the adapter's opaque data;
- on a launch line written for a workload adopted from a dead journal, ``"held": {"info", "cgroup",
  "at", "boot", "timeout", "from"}`` (what the dead journal said, and the instance it came from);
- ``{"handover": pid, "start_ticks": ..., "info": {...}, "cgroup": "<directory>" | null, "at": <wall time>,
  "boot": <CLOCK_BOOTTIME seconds>, "timeout": <s>}`` when a stopping scheduler handed a launch still
  open over (an exit ends it too; the last one of a launch counts).

A journal without these reads as before: no launch is handed over.

A process's start is the kernel's, in clock ticks since boot, which no step of the wall clock moves
(:mod:`~async_local_executor.core.proc_identity`).

A journal only ever appears under its name already locked: it is written under a fresh name
(``<instance>.launches.tmp-<random>``), locked, then renamed into place, the lock staying with the
file. A reclaimer that finds a journal it can lock therefore knows its writer is dead, never that it
has not locked it yet. Whoever only wants to know whether the writer lives takes a *shared* lock, for
an instant: a reclaimer that finds only shared locks knows the writer is dead and waits for them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from async_local_executor.core.files import create_exclusive, fresh_name, open_regular, read_fd, write_all

log = logging.getLogger("async_local_executor.ops.journal")

INSTANCE_ENV = "ASYNC_LOCAL_EXECUTOR_INSTANCE"
SUFFIX = ".launches"
CREATING = ".tmp-"  # infix of a journal being written, before it is renamed into place, locked
# A new journal whose fresh name a reclaimer removed meanwhile is written again under another.
_ATTEMPTS = 5

START_KEY = "start_ticks"  # a process's start, in clock ticks since boot

Records = dict[int, tuple[int, str]]  # the launches not ended: pid -> (process start, key)
# The descendants seen of the launches not ended: launch pid -> {descendant pid: its start}.
Seen = dict[int, dict[int, int]]

HANDOVER_TIMEOUT_KEY = "handover_timeout"
# In the header: whose workloads these are (a deployment and a team); a reclaim holds only its own key's.
OWNER_KEY = "owner_key"
# In the header: the owner's helper processes that must not outlive it, each {"pid", START_KEY, "what"}.
COMPANIONS_KEY = "companions"
# The header's owner process's start ticks, beside its "pid": a journal handed on is unlocked while its
# scheduler still runs, and that one's helpers are its own to stop until it has exited.
OWNER_START_KEY = "pid_start_ticks"


@dataclass(frozen=True)
class Companion:
    """A process of the journal's owner that must not outlive it (a service's helper it started before
    the executor existed), so that whoever reclaims the journal stops it if it still runs."""

    pid: int
    start: int
    """Its start, in clock ticks since boot: a later process under the same pid is not it."""
    what: str
    """What it is, for the log line that says it was stopped."""

    def encode(self) -> dict[str, object]:
        return {"pid": self.pid, START_KEY: self.start, "what": self.what}

    @classmethod
    def decode(cls, raw: object) -> Companion | None:
        """One from a header's entry; None for an entry that is not one."""
        if not isinstance(raw, Mapping):
            return None
        pid, start, what = raw.get("pid"), raw.get(START_KEY), raw.get("what")
        if type(pid) is not int or type(start) is not int or pid <= 1 or not isinstance(what, str):
            return None
        return cls(pid, start, what)


@dataclass(frozen=True)
class Handover:
    """How an open launch is to be handed over: by its handover line, else as its launch line enabled.

    With :attr:`boot` None there was no handover line: the launch was started (or held) to outlive its
    scheduler by :attr:`timeout`, and a crash of that scheduler hands it over.
    """

    start: int
    """The launch's start, in clock ticks since boot, as the line recorded it."""
    timeout: float
    """How long the workload outlives its owner's death before it kills itself, in seconds."""
    info: Mapping[str, object] = field(default_factory=dict)
    """The adapter's opaque data (the handover line's, else the launch line's)."""
    cgroup: str | None = None
    """The workload's own cgroup2 directory, as the line said; None without one."""
    at: float | None = None
    """Wall time of the handover line; None without one."""
    boot: float | None = None
    """``CLOCK_BOOTTIME`` seconds at the handover line, which its age is measured on; None without one."""
    held_from: str | None = None
    """The dead instance this launch was taken over from (a ``held`` launch line), else None."""


# The handovers of the launches not ended: launch pid -> its handover.
Handovers = dict[int, Handover]


@dataclass(frozen=True)
class Header:
    """The journal's first line: whose it is."""

    instance: str
    owner: str
    """Who this is, for the log lines of whoever reclaims it."""
    owner_key: str | None
    """Whose workloads it records (a deployment and a team); None in a header without one."""
    pid: int | None
    """The owner process."""
    pid_start: int | None
    """The owner process's start ticks: a journal handed on is unlocked while its scheduler still runs,
    and that one's companions are its own to stop until it has exited."""
    opened: float | None = None
    companions: tuple[Companion, ...] = ()

    def encode(self) -> bytes:
        return encode(
            {
                "instance": self.instance,
                "owner": self.owner,
                OWNER_KEY: self.owner_key,
                "pid": self.pid,
                OWNER_START_KEY: self.pid_start,
                "opened": self.opened,
                COMPANIONS_KEY: [companion.encode() for companion in self.companions],
            }
        )

    @classmethod
    def decode(cls, entry: Mapping[str, object]) -> Header:
        """Whatever a first line holds: a field of the wrong kind reads as missing."""
        pid, start, key = entry.get("pid"), entry.get(OWNER_START_KEY), entry.get(OWNER_KEY)
        opened, raw = entry.get("opened"), entry.get(COMPANIONS_KEY)
        companions = [Companion.decode(each) for each in raw] if isinstance(raw, list) else []
        return cls(
            instance=str(entry.get("instance", "?")),
            owner=str(entry.get("owner", "?")),
            # Any other key than this version's strings is another deployment's, as before it was decoded.
            owner_key=None if key is None else str(key),
            pid=pid if type(pid) is int else None,
            pid_start=start if type(start) is int else None,
            opened=_optional_seconds(opened),
            companions=tuple(each for each in companions if each is not None),
        )


@dataclass(frozen=True)
class HeldFrom:
    """What a dead journal said of a launch this instance took over: the ``held`` of its launch line.

    Its :attr:`at` and :attr:`boot` are for whoever reads the file: its age is not measured from there.
    """

    info: Mapping[str, object]
    cgroup: str | None
    at: float | None
    boot: float | None
    instance: str
    """The dead instance."""

    def encode(self, timeout: float) -> dict[str, object]:
        """Its line's ``held``, with the launch's ``timeout``, which the line says there too."""
        return {
            "info": dict(self.info),
            "cgroup": self.cgroup,
            "at": self.at,
            "boot": self.boot,
            "timeout": timeout,
            "from": self.instance,
        }


@dataclass(frozen=True)
class Launch:
    """A launch: ``{"+": pid, ...}``."""

    pid: int
    start: int
    key: str
    handover_timeout: float = 0.0
    """How long the workload outlives its scheduler (0: it dies with it)."""
    info: Mapping[str, object] | None = None
    """The adapter's data for whoever adopts it after a crash."""
    held: HeldFrom | None = None

    def encode(self) -> dict[str, object]:
        entry: dict[str, object] = {"+": self.pid, START_KEY: self.start, "key": self.key}
        if self.handover_timeout > 0:
            entry[HANDOVER_TIMEOUT_KEY] = self.handover_timeout
        if self.info is not None and self.held is None:
            entry["info"] = dict(self.info)
        if self.held is not None:
            entry["held"] = self.held.encode(self.handover_timeout)
        return entry

    def without_data(self) -> Launch:
        return dataclasses.replace(
            self,
            info={} if self.info is not None else None,
            held=None if self.held is None else dataclasses.replace(self.held, info={}),
        )


@dataclass(frozen=True)
class Ended:
    """A launch's end: ``{"-": pid}``."""

    pid: int

    def encode(self) -> dict[str, object]:
        return {"-": self.pid}


@dataclass(frozen=True)
class SeenLine:
    """A descendant a launch was seen with: ``{"seen": pid, "start_ticks": ..., "of": launch pid}``."""

    pid: int
    start: int
    of: int

    def encode(self) -> dict[str, object]:
        return {"seen": self.pid, START_KEY: self.start, "of": self.of}


@dataclass(frozen=True)
class HandoverLine:
    """A launch still open handed over by a stopping scheduler: ``{"handover": pid, ...}``."""

    pid: int
    start: int
    info: Mapping[str, object]
    cgroup: str | None
    at: float
    """Wall time of the handover."""
    boot: float
    """``CLOCK_BOOTTIME`` seconds at the handover, which its age is measured on."""
    timeout: float

    def encode(self) -> dict[str, object]:
        return {
            "handover": self.pid,
            START_KEY: self.start,
            "info": dict(self.info),
            "cgroup": self.cgroup,
            "at": self.at,
            "boot": self.boot,
            "timeout": self.timeout,
        }

    def without_data(self) -> HandoverLine:
        return dataclasses.replace(self, info={})


Line = Launch | Ended | SeenLine | HandoverLine


def encode_line(record: Line) -> bytes:
    """``record``'s line; the adapter's data, where JSON cannot hold it, is written empty, with a warning."""
    try:
        return encode(record.encode())
    except (TypeError, ValueError) as exc:
        if not isinstance(record, (Launch, HandoverLine)):
            raise
        log.warning(
            "the launch journal cannot hold the data given for pid %s (%s): written without it",
            record.pid,
            exc,
        )
        return encode(record.without_data().encode())


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


def read(fd: int, path: Path | None = None) -> tuple[Header, Records]:
    """The header and the launches still open, from a journal's whole content (see :func:`read_all`)."""
    header, live, _, _ = read_all(fd, path)
    return header, live


def read_all(fd: int, path: Path | None = None) -> tuple[Header, Records, Seen, Handovers]:
    """The header, the launches still open, the descendants they were seen with, and their handovers.

    Lines that are not this format's (a line cut short by a crash, another version's, garbage) are
    skipped; if any but a cut-short last line was, one warning names ``path``. A launch line whose
    handover fields are not this format's still records the launch (it is then not handed over).
    """
    lines = read_fd(fd).splitlines()
    header = Header.decode({})
    live: Records = {}
    seen: Seen = {}
    handovers: Handovers = {}
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
                header = Header.decode(entry)
                continue
            record, whole = decode(entry)
            foreign += not whole
            if isinstance(record, Launch):
                live[record.pid] = (record.start, record.key)
                handovers.pop(record.pid, None)
                enabled = _enabled(record)
                if enabled is not None:
                    handovers[record.pid] = enabled
            elif isinstance(record, Ended):
                live.pop(record.pid, None)
                seen.pop(record.pid, None)
                handovers.pop(record.pid, None)
            elif isinstance(record, HandoverLine):
                if record.pid in live:  # one of a launch that ended is nothing to hold
                    handovers[record.pid] = _handover(record, handovers.get(record.pid))
            elif record.of in live:  # one of a launch that ended is not reclaimed, as the launch is not
                seen.setdefault(record.of, {})[record.pid] = record.start
        except (ValueError, TypeError, KeyError):
            foreign += 1
    if foreign:
        log.warning(
            "skipped %d line(s) of the launch journal %s that are not in this version's format",
            foreign,
            path or f"fd {fd}",
        )
    return header, live, seen, handovers


def decode(entry: Mapping[str, object]) -> tuple[Line, bool]:
    """The record a line (other than the first) holds, and whether all of it was this format's.

    A launch whose handover fields are not this format's is still a launch, without them: it is then
    killed by a reclaim, not lost. Raises ValueError, TypeError or KeyError for a line that is no record.
    """
    if "+" in entry:
        launch = Launch(_pid(entry["+"]), _start(entry), str(entry["key"]))
        try:
            return _with_handover(launch, entry), True
        except (ValueError, TypeError, KeyError):
            return launch, False
    if "-" in entry:
        return Ended(_pid(entry["-"])), True
    if "handover" in entry:
        record = HandoverLine(
            _pid(entry["handover"]),
            _start(entry),
            info=_info(entry["info"]),
            cgroup=_cgroup(entry["cgroup"]),
            at=_seconds(entry["at"]),
            boot=_seconds(entry["boot"]),
            timeout=_seconds(entry["timeout"]),
        )
        return record, True
    if "seen" in entry:
        return SeenLine(_pid(entry["seen"]), _start(entry), _pid(entry["of"])), True
    raise KeyError("+")


def _with_handover(launch: Launch, entry: Mapping[str, object]) -> Launch:
    """``launch`` with the handover fields of its line. Raises like the other fields' checks."""
    timeout = _seconds(entry[HANDOVER_TIMEOUT_KEY]) if HANDOVER_TIMEOUT_KEY in entry else None
    raw = entry.get("held")
    if raw is None:
        if timeout is None:
            return launch
        info = _info(entry["info"]) if "info" in entry else None
        return dataclasses.replace(launch, handover_timeout=timeout, info=info)
    if not isinstance(raw, dict):
        raise TypeError(type(raw).__name__)
    source = raw["from"]
    if not isinstance(source, str):
        raise TypeError(type(source).__name__)
    held = HeldFrom(
        info=_info(raw["info"]),
        cgroup=_cgroup(raw["cgroup"]),
        at=_optional_seconds(raw.get("at")),
        boot=_optional_seconds(raw.get("boot")),
        instance=source,
    )
    timeout = _seconds(raw["timeout"]) if timeout is None else timeout
    return dataclasses.replace(launch, handover_timeout=timeout, held=held)


def _enabled(launch: Launch) -> Handover | None:
    """The handover a launch line enables, or None."""
    if launch.handover_timeout <= 0:
        return None
    if launch.held is None:
        return Handover(launch.start, launch.handover_timeout, info=launch.info or {})
    # What the dead journal said of it, for whoever reads this one; its age is not measured from
    # there, since this instance answered for it meanwhile (see ops/reclaim.py).
    held = launch.held
    return Handover(
        launch.start, launch.handover_timeout, info=held.info, cgroup=held.cgroup, held_from=held.instance
    )


def _handover(record: HandoverLine, enabled: Handover | None) -> Handover:
    return Handover(
        record.start,
        record.timeout,
        info=record.info,
        cgroup=record.cgroup,
        at=record.at,
        boot=record.boot,
        held_from=enabled.held_from if enabled is not None else None,
    )


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"not a number of seconds: {value!r}")
    try:
        seconds = float(value)
    except OverflowError:  # an integer beyond any float
        raise ValueError(f"not a number of seconds: {value!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"not a number of seconds: {value!r}")
    return seconds


def _optional_seconds(value: object) -> float | None:
    """A number of seconds where the field only informs: None for anything else."""
    try:
        return _seconds(value)
    except (TypeError, ValueError):
        return None


def _info(value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise TypeError(f"not an object: {value!r}")
    return value


def _cgroup(value: object) -> str | None:
    if value is not None and not (isinstance(value, str) and value.startswith("/")):
        raise ValueError(f"not a cgroup path: {value!r}")
    return value


def _start(entry: Mapping[str, object]) -> int:
    ticks = entry[START_KEY]
    if type(ticks) is not int or ticks < 0:
        raise ValueError(f"not a start in ticks: {ticks!r}")
    return ticks


def _pid(value: object) -> int:
    if type(value) is not int or value <= 0:
        raise ValueError(f"not a pid: {value!r}")
    return value
