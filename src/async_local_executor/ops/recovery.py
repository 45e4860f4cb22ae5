"""What a starting executor does before it launches anything: clean up after a crashed predecessor.

Its journal names the processes it left running (see :mod:`~async_local_executor.ops.reclaim`), and its
status file still claims a running executor. Both go before the new instance opens its own journal, so
no try can run beside a survivor of its previous attempt. Nothing here knows Airflow.
"""

from __future__ import annotations

import logging
from pathlib import Path

from async_local_executor.ops import journal, status
from async_local_executor.ops.reclaim import reclaim

log = logging.getLogger(__name__)


def reclaim_then_open(directory: Path, *, owner: str) -> journal.LaunchJournal:
    """Kill what dead executors left running, drop their status files, then open this one's journal.

    :param owner: who holds the new journal, for the log lines of the executor that reclaims it
    """
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
        if found.gone:
            found.path.unlink(missing_ok=True)  # a crashed scheduler's last word
    return journal.LaunchJournal.open(directory, owner=owner)
