"""Lines the executor itself adds to a task's log, for a workload that never ran to tell its own story.

A task that could not be launched has no process to write its log; without this line the task's log
in the UI is empty and the reason lives only in the scheduler log. The line has the task SDK's JSON
shape on Airflow 3, and Airflow 2's text format there, so the UI renders it like any other.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path

log = logging.getLogger(__name__)


def append_line(
    base_folder: str | os.PathLike[str], relative_path: str, message: str, *, text: bool = False
) -> Path | None:
    """Append one error line to ``base_folder/relative_path``; return the file, or None if it failed.

    Never raises: failing to write a task log must not stop the executor from reporting the failure.

    :param text: Airflow 2's plain-text line instead of the task SDK's JSON record
    """
    path = Path(base_folder, relative_path)
    now = datetime.now(timezone.utc)
    if text:
        line = f"[{now.isoformat()}] {{async_local_executor}} ERROR - {message}"
    else:
        stamp = now.isoformat().replace("+00:00", "Z")
        line = json.dumps(
            {"timestamp": stamp, "level": "error", "event": message, "logger": "async_local_executor"}
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as exc:
        log.warning("could not write to the task log %s: %s", path, exc)
        return None
    return path
