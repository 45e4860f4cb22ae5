"""Where the executors on this host keep their journals and status files: ``[async_local_executor] state_dir``.

Resolved here for both readers of the option, the executor (which reads its configuration itself, team
aware) and the ``status`` command (which must find what the executors wrote), so they cannot disagree.

The directory is opened once (:func:`secure`, :meth:`StateDir.open`) and everything after goes through
that descriptor: its mode is checked and tightened on the descriptor, its files are listed, opened and
removed relative to it. Its path is kept for messages only. Resolved again, the path could lead
elsewhere: where another user can write into a parent, a link swapped in after the check would point a
starting executor at a journal they planted, and it kills every process of the scheduler's user that
journal names.
"""

from __future__ import annotations

import errno
import os
import stat
import weakref
from pathlib import Path
from types import TracebackType

from typing_extensions import Self

from async_local_executor.core.files import READ_LIMIT, open_regular, read_fd

ENV = "AIRFLOW__ASYNC_LOCAL_EXECUTOR__STATE_DIR"
_SECTION = "async_local_executor"


def resolve(configured: str) -> Path:
    """The directory a configured ``state_dir`` names; empty: ``{AIRFLOW_HOME}/async_local_executor``."""
    if configured:
        return Path(configured)
    from airflow.configuration import AIRFLOW_HOME  # slow import: only when really needed

    return Path(AIRFLOW_HOME, "async_local_executor")


def from_airflow_config() -> Path:
    """The directory as the executor resolves it, read from Airflow's configuration."""
    configured = os.environ.get(ENV, "").strip()
    if not configured:  # the environment alone spares the status command Airflow's configuration
        from airflow.configuration import conf  # slow import: only when really needed

        configured = (conf.get(_SECTION, "state_dir", fallback="") or "").strip()
    return resolve(configured)


class UnsafeStateDir(PermissionError):
    """The state directory could let another user plant journals a starting executor would act on."""


class StateDirIsLink(UnsafeStateDir):
    """The state directory's path ends in a symbolic link: whoever can replace the link picks the directory."""


# Where a process finds its own open descriptors: a path through one resolves through the descriptor.
_FDS = Path("/proc/self/fd")


class StateDir:
    """The state directory, opened once: everything done in it goes through :attr:`fd`, never its path.

    Closed by :meth:`close` (or its ``with`` block), else when it is garbage collected.

    :param path: how it was named when it was opened, for messages only
    """

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path
        self._close = weakref.finalize(self, os.close, fd)

    @classmethod
    def open(cls, path: Path, *, follow: bool = False) -> StateDir:
        """Open the existing directory ``path``.

        :param follow: follow a link that ``path`` ends in (a reader that only shows what it finds);
            otherwise such a path is refused
        :raises StateDirIsLink: ``path`` ends in a symbolic link (unless ``follow``)
        :raises FileNotFoundError: there is nothing at ``path``
        :raises NotADirectoryError: ``path`` is not a directory
        """
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
        try:
            fd = os.open(path, flags)
        except OSError as exc:
            if not follow and exc.errno in (errno.ELOOP, errno.ENOTDIR) and path.is_symlink():
                raise _is_link(path) from None
            raise
        return cls(fd, path)

    def close(self) -> None:
        self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def names(self) -> list[str]:
        """The names in the directory (``.`` and ``..`` left out), unsorted."""
        return os.listdir(self.fd)

    def shown(self, name: str) -> Path:
        """The path of ``name`` in the directory, as the directory was named: for messages only."""
        return self.path / _plain(name)

    def pinned(self, name: str) -> Path:
        """A path to ``name`` that resolves through :attr:`fd` (``/proc/self/fd/<fd>/<name>``), for a
        function that takes a path; where ``/proc`` is not mounted, :meth:`shown`'s."""
        return _FDS / str(self.fd) / _plain(name) if _FDS.is_dir() else self.shown(name)

    def open_regular(self, name: str, flags: int = os.O_RDONLY, *, owned: bool = False) -> int:
        """An fd of the regular file ``name`` in the directory (see :func:`~async_local_executor.core.files.open_regular`).

        :param owned: refuse a file not owned by this process's user (:class:`PermissionError`)
        """
        fd = open_regular(_plain(name), flags, dir_fd=self.fd)
        owner, uid = os.fstat(fd).st_uid, os.geteuid()
        if owned and owner != uid:
            os.close(fd)
            raise PermissionError(errno.EPERM, f"owned by uid {owner}, not by the scheduler's uid {uid}")
        return fd

    def read(self, name: str, limit: int = READ_LIMIT) -> bytes:
        """The content of the regular file ``name`` in the directory."""
        fd = self.open_regular(name)
        try:
            return read_fd(fd, limit)
        finally:
            os.close(fd)

    def lstat(self, name: str) -> os.stat_result:
        """What ``name`` in the directory is, a link not followed."""
        return os.stat(_plain(name), dir_fd=self.fd, follow_symlinks=False)

    def unlink(self, name: str, *, missing_ok: bool = False) -> None:
        try:
            os.unlink(_plain(name), dir_fd=self.fd)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def tighten(self) -> None:
        """Make it 0700 (through the descriptor)."""
        os.fchmod(self.fd, 0o700)

    def check_named(self) -> None:
        """Make sure its path still names it, as a directory and not through a link.

        :raises UnsafeStateDir: the path leads elsewhere now (or nowhere)
        """
        mine = os.fstat(self.fd)
        try:
            named: os.stat_result | None = os.lstat(self.path)
        except OSError:
            named = None
        if named is None or (named.st_dev, named.st_ino) != (mine.st_dev, mine.st_ino):
            raise UnsafeStateDir(
                f"state directory {self.path} was replaced while in use (by a link or another directory): "
                "another user who can write into one of its parents could make the executor act on a "
                "directory of their choosing. Make its parents writable by the scheduler's user only, "
                "or set [async_local_executor] state_dir to a directory whose parents are"
            )


def _plain(name: str) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"not a name in the state directory: {name!r}")
    return name


def _is_link(path: Path) -> StateDirIsLink:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return StateDirIsLink(
        f"state directory {path} is a symbolic link{target}: whoever can replace the link chooses the "
        "directory the executor acts on, and could make it kill processes through a journal planted there. "
        "Set [async_local_executor] state_dir to the directory itself"
    )


def secure(directory: Path) -> StateDir:
    """Open ``directory`` (created 0700 if missing) once, and make sure no other user can write into it.

    A journal in it makes a starting executor kill the processes it names: one planted by another user
    would have the scheduler kill for them. So the directory must be this process's user's, and not
    writable by group or others; if it is ours, it is tightened to 0700 (as it is created). Both are
    checked, and the mode changed, on the descriptor returned, which is what the caller works through.

    :returns: the directory, open; the caller closes it
    :raises StateDirIsLink: ``directory`` ends in a symbolic link
    :raises UnsafeStateDir: it belongs to another user, or stays writable by others
    """
    try:
        folder = StateDir.open(directory)
    except FileNotFoundError:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = StateDir.open(directory)
    try:
        _check(folder)
    except BaseException:
        folder.close()
        raise
    return folder


def _check(folder: StateDir) -> None:
    directory = folder.path
    info = os.fstat(folder.fd)
    uid = os.geteuid()
    failed = ""
    if info.st_uid == uid and stat.S_IMODE(info.st_mode) & 0o077:
        try:
            folder.tighten()
            info = os.fstat(folder.fd)
        except OSError as exc:
            failed = f" and cannot be made 0700 ({exc.strerror or exc})"
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != uid:
        raise UnsafeStateDir(
            f"state directory {directory} is owned by uid {info.st_uid} (mode {mode:04o}), not by the "
            f"scheduler's uid {uid}: another user could make the executor kill processes through it. "
            f"Give it to uid {uid} with mode 0700, or set [async_local_executor] state_dir to a directory "
            "of the scheduler's user"
        )
    if mode & 0o022:
        raise UnsafeStateDir(
            f"state directory {directory} (owner uid {uid}, mode {mode:04o}) is writable by other users"
            f"{failed}: another user could make the executor kill processes through it. Make it 0700, "
            "or set [async_local_executor] state_dir to another directory"
        )
