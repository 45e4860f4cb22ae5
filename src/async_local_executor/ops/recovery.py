"""What a starting executor does before it launches anything: clean up after a crashed predecessor.

Its journal names the processes it left running (see :mod:`~async_local_executor.ops.reclaim`), and its
status file still claims a running executor. Both go before the new instance opens its own journal, so
no try can run beside a survivor of its previous attempt. Nothing here knows Airflow.

What is in the directory never makes this raise (a file it cannot read is skipped with a warning); the
directory itself does, when another user could write into it (:func:`state_dir.secure`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from async_local_executor.ops import journal, state_dir, status
from async_local_executor.ops.reclaim import reclaim

log = logging.getLogger(__name__)


def reclaim_then_open(directory: Path, *, owner: str) -> journal.LaunchJournal:
    """Kill what dead executors left running, drop their status files, then open this one's journal.

    :param owner: who holds the new journal, for the log lines of the executor that reclaims it
    :raises state_dir.UnsafeStateDir: ``directory`` is another user's, or writable by other users
    """
    state_dir.secure(directory)
    survivors = reclaim(directory)
    for survivor in survivors:
        log.warning(
            "killed pid %d (%s) left running by a stopped executor (%s): %s",
            survivor.pid,
            survivor.label or "started by one of its workloads",
            survivor.owner,
            survivor.command,
        )
    if survivors:
        log.warning(
            "killed %d process(es) a previous executor left running; the scheduler resets their "
            "task instances and retries decide what runs again",
            len(survivors),
        )
    for found in status.read_all(directory):
        if found.gone:  # a crashed scheduler's last word, and any write of it cut short
            for path in [found.path, *directory.glob(f"{found.path.name}{status.TMP_INFIX}*")]:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    log.warning("cannot remove %s, a stopped executor's status file: %s", path, exc)
    return journal.LaunchJournal.open(directory, owner=owner)
