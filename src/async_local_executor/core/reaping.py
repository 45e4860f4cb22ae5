"""Awaiting a workload's process: for its exit status, or only to release what it holds.

A process that is never awaited keeps its output pipes, the event loop's transport for it and (on a
fork-server child) its pidfd open, and may stay a zombie: every workload that had a process gets
awaited, including the ones whose supervision failed.
"""

from __future__ import annotations

import logging

import anyio

from async_local_executor.core.clock import Clock
from async_local_executor.core.errors import ChildLost
from async_local_executor.core.launchers.base import Child

log = logging.getLogger(__name__)

# How long a process killed after an internal error may take to be awaited. Killed, it exits at once;
# awaiting it also waits (bounded by the launcher) for its output to reach EOF.
ABANDONED_REAP = 10.0


async def reap(child: Child) -> int | ChildLost:
    """``child``'s exit status, or why it is lost."""
    # Shielded: once a process exists, only its exit may end this wait, or the workload would lose its
    # final event and the process its reaper.
    with anyio.CancelScope(shield=True):
        try:
            status: int | ChildLost = await child.wait()
        except ChildLost as exc:
            status = exc
    return status


async def reap_abandoned(child: Child, label: str, clock: Clock) -> None:
    """Await ``child`` (already killed, its outcome already reported) so that what it holds is released.

    Nothing it does here can reach the workload's outcome any more, so a failure is only logged.

    :param label: names the workload in the log
    :param clock: what the bound of :data:`ABANDONED_REAP` seconds is measured on
    """
    with clock.move_on_after(ABANDONED_REAP, shield=True) as scope:
        try:
            await child.wait()
        except Exception:
            log.warning(
                "workload %s (pid %d): awaiting its killed process after an internal error failed; "
                "its pipes may stay open",
                label,
                child.pid,
                exc_info=True,
            )
    if scope.cancelled_caught:
        log.warning(
            "workload %s (pid %d) was not gone %.0fs after it was killed for an internal error; "
            "its pipes may stay open",
            label,
            child.pid,
            ABANDONED_REAP,
        )
