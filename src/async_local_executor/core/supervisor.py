"""Takes each workload from acceptance to its one outcome: admit, launch, await the exit, report.

Runs entirely on one event loop and knows nothing of Airflow: a workload is a :class:`LaunchRequest`
with an opaque key, and the result is an :class:`Outcome`. Every method here must be called from the
loop's own thread; :mod:`async_local_executor.core.runtime` is what crosses threads.

The parts live beside it: who may launch (:mod:`.admission`), how a workload is stopped
(:mod:`.escalation`), its run-time limit (:mod:`.timeouts`), awaiting its process (:mod:`.reaping`),
what its end means (:mod:`.outcome`), and its phases (:mod:`.lifecycle`). This module sequences them
for each workload.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import signal
from collections.abc import Callable, Hashable, Mapping
from typing import Protocol

import anyio
import anyio.abc

from async_local_executor.core.admission import Admission, host_available_memory
from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.contained import contained_outcome
from async_local_executor.core.errors import LaunchError
from async_local_executor.core.escalation import escalate
from async_local_executor.core.launchers.base import Child, Launcher, LaunchRequest
from async_local_executor.core.lifecycle import Phase, Step
from async_local_executor.core.outcome import (
    ExitStatus,
    Outcome,
    Times,
    classify,
    internal_error,
)
from async_local_executor.core.reaping import reap, reap_abandoned
from async_local_executor.core.state import RunningWorkload, SupervisorState, Tally, snapshot
from async_local_executor.core.termination import TerminationPolicy
from async_local_executor.core.timeouts import Deadline
from async_local_executor.core.tracked import Tracked

__all__ = ["Listener", "Supervisor"]

log = logging.getLogger(__name__)


class Listener(Protocol):
    """Told about each workload; called on the loop thread, so it must not block."""

    def started(self, key: Hashable, pid: int) -> None: ...

    def finished(self, outcome: Outcome) -> None: ...


class Supervisor:
    """Owns every child of one executor.

    :param launcher: turns requests into processes
    :param listener: receives ``started`` and ``finished`` events
    :param limit: at most this many workloads hold a slot (launching or running) at once;
        ``None`` for no limit
    :param policy: how a workload is stopped on revoke or shutdown
    :param group_limits: at most this many workloads of each named group hold a slot at once
    :param memory_floor: bytes of available memory below which admitted workloads wait before
        launching (they never fail for it); 0 turns the guard off
    :param available_memory: reads the host's available memory in bytes
    :param memory_poll: seconds between two reads while memory is low
    :param clock: the wall time stamped on workloads, and what grace periods, timeouts and memory polls
        wait on; tests inject one they drive by hand
    """

    def __init__(
        self,
        launcher: Launcher,
        listener: Listener,
        *,
        limit: int | None,
        policy: TerminationPolicy | None = None,
        group_limits: Mapping[str, int] | None = None,
        memory_floor: int = 0,
        available_memory: Callable[[], int] = host_available_memory,
        memory_poll: float = 1.0,
        clock: Clock = SYSTEM,
    ) -> None:
        self._admission = Admission(
            limit=limit,
            group_limits=group_limits,
            memory_floor=memory_floor,
            available_memory=available_memory,
            memory_poll=memory_poll,
            clock=clock,
        )
        self._launcher = launcher
        self._listener = listener
        self._policy = policy or TerminationPolicy()
        self._clock = clock
        self._tally = Tally()
        self._tracked: dict[int, Tracked] = {}
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
                cgroup = getattr(child, "cgroup", None)
                running.append(
                    RunningWorkload(tracked.label, child.pid, launched, tracked.request.group, cgroup)
                )
            elif not tracked.life.finished:
                waiting += 1
                oldest = tracked.accepted if oldest is None else min(oldest, tracked.accepted)
        launcher = self._launcher
        problem = getattr(launcher, "problem", None)
        described = getattr(launcher, "state", None)
        preload = getattr(launcher, "preload", None)
        return snapshot(
            tuple(running), waiting, oldest, self._admission, self._tally, problem, described, preload
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
        tracked = Tracked(request, accepted=self._clock.time())
        if not self._accepting:
            tracked.stop_reason = "executor is shutting down"
            self._end(tracked, None, Step.DROP)
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
        with self._clock.move_on_after(wait):
            await self._idle.wait()
        for tracked in list(self._tracked.values()):
            self._stop(tracked, "executor shut down")
        await self._idle.wait()
        self._closed.set()

    async def _supervise(self, serial: int, tracked: Tracked) -> None:
        try:
            with tracked.scope:
                async with self._admission.slot(tracked.request):
                    if tracked.life.finished:  # dropped before this task first ran
                        return
                    await self._admission.wait_for_memory(tracked.request)
                    tracked.life.advance(Step.ADMIT)
                    child = await self._launch(tracked)
                    if child is not None:
                        tracked.reaping = True
                        status = await reap(child)
                        tracked.exited.set()
                        self._end(tracked, status, Step.EXIT)
        except Exception as exc:
            # A bug of ours or the launcher's must still end in a final event, not in silence.
            log.exception("supervising workload %s failed", tracked.label)
            try:
                self._abandon(tracked, exc)
            except Exception:
                log.exception("reporting the internal error of workload %s failed too", tracked.label)
            if tracked.child is not None and not tracked.reaping:
                # Killed by _abandon, its outcome reported: awaited only so its pipes are closed.
                await reap_abandoned(tracked.child, tracked.label)
        finally:
            if tracked.deadline is not None:
                tracked.deadline.cancel()  # else a long timeout's timer would hold up shutdown
            self._tracked.pop(serial, None)
            if not self._tracked:
                self._idle.set()

    async def _launch(self, tracked: Tracked) -> Child | None:
        """Start the process and arm its stop or its timeout; None if it could not be started."""
        request = tracked.request
        try:
            child = await self._launcher.launch(request)
        except LaunchError as exc:
            self._end(tracked, exc, Step.LAUNCH_FAILED)
            return None
        tracked.child = child
        tracked.launched = now = self._clock.time()
        self._tally.launched(now)
        tracked.life.advance(Step.LAUNCHED)
        self._listener.started(request.key, child.pid)
        if tracked.stop_reason is not None:  # stopped while it was launching
            self._terminate(tracked)
        elif request.timeout is not None:
            assert self._tg is not None
            tracked.deadline = Deadline(
                request.timeout,
                clock=self._clock,
                exited=tracked.exited,
                expire=lambda reason: self._stop(tracked, reason),
                label=request.label or request.key,
            )
            self._tg.start_soon(tracked.deadline.run)
        return child

    def _stop(self, tracked: Tracked, reason: str) -> None:
        if tracked.stop_reason is not None:
            return
        tracked.stop_reason = reason
        phase = tracked.life.phase
        if phase is Phase.QUEUED:
            tracked.scope.cancel()
            self._end(tracked, None, Step.DROP)
        elif phase is Phase.RUNNING:
            self._terminate(tracked)
        # LAUNCHING: _launch terminates it as soon as the launch returns.

    def _terminate(self, tracked: Tracked) -> None:
        tracked.life.advance(Step.TERMINATE)
        assert self._tg is not None
        assert tracked.child is not None
        label = tracked.request.label or tracked.request.key
        self._tg.start_soon(escalate, tracked.child, tracked.exited, self._policy, self._clock, label)

    def _abandon(self, tracked: Tracked, error: Exception) -> None:
        if tracked.life.finished:
            return
        child = tracked.child
        if child is not None and not tracked.exited.is_set():
            # It runs with nothing left to reap it or report its exit: kill its group, so the task is
            # not still running (and reporting) after its final event says failed.
            with contextlib.suppress(OSError):
                child.signal(signal.SIGKILL)
        self._finish(
            tracked, internal_error(tracked.request.key, error, launched=child is not None), Step.ABANDON
        )

    def _end(self, tracked: Tracked, status: ExitStatus, step: Step) -> None:
        outcome = classify(tracked.request.key, status, tracked.stop_reason)
        # A contained child (core.contained) knows, once awaited, what its cgroup held and used.
        self._finish(tracked, contained_outcome(outcome, getattr(tracked.child, "cleanup", None)), step)

    def _finish(self, tracked: Tracked, outcome: Outcome, step: Step) -> None:
        tracked.life.advance(step)
        now = self._clock.time()
        outcome = dataclasses.replace(outcome, times=Times(tracked.accepted, tracked.launched, now))
        self._tally.finished(outcome, tracked.label, now)
        self._listener.finished(outcome)
