"""Where a scheduler stop lands: between the scheduler loop's database transactions, not inside one.

Airflow's scheduler stops on SIGTERM and SIGINT by raising ``SystemExit`` from its signal handler, at
whatever line its main thread is on. Landing inside a database call, that leaves the process unable to
record its own end, and the scheduler exits 1 instead of 0 (reproduced on Airflow 3.3 with SQLite, about
one stop in 5 with running tasks to terminate and one in 35 without; docs/design.md, "Where a stop
lands"):

- inside a statement: SQLAlchemy invalidates the connection, but SQLite (Python 3.11's ``sqlite3`` closes
  with ``sqlite3_close_v2``) keeps a connection whose statement is still referenced open as a zombie,
  with its write lock, until that statement is freed; the traceback in flight holds it. Every other
  writer (the api-server's task heartbeats, the dag-processor) fails with "database is locked" for as
  long as the executor's stop lasts, and so does the scheduler's final update of its job row;
- inside the critical section's ``prohibit_commit`` guard as it is entered: the guard's listener stays on
  the thread's session, and that final update raises "UNEXPECTED COMMIT - THIS WILL BREAK HA LOCKS!".

So while the executor runs, a stop signal that finds the scheduler's main thread anywhere but its loop's
own frame with no connection checked out is held, and delivered (Airflow's own handler called) at the
executor's next heartbeat, which the loop calls outside its database work. A second signal, or one still
held after :data:`BOUND` seconds, is delivered at once, as Airflow alone would: a stuck loop still stops.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["BOUND", "arm", "deliver_held", "hold", "release"]

log = logging.getLogger(__name__)

BOUND = 5.0
"""Seconds a stop signal may be held before it is delivered wherever the scheduler's thread is."""

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# The scheduler loop's own frame: with no connection checked out, a signal there lands between
# transactions (its idle sleep, mostly), so it is delivered at once, as fast as Airflow alone stops.
_LOOP = "_run_scheduler_loop"
# The scheduler job runner's handler, Airflow 2 and 3: no other process's stop is held.
_AIRFLOW_HANDLER = "_exit_gracefully"

Handler = Callable[[int, FrameType | None], Any]


class _Held:
    """The process's stop-signal handlers while the executor runs (signal handlers are per process)."""

    def __init__(self) -> None:
        self.owner = 0  # the pid that installed them: a forked child gets Airflow's behaviour
        self.originals: dict[int, Handler] = {}
        self.pending: tuple[int, FrameType | None] | None = None
        self.released = False
        self.delivered = False  # a stop went to Airflow's handler: it is under way
        self.timer: threading.Timer | None = None

    def install(self) -> None:
        for sig in _SIGNALS:
            current = signal.getsignal(sig)
            if (
                not callable(current)
                or current == self.handle
                or getattr(current, "__name__", "") != _AIRFLOW_HANDLER
            ):
                continue  # ours already, or not the scheduler's stop (a test's, Python's Ctrl-C): left alone
            self.originals[sig] = current
            signal.signal(sig, self.handle)
        self.owner = os.getpid()

    def handle(self, signum: int, frame: FrameType | None) -> None:
        original = self.originals.get(signum)
        if original is None:
            return
        if (
            os.getpid() != self.owner
            or self.released
            or self.pending is not None
            or _between_transactions(frame)
        ):
            self.deliver(original, signum, frame)
            return
        self.pending = (signum, frame)
        log.info(
            "%s received while the scheduler is inside its database work: it stops at the loop's next "
            "executor heartbeat, at most %.0fs from now",
            signal.Signals(signum).name,
            BOUND,
        )
        self.timer = threading.Timer(BOUND, _overdue, args=(signum,))
        self.timer.daemon = True
        self.timer.start()

    def deliver(self, original: Handler, signum: int, frame: FrameType | None) -> None:
        timer, self.timer = self.timer, None
        if timer is not None:
            timer.cancel()
        self.delivered = True
        original(signum, frame)  # Airflow's: raises SystemExit


_held = _Held()


def _between_transactions(frame: FrameType | None) -> bool:
    """Whether the main thread, interrupted in ``frame``, is in the scheduler loop's own frame with no
    database connection checked out: raising there interrupts no statement, guard or commit."""
    if frame is None or frame.f_code.co_name != _LOOP:
        return False
    from airflow import settings

    engine = getattr(settings, "engine", None)
    checked_out = getattr(getattr(engine, "pool", None), "checkedout", None)
    return callable(checked_out) and checked_out() == 0


def _overdue(signum: int) -> None:
    """The timer's thread: signal the main thread again, where the second signal is delivered at once."""
    if _held.pending is not None and not (_held.released or _held.delivered):
        signal.pthread_kill(threading.main_thread().ident or 0, signum)


def arm() -> None:
    """The executor starts: hold stop signals from now on (:func:`hold`), a stop before it forgotten."""
    _held.released = False
    _held.pending = None
    _held.delivered = False
    hold()


def hold() -> None:
    """Hold stop signals from now on, over whatever handlers the scheduler installed. Main thread only
    (elsewhere a no-op); idempotent, and cheap enough for every heartbeat: Airflow 2 installs its
    handlers after the executor's start, Airflow 3 before."""
    if threading.current_thread() is threading.main_thread():
        _held.install()


def deliver_held() -> None:
    """At a point between the scheduler's transactions (the executor's heartbeat): act on a held stop
    signal now. Raises what Airflow's handler raises (``SystemExit``); nothing when none is held."""
    pending = _held.pending
    if pending is None or os.getpid() != _held.owner or _held.released or _held.delivered:
        return
    signum, frame = pending
    original = _held.originals.get(signum)
    if original is not None:
        _held.deliver(original, signum, frame)


def release() -> None:
    """The executor stops: signals are delivered at once again (a second SIGTERM during the stop is
    Airflow's), and a held one's timer is cancelled: the stop it asked for is under way."""
    _held.released = True
    timer, _held.timer = _held.timer, None
    if timer is not None:
        timer.cancel()
