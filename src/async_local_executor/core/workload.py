"""The supervisor's record of one accepted workload, from acceptance to its final event."""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio

from async_local_executor.core.launchers.base import Child, LaunchRequest
from async_local_executor.core.lifecycle import Lifecycle
from async_local_executor.core.stopping import Deadline


@dataclass(eq=False)
class Workload:
    """Loop thread only. Identity, not value, tells two records apart: keys may repeat."""

    request: LaunchRequest
    accepted: float  # wall clock
    lifecycle: Lifecycle = field(default_factory=Lifecycle)  # its phase; the only way a phase changes
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)  # cancelled to drop it unlaunched
    child: Child | None = None
    stop_reason: str | None = None  # set once we decide to stop it
    timed_out: bool = False  # stopped because its run-time limit ran out
    escalation: anyio.CancelScope | None = None  # its stop's signals, while they are being sent
    # When its SIGKILL is due (the clock's monotonic time), once a stop for its run-time limit began here
    # or before its handover; what is left of it travels with it if it is let go meanwhile.
    kill_at: float | None = None
    exited: anyio.Event = field(default_factory=anyio.Event)  # set once its process's exit is known
    deadline: Deadline | None = None  # the timeout's timer, while one runs
    launched: float | None = None  # wall clock
    exit_awaited: bool = False  # its process is being awaited (or was): it must not be awaited twice
    # While its launch is held back for want of descriptors: cancelled by a stop, which ends the wait.
    held_back: anyio.CancelScope | None = None

    @property
    def label(self) -> str:
        return self.request.label or str(self.request.key)

    @property
    def adopted(self) -> bool:
        """It runs already, launched by another executor (its request's ``takeover``)."""
        return self.request.takeover is not None
