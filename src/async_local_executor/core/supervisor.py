"""Takes each workload from acceptance to its one outcome: admit, launch, await the exit, report.

Runs entirely on one event loop and knows nothing of Airflow: a workload is a :class:`LaunchRequest`
with an opaque key, and the result is an :class:`Outcome`. Every method here must be called from the
loop's own thread; :mod:`async_local_executor.core.runtime` is what crosses threads.

The parts live beside it: who may launch (:mod:`.admission`), how a workload is stopped
and its run-time limit (:mod:`.stopping`), awaiting its process (:mod:`.reaping`),
what its end means (:mod:`.outcome`), its phases (:mod:`.lifecycle`) and its record
(:mod:`.workload`). This module sequences them for each workload.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import signal
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.abc

from async_local_executor.core import descriptors
from async_local_executor.core.admission import Admission, host_available_memory
from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.errors import DescriptorsFull, LaunchError, Released
from async_local_executor.core.launchers.base import Child, Launcher, LaunchRequest
from async_local_executor.core.lifecycle import Phase, Step
from async_local_executor.core.outcome import (
    ExitStatus,
    Outcome,
    Times,
    classify,
    internal_error,
    with_cleanup,
)
from async_local_executor.core.reaping import reap, reap_abandoned
from async_local_executor.core.state import RunningWorkload, SupervisorState, Tally, snapshot
from async_local_executor.core.stopping import Deadline, TerminationPolicy, escalate
from async_local_executor.core.workload import Workload

__all__ = ["LetGo", "Listener", "Supervisor", "every"]

log = logging.getLogger(__name__)


class Listener(Protocol):
    """Told about each workload; called on the loop thread, so it must not block."""

    def started(self, key: Hashable, pid: int) -> None: ...

    def finished(self, outcome: Outcome) -> None: ...


def every(_: Hashable) -> bool:
    """Every workload may be handed over."""
    return True


@dataclass(frozen=True)
class LetGo:
    """A running workload let go alive by :meth:`Supervisor.release`, for a successor to adopt.

    What is left of its run-time limit is not here: the wall clock this supervisor stamps workloads
    with may be stepped, so whoever hands it over keeps the limit on a clock no step moves.

    :param cgroup: its cgroup2 directory, when it is contained
    :param launched: wall clock of its launch (or of its adoption's first launch), for display
    :param kill_in: it was being stopped for its run-time limit: the seconds left until its SIGKILL was
        due (what its adopter gives it, :attr:`~async_local_executor.core.launchers.base.Takeover.kill_in`);
        None for a workload let go while it ran
    """

    key: Hashable
    pid: int
    label: str
    cgroup: str | None
    launched: float
    kill_in: float | None = None


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
    :param descriptor_reserve: launches wait while fewer descriptors than this are free; 0: only while
        the table is full
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
        descriptor_reserve: int = 0,
    ) -> None:
        self._admission = Admission(
            limit=limit,
            group_limits=group_limits,
            memory_floor=memory_floor,
            available_memory=available_memory,
            memory_poll=memory_poll,
            clock=clock,
            descriptor_reserve=descriptor_reserve,
        )
        self._launcher = launcher
        self._listener = listener
        self._policy = policy or TerminationPolicy()
        self._clock = clock
        self._tally = Tally()
        self._workloads: dict[int, Workload] = {}
        self._serials = itertools.count()
        self._accepting = True
        self._releasing: Callable[[Hashable], bool] | None = None  # which keys release() lets go
        self._late_handovers: list[LetGo] = []
        self._idle = anyio.Event()
        self._idle.set()
        self._closed = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None

    def state(self) -> SupervisorState:
        """A snapshot for health checks and status reports. Loop thread only; O(workloads)."""
        running: list[RunningWorkload] = []
        waiting = 0
        oldest: float | None = None
        for workload in self._workloads.values():
            child, launched = workload.child, workload.launched
            if child is not None and launched is not None:
                running.append(
                    RunningWorkload(
                        workload.label,
                        child.pid,
                        launched,
                        workload.request.group,
                        child.cgroup,
                        adopted=workload.adopted,
                    )
                )
            elif not workload.lifecycle.finished:
                waiting += 1
                oldest = workload.accepted if oldest is None else min(oldest, workload.accepted)
        return snapshot(
            running=tuple(running),
            waiting=waiting,
            oldest_waiting_since=oldest,
            admission=self._admission,
            tally=self._tally,
            launcher=self._launcher.report(),
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
        self._accept(Workload(request, accepted=self._clock.time()), "workload")

    def _accept(self, workload: Workload, kind: str) -> None:
        """Supervise ``workload`` from now on, or drop it at once (with its event) after a stop began.

        An adopted one is never dropped, since its process runs: after a stop began it is taken and
        stopped, or, during a release, taken and handed over again.
        """
        assert self._tg is not None
        if not self._accepting and not workload.adopted:
            workload.stop_reason = "executor is shutting down"
            self._end(workload, None, Step.DROP)
            return
        if not self._accepting and self._releasing is None:
            workload.stop_reason = "executor is shutting down"
        serial = next(self._serials)
        self._workloads[serial] = workload
        if self._idle.is_set():
            self._idle = anyio.Event()
        request = workload.request
        self._tg.start_soon(self._supervise, serial, workload, name=f"{kind} {request.label or request.key}")

    def hold_starts(self, paused: bool) -> None:
        """Pause (True) or resume (False) the launch of pausable workloads (:meth:`Admission.pause`)."""
        if paused:
            self._admission.pause()
        else:
            self._admission.resume()

    def resize(self, limit: int | None, group_limits: Mapping[str, int]) -> None:
        """New limits, live (:meth:`Admission.resize`); lowering one stops nothing that runs."""
        self._admission.resize(limit, group_limits)

    def stop(self, key: Hashable, reason: str) -> int:
        """Stop every workload with ``key``: drop it if it has no slot yet, else terminate it.

        :return: how many workloads were affected
        """
        matches = [w for w in self._workloads.values() if w.request.key == key]
        for workload in matches:
            self._stop(workload, reason)
        return len(matches)

    async def shutdown(self, wait: float) -> None:
        """Stop accepting, give running workloads ``wait`` seconds to finish, then stop the rest."""
        self._accepting = False
        if self._admission.paused:
            # What a pause holds back would never start within the wait: it ends unlaunched now.
            for workload in list(self._workloads.values()):
                if workload.lifecycle.phase is Phase.QUEUED and workload.request.pausable:
                    self._stop(workload, "executor shut down")
        with self._clock.move_on_after(wait):
            await self._idle.wait()
        for workload in list(self._workloads.values()):
            self._stop(workload, "executor shut down")
        await self._idle.wait()
        self._closed.set()

    async def release(self, grace: float, *, which: Callable[[Hashable], bool] = every) -> list[LetGo]:
        """Stop accepting and let every running workload ``which`` accepts go alive, for a successor.

        What has no process yet is dropped (its final event says so), as at a shutdown. A workload being
        stopped because its run-time limit ran out is let go too: the event of its end would come after
        the caller stops reading events (a scheduler reads none once it stops), so that end is its
        adopter's to report, which stops it at once (its limit is long gone) within what is left of the
        grace period (its :class:`LetGo` says how much, ``kill_in``). A workload being stopped
        for any other reason (revoked), or whose launch path cannot let a process go, is stopped to its
        end as at a shutdown, within ``grace`` seconds plus the termination policy's. Released workloads
        get no final event from here: their end is their adopter's to report.
        """
        self._accepting = False
        self._releasing = which
        handovers: list[LetGo] = []
        for workload in list(self._workloads.values()):
            if (handover := self._release_one(workload)) is not None:
                handovers.append(handover)
            elif (
                workload.lifecycle.phase is not Phase.LAUNCHING or workload.held_back is not None
            ) and not workload.adopted:
                self._stop(workload, "executor shut down")  # held back for descriptors: ends unlaunched
        # Those launching, and adopted ones not yet taken, are released by _launch once it has their process.
        with self._clock.move_on_after(grace):
            await self._idle.wait()
        for workload in list(self._workloads.values()):
            self._stop(workload, "executor shut down")
        await self._idle.wait()
        handovers += self._late_handovers
        self._closed.set()
        return handovers

    def _release_one(self, workload: Workload) -> LetGo | None:
        child = workload.child
        if (
            self._releasing is None
            or child is None
            or workload.launched is None
            or workload.exited.is_set()  # its exit was read: its end is to be reported here
            or not (
                workload.lifecycle.phase is Phase.RUNNING
                or (workload.lifecycle.phase is Phase.TERMINATING and workload.timed_out)
            )
            or not child.releasable
            or not self._releasing(workload.request.key)
        ):
            return None
        # Set once a stop for its limit began (here, or before its handover): it goes with it.
        kill_in = None if workload.kill_at is None else workload.kill_at - self._clock.monotonic()
        workload.lifecycle.advance(Step.RELEASE)
        if workload.deadline is not None:
            workload.deadline.cancel()
        if workload.escalation is not None:
            workload.escalation.cancel()
        child.release()
        return LetGo(
            workload.request.key,
            child.pid,
            workload.label,
            _cgroup_dir(workload, child),
            workload.launched,
            kill_in,
        )

    def adopt(self, request: LaunchRequest) -> None:
        """Supervise a running process another executor launched: ``request.takeover`` says which.

        It goes through the launch path as any workload, which takes its process instead of starting
        one. It holds a slot and a group slot like any workload, but never waits for them: it runs
        already. (A successor started with a lower limit than its predecessor's takes them on credit and
        lets its own launches wait until enough adopted ones have ended.) Its run-time limit is
        ``request.timeout`` from now, a stop or a release reaches its process as any running one's, and
        its end is reported once, as any other's. If its process cannot be taken
        (:class:`LaunchError`: it is gone, or its pid is another's now), the workload ends at once as a
        failed launch.
        """
        if request.takeover is None:
            raise ValueError("adopt() takes a request with a takeover")
        if self._tg is None:
            raise RuntimeError("supervisor is not serving")
        workload = Workload(request, accepted=self._clock.time())
        if request.takeover.kill_in is not None:
            workload.kill_at = self._clock.monotonic() + request.takeover.kill_in
        self._accept(workload, "adopted workload")

    async def _supervise(self, serial: int, workload: Workload) -> None:
        try:
            with workload.scope:
                admitted = False
                while not admitted:
                    # An adopted one runs already: neither a slot nor memory is a reason to wait.
                    async with self._admission.slot(workload.request, running=workload.adopted):
                        if workload.lifecycle.finished:  # dropped before this task first ran
                            return
                        if not workload.adopted:
                            await self._admission.wait_for_memory(workload.request)
                            if self._admission.holds(workload.request):
                                continue  # paused while it waited for memory: its slot goes on
                        admitted = True
                        workload.lifecycle.advance(Step.ADMIT)
                        child = await self._launch(workload)
                        if child is not None:
                            workload.exit_awaited = True
                            status = await reap(child)
                            workload.exited.set()
                            self._end(workload, status, Step.EXIT)
        except Released:
            # Handed over alive (release() moved it to RELEASED): nothing to report, nothing to kill.
            if workload.lifecycle.phase is not Phase.RELEASED:
                log.error(
                    "workload %s was let go without a handover; it runs on unsupervised", workload.label
                )
        except Exception as exc:
            # A bug of ours or the launcher's must still end in a final event, not in silence.
            log.exception("supervising workload %s failed", workload.label)
            try:
                self._abandon(workload, exc)
            except Exception:
                log.exception("reporting the internal error of workload %s failed too", workload.label)
            if workload.child is not None and not workload.exit_awaited:
                # Killed by _abandon, its outcome reported: awaited only so its pipes are closed.
                await reap_abandoned(workload.child, workload.label, self._clock)
        finally:
            if workload.deadline is not None:
                workload.deadline.cancel()  # else a long timeout's timer would hold up shutdown
            self._workloads.pop(serial, None)
            if workload.child is not None:
                descriptors.running_changed(-1)
                self._admission.workload_ended()  # its descriptors are closed: a held-back launch tries again
            if not self._workloads:
                self._idle.set()

    async def _launch(self, workload: Workload) -> Child | None:
        """Start the process and arm its stop or its timeout; None if it could not be started."""
        request = workload.request
        try:
            child = await self._start(workload)
            if child is None:
                return None
        except LaunchError as exc:
            self._end(workload, exc, Step.LAUNCH_FAILED)
            return None
        workload.child = child
        descriptors.running_changed(+1)
        workload.launched = now = self._clock.time()
        if request.takeover is None:
            self._tally.launched(now)
        else:
            workload.launched = request.takeover.launched
        workload.lifecycle.advance(Step.LAUNCHED)
        self._listener.started(request.key, child.pid)
        if workload.stop_reason is not None:  # stopped while it was launching
            self._terminate(workload)
        elif (handover := self._release_one(workload)) is not None:  # release() began while it launched
            self._late_handovers.append(handover)
        elif request.timeout is not None:
            # From now, for an adopted one too: its request carries what was left of its limit (spent
            # already, maybe: the Deadline then fires at once).
            assert self._tg is not None
            workload.deadline = Deadline(
                request.timeout,
                clock=self._clock,
                exited=workload.exited,
                expire=lambda reason: self._time_out(workload, reason),
                label=request.label or request.key,
            )
            self._tg.start_soon(workload.deadline.run)
        return child

    async def _start(self, workload: Workload) -> Child | None:
        """Its process, launched; held back while the descriptor table is full and another workload runs
        whose end would free some. None: it was stopped while held back (its end is reported).

        :raises LaunchError: it cannot be launched (a full table with nothing else running included)
        """
        held = launched = False
        try:
            while True:
                try:
                    # An adopted one runs already: the descriptors it holds are held.
                    if not workload.adopted and (short := self._admission.short_of_descriptors()) is not None:
                        raise short
                    child = await self._launcher.launch(workload.request)
                except DescriptorsFull as full:
                    if not self._accepting and workload.stop_reason is None:
                        workload.stop_reason = "executor shut down"  # a stop began: it launches nothing
                    if workload.stop_reason is not None:
                        self._end(workload, None, Step.LAUNCH_FAILED)
                        return None
                    # Processes of any supervisor here (they share the table), and this one's launches
                    # in flight (they hold descriptors now, and either run or close them); not the ones
                    # held back, which hold none.
                    others = descriptors.running() + sum(
                        1
                        for w in self._workloads.values()
                        if w is not workload
                        and w.child is None
                        and w.lifecycle.phase is Phase.LAUNCHING
                        and w.held_back is None
                    )
                    with anyio.CancelScope() as workload.held_back:
                        await self._admission.hold_back(workload.request, full, others, again=held)
                    held = True
                    workload.held_back = None
                    if workload.stop_reason is not None:
                        self._end(workload, None, Step.LAUNCH_FAILED)
                        return None
                    continue
                launched = True
                return child
        finally:
            workload.held_back = None
            if held:
                self._admission.held_back_ended(launched=launched)

    def _time_out(self, workload: Workload, reason: str) -> None:
        if workload.stop_reason is None:
            workload.timed_out = True
        self._stop(workload, reason)

    def _stop(self, workload: Workload, reason: str) -> None:
        if workload.stop_reason is not None:
            return
        workload.stop_reason = reason
        phase = workload.lifecycle.phase
        if phase is Phase.QUEUED and not workload.adopted:
            workload.scope.cancel()
            self._end(workload, None, Step.DROP)
        elif phase is Phase.RUNNING:
            self._terminate(workload)
        elif workload.held_back is not None:  # waiting for descriptors: it ends unlaunched at once
            workload.held_back.cancel()
        # LAUNCHING, or adopted and not taken yet (its process runs: dropping it would leave that process
        # to nobody): _launch terminates it as soon as it has the process.

    def _terminate(self, workload: Workload) -> None:
        workload.lifecycle.advance(Step.TERMINATE)
        assert self._tg is not None
        assert workload.child is not None
        label = workload.request.label or workload.request.key
        child, scope = workload.child, anyio.CancelScope()
        workload.escalation = scope
        policy = self._policy
        if workload.timed_out:
            # Its SIGKILL is due a grace period after this stop's SIGTERM, or when its predecessor's stop
            # had it due (a handover inside the grace must not grant a whole one again, after however
            # long this executor took to start); what is left of it goes with it if it is let go again.
            now = self._clock.monotonic()
            if workload.kill_at is None:
                workload.kill_at = now + policy.grace
            policy = dataclasses.replace(policy, grace=max(0.0, min(policy.grace, workload.kill_at - now)))

        async def stop() -> None:
            with scope:  # cancelled when it is let go: its stop is its adopter's then
                await escalate(child, workload.exited, policy, self._clock, label)

        self._tg.start_soon(stop)

    def _abandon(self, workload: Workload, error: Exception) -> None:
        if workload.lifecycle.finished:
            return
        child = workload.child
        if child is not None and not workload.exited.is_set():
            # It runs with nothing left to reap it or report its exit: kill its group, so the task is
            # not still running (and reporting) after its final event says failed.
            with contextlib.suppress(OSError):
                child.signal(signal.SIGKILL)
        self._finish(
            workload, internal_error(workload.request.key, error, launched=child is not None), Step.ABANDON
        )

    def _end(self, workload: Workload, status: ExitStatus, step: Step) -> None:
        outcome = classify(workload.request.key, status, workload.stop_reason)
        # A contained child knows, once awaited, what its cgroup held and used.
        cleanup = workload.child.cleanup if workload.child is not None else None
        self._finish(workload, with_cleanup(outcome, cleanup), step)

    def _finish(self, workload: Workload, outcome: Outcome, step: Step) -> None:
        workload.lifecycle.advance(step)
        now = self._clock.time()
        outcome = dataclasses.replace(outcome, times=Times(workload.accepted, workload.launched, now))
        self._tally.finished(outcome, workload.label, now)
        self._listener.finished(outcome)


def _cgroup_dir(workload: Workload, child: Child) -> str | None:
    """Where a released workload's cgroup is: its child's, or, for an adopted one whose cgroup was not
    re-attached (an uncontained adopter), the one recorded with it."""
    if child.cgroup is not None:
        return str(child.cgroup.path)
    takeover = workload.request.takeover
    return None if takeover is None else takeover.cgroup_dir
