"""The launch journal's file: its name, its lines, its lock, and reading it back.

One file per executor instance, ``<instance>.launches`` in the state directory, 0600, held under an
exclusive ``flock`` by its writer for the writer's whole life. It is JSON lines: a header naming the
instance and its owner, then ``{"+": pid, "start": ..., "key": ...}`` per launch and ``{"-": pid}`` per
exit. Written by :class:`~async_local_executor.ops.journal.LaunchJournal`, read by
:func:`~async_local_executor.ops.reclaim.reclaim`.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Mapping
from pathlib import Path

import psutil

INSTANCE_ENV = "ASYNC_LOCAL_EXECUTOR_INSTANCE"
SUFFIX = ".launches"
TMP_SUFFIX = ".launches.tmp"

Records = dict[int, tuple[float, str]]  # the launches not ended: pid -> (process start time, key)


def start_time(pid: int) -> float | None:
    """The process's start time as /proc gives it, which tells it from a later one under the same pid."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def create_locked(path: Path) -> int:
    """Create ``path`` (0600, append-only) and lock it; the fd is ours until the process ends."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise OSError(errno.EAGAIN, f"cannot lock new journal {path}") from exc
    return fd


def encode(entry: Mapping[str, object]) -> bytes:
    """One line of the journal."""
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def read(fd: int) -> tuple[dict[str, object], Records]:
    """The header and the launches still open, from a journal's whole content."""
    with os.fdopen(os.dup(fd), "rb") as stream:
        lines = stream.read().splitlines()
    header: dict[str, object] = {}
    live: Records = {}
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
