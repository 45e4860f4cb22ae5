"""Admits workloads under a limit, launches them, awaits their exits and reports one outcome each.

Runs entirely on one event loop and knows nothing of Airflow: a workload is a :class:`LaunchRequest`
with an opaque key, and the result is an :class:`Outcome`. Every method here must be called from the
loop's own thread; :mod:`async_local_executor.core.runtime` is what crosses threads.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import itertools
import logging
import math
import signal
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import anyio.abc
import psutil

from async_local_executor.core.errors import ChildLost, LaunchError
from async_local_executor.core.launchers.base import Child, Launcher, LaunchRequest
from async_local_executor.core.lifecycle import Lifecycle, Phase, Step
from async_local_executor.core.termination import TerminationPolicy

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
MB = 1024 * 1024
# Launch failures kept for the health check and the status report.
RECENT_FAILURES = 20


def _available_memory() -> int:
    return int(psutil.virtual_memory().available)


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
class Outcome:
    """The one final result of a workload.

    :param returncode: the exit status where a process ran (negative: killed by that signal)
    :param reason: a short human sentence; empty for a clean exit
    """

    key: Hashable
    kind: OutcomeKind
    returncode: int | None = None
    reason: str = ""
    times: Times | None = None

    @property
    def ok(self) -> bool:
        return self.kind is OutcomeKind.EXITED and self.returncode == 0


@dataclass(frozen=True)
class RunningWorkload:
    label: str
    pid: int
    launched: float  # wall clock
    group: str


@dataclass(frozen=True)
class LaunchFailure:
    at: float  # wall clock
    label: str
    reason: str


@dataclass(frozen=True)
class SupervisorState:
    """What the supervisor is doing, as of one moment; built on the loop thread, read anywhere."""

    running: tuple[RunningWorkload, ...]
    waiting: int  # accepted, no process yet (waiting for a slot, for memory, or being launched)
    oldest_waiting_since: float | None  # wall clock acceptance of the longest-waiting one
    memory_low: bool
    memory_floor: int  # bytes; 0 when the guard is off
    available_memory: int | None  # bytes, as last read by the guard
    launcher_problem: str | None
    recent_failures: tuple[LaunchFailure, ...]
    launched_total: int
    last_launched_at: float | None  # wall clock of the latest successful launch
    memory_waits_total: int  # workloads that had to wait for memory
    outcomes_total: Mapping[str, int]  # OutcomeKind value (or "ok") -> count


class Listener(Protocol):
    """Told about each workload; called on the loop thread, so it must not block."""

    def started(self, key: Hashable, pid: int) -> None: ...

    def finished(self, outcome: Outcome) -> None: ...


@dataclass(eq=False)
class _Tracked:
    request: LaunchRequest
    life: Lifecycle = field(default_factory=Lifecycle)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    child: Child | None = None
    stop_reason: str | None = None  # set once we decide to stop it
    exited: anyio.Event = field(default_factory=anyio.Event)
    deadline: anyio.CancelScope | None = None  # the timeout's timer, while one runs
    accepted: float = field(default_factory=time.time)
    launched: float | None = None


def describe_status(status: int) -> str:
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"killed by {name}"
    return f"exited with code {status}"


class Supervisor:
    """Owns every child of one executor.

    :param launcher: turns requests into processes
    :param listener: receives ``started`` and ``finished`` events
    :param limit: at most this many workloads hold a slot (launching or running) at once;
        ``None`` for no limit
    :param policy: how a workload is stopped on revoke or shutdown
    :param sleep: the clock used to wait out the grace period; tests inject one that does not wait
    :param group_limits: at most this many workloads of each named group hold a slot at once
    :param memory_floor: bytes of available memory below which admitted workloads wait before
        launching (they never fail for it); 0 turns the guard off
    :param available_memory: reads the host's available memory in bytes
    :param memory_poll: seconds between two reads while memory is low
    """

    def __init__(
        self,
        launcher: Launcher,
        listener: Listener,
        *,
        limit: int | None,
        policy: TerminationPolicy | None = None,
        sleep: Sleep = anyio.sleep,
        group_limits: Mapping[str, int] | None = None,
        memory_floor: int = 0,
        available_memory: Callable[[], int] = _available_memory,
        memory_poll: float = 1.0,
    ) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {limit}")
        for group, group_limit in (group_limits or {}).items():
            if group_limit < 1:
                raise ValueError(f"limit of group {group!r} must be >= 1, got {group_limit}")
        self._group_limiters = {
            group: anyio.CapacityLimiter(group_limit) for group, group_limit in (group_limits or {}).items()
        }
        self._saturated: set[str] = set()
        self._memory_floor = memory_floor
        self._available_memory = available_memory
        self._memory_poll = memory_poll
        self._memory_low = False
        self._last_available: int | None = None
        self._launcher = launcher
        self._failures: collections.deque[LaunchFailure] = collections.deque(maxlen=RECENT_FAILURES)
        self._launched_total = 0
        self._last_launched_at: float | None = None
        self._memory_waits_total = 0
        self._outcomes_total: collections.Counter[str] = collections.Counter()
        self._listener = listener
        self._limiter = anyio.CapacityLimiter(math.inf if limit is None else limit)
        self._policy = policy or TerminationPolicy()
        self._sleep = sleep
        self._tracked: dict[int, _Tracked] = {}
        self._serials = itertools.count()
        self._accepting = True
        self._idle = anyio.Event()
        self._idle.set()
        self._closed = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None

    @property
    def in_flight(self) -> int:
        """Workloads accepted and not finished."""
        return len(self._tracked)

    def state(self) -> SupervisorState:
        """A snapshot for health checks and status reports. Loop thread only; O(workloads)."""
        running: list[RunningWorkload] = []
        waiting = 0
        oldest: float | None = None
        for tracked in self._tracked.values():
            child, launched = tracked.child, tracked.launched
            if child is not None and launched is not None:
                request = tracked.request
                running.append(
                    RunningWorkload(request.label or str(request.key), child.pid, launched, request.group)
                )
            elif not tracked.life.finished:
                waiting += 1
                oldest = tracked.accepted if oldest is None else min(oldest, tracked.accepted)
        return SupervisorState(
            running=tuple(running),
            waiting=waiting,
            oldest_waiting_since=oldest,
            memory_low=self._memory_low,
            memory_floor=self._memory_floor,
            available_memory=self._last_available,
            launcher_problem=getattr(self._launcher, "problem", None),
            recent_failures=tuple(self._failures),
            launched_total=self._launched_total,
            last_launched_at=self._last_launched_at,
            memory_waits_total=self._memory_waits_total,
            outcomes_total=dict(self._outcomes_total),
        )

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until :meth:`shutdown` has finished every workload."""
        async with self._launcher, anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await self._closed.wait()
        self._tg = None

    def submit(self, request: LaunchRequest) -> None:
        """Accept one workload; its outcome always arrives through the listener, exactly once."""
        if self._tg is None:
            raise RuntimeError("supervisor is not serving")
        tracked = _Tracked(request)
        if not self._accepting:
            self._finish(
                tracked,
                Outcome(request.key, OutcomeKind.NOT_STARTED, reason="executor is shutting down"),
                Step.DROP,
            )
            return
        serial = next(self._serials)
        self._tracked[serial] = tracked
        if self._idle.is_set():
            self._idle = anyio.Event()
        self._tg.start_soon(self._supervise, serial, tracked, name=f"workload {request.label or request.key}")

    def stop(self, key: Hashable, reason: str) -> int:
        """Stop every workload with ``key``: drop it if it has no slot yet, else terminate it.

        :return: how many workloads were affected
        """
        matches = [t for t in self._tracked.values() if t.request.key == key]
        for tracked in matches:
            self._stop(tracked, reason)
        return len(matches)

    async def shutdown(self, wait: float) -> None:
        """Stop accepting, give running workloads ``wait`` seconds to finish, then stop the rest."""
        self._accepting = False
        with anyio.move_on_after(wait):
            await self._idle.wait()
        for tracked in list(self._tracked.values()):
            self._stop(tracked, "executor shut down")
        await self._idle.wait()
        self._closed.set()

    def _stop(self, tracked: _Tracked, reason: str) -> None:
        if tracked.stop_reason is not None:
            return
        tracked.stop_reason = reason
        phase = tracked.life.phase
        if phase is Phase.QUEUED:
            tracked.scope.cancel()
            self._finish(
                tracked, Outcome(tracked.request.key, OutcomeKind.NOT_STARTED, reason=reason), Step.DROP
            )
        elif phase is Phase.RUNNING:
            self._terminate(tracked)
        # LAUNCHING: _supervise terminates it as soon as the launch returns.

    def _terminate(self, tracked: _Tracked) -> None:
        tracked.life.advance(Step.TERMINATE)
        assert self._tg is not None
        self._tg.start_soon(self._escalate, tracked)

    async def _escalate(self, tracked: _Tracked) -> None:
        child = tracked.child
        assert child is not None
        child.signal(self._policy.signal)
        async with anyio.create_task_group() as tg:

            async def kill_after_grace() -> None:
                await self._sleep(self._policy.grace)
                log.warning(
                    "workload %s (pid %d) still running %.1fs after %s; sending SIGKILL",
                    tracked.request.label or tracked.request.key,
                    child.pid,
                    self._policy.grace,
                    self._policy.signal.name,
                )
                child.signal(signal.SIGKILL)

            tg.start_soon(kill_after_grace)
            await tracked.exited.wait()
            tg.cancel_scope.cancel()

    def _group_slot(self, request: LaunchRequest) -> contextlib.AbstractAsyncContextManager[object]:
        # Taken before the executor-wide slot, so a workload held back by its group's limit does not
        # also hold a slot another group could use.
        limiter = self._group_limiters.get(request.group)
        if limiter is None:
            return contextlib.nullcontext()
        if limiter.available_tokens < 1:
            if request.group not in self._saturated:
                self._saturated.add(request.group)
                log.info(
                    "queue %r is at its limit of %d running workloads; its next ones wait",
                    request.group,
                    int(limiter.total_tokens),
                )
        else:
            self._saturated.discard(request.group)
        return limiter

    async def _wait_for_memory(self, request: LaunchRequest) -> None:
        if not self._memory_floor:
            return
        waited = False
        while (available := self._available_memory()) < self._memory_floor:
            self._last_available = available
            if not waited:
                waited = True
                self._memory_waits_total += 1
            if not self._memory_low:
                self._memory_low = True
                log.warning(
                    "available memory %d MB is below the floor of %d MB; workload %s and the ones "
                    "after it wait to launch",
                    available // MB,
                    self._memory_floor // MB,
                    request.label or request.key,
                )
            await self._sleep(self._memory_poll)
        self._last_available = available
        if self._memory_low:
            self._memory_low = False
            log.warning("available memory is back above %d MB; launching again", self._memory_floor // MB)

    async def _enforce_timeout(self, tracked: _Tracked, limit: float) -> None:
        assert tracked.deadline is not None
        with tracked.deadline:  # cancelled when the workload ends, even before this task first runs
            await self._sleep(limit)
            if not tracked.exited.is_set():
                log.warning(
                    "workload %s ran longer than its %gs timeout; terminating it",
                    tracked.request.label or tracked.request.key,
                    limit,
                )
                self._stop(tracked, f"timed out after {limit:g}s")

    async def _supervise(self, serial: int, tracked: _Tracked) -> None:
        request = tracked.request
        try:
            with tracked.scope:
                async with self._group_slot(request), self._limiter:
                    if tracked.life.finished:  # dropped before this task first ran
                        return
                    await self._wait_for_memory(request)
                    tracked.life.advance(Step.ADMIT)
                    try:
                        child = await self._launcher.launch(request)
                    except LaunchError as exc:
                        self._finish(
                            tracked,
                            Outcome(request.key, OutcomeKind.LAUNCH_FAILED, reason=str(exc)),
                            Step.LAUNCH_FAILED,
                        )
                        return
                    tracked.child = child
                    tracked.launched = self._last_launched_at = time.time()
                    self._launched_total += 1
                    tracked.life.advance(Step.LAUNCHED)
                    self._listener.started(request.key, child.pid)
                    if tracked.stop_reason is not None:
                        self._terminate(tracked)
                    elif request.timeout is not None:
                        assert self._tg is not None
                        tracked.deadline = anyio.CancelScope()
                        self._tg.start_soon(self._enforce_timeout, tracked, request.timeout)
                    # Shielded: once a process exists, only its exit may end this wait, or the workload
                    # would lose its final event and the process its reaper.
                    with anyio.CancelScope(shield=True):
                        try:
                            status = await child.wait()
                        except ChildLost as exc:
                            tracked.exited.set()
                            self._finish(
                                tracked, Outcome(request.key, OutcomeKind.LOST, reason=str(exc)), Step.EXIT
                            )
                            return
                    tracked.exited.set()
                    if tracked.stop_reason is not None:
                        outcome = Outcome(
                            request.key,
                            OutcomeKind.TERMINATED,
                            status,
                            f"{tracked.stop_reason}: terminated ({describe_status(status)})",
                        )
                    elif status < 0:
                        outcome = Outcome(request.key, OutcomeKind.SIGNALLED, status, describe_status(status))
                    else:
                        reason = "" if status == 0 else describe_status(status)
                        outcome = Outcome(request.key, OutcomeKind.EXITED, status, reason)
                    self._finish(tracked, outcome, Step.EXIT)
        except Exception as exc:
            # A bug of ours or the launcher's must still end in a final event, not in silence.
            log.exception("supervising workload %s failed", request.label or request.key)
            if not tracked.life.finished:
                tracked.life.phase = Phase.FINISHED
                if tracked.child is None:
                    kind = OutcomeKind.LAUNCH_FAILED
                else:
                    # It runs with nothing left to reap it or report its exit: kill its group, so the
                    # task is not still running (and reporting) after its final event says failed.
                    kind = OutcomeKind.LOST
                    if not tracked.exited.is_set():
                        with contextlib.suppress(OSError):
                            tracked.child.signal(signal.SIGKILL)
                outcome = Outcome(request.key, kind, reason=f"internal error: {exc!r}")
                self._count(tracked, outcome)
                self._listener.finished(
                    dataclasses.replace(outcome, times=Times(tracked.accepted, tracked.launched, time.time()))
                )
        finally:
            if tracked.deadline is not None:
                tracked.deadline.cancel()  # else a long timeout's timer would hold up shutdown
            self._tracked.pop(serial, None)
            if not self._tracked:
                self._idle.set()

    def _finish(self, tracked: _Tracked, outcome: Outcome, step: Step) -> None:
        tracked.life.advance(step)
        self._count(tracked, outcome)
        times = Times(tracked.accepted, tracked.launched, time.time())
        self._listener.finished(dataclasses.replace(outcome, times=times))

    def _count(self, tracked: _Tracked, outcome: Outcome) -> None:
        self._outcomes_total["ok" if outcome.ok else outcome.kind.value] += 1
        if outcome.kind is OutcomeKind.LAUNCH_FAILED:
            label = tracked.request.label or str(tracked.request.key)
            self._failures.append(LaunchFailure(time.time(), label, outcome.reason))
