"""The executor's own failures; bad arguments stay ``ValueError`` / ``TypeError``."""

from __future__ import annotations

import errno
from typing import Final


class AsyncLocalExecutorError(Exception):
    """Base class for every error this package raises on purpose."""


class LaunchError(AsyncLocalExecutorError):
    """A workload could not be turned into a running process."""


class DescriptorsFull(LaunchError):
    """A launch found the descriptor table full (``EMFILE``, or the system's: ``ENFILE``): a capacity
    reached, so the workload waits for a running one to end, like one over the workload limit."""


class ChildLost(AsyncLocalExecutorError):
    """A launched process ended but its exit status can no longer be read (something else reaped it)."""


class InvalidTransition(AsyncLocalExecutorError):
    """A workload's lifecycle was asked to move along an edge it does not have."""


class RuntimeNotRunning(AsyncLocalExecutorError):
    """The event-loop thread is not running, so no workload can be accepted."""


class Released(AsyncLocalExecutorError):
    """The child was handed over alive: it runs on, no longer supervised here, and has no exit status for us."""


# A descriptor table full: the process's own (EMFILE) or the system's (ENFILE).
FULL: Final[frozenset[int]] = frozenset({errno.EMFILE, errno.ENFILE})


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` says a descriptor table (the process's, or the system's) is full."""
    return isinstance(exc, OSError) and exc.errno in FULL


def launch_error(what: str, exc: OSError) -> LaunchError:
    """The error of a launch that could not ``what``: :class:`DescriptorsFull` when the table was full."""
    message = f"{what}: {exc.strerror or exc}"
    return DescriptorsFull(message) if is_full(exc) else LaunchError(message)
