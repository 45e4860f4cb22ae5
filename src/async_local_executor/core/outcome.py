"""What a workload's end means: the :class:`Outcome` types and the pure rules that produce one.

Kept apart from the supervisor so the meaning of an exit (ours or its own, clean or not) can be read and
tested without processes or an event loop.
"""

from __future__ import annotations

import dataclasses
import enum
import signal
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TypeAlias

from async_local_executor.core.cgroups.limits import format_bytes
from async_local_executor.core.errors import ChildLost, LaunchError


class OutcomeKind(enum.Enum):
    EXITED = "exited"  # the process ended on its own, with an exit code
    SIGNALLED = "signalled"  # a signal we did not send ended it
    TERMINATED = "terminated"  # we stopped it (revoke, shutdown)
    LAUNCH_FAILED = "launch_failed"
    LOST = "lost"  # it ran, but how it ended can no longer be known
    NOT_STARTED = "not_started"  # dropped before it got a slot


@dataclass(frozen=True)
class Times:
    """Wall-clock times (seconds since the epoch) of one workload's life."""

    accepted: float
    launched: float | None = None  # None: it never got a process
    ended: float | None = None


@dataclass(frozen=True)
class Cleanup:
    """What a contained workload's cgroup held and used, read when its main process had exited.

    :param leftovers: processes still in the cgroup then (what the workload left behind)
    :param killed: how many of those were killed
    :param oom_kills: processes the kernel killed for exceeding the cgroup's memory limit
    :param memory_peak: the most memory (bytes) the cgroup used; None where it is not accounted
    :param cpu_seconds: CPU time the cgroup used; None where it is not accounted
    :param memory_limit: the cgroup's memory limit (bytes), None for none
    """

    leftovers: int = 0
    killed: int = 0
    oom_kills: int = 0
    memory_peak: int | None = None
    cpu_seconds: float | None = None
    memory_limit: int | None = None


@dataclass(frozen=True)
class Outcome:
    """The one final result of a workload.

    :param returncode: the exit status where a process ran (negative: killed by that signal)
    :param reason: a short human sentence; empty for a clean exit
    :param cleanup: what its cgroup held and used, for a contained workload
    """

    key: Hashable
    kind: OutcomeKind
    returncode: int | None = None
    reason: str = ""
    times: Times | None = None
    cleanup: Cleanup | None = None

    @property
    def ok(self) -> bool:
        return self.kind is OutcomeKind.EXITED and self.returncode == 0


# How supervision of a workload ended: its process's exit status (negative: the signal that killed it),
# the error that kept it from being launched or reaped, or None when it never got a process.
ExitStatus: TypeAlias = int | LaunchError | ChildLost | None


def describe_status(status: int) -> str:
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"killed by {name}"
    return f"exited with code {status}"


def classify(key: Hashable, status: ExitStatus, stop_reason: str | None) -> Outcome:
    """The outcome of a workload that ended with ``status``.

    :param stop_reason: why we stopped it, or None if we did not; a stopped process is ``TERMINATED``
        whatever its status, because its exit is our doing, not its own
    """
    if status is None:
        return Outcome(key, OutcomeKind.NOT_STARTED, reason=stop_reason or "")
    if isinstance(status, LaunchError):
        return Outcome(key, OutcomeKind.LAUNCH_FAILED, reason=str(status))
    if isinstance(status, ChildLost):
        return Outcome(key, OutcomeKind.LOST, reason=str(status))
    if stop_reason is not None:
        reason = f"{stop_reason}: terminated ({describe_status(status)})"
        return Outcome(key, OutcomeKind.TERMINATED, status, reason)
    if status < 0:
        return Outcome(key, OutcomeKind.SIGNALLED, status, describe_status(status))
    return Outcome(key, OutcomeKind.EXITED, status, "" if status == 0 else describe_status(status))


def internal_error(key: Hashable, error: Exception, *, launched: bool) -> Outcome:
    """The outcome of a workload whose supervision itself failed (a bug of ours or the launcher's).

    :param launched: whether a process existed; if it did, how it ended will never be read
    """
    kind = OutcomeKind.LOST if launched else OutcomeKind.LAUNCH_FAILED
    return Outcome(key, kind, reason=f"internal error: {error!r}")


def with_cleanup(outcome: Outcome, cleanup: Cleanup | None) -> Outcome:
    """``outcome`` with what its cgroup says (an OOM kill's reason, the leftovers killed); as is without one."""
    if cleanup is None:
        return outcome
    reason = outcome.reason
    if cleanup.oom_kills:
        limit = cleanup.memory_limit
        what = f"memory limit {format_bytes(limit)} exceeded" if limit is not None else "out of memory"
        reason = f"killed by the kernel: {what}" + (f" ({reason})" if reason else "")
    if cleanup.killed and not outcome.ok:
        reason += f"; {cleanup.killed} leftover processes killed"
    return dataclasses.replace(outcome, reason=reason, cleanup=cleanup)
