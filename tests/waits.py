"""Waiting, in every suite, for what sends no event: a file's content, ``/proc``, a database row.

One loop: it asks ``done`` every ``interval`` seconds and fails after ``guard`` seconds, a bound only a
hang reaches (each suite has its own: tests/core/helpers.py's for real children, tests/e2e/helpers.py's for
a real Airflow). Where there is an event (a line on a pipe, a pidfd, an anyio event), tests wait on that.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["poll"]


def poll(what: str, done: Callable[[], bool], guard: float, interval: float = 0.02) -> None:
    """Return once ``done()`` is true.

    :raises TimeoutError: it is still false after ``guard`` seconds (the message names ``what``)
    """
    deadline = time.monotonic() + guard
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {guard:g}s")
        time.sleep(interval)
