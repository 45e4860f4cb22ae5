"""The fork server's wire protocol: every message between the loop and a helper, typed, in one place.

One ``SOCK_SEQPACKET`` socket joins them, one JSON object per datagram (``{"op": <kind>, ...}``), so
message boundaries hold. Each kind is a frozen dataclass below; :func:`encode` and :func:`decode` are
the only way onto and off the wire, and :func:`decode` refuses (:class:`ProtocolError`) anything that
is not exactly one of them.

loop -> helper:

- :class:`Plan` (``plan``): the learned modules to try and their memory budget; the first message,
  sent only to a helper started with ``--learned``;
- :class:`Spawn` (``spawn``): fork one workload; carries two descriptors, the write end of the child's
  output pipe and the child's control socket;
- :class:`Ping` (``ping``): show progress;
- :class:`Check` (``check``): which of these names it already has (imported before any learned module,
  or defined by such a module) and which no helper would ever preload; answered without importing
  anything.

helper -> loop:

- :class:`Importing` (``importing``): during startup, the learned module it is importing now (so a
  crash or a hang there is blamed on that module);
- :class:`Ready` (``ready``): it forks from now on; its pid, and what it preloaded of the plan;
- :class:`Unfit` (``unfit``), in place of ``ready``: it must not fork (a preload started a thread, or a
  learned module was refused for good) and exits; ``blame`` names the learned module at fault;
- :class:`SpawnFailed` (``spawn_failed``): a spawn it did not start, with ``unfit`` set when a thread
  has started since its start: it forks nothing more;
- :class:`Pong` (``pong``): the answer to a ping;
- :class:`Checked` (``checked``): the answer to a check.

A forked child says its pid on its own control socket (``"<pid>\\n"``); the loop then sends it
:data:`GO` and its payload there, and closes the socket. EOF before :data:`GO`: the child exits and runs
nothing.

Only the standard library is imported: the helper imports this module and must start fast.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import socket
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

# SEQPACKET messages are bounded by the socket buffers; both ends ask for buffers that fit this, and a
# larger spawn request goes through the plain launcher instead. The kernel may grant less
# (net.core.wmem_max): the loop's end reads back what it got (see ``channel``).
MAX_MESSAGE = 1024 * 1024
BUFFER = MAX_MESSAGE + 4096
# The first byte the loop sends on a child's control socket: run. EOF before it: exit, run nothing.
GO = b"1"


class ProtocolError(ValueError):
    """A datagram that is not one of the protocol's messages."""


@dataclass(frozen=True)
class Plan:
    op: ClassVar[str] = "plan"
    modules: tuple[str, ...]
    budget: int  # bytes the learned modules may add to the helper; 0: no limit


@dataclass(frozen=True)
class Spawn:
    op: ClassVar[str] = "spawn"
    id: int
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Ping:
    op: ClassVar[str] = "ping"
    id: int


@dataclass(frozen=True)
class Check:
    op: ClassVar[str] = "check"
    id: int
    modules: tuple[str, ...]


@dataclass(frozen=True)
class Importing:
    op: ClassVar[str] = "importing"
    module: str


@dataclass(frozen=True)
class Loaded:
    """A learned module a helper imported."""

    module: str
    distribution: str  # the installed distribution it was found in
    version: str | None
    kib: int  # what importing it added to the helper's resident memory (0: an earlier module brought it)
    path: str | None  # its file (None: a namespace package)


@dataclass(frozen=True)
class Refused:
    """A learned module a helper did not import, and why."""

    module: str
    reason: str


@dataclass(frozen=True)
class PreloadReport:
    """What a helper made of its plan's learned modules, in the order it tried them."""

    loaded: tuple[Loaded, ...] = ()
    refused: tuple[Refused, ...] = ()
    covered: tuple[str, ...] = ()  # already imported, or names a module defines: nothing to do


@dataclass(frozen=True)
class Ready:
    op: ClassVar[str] = "ready"
    pid: int
    preload: PreloadReport | None = None  # what it made of the plan; None: it was given none


@dataclass(frozen=True)
class Unfit:
    op: ClassVar[str] = "unfit"
    error: str
    blame: str | None = None  # the learned module that made it unfit, when one did
    preload: PreloadReport | None = None  # what it made of the plan up to that module


@dataclass(frozen=True)
class SpawnFailed:
    op: ClassVar[str] = "spawn_failed"
    id: int
    error: str
    unfit: bool = False  # a thread started since its start: it forks nothing more
    full: bool = False  # its descriptor table was full: the request's fds did not reach it


@dataclass(frozen=True)
class Pong:
    op: ClassVar[str] = "pong"
    id: int


@dataclass(frozen=True)
class Checked:
    op: ClassVar[str] = "checked"
    id: int
    covered: tuple[str, ...]  # those of the check's names it has: preloading them would add nothing
    refused: tuple[Refused, ...] = ()  # those no helper would ever preload, and why (not installed, ...)


ToHelper = Plan | Spawn | Ping | Check
ToLoop = Importing | Ready | Unfit | SpawnFailed | Pong | Checked
Message = ToHelper | ToLoop

KINDS: dict[str, type[Message]] = {
    kind.op: kind for kind in (Plan, Spawn, Ping, Check, Importing, Ready, Unfit, SpawnFailed, Pong, Checked)
}
_FIELDS: dict[type[Any], dict[str, Any]] = {kind: typing.get_type_hints(kind) for kind in KINDS.values()}


def encode(message: Message) -> bytes:
    return json.dumps({"op": message.op, **dataclasses.asdict(message)}, separators=(",", ":")).encode()


def decode(data: bytes) -> Message:
    """The message ``data`` holds.

    :raises ProtocolError: it is not JSON, names no known kind, or lacks or mistypes a field
    """
    try:
        raw = json.loads(data)
    except ValueError as exc:  # UnicodeDecodeError included
        raise ProtocolError(f"not a fork-server message: {data[:80]!r}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("op"), str):
        raise ProtocolError(f"not a fork-server message: {data[:80]!r}")
    kind = KINDS.get(raw["op"])
    if kind is None:
        raise ProtocolError(f"unknown fork-server message {raw['op']!r}")
    fields = dataclasses.fields(kind)
    unknown = set(raw) - {"op"} - {f.name for f in fields}
    if unknown:
        raise ProtocolError(f"{kind.op} message with unknown fields {sorted(unknown)}")
    values: dict[str, Any] = {}
    for f in fields:
        if f.name not in raw:
            if f.default is dataclasses.MISSING:
                raise ProtocolError(f"{kind.op} message without {f.name!r}")
            continue
        values[f.name] = _value(raw[f.name], _FIELDS[kind][f.name], f"{kind.op}.{f.name}")
    return kind(**values)


_WORDS: dict[object, str] = {
    tuple: "a list",
    int: "an integer",
    str: "a string",
    bool: "a boolean",
}
# The records a message carries (the preload report), read field by field as the messages are.
_RECORDS: tuple[type[Any], ...] = (PreloadReport, Loaded, Refused)
_FIELDS.update({kind: typing.get_type_hints(kind) for kind in _RECORDS})


def _record(kind: type[Any], value: object, where: str) -> Any:
    if not isinstance(value, dict):
        raise ProtocolError(f"{where} must be an object, got {value!r:.80}")
    names = {f.name: f for f in dataclasses.fields(kind)}
    if unknown := set(value) - set(names):
        raise ProtocolError(f"{where} has unknown fields {sorted(unknown)}")
    values: dict[str, Any] = {}
    for name, f in names.items():
        if name not in value:
            if f.default is dataclasses.MISSING:
                raise ProtocolError(f"{where} without {name!r}")
            continue
        values[name] = _value(value[name], _FIELDS[kind][name], f"{where}.{name}")
    return kind(**values)


def _value(value: object, hint: object, where: str) -> Any:
    """``value`` as ``hint`` (the few field types above), or :class:`ProtocolError`."""
    optional, hint, origin, item = _shape(hint)
    if optional and value is None:
        return None
    if hint in _RECORDS:
        return _record(hint, value, where)
    if origin is tuple:
        if isinstance(value, list):
            return tuple(_value(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(hint, type) and isinstance(value, hint):
        return value
    raise ProtocolError(f"{where} must be {_WORDS.get(origin or hint, hint)}, got {value!r:.80}")


@functools.cache
def _shape(hint: Any) -> tuple[bool, Any, Any, Any]:
    """Whether ``hint`` is optional, the type under it, its origin and a tuple's item type.

    Worked out once per hint: the helper decodes a spawn for every workload, and typing's
    introspection of each of its fields was most of that (py-spy over the ordinary benchmark).
    """
    args = typing.get_args(hint)
    optional = type(None) in args
    if optional:
        [hint] = [a for a in args if a is not type(None)]
    origin = typing.get_origin(hint)
    item = typing.get_args(hint)[0] if origin is tuple else None
    return optional, hint, origin, item


def size_buffers(sock: socket.socket, size: int = BUFFER) -> None:
    """Ask for ``size``-byte buffers; Linux grants twice that, capped at twice net.core.[rw]mem_max."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
