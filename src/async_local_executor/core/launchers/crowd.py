"""A workload that starts in a crowd gets a low CPU share, and gets it back when the crowd ends.

A start is crowded when :attr:`CrowdLauncher.threshold` or more workloads run; below it a start keeps
the scheduler's priority. The rule: a lowered share never outlasts the crowd, so every lowering is one
the scheduler itself undoes, for a process of any user, as soon as fewer than the threshold run:

- ``cgroup``: the workload's cgroup gets the lowest CPU weight and the default back (the scheduler owns
  the cgroup; the task cannot change it either way).
- ``class``: the workload's process enters ``SCHED_IDLE`` before it runs anything, with the
  ``RLIMIT_NICE`` that lets each of its threads be put back to ``SCHED_OTHER``.
- ``none``: neither can be undone here; crowded starts keep the scheduler's priority.

Why a crowd starves the scheduler's loop, and how the threshold was chosen: docs/design.md ("A start
in a crowd gets a low CPU share until the crowd ends").
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import anyio
import anyio.to_thread
import psutil

from async_local_executor.core import cpu_priority
from async_local_executor.core.cgroups import WorkloadCgroup
from async_local_executor.core.launchers.base import Child, Launcher, LaunchRequest, Wrapper
from async_local_executor.core.outcome import Cleanup

log = logging.getLogger(__name__)

# Running workloads per core from which a start is crowded (measured: docs/design.md).
CROWD_PER_CORE = 24


class How(enum.Enum):
    """How a crowded start's CPU share is lowered (and raised again)."""

    CGROUP = "cgroup"
    CLASS = "class"
    NONE = "none"


@dataclass(frozen=True)
class Choice:
    """The mechanism this host allows, and why."""

    how: How
    why: str

    def describe(self, threshold: int) -> str:
        """The start line's words for it."""
        if self.how is How.NONE:
            return f"workloads starting in a crowd keep the scheduler's CPU priority: {self.why}"
        return (
            f"workloads starting while {threshold} or more run get the lowest CPU share ({self.why}) "
            "until fewer run"
        )


def choose(weighs_cpu: bool) -> Choice:
    """The mechanism: a cgroup CPU weight where workload cgroups have one, else the process class if it can be left.

    :param weighs_cpu: whether workload cgroups can be given a CPU weight here
    """
    if weighs_cpu:
        return Choice(How.CGROUP, "their cgroup's CPU weight")
    problem = cpu_priority.leave_problem()
    if problem is None:
        return Choice(How.CLASS, "SCHED_IDLE")
    return Choice(
        How.NONE,
        f"no cgroup CPU controller for workloads, and {problem}; "
        "give workloads a cgroup cpu controller or the scheduler that limit",
    )


def threshold() -> int:
    """Running workloads from which a start is crowded, for this host."""
    return CROWD_PER_CORE * (os.cpu_count() or 1)


@dataclass
class _Lowered:
    child: Child
    cgroup: WorkloadCgroup | None
    weighed: bool
    """True: the cgroup's weight was lowered; False: the process class of its members (or tree)."""


class CrowdLauncher(Wrapper):
    """Launches through ``inner``, lowering the CPU share of a start made in a crowd until the crowd ends.

    :param inner: the launch path (a contained launcher, for :attr:`How.CGROUP`)
    :param choice: how to lower, from :func:`choose`
    :param crowd: running workloads from which a start is crowded
    """

    def __init__(self, inner: Launcher, choice: Choice, *, crowd: int) -> None:
        super().__init__(inner)
        self._how = choice.how
        self.threshold = crowd
        self._running = 0
        self._lowered: dict[int, _Lowered] = {}
        self._serials = 0

    @property
    def lowered(self) -> int:
        """Running workloads whose share is lowered now."""
        return len(self._lowered)

    async def launch(self, request: LaunchRequest) -> Child:
        crowded = self._how is not How.NONE and self._running >= self.threshold
        if crowded:
            request = self._lowering(request)
        self._running += 1
        try:
            child = await self._inner.launch(request)
        except BaseException:
            self._running -= 1
            raise
        serial = self._serials = self._serials + 1
        if crowded:
            cgroup = child.cgroup
            weighed = self._how is How.CGROUP
            # A weighed start that ran without a cgroup (it could not be made) was not lowered.
            if not weighed or cgroup is not None:
                if not self._lowered:
                    log.info(
                        "%d workloads running: the ones starting now get the lowest CPU share until fewer "
                        "than %d run",
                        self._running - 1,
                        self.threshold,
                    )
                self._lowered[serial] = _Lowered(child, cgroup, weighed)
        return CrowdChild(child, lambda: self._ended(serial))

    def _lowering(self, request: LaunchRequest) -> LaunchRequest:
        if self._how is How.CGROUP:
            return replace(request, low_cpu=True)
        earlier = request.before_start

        async def lower(pid: int) -> None:
            # Before it runs anything: what it starts inherits the class, and can leave it with it.
            try:
                cpu_priority.lower(pid)
            except OSError as exc:
                log.warning(
                    "could not lower the CPU priority of workload %s: %s", request.label or request.key, exc
                )
            if earlier is not None:
                await earlier(pid)

        return replace(request, before_start=lower)

    async def _ended(self, serial: int) -> None:
        self._running -= 1
        self._lowered.pop(serial, None)
        if self._lowered and self._running < self.threshold:
            lowered, self._lowered = list(self._lowered.values()), {}
            log.info(
                "%d workloads running: %d started in the crowd get their CPU share back",
                self._running,
                len(lowered),
            )
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_raise, lowered)


def _raise(lowered: list[_Lowered]) -> None:
    """Worker thread: undo each lowering; a failure is logged and leaves the others to be raised."""
    for each in lowered:
        try:
            if each.weighed and each.cgroup is not None:
                each.cgroup.restore_cpu()
            else:
                # The cgroup's members include what left the process tree (a daemon, a double fork).
                members = each.cgroup.members() if each.cgroup is not None else []
                cpu_priority.restore(members or _tree(each.child.pid))
        except FileNotFoundError:
            continue  # it ended meanwhile, and its cgroup went with it
        except OSError as exc:
            log.warning("could not give workload process %d its CPU share back: %s", each.child.pid, exc)


def _tree(pid: int) -> list[int]:
    try:
        return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]


class CrowdChild:
    """A launched workload that tells the crowd when it has ended; otherwise the child it wraps."""

    def __init__(self, child: Child, ended: Callable[[], Awaitable[None]]) -> None:
        self._child = child
        self._ended: Callable[[], Awaitable[None]] | None = ended

    @property
    def pid(self) -> int:
        return self._child.pid

    @property
    def cgroup(self) -> WorkloadCgroup | None:
        return self._child.cgroup

    @property
    def cleanup(self) -> Cleanup | None:
        return self._child.cleanup

    @property
    def releasable(self) -> bool:
        return self._child.releasable

    def signal(self, sig: int) -> None:
        self._child.signal(sig)

    def release(self) -> None:
        # wait() then raises Released, and its finally still tells the crowd this one is gone.
        self._child.release()

    async def wait(self) -> int:
        try:
            return await self._child.wait()
        finally:
            ended, self._ended = self._ended, None  # counted once, however often it is awaited
            if ended is not None:
                await ended()
