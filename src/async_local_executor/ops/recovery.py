"""What a starting executor does before it launches anything: clean up after a crashed predecessor.

Its journal names the processes it left running (see :mod:`~async_local_executor.ops.reclaim`), and its
status file still claims a running executor. Both go before the new instance opens its own journal, so
no try can run beside a survivor of its previous attempt. Nothing here knows Airflow.

What is in the directory never makes this raise (a file it cannot read is skipped with a warning); the
directory itself does, when another user could write into it or pick it (:func:`state_dir.secure`). It is
opened and checked once, and worked through that descriptor, not by resolving its path again.
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
    :raises state_dir.UnsafeStateDir: ``directory`` is another user's, writable by other users, a
        symbolic link, or was replaced while it was worked on
    """
    with state_dir.secure(directory) as folder:
        _clean_up(folder)
        # The journal and the status file are created by path: not where another directory now is.
        folder.check_named()
        return journal.LaunchJournal.open(directory, owner=owner)


def _clean_up(folder: state_dir.StateDir) -> None:
    survivors = reclaim(folder)
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
    for found in status.read_all(folder):
        if found.gone:  # a crashed scheduler's last word, and any write of it cut short
            name = found.path.name
            cut_short = [n for n in folder.names() if n.startswith(f"{name}{status.TMP_INFIX}")]
            for each in [name, *cut_short]:
                try:
                    folder.unlink(each, missing_ok=True)
                except OSError as exc:
                    log.warning(
                        "cannot remove %s, a stopped executor's status file: %s", folder.shown(each), exc
                    )
