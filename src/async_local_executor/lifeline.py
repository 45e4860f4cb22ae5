"""Tie a process's life to its parent's: nothing we launch may outlive the executor."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` when our parent thread exits; report whether the parent is alive.

    The kernel fires on the exit of the *thread* that forked us, so a parent must fork from a thread
    that lives as long as it does. Checking the parent right after closes the race where it died
    before ``prctl`` ran: then we were already reparented and no signal will ever come.

    :param parent_pid: the pid we expect as parent; 0 skips the check
    :return: ``False`` when the parent is already gone
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    return not parent_pid or os.getppid() == parent_pid
