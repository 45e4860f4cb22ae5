"""Where a scheduler stop lands: between the scheduler loop's database transactions, not inside one.

Airflow's scheduler stops on SIGTERM and SIGINT by raising ``SystemExit`` from its signal handler, at
whatever line its main thread is on. Landing inside a database call, that leaves the process unable to
record its own end, and the scheduler exits 1 instead of 0 (docs/design.md, "A stop lands between
transactions", has the cases and how often they happened):

- inside a statement: SQLAlchemy invalidates the connection, but SQLite (Python 3.11's ``sqlite3`` closes
  with ``sqlite3_close_v2``) keeps a connection whose statement is still referenced open as a zombie,
  with its write lock, until that statement is freed; the traceback in flight holds it. Every other
  writer (the api-server's task heartbeats, the dag-processor) fails with "database is locked" for as
  long as the executor's stop lasts, and so does the scheduler's final update of its job row;
- inside the critical section's ``prohibit_commit`` guard as it is entered: the guard's listener stays on
  the thread's session, and that final update raises "UNEXPECTED COMMIT - THIS WILL BREAK HA LOCKS!".

So while the executor runs, a stop signal that finds the scheduler's main thread anywhere but in its
loop's own frame (its idle sleep, or between two of its calls: no statement runs there, and a session
the loop holds open is closed by its ``with`` block) is held, and delivered (Airflow's own handler
called) at the executor's next heartbeat, which the loop calls outside its database calls. A second
signal, or one still held after :data:`BOUND` seconds, is delivered at once, as Airflow alone would: a
stuck loop still stops.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["BOUND", "arm", "deliver_held", "hold", "release"]

log = logging.getLogger(__name__)

BOUND = 5.0
"""Seconds a stop signal may be held before it is delivered wherever the scheduler's thread is."""

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# The scheduler loop's own frame (Airflow 2 and 3): a signal there is delivered at once.
LOOP = "_run_scheduler_loop"
# The scheduler job runner's stop handler (Airflow 2 and 3): no other handler is held over.
AIRFLOW_HANDLER = "_exit_gracefully"

Handler = Callable[[int, FrameType | None], Any]


class _Held:
    """The process's stop-signal handlers while the executor runs (signal handlers are per process).

    The signal handler only reads and sets plain attributes (it runs on the main thread, between any two
    of its bytecodes, so it takes no lock and starts no thread); the watcher thread, started at the
    executor's start, delivers a signal held past the bound, under :attr:`lock` with the normal code.
    """

    def __init__(self) -> None:
        self.owner = 0  # the pid that installed them: a forked child gets Airflow's behaviour
        self.originals: dict[int, Handler] = {}
        self.pending = 0  # the signal held, 0: none
        self.deadline = 0.0  # monotonic: when a held signal is delivered wherever the thread is
        self.delivered = False  # a stop went to Airflow's handler: it is under way
        self.released = False  # the executor stops: signals go to Airflow's handler at once
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.watcher: threading.Thread | None = None

    def install(self) -> None:
        for sig in _SIGNALS:
            current = signal.getsignal(sig)
            if (
                not callable(current)
                or current == self.handle
                or getattr(current, "__name__", "") != AIRFLOW_HANDLER
            ):
                continue  # ours already, or not the scheduler's stop (a test's, Python's Ctrl-C): left alone
            self.originals[sig] = current
            signal.signal(sig, self.handle)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        original = self.originals.get(signum)
        if original is None:
            return
        if os.getpid() != self.owner or self.released or self.pending or _in_loop(frame):
            self.deliver(original, signum)
            return
        self.deadline = time.monotonic() + BOUND  # before pending: the watcher reads them in that order
        self.pending = signum
        self.wake.set()  # only the watcher waits on it: no lock the interrupted thread could hold

    def deliver(self, original: Handler, signum: int) -> None:
        self.delivered = True
        original(signum, None)  # Airflow's: raises SystemExit

    def watch(self) -> None:
        """The watcher thread: signal the main thread again once a held signal's bound has passed; the
        handler then finds one held and delivers it."""
        announced = 0
        while True:
            self.wake.wait()
            self.wake.clear()
            while True:
                with self.lock:
                    signum = self.pending
                    if not signum or self.delivered or self.released:
                        announced = 0
                        break
                    announce, announced = signum != announced, signum
                    left = self.deadline - time.monotonic()
                    if left <= 0:
                        signal.pthread_kill(threading.main_thread().ident or 0, signum)
                        break
                if announce:  # logged here, not in the handler, where a log call could deadlock
                    log.info(
                        "%s received while the scheduler is inside a call of its loop: it stops at the "
                        "loop's next executor heartbeat, or in %.0fs wherever it is",
                        signal.Signals(signum).name,
                        BOUND,
                    )
                if self.wake.wait(left):  # a change meanwhile: look again
                    self.wake.clear()


_held = _Held()


def _in_loop(frame: FrameType | None) -> bool:
    """Whether the main thread was interrupted in the scheduler loop's own frame: not inside one of its
    calls, so no statement, guard or commit is cut short."""
    return frame is not None and frame.f_code.co_name == LOOP


def arm() -> None:
    """An executor starts in this process: hold stop signals from now on (:func:`hold`).

    A stop held for an executor of this process that still runs (teams start one after another) stays
    held; after every executor of the process stopped (a test's next one), the slate is clean.
    """
    with _held.lock:
        if _held.released or _held.owner != os.getpid():
            _held.pending, _held.delivered, _held.released = 0, False, False
        _held.owner = os.getpid()
        if _held.watcher is None or not _held.watcher.is_alive():
            _held.watcher = threading.Thread(target=_held.watch, name="ale-stop-signals", daemon=True)
            _held.watcher.start()
    hold()


def hold() -> None:
    """Hold stop signals from now on, over whatever handlers the scheduler installed. Main thread only
    (elsewhere a no-op); idempotent, and cheap enough for every call: Airflow 2 installs its handlers
    after the executor's start, Airflow 3 before."""
    if threading.current_thread() is threading.main_thread():
        _held.install()


def deliver_held() -> None:
    """At a point between the scheduler's database calls (the executor's heartbeat): act on a held stop
    signal now. Raises what Airflow's handler raises (``SystemExit``); nothing when none is held."""
    with _held.lock:
        signum = _held.pending
        if not signum or os.getpid() != _held.owner or _held.released or _held.delivered:
            return
        _held.delivered = True  # the watcher sends nothing more
    original = _held.originals.get(signum)
    if original is not None:
        original(signum, None)


def release() -> None:
    """The executor stops: signals go to Airflow's handler at once again (a second SIGTERM during the
    stop is Airflow's), and a held one is not delivered by the watcher: the stop it asked for is under
    way."""
    with _held.lock:
        _held.released = True
        if _held.pending and not _held.delivered:
            log.debug("the held %s is dropped: the executor stops anyway", signal.Signals(_held.pending).name)
    _held.wake.set()
