"""Lines the executor itself adds to a task's log, for a workload that never ran to tell its own story.

A task that could not be launched has no process to write its log; without this line the task's log
in the UI is empty and the reason lives only in the scheduler log. A workload whose scheduler is gone
writes its own last lines here the same way when it fails (a traceback, why it killed itself), since no
scheduler reads its output any more. The lines have the task SDK's JSON shape on Airflow 3, and Airflow
2's text format there, so the UI renders them like any other.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from async_local_executor.core.files import write_all

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskLogFile:
    """A task's log file, and in which of the two formats its lines are.

    :param text: Airflow 2's plain-text lines instead of the task SDK's JSON records
    """

    path: Path
    text: bool = False


def append_line(
    base_folder: str | os.PathLike[str], relative_path: str, message: str, *, text: bool = False
) -> Path | None:
    """Append one error line to ``base_folder/relative_path``; return the file, or None if it failed.

    Never raises: failing to write a task log must not stop the executor from reporting the failure.

    :param text: Airflow 2's plain-text line instead of the task SDK's JSON record
    """
    return append_lines(TaskLogFile(Path(base_folder, relative_path), text), [message])


def append_lines(
    where: TaskLogFile, messages: Sequence[str], *, logger: str = "async_local_executor"
) -> Path | None:
    """Append each of ``messages`` as an error line of its own to ``where``; the file, or None if it failed.

    In one write: a line of the task's own, appended meanwhile, lands between two batches, not inside one.
    Never raises.

    :param logger: the name the lines are logged under
    """
    now = datetime.now(timezone.utc)
    if where.text:
        stamp = now.isoformat()
        lines = [f"[{stamp}] {{{logger}}} ERROR - {message}" for message in messages]
    else:
        stamp = now.isoformat().replace("+00:00", "Z")
        lines = [
            json.dumps({"timestamp": stamp, "level": "error", "event": message, "logger": logger})
            for message in messages
        ]
    path = where.path
    data = "".join(f"{line}\n" for line in lines).encode("utf-8", "replace")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("could not write to the task log %s: %s", path, exc)
        return None
    return path
