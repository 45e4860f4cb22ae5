"""How a running workload is stopped: the policy is data, so it can be configured and tested."""

from __future__ import annotations

import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class TerminationPolicy:
    """Signal the whole process group, wait ``grace`` seconds for it to exit, then SIGKILL the group.

    The supervisor always waits for the process to exit before it reports the outcome, so a terminated
    workload never has a final event while its process still runs.

    :param signal: the first signal sent to the process group
    :param grace: seconds between the first signal and SIGKILL
    """

    signal: signal.Signals = signal.SIGTERM
    grace: float = 10.0

    def __post_init__(self) -> None:
        if self.grace < 0:
            raise ValueError(f"grace must be >= 0, got {self.grace}")
