"""Live control: an operator's pause, drain and resize of the executors on this host, and where they last.

One file per team in the state directory, ``control.json`` (``control.<team>.json`` for a team's
executor), 0600, replaced atomically under a lock (``control.lock``) so that two operators changing it at
once do not lose one another's change. Every executor of that team on this host reads it on its
heartbeat (a ``stat``, and a read only when that changed) and applies it; it stays in force across
scheduler restarts until an operator changes it. Each executor writes what it applied into its status
file (:class:`~async_local_executor.ops.status_format.ControlFields`, with the serial of the change), which
is how the command line and the REST API know a change took. A resize never touches airflow.cfg: the
file holds the live limits, and the configured ones stay where they are, shown beside.

Nothing here knows Airflow.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final, Literal

from async_local_executor.core.files import replace_atomically
from async_local_executor.ops.status_read import Found, read_all

Mode = Literal["running", "paused", "draining"]
RUNNING: Final[Mode] = "running"
PAUSED: Final[Mode] = "paused"
DRAINING: Final[Mode] = "draining"
MODES: Final = (RUNNING, PAUSED, DRAINING)

PREFIX: Final = "control"
SUFFIX: Final = ".json"
LOCK: Final = "control.lock"
TMP_INFIX: Final = ".tmp-"
READ_LIMIT = 64 * 1024
ACK_POLL = 0.2  # seconds between two looks at the status files while waiting for a change to take
# Airflow's team names are identifiers; anything else would not name one file in one directory.
_TEAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ControlError(ValueError):
    """A change that cannot be made, or a control file that cannot be read; nothing was changed."""


@dataclass(frozen=True)
class Control:
    """What an operator set for one team's executors.

    :param mode: ``running``, ``paused`` (no new task starts) or ``draining`` (no new task starts, and
        done once nothing runs)
    :param parallelism: the executor-wide limit in force instead of the configured one; None: the
        configured one
    :param queues: each named queue's limit in force instead of its configured ``queue_limits`` one
    :param deadline: a drain's deadline, wall clock; None: none
    :param by: who made the last change (an operator's name)
    :param at: when, wall clock
    :param serial: counts the changes; an executor reports the serial it applied
    """

    mode: Mode = RUNNING
    parallelism: int | None = None
    queues: Mapping[str, int] = field(default_factory=dict)
    deadline: float | None = None
    by: str = ""
    at: float = 0.0
    serial: int = 0

    @property
    def holds_starts(self) -> bool:
        return self.mode != RUNNING

    def to_json(self) -> dict[str, Any]:
        return {
            "format": 1,
            "mode": self.mode,
            "parallelism": self.parallelism,
            "queues": dict(self.queues),
            "deadline": self.deadline,
            "by": self.by,
            "at": self.at,
            "serial": self.serial,
        }

    @classmethod
    def from_json(cls, raw: object) -> Control:
        """:raises ControlError: not a control document this version reads"""
        if not isinstance(raw, dict) or raw.get("format") != 1:
            raise ControlError("not a control file of format 1")
        mode, parallelism, queues = raw.get("mode"), raw.get("parallelism"), raw.get("queues")
        deadline, by, at, serial = raw.get("deadline"), raw.get("by"), raw.get("at"), raw.get("serial")
        if mode not in MODES:
            raise ControlError(f"unknown mode {mode!r}")
        if parallelism is not None and not _limit(parallelism):
            raise ControlError(f"parallelism {parallelism!r} is not a whole number of at least 1")
        if not isinstance(queues, dict) or not all(
            isinstance(name, str) and _limit(value) for name, value in queues.items()
        ):
            raise ControlError(
                f"queues {queues!r} is not a map of queue names to whole numbers of at least 1"
            )
        if deadline is not None and not _number(deadline):
            raise ControlError(f"deadline {deadline!r} is not a time")
        if not isinstance(by, str) or not isinstance(at, (int, float)) or not _number(at):
            raise ControlError("by or at is missing or malformed")
        if type(serial) is not int or serial < 0:
            raise ControlError(f"serial {serial!r} is not a count")
        return cls(mode, parallelism, dict(queues), deadline, by, float(at), serial)

    def describe(self) -> str:
        """One line for people: ``paused by alice at 12:00:05 UTC``."""
        if self.mode == RUNNING and not self.by:
            return "running"
        said = f"{self.mode} by {self.by or 'an operator'} at {when(self.at)}"
        if self.mode == DRAINING and self.deadline is not None:
            said += f", deadline {when(self.deadline)}"
        return said


def when(at: float) -> str:
    try:
        return f"{datetime.fromtimestamp(at, timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
    except (OverflowError, ValueError, OSError):
        return "an impossible time"


def _limit(value: object) -> bool:
    return type(value) is int and value >= 1


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def file_name(team: str | None) -> str:
    """:raises ControlError: a team name that is not one"""
    if team is None:
        return PREFIX + SUFFIX
    if not _TEAM.match(team):
        raise ControlError(f"{team!r} is not a team name")
    return f"{PREFIX}.{team}{SUFFIX}"


def read(directory: Path, team: str | None) -> Control:
    """The control in force for ``team`` (the default, running at the configured limits, if none was set).

    :raises ControlError: the file is there but unreadable or malformed
    """
    path = directory / file_name(team)
    try:
        # Not followed if a link, and never waited on if a FIFO: a planted name cannot stall the scheduler.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return Control()
    except OSError as exc:
        raise ControlError(f"cannot open {path}: {exc.strerror or exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ControlError(f"{path} is not a regular file")
        data = os.read(fd, READ_LIMIT)
    except OSError as exc:
        raise ControlError(f"cannot read {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    try:
        return Control.from_json(json.loads(data))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ControlError(f"{path}: {exc}") from exc


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    try:
        owner = os.stat(directory).st_uid
        if owner != os.geteuid():
            # A file made by another user (root, say) would be one the scheduler cannot read, or one it
            # could not replace: the change must be made as the state directory's owner.
            raise ControlError(
                f"the state directory {directory} belongs to uid {owner}, not to this user (uid "
                f"{os.geteuid()}): run this as the scheduler's user"
            )
        fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ControlError(f"cannot lock the control file in {directory}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def change(directory: Path, team: str | None, edit: Callable[[Control], Control]) -> Control:
    """Apply ``edit`` to ``team``'s control under the lock, and write it with the next serial.

    :raises ControlError: what ``edit`` raised (nothing is written), or an unreadable file
    """
    with _locked(directory):
        now = read(directory, team)
        new = dataclasses.replace(edit(now), serial=now.serial + 1)
        data = json.dumps(new.to_json(), sort_keys=True).encode()
        try:
            replace_atomically(directory / file_name(team), data, TMP_INFIX)
        except OSError as exc:
            raise ControlError(
                f"cannot write the control file in {directory}: {exc.strerror or exc}"
            ) from exc
    return new


# The edits an operator makes; each replaces who and when.


def pause(by: str, at: float) -> Callable[[Control], Control]:
    return lambda now: dataclasses.replace(now, mode=PAUSED, deadline=None, by=by, at=at)


def resume(by: str, at: float) -> Callable[[Control], Control]:
    return lambda now: dataclasses.replace(now, mode=RUNNING, deadline=None, by=by, at=at)


def drain(by: str, at: float, deadline: float | None) -> Callable[[Control], Control]:
    """:param deadline: seconds from ``at``; None: no deadline"""
    if deadline is not None and (not _number(deadline) or deadline < 0):
        raise ControlError(f"a deadline is a number of seconds, at least 0; got {deadline!r}")
    end = None if deadline is None else at + deadline
    return lambda now: dataclasses.replace(now, mode=DRAINING, deadline=end, by=by, at=at)


def resize(
    by: str,
    at: float,
    *,
    parallelism: int | None,
    queues: Mapping[str, int],
    configured_parallelism: int,
    configured_queues: Mapping[str, int],
) -> Callable[[Control], Control]:
    """New live limits. A value equal to the configured one drops the override (the configured value
    is in force again); a queue is one with a configured limit (``queue_limits``).

    :raises ControlError: a limit below 1, or a queue without a configured limit
    """
    if parallelism is not None and parallelism != configured_parallelism and not _limit(parallelism):
        raise ControlError(f"parallelism must be a whole number of at least 1, got {parallelism!r}")
    for name, value in queues.items():
        if name not in configured_queues:
            known = ", ".join(sorted(configured_queues)) or "none"
            raise ControlError(
                f"queue {name!r} has no limit in queue_limits (queues with one: {known}); only those "
                "can be resized"
            )
        if not _limit(value):
            raise ControlError(
                f"the limit of queue {name!r} must be a whole number of at least 1, got {value!r}"
            )

    def edit(now: Control) -> Control:
        live = dict(now.queues)
        for name, value in queues.items():
            if value == configured_queues[name]:
                live.pop(name, None)
            else:
                live[name] = value
        limit = now.parallelism
        if parallelism is not None:
            limit = None if parallelism == configured_parallelism else parallelism
        return dataclasses.replace(now, parallelism=limit, queues=live, by=by, at=at)

    return edit


class Watcher:
    """Tells an executor when its team's control file changed: a ``stat`` per call, a read on a change.

    Scheduler thread only.
    """

    def __init__(self, directory: Path, team: str | None) -> None:
        self._path = directory / file_name(team)
        self._directory = directory
        self._team = team
        self._seen: tuple[int, int, int] | None = None

    def changed(self) -> Control | None:
        """The control now, if the file changed since the last call (the first call always reads).

        :raises ControlError: the file changed and cannot be read; asked again, it tries again
        """
        try:
            st = os.stat(self._path, follow_symlinks=False)
            seen: tuple[int, int, int] = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            seen = (0, 0, 0)
        except OSError as exc:
            raise ControlError(f"cannot look at {self._path}: {exc.strerror or exc}") from exc
        if seen == self._seen:
            return None
        control = read(self._directory, self._team)
        self._seen = seen
        return control


# Asking the running executors: what the command line and the REST API do.


class NotRunning(ControlError):
    """No executor of that team runs on this host: nothing was changed."""


@dataclass(frozen=True)
class Applied:
    """A change written, and what each running executor made of it.

    :param applied: the status (its ``control`` fields) of each executor that applied it, by instance
    :param pending: the instances that had not applied it when the wait ended
    """

    control: Control
    applied: Mapping[str, Mapping[str, Any]]
    pending: tuple[str, ...]


def running(directory: Path, team: str | None) -> list[Found]:
    """The status of each executor of ``team`` that runs on this host now."""
    return [f for f in read_all(directory) if f.stale is None and not f.gone and f.data.get("team") == team]


def configured(found: Sequence[Found]) -> tuple[int, dict[str, int]]:
    """The configured limits, as the running executors report them.

    :raises ControlError: an executor that does not report live control (an older version)
    """
    for f in found:
        fields = f.data.get("control")
        if not isinstance(fields, dict):
            raise ControlError(
                f"the executor of scheduler pid {f.data.get('pid')} does not report live control (an older "
                "version): restart its scheduler first"
            )
    fields = found[0].data["control"]
    return int(fields.get("configured_parallelism") or 0), dict(fields.get("configured_queue_limits") or {})


def _took(fields: Mapping[str, Any], new: Control) -> bool:
    """Whether an executor's applied control is ``new``, or a change made after it (by another operator,
    meanwhile); a serial alone could be an older file's (one deleted, and counted again from 1)."""
    serial, at = fields.get("serial"), fields.get("at")
    if serial == new.serial:
        return at == new.at
    return isinstance(serial, int) and serial > new.serial and isinstance(at, (int, float)) and at >= new.at


def request(
    directory: Path,
    team: str | None,
    edit: Callable[[int, Mapping[str, int]], Callable[[Control], Control]],
    *,
    timeout: float,
    sleep: Callable[[float], None] = time.sleep,
) -> Applied:
    """Write a change for ``team``'s running executors, and wait up to ``timeout`` seconds for each to
    apply it (its status file shows the change's serial).

    :param edit: given the configured parallelism and queue limits, the edit to make
    :raises NotRunning: no executor of ``team`` runs here (nothing is written)
    :raises ControlError: the change is not one that can be made (nothing is written)
    """
    live = running(directory, team)
    if not live:
        whose = f"of team {team}" if team else "without a team"
        raise NotRunning(
            f"no AsyncLocalExecutor {whose} is running on this host (state directory {directory}); "
            "nothing was changed"
        )
    parallelism, queues = configured(live)
    new = change(directory, team, edit(parallelism, queues))
    pending = {str(f.data.get("instance")) for f in live}
    applied: dict[str, Mapping[str, Any]] = {}
    end = time.monotonic() + timeout
    while True:
        for f in running(directory, team):
            instance, fields = str(f.data.get("instance")), f.data.get("control")
            if instance in pending and isinstance(fields, dict) and _took(fields, new):
                pending.discard(instance)
                applied[instance] = {**fields, "pid": f.data.get("pid")}
        if not pending or time.monotonic() >= end:
            return Applied(new, applied, tuple(sorted(pending)))
        sleep(ACK_POLL)  # the executor applies it on its heartbeat, and says so in its next status write
