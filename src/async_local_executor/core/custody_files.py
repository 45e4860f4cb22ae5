"""The custody directory's files: their names and what each holds, for the workload that writes them and
the executor that reads them.

A handed-over workload's files are named after it, ``<pid>-<start ticks>`` (:func:`name`), plus a suffix:

- ``.json`` (:data:`OWNER`), ``{"owner_pid": int, "owner_start": int}``: the executor process that answers
  for the workload now, written by the scheduler that hands it over and by the one that adopts it, read
  by the workload's watchdog once its owner has died.
- ``.exit`` (:data:`EXIT`), ``{"status": int}``: the workload's exit code, written by the workload itself,
  read by its adopter, which is not its parent and has no other way to learn it.
- ``.out`` (:data:`OUT`): its output once its owner's pipe had no reader any more, for whoever looks.

A file being written has the workload's name, a dot and more (:data:`WORKLOAD_FILE` matches them all), so
whoever removes a workload's files removes one cut short too. Every file is small (:data:`MAX_SIZE`) but
the output; a larger one is not ours. Decoding never raises: what is not a valid record is None.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Final, NamedTuple

__all__ = [
    "EXIT",
    "MAX_SIZE",
    "OUT",
    "OWNER",
    "WORKLOAD_FILE",
    "WRITING",
    "Owner",
    "decode_exit",
    "decode_owner",
    "encode_exit",
    "encode_owner",
    "file",
    "name",
]

OWNER: Final = ".json"
EXIT: Final = ".exit"
OUT: Final = ".out"
MAX_SIZE: Final = 4096
# Between a record's final name and a random id while it is written, before it is renamed into place.
WRITING: Final = ".tmp-"
# A workload's files: its name, then a dot and anything (a suffix, a file being written).
WORKLOAD_FILE: Final = re.compile(r"^(\d+)-(\d+)\.")


class Owner(NamedTuple):
    """The executor process that answers for a workload: its pid and start in clock ticks since boot."""

    pid: int
    start: int


def name(pid: int, start: int) -> str:
    """A workload's name in the custody directory: ``<pid>-<start ticks>``."""
    return f"{pid}-{start}"


def file(directory: Path, pid: int, start: int, suffix: str) -> Path:
    """The workload ``(pid, start)``'s file with ``suffix`` (:data:`OWNER`, :data:`EXIT`, :data:`OUT`)."""
    return directory / f"{name(pid, start)}{suffix}"


def encode_owner(owner: Owner) -> bytes:
    return json.dumps({"owner_pid": owner.pid, "owner_start": owner.start}).encode()


def decode_owner(raw: bytes) -> Owner | None:
    found = _record(raw)
    pid, start = found.get("owner_pid"), found.get("owner_start")
    return Owner(pid, start) if type(pid) is int and type(start) is int else None


def encode_exit(code: int) -> bytes:
    return json.dumps({"status": code}).encode()


def decode_exit(raw: bytes) -> int | None:
    status = _record(raw).get("status")
    return status if type(status) is int else None


def _record(raw: bytes) -> dict[str, object]:
    if len(raw) > MAX_SIZE:
        return {}
    try:
        found = json.loads(raw)
    except (ValueError, RecursionError):  # half a file, or one written by hand
        return {}
    return found if isinstance(found, dict) else {}
