"""Tie a process's life to its parent's: nothing we launch may outlive the executor."""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
import threading

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` when our parent thread exits; report whether the parent is alive.

    The kernel fires on the exit of the *thread* that forked us, so a parent must fork from a thread
    that lives as long as it does. Checking the parent right after closes the race where it died
    before ``prctl`` ran: then we were already reparented and no signal will ever come.

    :param parent_pid: the pid we expect as parent; 0 skips the check
    :return: ``False`` when the parent is already gone
    """
    prctl(_PR_SET_PDEATHSIG, int(sig))
    return not parent_pid or os.getppid() == parent_pid


def outlive_parent() -> None:
    """Clear the parent-death signal, whoever armed it (a fork-server child has it armed by the helper).

    A workload that is handed over when its executor stops must outlive it; what ends it instead is
    :mod:`~async_local_executor.core.custody`'s watchdog.
    """
    prctl(_PR_SET_PDEATHSIG, 0)


def prctl(option: int, arg: int | bytes) -> None:
    """``prctl(2)`` with one argument; nothing off Linux, where the options used here do not exist."""
    if sys.platform.startswith("linux"):
        _libc().prctl(option, arg, 0, 0, 0)


@functools.cache
def _libc() -> ctypes.CDLL:
    # Loaded once, in the fork server before its first fork: every workload calls prctl twice as it
    # starts, and a CDLL made there cost 0.4 ms and 100 page faults of each (python -m benchmarks.entry_cost).
    return ctypes.CDLL(None, use_errno=True)


EXIT_ORPHANED = 3
# Which process's direct forks are tied to it (0: none); main_only (1): only forks from its main thread are.
_tie = {"owner": 0, "signal": int(signal.SIGKILL), "main_only": 0}
# Per forking thread, the pid its fork in progress was armed for. Per thread, because two threads' forks
# interleave: the before-fork hooks of one run while another's wait (the runtime's parks its loop
# thread), and a single value one thread disarmed left the other's child untied.
_armed: dict[int, int] = {}


def tie_direct_children(sig: int = signal.SIGKILL, *, main_thread_only: bool = False) -> None:
    """Make every process this process forks from now on die with it (only its direct children).

    The task SDK's supervisor forks the task process into a process group of its own, where signals to
    ours never reach it; without this, a supervisor killed outright (or dying with the executor)
    leaves its task process running as an orphan. Later forks by those children are left alone.
    Forks through ``os.fork`` (``multiprocessing``'s fork) only: ``subprocess`` runs no fork hooks.

    :param main_thread_only: tie only what the main thread forks. The kernel sends ``sig`` when the
        forking *thread* exits, so a child another thread forked would die with that thread, not
        with the process, where the process does not own every thread it runs
    """
    first = not _tie["owner"]
    _tie["owner"] = os.getpid()
    if first:
        os.register_at_fork(before=_arm, after_in_parent=_disarm, after_in_child=_tie_child)
    _tie["signal"] = int(sig)
    _tie["main_only"] = int(main_thread_only)


def _arm() -> None:
    mine = os.getpid() == _tie["owner"]
    if mine and _tie["main_only"]:
        mine = threading.current_thread() is threading.main_thread()
    if mine:
        _armed[threading.get_ident()] = os.getpid()


def _disarm() -> None:
    _armed.pop(threading.get_ident(), None)


def _tie_child() -> None:
    # The child runs as a copy of the forking thread, under the same ident.
    parent = _armed.pop(threading.get_ident(), 0)
    _armed.clear()
    if parent and not die_with_parent(parent, _tie["signal"]):
        os._exit(EXIT_ORPHANED)
