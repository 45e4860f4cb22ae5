"""Reading the status files back, for ``async-local-executor status`` and a starting executor's clean-up.

Whether a file's writer still runs is told by the writer's journal, ``<instance>.launches`` beside it:
a live executor holds its journal locked, whatever pid namespace it runs in (another container sharing
the directory), and a crashed one's lock is gone with it. Without a journal (an executor stopping, or
one whose journal was reclaimed), by its pid *and* that process's start time, which the file records:
a container restarted with its filesystem kept often gives the new scheduler the crashed one's pid.

A file written before the start time was recorded counts as alive only while its pid runs and, if its
journal is there, the journal is locked; and never when its pid is the reader's own (this process
records the start time in every file it writes). Nothing here knows Airflow.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from async_local_executor.ops.files import read_regular
from async_local_executor.ops.journal_file import SUFFIX as JOURNAL_SUFFIX
from async_local_executor.ops.journal_file import holder_alive, same_process

log = logging.getLogger("async_local_executor.ops.status")

PREFIX = "status."
SUFFIX = ".json"
START_KEY = "pid_start"  # the writer's process start time, as psutil's create_time gives it
# A report older than this comes from an executor whose loop (or whole scheduler) has stopped.
STALE_AFTER = 15.0

_warned: set[Path] = set()  # files already warned about: the status command rereads them every redraw


@dataclass(frozen=True)
class Found:
    """One status file as read back, with what the reader could tell about its freshness."""

    path: Path
    data: dict[str, Any]
    stale: str | None  # why it cannot be trusted, or None when it is current
    gone: bool = False  # its scheduler is no longer running: nothing will ever update or remove it

    @property
    def healthy(self) -> bool:
        return self.stale is None and self.data.get("health", {}).get("status") == "healthy"


def read_all(directory: Path, now: float | None = None) -> list[Found]:
    """Every status file in ``directory``, each marked stale when its writer is gone or silent.

    A file that is not a status file this version can read is skipped, with one warning naming it.
    """
    now = time.time() if now is None else now
    found: list[Found] = []
    for path in sorted(directory.glob(f"{PREFIX}*{SUFFIX}")):
        try:
            data = _parse(read_regular(path))
        except FileNotFoundError:
            continue  # removed while we looked
        except (OSError, ValueError, RecursionError) as exc:
            _warn(path, str(exc))
            continue
        if data is None:
            _warn(path, "not a status file of this version")
            continue
        pid = data["pid"]
        age = now - float(data["written_at"])
        stale = None
        gone = not writer_alive(path, data)
        if gone:
            stale = f"scheduler pid {pid} is not running"
        elif age > STALE_AFTER:
            stale = f"not updated for {age:.0f}s"
        found.append(Found(path, data, stale, gone))
    return found


def writer_alive(path: Path, data: dict[str, Any]) -> bool:
    """Whether the executor that wrote the status file ``path`` (whose content is ``data``) runs."""
    instance = path.name.removeprefix(PREFIX).removesuffix(SUFFIX)
    held = holder_alive(path.with_name(f"{instance}{JOURNAL_SUFFIX}"))
    pid: int = data["pid"]
    start = data.get(START_KEY)
    if start is not None:
        return held if held is not None else same_process(pid, float(start))
    if pid == os.getpid():
        return False  # an older version's file: every file this process writes has the start time
    return held is not False and _running(pid)


def _running(pid: int) -> bool:
    # A killed scheduler nobody has reaped yet is a zombie: it exists, and runs nothing.
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _parse(raw: bytes) -> dict[str, Any] | None:
    """The status file's object, or None when it is JSON of another shape."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        return None
    pid, running = data.get("pid"), data.get("running", [])
    if type(pid) is not int or pid <= 0 or not _number(data.get("written_at")):
        return None
    if data.get(START_KEY) is not None and not _number(data[START_KEY]):
        return None
    if not isinstance(data.get("health", {}), dict) or not isinstance(running, list):
        return None
    if not all(isinstance(row, dict) for row in running):
        return None
    return data


def _warn(path: Path, why: str) -> None:
    if path not in _warned:
        _warned.add(path)
        log.warning("skipped %s, which is not a readable status file (%s)", path, why)
