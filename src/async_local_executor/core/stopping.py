"""How a running workload is stopped: the policy (signal, grace, SIGKILL), its escalation, and the
run-time limit that calls for a stop.

The rule: a stop ends when the process exits, never when a signal has merely been sent. The supervisor
reports a stopped workload only once its process is gone, and every wait here runs on the injected
clock, so a test drives the grace period and the timeout by hand.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from async_local_executor.core.clock import Clock
from async_local_executor.core.launchers.base import Child

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TerminationPolicy:
    """Signal the whole process group, wait ``grace`` seconds for it to exit, then SIGKILL the group.

    :param signal: the first signal sent to the process group
    :param grace: seconds between the first signal and SIGKILL
    """

    signal: signal.Signals = signal.SIGTERM
    grace: float = 10.0

    def __post_init__(self) -> None:
        if self.grace < 0:
            raise ValueError(f"grace must be >= 0, got {self.grace}")


async def escalate(
    child: Child, exited: anyio.Event, policy: TerminationPolicy, clock: Clock, label: object
) -> None:
    """Signal ``child``'s group, and SIGKILL it if ``exited`` is not set within the grace period (at once
    for a grace of 0).

    :param label: names the workload in the log
    """
    child.signal(policy.signal)
    with clock.move_on_after(policy.grace) as grace:
        await exited.wait()
    if grace.cancelled_caught and not exited.is_set():
        log.warning(
            "workload %s (pid %d) still running %.1fs after %s; sending SIGKILL",
            label,
            child.pid,
            policy.grace,
            policy.signal.name,
        )
        child.signal(signal.SIGKILL)


class Deadline:
    """A workload's run-time limit: calls ``expire`` with the reason once ``limit`` seconds of ``clock``
    have passed, unless the workload has exited (``exited`` is set) or the deadline was cancelled.

    ``limit`` may be spent already (0 or less: an adopted workload whose limit ran out ``-limit``
    seconds before its adoption); ``expire`` is then called at once.

    Cancelling works even before :meth:`run` first runs, so a workload that exits at once does not leave
    a timer behind to hold up shutdown.

    :param label: names the workload in the log
    """

    def __init__(
        self,
        limit: float,
        *,
        clock: Clock,
        exited: anyio.Event,
        expire: Callable[[str], None],
        label: object,
    ) -> None:
        self.limit = limit
        self._clock = clock
        self._exited = exited
        self._expire = expire
        self._label = label
        self._scope = anyio.CancelScope()

    async def run(self) -> None:
        with self._scope:
            await self._clock.sleep(max(0.0, self.limit))
            if self._exited.is_set():
                return
            if self.limit > 0:
                log.warning(
                    "workload %s ran longer than its %gs timeout; terminating it", self._label, self.limit
                )
                self._expire(f"timed out after {self.limit:g}s")
            else:
                spent = max(0.0, -self.limit)  # never "-0.0"
                log.warning(
                    "workload %s ran longer than its timeout, which ran out %.1fs before this executor took "
                    "it over; terminating it",
                    self._label,
                    spent,
                )
                self._expire(f"timed out {spent:.1f}s before its adoption")

    def cancel(self) -> None:
        self._scope.cancel()
