"""Careful file primitives for directories whose files may be stale, foreign or planted: the state
directory, and the custody directory a workload writes to after its scheduler has gone.

Opening never follows a symbolic link and never blocks (a FIFO under a journal's name would otherwise
hang the scheduler's start); only regular files are read; writes go on until every byte is written.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

# Far above any status file or compacted journal; a larger file is not one of ours.
READ_LIMIT = 16 << 20


class NotRegular(OSError):
    """The path names something other than a regular file (a directory, a FIFO, a device)."""


def open_regular(
    path: Path | str, flags: int = os.O_RDONLY, *, dir_fd: int | None = None, mode: int = 0o600
) -> int:
    """An fd of the regular file ``path``, opened without following a link and without blocking.

    :param dir_fd: the directory a relative ``path`` is in (the state directory, opened once)
    :param mode: its permissions if ``flags`` create it
    :raises FileNotFoundError: it is gone
    :raises OSError: it is a link (ELOOP), not a regular file (:class:`NotRegular`), or unreadable
    """
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int = READ_LIMIT) -> bytes:
    """The content of the open file ``fd`` from its start, at most ``limit`` bytes."""
    chunks: list[bytes] = []
    size, offset = 0, 0
    while size < limit:
        chunk = os.pread(fd, min(1 << 20, limit - size), offset)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte of ``data``: ``write(2)`` may write fewer than asked (a signal, a full disk)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(f"write wrote {written} bytes")
        view = view[written:]


def fresh_name(final: Path, infix: str) -> Path:
    """A name beside ``final`` no one else can have chosen: ``final``'s name + ``infix`` + a random id."""
    # os.urandom, not uuid: a workload process writes through here, and uuid's import is not free.
    return final.with_name(f"{final.name}{infix}{os.urandom(16).hex()}")


def create_exclusive(path: Path, flags: int = os.O_WRONLY) -> int:
    """Create ``path``, 0600: fails if anything (a file, a planted link) already has its name."""
    return os.open(path, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def replace_atomically(final: Path, data: bytes, infix: str) -> None:
    """Replace ``final`` with ``data`` (0600), so a reader sees the old content or the new, never half.

    Written to a fresh, exclusively created name first, then renamed into place.
    """
    tmp = fresh_name(final, infix)
    fd = create_exclusive(tmp)
    try:
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
