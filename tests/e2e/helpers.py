"""What the end-to-end tests share: waiting on Airflow's state, and reading processes from /proc."""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

GUARD = 600.0


def poll(what: str, done: Callable[[], bool], guard: float = GUARD) -> None:
    # Airflow's state lives in the database and in /proc; polling them is the only way to observe it.
    deadline = time.monotonic() + guard
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {guard:.0f}s")
        time.sleep(0.2)


def cmdline(pid: int) -> list[str]:
    try:
        return list(psutil.Process(pid).cmdline())
    except psutil.Error:
        return []


def alive(pid: int) -> bool:
    """Running; a zombie (killed, not yet reaped by its new parent) runs nothing any more."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
