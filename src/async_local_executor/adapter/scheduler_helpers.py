"""Airflow's helper processes around the scheduler: what they share with it, and who stops them.

Airflow forks helpers from the scheduler's process: its log server and health-check server before the
executor exists, and on Airflow 2 its DAG file processor manager right after. A scheduler killed
outright (kill -9, the OOM killer) leaves them running, since a handover needs a service manager's
``KillMode=process``: they keep the log port and whatever database connection they were forked with.
So the executor, at its start, closes the pooled connections (:func:`unshare_db_connections`), names the
helpers already running as its journal's companions for the next executor's reclaim to stop
(:func:`companions`), and on Airflow 2 ties what the main thread forks from then on to the scheduler's
life (:func:`tie_to_scheduler`).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Sequence

import psutil

from async_local_executor.core import lifeline
from async_local_executor.core.proc_identity import start_ticks
from async_local_executor.ops import journal

__all__ = ["companions", "is_airflow_helper", "tie_to_scheduler", "unshare_db_connections"]


def unshare_db_connections() -> None:
    """Close the scheduler's pooled database connections, so that no process it forked shares them.

    The scheduler forks its log server (and health-check server) before the executor starts, and on
    Airflow 2 its DAG file processor manager right after, with its pooled connections open: they hold
    the same sockets, and outlive a scheduler killed outright (kill -9, the OOM killer; systemd's
    ``KillMode=process``, which a handover needs, leaves them). The database then never sees the dead
    scheduler's connection close, so a transaction the kill cut short stays open with its row locks
    (the pool rows of its critical section, its ``FOR UPDATE`` of a running dag run) for as long as they
    run: the next scheduler never queues a task, and a task ending blocks. Closed here, the connections
    the scheduler opens from now on are its own, and its death ends their transactions.
    """
    from airflow import settings

    engine = getattr(settings, "engine", None)
    if engine is not None:
        engine.dispose()  # closes what is checked in; nothing is checked out when the executor starts


def companions() -> list[journal.Companion]:
    """The processes Airflow forked from this process before the executor started: a scheduler's log
    server and health-check server (``multiprocessing`` children; see :func:`is_airflow_helper`).

    A scheduler killed outright leaves them running (``KillMode=process``, which a handover needs, spares
    them): the log server keeps its port, so the next scheduler's own cannot bind it, and whatever
    database connection it was forked with. The next executor to reclaim this one's journal stops them.
    """
    found: list[journal.Companion] = []
    for child in multiprocessing.active_children():
        start = None if child.pid is None else start_ticks(child.pid)
        if child.pid is None or start is None:
            continue
        try:
            words = psutil.Process(child.pid).cmdline()
        except psutil.Error:
            continue
        if is_airflow_helper(words):
            found.append(journal.Companion(child.pid, start, " ".join(words).strip()[:80]))
    return found


def is_airflow_helper(words: Sequence[str]) -> bool:
    """Whether a child's command line is one of the scheduler's helpers. A ``multiprocessing`` child keeps
    no trace of its target once started, so its title tells: ``airflow serve-logs`` (Airflow 3's log
    server), ``gunicorn: master`` (Airflow 2's, which renames itself), the scheduler's own command line
    (the health-check server); not another executor's workers (``airflow worker -- LocalExecutor``),
    which a stop of their own handles."""
    title = " ".join(words).strip()
    if title.startswith("airflow worker"):
        return False
    if title.startswith("gunicorn: master"):
        return True
    return any(os.path.basename(word).startswith("airflow") for word in words[:3])


def tie_to_scheduler() -> None:
    """Airflow 2: what the scheduler's main thread forks from now on (its DAG file processor manager, and
    that manager again if it has to be restarted) gets SIGTERM when the scheduler dies.

    Airflow 2 leaves the manager running after a scheduler killed outright: it parses on beside the next
    scheduler's own, and keeps the database connections (with any transaction the kill cut short, and its
    row locks) it inherited. A service manager's ``KillMode=process``, which a handover needs, no longer
    kills it with the scheduler's unit. SIGTERM is the manager's own way to stop: it ends its parsing
    processes and exits. The log server, forked before the executor exists, is a companion instead (:func:`companions`).
    """
    lifeline.tie_direct_children(signal.SIGTERM, main_thread_only=True)
