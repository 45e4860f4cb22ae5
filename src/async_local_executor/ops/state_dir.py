"""Where the executors on this host keep their journals and status files: ``[async_local_executor] state_dir``.

Resolved here for both readers of the option, the executor (which reads its configuration itself, team
aware) and the ``status`` command (which must find what the executors wrote), so they cannot disagree.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

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


def secure(directory: Path) -> None:
    """Create ``directory`` (0700) if missing, else make sure no other user can write into it.

    A journal in it makes a starting executor kill the processes it names: one planted by another user
    would have the scheduler kill for them. So the directory must be this process's user's, and not
    writable by group or others; if it is ours, it is tightened to 0700 (as it is created).

    :raises UnsafeStateDir: it belongs to another user, or stays writable by others
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.stat()
    uid = os.geteuid()
    failed = ""
    if info.st_uid == uid and stat.S_IMODE(info.st_mode) & 0o077:
        try:
            directory.chmod(0o700)
            info = directory.stat()
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
