"""Reading the status files back, for ``async-local-executor status`` and a starting executor's clean-up.

Whether a file's writer still runs is told by the writer's journal, ``<instance>.launches`` beside it:
a live executor holds its journal locked, whatever pid namespace it runs in (another container sharing
the directory), and a crashed one's lock is gone with it. Without a journal (an executor stopping, or
one whose journal was reclaimed), by its pid *and* that process's start time, which the file records:
a container restarted with its filesystem kept often gives the new scheduler the crashed one's pid. The
start is the kernel's, in clock ticks since boot (``pid_start_ticks``), which no wall-clock step moves.

A file whose writer could not read its own start (``null``) counts as alive only while its pid runs
and, if its journal is there, the journal is locked; and never when its pid is the reader's own. Nothing
here knows Airflow.

Every field is checked against the format (:mod:`~async_local_executor.ops.status_format`) before anyone
uses it (:func:`parse`): a file without a valid pid, start and time written is skipped, with a warning;
any other field of the wrong kind (a string where a number goes, NaN, a list of something else than
objects, an object without its needed keys) is left out, and :attr:`Found.problems` says what was. Whatever a file holds, reading it never raises, and what is read can be shown as JSON.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import types
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import psutil
import typing_extensions

from async_local_executor.core.proc_identity import runs_as
from async_local_executor.ops.journal_file import SUFFIX as JOURNAL_SUFFIX
from async_local_executor.ops.journal_file import holder_alive
from async_local_executor.ops.state_dir import StateDir
from async_local_executor.ops.status_format import (
    ADOPTION_ADOPTED,
    ADOPTION_HELD,
    PREFIX,
    START_TICKS_KEY,
    SUFFIX,
    Adoption,
    Rule,
    StatusFile,
)

log = logging.getLogger("async_local_executor.ops.status")

# A report older than this comes from an executor whose loop (or whole scheduler) has stopped.
STALE_AFTER = 15.0

# Files already warned about (unreadable, or read without some fields): the status command rereads them
# every redraw.
_warned: set[tuple[Path, bool]] = set()


def adoption_of(row: Mapping[str, Any]) -> Adoption | None:
    """What a running workload's row says of its adoption: :data:`ADOPTION_HELD`, :data:`ADOPTION_ADOPTED`,
    or None for a workload launched by its own executor."""
    adoption = row.get("adoption")
    return adoption if adoption in (ADOPTION_HELD, ADOPTION_ADOPTED) else None


@dataclass(frozen=True)
class Found:
    """One status file as read back, with what the reader could tell about its freshness."""

    path: Path  # for messages: the file is read through the state directory's descriptor
    data: dict[str, Any]
    stale: str | None  # why it cannot be trusted, or None when it is current
    gone: bool = False  # its scheduler is no longer running: nothing will ever update or remove it
    problems: tuple[str, ...] = ()  # the fields left out of ``data``, each with what was wrong with it

    @property
    def healthy(self) -> bool:
        return self.stale is None and self.data.get("health", {}).get("status") == "healthy"


def read_all(directory: Path | StateDir, now: float | None = None) -> list[Found]:
    """Every status file in ``directory``, each marked stale when its writer is gone or silent.

    A file that is not a status file this version can read is skipped, with one warning naming it; one
    with fields it cannot use is read without them, with one warning naming them.

    :param directory: the state directory as opened once (its files are read through that descriptor),
        or its path, which is opened here (a link followed: reading acts on nothing); none: no files
    """
    if isinstance(directory, StateDir):
        return _read_in(directory, time.time() if now is None else now)
    try:
        folder = StateDir.open(directory, follow=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        _warn(directory, f"cannot open the state directory: {exc.strerror or exc}")
        return []
    with folder:
        return _read_in(folder, time.time() if now is None else now)


def _read_in(folder: StateDir, now: float) -> list[Found]:
    found: list[Found] = []
    try:
        names = sorted(n for n in folder.names() if _named_status(n))
    except OSError as exc:
        _warn(folder.path, f"cannot list the state directory: {exc.strerror or exc}")
        return []
    for name in names:
        path = folder.shown(name)
        try:
            data, problems = parse(folder.read(name))
        except FileNotFoundError:
            continue  # removed while we looked
        except (OSError, ValueError) as exc:
            _warn(path, str(exc))
            continue
        if problems:
            _warn(path, "; ".join(problems), readable=True)
        pid = data["pid"]
        age = now - float(data["written_at"])
        stale = None
        gone = not writer_alive(path, data, folder=folder)
        if gone:
            stale = f"scheduler pid {pid} is not running"
        elif age > STALE_AFTER:
            stale = f"not updated for {age:.0f}s"
        found.append(Found(path, data, stale, gone, problems))
    return found


def _named_status(name: str) -> bool:
    return name.startswith(PREFIX) and name.endswith(SUFFIX) and len(name) >= len(PREFIX) + len(SUFFIX)


def writer_alive(path: Path, data: dict[str, Any], *, folder: StateDir | None = None) -> bool:
    """Whether the executor that wrote the status file ``path`` (whose content is ``data``) runs.

    :param folder: the state directory ``path`` was read from, as opened: its journal is asked through it
    """
    instance = path.name.removeprefix(PREFIX).removesuffix(SUFFIX)
    journal = f"{instance}{JOURNAL_SUFFIX}"
    held = holder_alive(folder.pinned(journal) if folder is not None else path.with_name(journal))
    pid: int = data["pid"]
    start: int | None = data.get(START_TICKS_KEY)
    if start is not None:
        return held if held is not None else runs_as(pid, start)
    if pid == os.getpid():
        return False  # a predecessor's file: this process reads its own start
    return held is not False and _running(pid)


def _running(pid: int) -> bool:
    # A killed scheduler nobody has reaped yet is a zombie: it exists, and runs nothing.
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


class Unreadable(ValueError):
    """Not a status file this version can read: not JSON, not an object, or no valid pid or time written."""


def parse(raw: bytes) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The status file's object, without the fields it cannot use, and what was wrong with each of those.

    :raises Unreadable: it is not a status file this version can read
    """
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise Unreadable(f"not JSON: {exc}") from None
    reading = _Reading()
    try:
        kept = _STATUS(data, reading, "")
    except _Bad as exc:
        raise Unreadable(f"not a status file of this version: {exc}") from None
    return kept, reading.problems()


# What each field must be, from status_format's definition. A check returns the value as kept, or raises
# _Bad saying what is wrong with it; a record or a list leaves out what is wrong inside it and notes it on
# the _Reading.
class _Bad(ValueError):
    pass


class _Reading:
    """What was left out of one file, as ``<field>: <what is wrong>`` (the first few listed)."""

    LISTED = 20

    def __init__(self) -> None:
        self._noted: list[str] = []
        self._more = 0

    def note(self, where: str, why: str) -> None:
        if len(self._noted) < self.LISTED:
            self._noted.append(f"{where}: {why}")
        else:
            self._more += 1

    def problems(self) -> tuple[str, ...]:
        return (*self._noted, f"and {self._more} more") if self._more else tuple(self._noted)


Check = Callable[[Any, _Reading, str], Any]


def _scalar(test: Callable[[Any], bool], should: str) -> Check:
    def check(value: Any, reading: _Reading, where: str) -> Any:
        if not test(value):
            raise _Bad(should)
        return value

    return check


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_PLAIN: dict[object, Check] = {
    float: _scalar(_finite, "not a finite number"),
    int: _scalar(lambda v: type(v) is int, "not an integer"),
    str: _scalar(lambda v: isinstance(v, str), "not a string"),
    bool: _scalar(lambda v: isinstance(v, bool), "not true or false"),
}
_RULES: dict[Rule, Check] = {
    Rule.PID: _scalar(lambda v: type(v) is int and v > 0, "not a pid"),
    Rule.COUNT: _scalar(lambda v: type(v) is int and v >= 0, "not a count"),
    Rule.SAMPLE: _scalar(
        lambda v: isinstance(v, list) and len(v) == 3 and all(map(_finite, v)), "not 3 numbers"
    ),
}


def _maybe(check: Check) -> Check:
    def maybe(value: Any, reading: _Reading, where: str) -> Any:
        return None if value is None else check(value, reading, where)

    return maybe


def _list(item: Check) -> Check:
    def check(value: Any, reading: _Reading, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise _Bad("not a list")
        kept = []
        for index, each in enumerate(value):
            try:
                kept.append(item(each, reading, f"{where}[{index}]"))
            except _Bad as exc:
                reading.note(f"{where}[{index}]", str(exc))
        return kept

    return check


def _mapping(item: Check) -> Check:
    def check(value: Any, reading: _Reading, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _Bad("not an object")
        kept = {}
        for name, each in value.items():
            try:
                kept[name] = item(each, reading, f"{where}.{name}")
            except _Bad as exc:
                reading.note(f"{where}.{name}", str(exc))
        return kept

    return check


def _one_of(allowed: tuple[object, ...]) -> Check:
    return _scalar(
        lambda v: isinstance(v, str) and v in allowed, f"not one of {', '.join(map(str, allowed))}"
    )


def _plain(value: Any, depth: int = 0) -> Any:
    """A field the format does not define, kept if it is JSON that can be written back (no NaN)."""
    if depth > 8:
        raise _Bad("nested too deep")
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, (int, float)):
        return _PLAIN[float](value, _Reading(), "")
    if isinstance(value, list):
        return [_plain(each, depth + 1) for each in value]
    if isinstance(value, dict):
        return {name: _plain(each, depth + 1) for name, each in value.items()}
    raise _Bad("not JSON")


def _record(fields: Mapping[str, Check], needed: Collection[str]) -> Check:
    """An object: its known fields checked, others kept if plain JSON.

    :param needed: one missing or wrong makes the whole object wrong (any other wrong one is left out)
    """

    def check(value: Any, reading: _Reading, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _Bad("not an object")
        for name in needed:
            if name not in value:
                raise _Bad(f"no {name}")
        kept = {}
        for name, each in value.items():
            inner = f"{where}.{name}" if where else name
            known = fields.get(name)
            try:
                kept[name] = _plain(each) if known is None else known(each, reading, inner)
            except _Bad as exc:
                if name in needed:
                    raise _Bad(f"{name} {exc}") from None
                reading.note(inner, str(exc))
        return kept

    return check


# Special forms, compared by identity with what get_origin returns.
_REQUIRED: object = typing_extensions.Required
_NOT_REQUIRED: object = typing_extensions.NotRequired


def _check_of(hint: Any) -> Check:
    """The check of a value of type ``hint``, as status_format writes types."""
    origin, args = typing_extensions.get_origin(hint), typing_extensions.get_args(hint)
    if origin is _REQUIRED or origin is _NOT_REQUIRED:
        return _check_of(args[0])
    if origin is Annotated:
        rules = [r for r in hint.__metadata__ if isinstance(r, Rule)]
        if not rules:
            return _check_of(args[0])
        [rule] = rules
        nullable = type(None) in typing_extensions.get_args(args[0])
        return _maybe(_RULES[rule]) if nullable else _RULES[rule]
    if origin is Union or isinstance(hint, types.UnionType):
        [other] = [a for a in args if a is not type(None)]
        return _maybe(_check_of(other))
    if origin is Literal:
        return _one_of(args)
    if origin is list:
        return _list(_check_of(args[0]))
    if origin is dict:
        return _mapping(_check_of(args[1]))
    if typing_extensions.is_typeddict(hint):
        hints = typing_extensions.get_type_hints(hint, include_extras=True)
        needed = [name for name, each in hints.items() if typing_extensions.get_origin(each) is _REQUIRED]
        return _record({name: _check_of(each) for name, each in hints.items()}, needed)
    return _PLAIN[hint]


_STATUS = _check_of(StatusFile)


def _warn(path: Path, why: str, *, readable: bool = False) -> None:
    if (path, readable) not in _warned:
        _warned.add((path, readable))
        if readable:
            log.warning("read %s without what is malformed in it (%s)", path, why)
        else:
            log.warning("skipped %s, which is not a readable status file (%s)", path, why)
