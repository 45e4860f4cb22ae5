"""The contract between the supervisor and a launch path."""

from __future__ import annotations

import math
import threading
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Annotated, Any, Protocol

import anyio
import anyio.abc
from typing_extensions import Required, Self, TypedDict

from async_local_executor.core.cgroups.group import WorkloadCgroup
from async_local_executor.core.cgroups.limits import Limits
from async_local_executor.core.errors import DescriptorsFull, LaunchError, is_full
from async_local_executor.core.field_rules import COUNT
from async_local_executor.core.outcome import Cleanup

OutputSink = Callable[[Hashable, str], None]
"""Receives each line a child writes to stdout or stderr, with the key of the workload."""

HELPER_KEY = "fork-server"
"""The key an :data:`OutputSink` receives with a launcher's own lines (its helper's), not a workload's."""


@dataclass(frozen=True)
class Takeover:
    """A running process another executor launched and handed over, supervised from now on as if it had
    been launched here: the innermost launcher takes it (:class:`TakesOver`) instead of starting one, and
    each wrapper takes it in as its own (the cgroup wrapper re-attaches its cgroup, the crowd counts it
    and gives back a CPU share a predecessor's crash left lowered).

    :param take: the process as a child; raises :class:`~async_local_executor.core.errors.LaunchError`
        when it no longer runs as recorded (gone, or its pid another's)
    :param launched: wall clock of its first launch, for the status report
    :param cgroup_dir: its cgroup2 directory, when it was contained
    :param kill_in: its predecessor was stopping it for its run-time limit when it let it go: the
        seconds from now until its SIGKILL was due then (0 or less: due already). Its stop here waits
        no longer than that, so a handover inside the grace period does not grant a whole one again.
        None: no stop of it had begun, and its stop gets a whole grace period, as any other
    """

    take: Callable[[], Child]
    launched: float
    cgroup_dir: str | None = None
    kill_in: float | None = None


@dataclass(frozen=True)
class LaunchRequest:
    """What to start for one workload.

    :param key: identifies the workload in every event about it; any hashable value
    :param argv: the program and its arguments; never holds a secret (``/proc/*/cmdline`` is
        world-readable)
    :param stdin: bytes written to the child's stdin, which is then closed; secrets travel here
    :param env: the child's whole environment, or ``None`` to inherit ours
    :param label: a short human name for logs
    :param timeout: seconds the process may run before it is terminated; ``None`` for no limit. For a
        ``takeover``, what is left of the limit its launch set, which may be spent: ``-5`` says it ran
        out 5 seconds ago (the stop begins at once; see :attr:`Takeover.kill_in` for its grace period)
    :param group: the admission group whose own limit (if the supervisor has one for it) also applies
    :param limits: memory, CPU and process limits of this workload's own, over the executor's (they need
        containment: a contained launcher enforces them, or refuses the launch)
    :param source: a Python file the workload will run (an Airflow task's DAG file); a launcher that
        learns what workloads import reads its top-level imports
    :param low_cpu: it starts in a crowd: a contained launcher gives its cgroup the lowest CPU weight
        (see ``core/launchers/crowd.py``, which asks for it and undoes it)
    :param before_start: awaited with the new process's pid before it gets ``stdin``, so before it runs
        anything of the workload (a contained launcher moves it into its cgroup here); if it raises,
        the process is killed and the launch fails with the error. A program started by the plain
        launcher runs from its ``exec`` on: it must read its stdin before it starts anything
    :param takeover: the workload runs already, launched by another executor: the launch path takes its
        process instead of starting one (see :class:`Takeover`)
    :param pausable: a pause of new starts holds it back (see :meth:`Admission.pause`); False for what
        must not wait on an operator's pause (a callback, a connection test)
    """

    key: Hashable
    argv: Sequence[str]
    stdin: bytes = b""
    env: Mapping[str, str] | None = None
    label: str = field(default="")
    timeout: float | None = None
    group: str = ""
    source: str | None = None
    limits: Limits = field(default_factory=Limits)
    low_cpu: bool = False
    before_start: Callable[[int], Awaitable[None]] | None = field(default=None, compare=False, repr=False)
    takeover: Takeover | None = field(default=None, compare=False, repr=False)
    pausable: bool = True

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError("argv must not be empty")
        if self.timeout is not None and not (
            self.timeout > 0 or (self.takeover is not None and math.isfinite(self.timeout))
        ):
            raise ValueError(
                f"timeout must be > 0 or None (any finite number for a takeover), got {self.timeout}"
            )


class Child(Protocol):
    """A launched process, the leader of its own process group."""

    @property
    def pid(self) -> int: ...

    @property
    def releasable(self) -> bool:
        """Whether :meth:`release` hands it over alive. False where it is watched through something that
        kills it when closed (the event loop's subprocess transport, on a kernel without pidfds): then
        :meth:`release` does nothing, and the supervisor terminates it instead of handing it over."""
        ...

    @property
    def cgroup(self) -> WorkloadCgroup | None:
        """The cgroup that holds every process of the workload, for a contained one; None otherwise."""
        ...

    @property
    def cleanup(self) -> Cleanup | None:
        """What its cgroup held and used, read once :meth:`wait` has returned; None before that, or when
        it has no cgroup."""
        ...

    async def wait(self) -> int:
        """Wait until the process has exited and its output is drained; return its exit status.

        The status follows :attr:`subprocess.Popen.returncode`: negative ``-N`` means killed by signal N.

        :raises ~async_local_executor.core.errors.ChildLost: when the exit happened but its status is lost
        :raises ~async_local_executor.core.errors.Released: when it was released (see :meth:`release`)
        """
        ...

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole process group; a group that is already gone is not an error.

        Nothing, once it has been released."""
        ...

    def release(self) -> None:
        """Stop supervising it, without touching it: it runs on, for whoever adopts it.

        From then on nothing is signalled to it (nor to its group or cgroup, nor to what it left there),
        and the fds held for it (its output pipe, its stdin pipe, its pidfd) are closed: its output goes
        nowhere of ours, and its exit status is not ours to read. A :meth:`wait` pending or to come
        raises :class:`~async_local_executor.core.errors.Released` (a pending one promptly), unless it
        already has the exit status (a contained child settling its cgroup): then it returns it. Safe
        before :meth:`wait` was ever awaited, and while another task awaits it; after :meth:`wait` has
        returned it does nothing. A child already exited when released is reaped: it has nothing left to
        hand over. Loop thread only; does nothing where :attr:`releasable` is False.
        """
        ...


class PreloadedModule(TypedDict):
    module: Required[str]
    distribution: str | None
    version: str | None
    kib: Annotated[int | None, COUNT]


class RefusedModule(TypedDict):
    module: Required[str]
    reason: str
    retried: bool  # refused for a reason that may pass: tried again later


class PreloadSummary(TypedDict, total=False):
    """What a launch path preloads beyond its target's own imports, as the status file holds it.

    ``mode`` is ``explicit`` (``modules``, as configured) or ``auto`` (the rest: learned from tasks).
    """

    mode: Required[str]
    modules: list[str]
    preloaded: list[PreloadedModule]
    refused: list[RefusedModule]
    pending: list[str]
    generation: Annotated[int, COUNT]


@dataclass(frozen=True)
class LauncherReport:
    """A launch path's account of itself, for the status report and the health check.

    :param description: the launch path in words (which fork server, say)
    :param problem: why it is degraded or down right now, in words; None when it is fine
    :param preload: what it preloads and what it refused, for a path that learns; None otherwise
    :param pid: the process it launches through (the fork server's helper) while one runs; None for a
        path without one
    """

    description: str
    problem: str | None = None
    preload: PreloadSummary | None = None
    pid: int | None = None


class Launcher(Protocol):
    """Starts children. Raises :class:`~async_local_executor.core.errors.LaunchError` when it cannot.

    Used as an async context manager around all launches, so a launcher can own helpers and tasks.
    """

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None: ...

    async def launch(self, request: LaunchRequest) -> Child: ...

    def report(self) -> LauncherReport:
        """How this launch path is, right now. Loop thread only; cheap (read on every status)."""
        ...


class Wrapper:
    """A launcher that adds to another's launches (a cgroup, a CPU share): it is entered, left and
    reported as the launcher it wraps, and implements :meth:`launch` itself."""

    def __init__(self, inner: Launcher) -> None:
        self._inner = inner

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc, tb)

    def report(self) -> LauncherReport:
        return self._inner.report()


class TakesOver(Wrapper):
    """The innermost of a launch path's wrappers: a request with a :class:`Takeover` is taken, every
    other is launched by the launcher it wraps."""

    async def launch(self, request: LaunchRequest) -> Child:
        if request.takeover is not None:
            return request.takeover.take()
        return await self._inner.launch(request)


def refuse_takeover(request: LaunchRequest) -> None:
    """For a launcher that starts processes: a handed-over one reached it, past where it is taken.

    :raises LaunchError: always, when ``request`` has a takeover (its launch path lacks :class:`TakesOver`)
    """
    if request.takeover is not None:
        raise LaunchError("a handed-over process reached a launcher that starts processes: no TakesOver")


async def prepare(request: LaunchRequest, pid: int) -> None:
    """Run ``request``'s :attr:`~LaunchRequest.before_start` for process ``pid``, if it has one.

    :raises LaunchError: with the hook's error, for the launcher to kill the process and fail the launch
    """
    if request.before_start is None:
        return
    try:
        await request.before_start(pid)
    except DescriptorsFull:
        raise
    except Exception as exc:
        if is_full(exc):  # waits for room
            raise DescriptorsFull(f"cannot prepare the workload process: {exc}") from exc
        raise LaunchError(f"cannot prepare the workload process: {exc}") from exc


# One spawn through an event loop at a time in this process, whichever loop asks: uvloop refuses a spawn
# while another loop of the process is inside one ("Racing with another loop to spawn a process"), which
# happens when a before-fork hook lets the other thread run; a scheduler with teams runs one loop per
# team's executor.
_SPAWNING = threading.Lock()
SPAWN_POLL = 0.001
"""Seconds between tries for the spawn lock while another loop of the process spawns (a few ms)."""


async def open_process(command: Sequence[str], **kwargs: Any) -> anyio.abc.Process:
    """:func:`anyio.open_process`, one at a time in this process across event loops.

    The lock is taken without waiting, so no cancellation falls between taking it and the ``try`` that
    releases it; a loop that finds it taken polls, leaving its own tasks to run.
    """
    while not _SPAWNING.acquire(blocking=False):  # noqa: ASYNC110 - held by other threads' loops
        await anyio.sleep(SPAWN_POLL)
    try:
        return await anyio.open_process(list(command), **kwargs)
    finally:
        _SPAWNING.release()
