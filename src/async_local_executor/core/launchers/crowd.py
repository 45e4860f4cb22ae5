"""A workload that starts in a crowd gets a low CPU share, and gets it back when the crowd ends.

A start is crowded when :attr:`CrowdLauncher.threshold` or more workloads run (adopted ones included:
they compete for the CPU as any), or when :attr:`CrowdLauncher.starts` or more started within the last
:attr:`CrowdLauncher.window` seconds (a crowd of starts: a wave of them takes the cores at once, before
the running count says so); otherwise a start keeps the scheduler's priority. The rule: a lowered
share never outlasts the crowd, nor the executor's supervision of the workload, so every lowering is
one the scheduler itself undoes, for a process of any user, as soon as neither crowd is on, or
when it hands the workload over to a successor (which could not tell a lowering of this crowd from
one of its own). A successor that adopts a workload still lowered (left by a crash) gives it its share
back, unless its own crowd of running workloads is on when it takes it: then it stays lowered until that crowd ends. A
process that already runs is never lowered here: its start is over.

- ``cgroup``: the workload's cgroup gets the lowest CPU weight and the default back (the scheduler owns
  the cgroup; the task cannot change it either way).
- ``class``: the workload's process enters ``SCHED_IDLE`` before it runs anything, with the
  ``RLIMIT_NICE`` that lets each of its threads be put back to ``SCHED_OTHER``.
- ``none``: neither can be undone here; crowded starts keep the scheduler's priority.

Why a crowd starves the scheduler's loop, and how the threshold was chosen: docs/design.md ("A start
in a crowd gets a low CPU share until the crowd ends").
"""

from __future__ import annotations

import collections
import enum
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from types import TracebackType

import anyio
import anyio.abc
import anyio.to_thread
from typing_extensions import Self

from async_local_executor.core import cpu_priority
from async_local_executor.core.cgroups import Limits, WorkloadCgroup
from async_local_executor.core.cgroups.discovery import directory_of, mount_root, own_cgroups, v1_mounts
from async_local_executor.core.cgroups.group import LOWEST_SHARES, LOWEST_WEIGHT
from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.launchers.base import Child, Launcher, LaunchRequest, Takeover, Wrapper
from async_local_executor.core.outcome import Cleanup

log = logging.getLogger(__name__)

# Running workloads per core from which a start is crowded (measured: docs/design.md).
CROWD_PER_CORE = 24
# Starts per core within START_WINDOW seconds from which a start is crowded too (measured:
# docs/design.md): without it the first wave of a burst starts 24 per core at the scheduler's priority.
# A wave's launches begin within milliseconds of each other (the scheduler queues them in one loop);
# the ordinary pace at parallelism 16 per core seldom puts 8 per core in half a second.
STARTS_PER_CORE = 8
START_WINDOW = 0.5


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

    def describe(self, threshold: int, starts: int, window: float) -> str:
        """The start line's words for it."""
        if self.how is How.NONE:
            return f"workloads starting in a crowd keep the scheduler's CPU priority: {self.why}"
        return (
            f"workloads starting while {threshold} or more run, or after {starts} started within {window:g}s, "
            f"get the lowest CPU share ({self.why}) until fewer run and fewer start"
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


def start_threshold() -> int:
    """Starts within :data:`START_WINDOW` from which a start is crowded, for this host."""
    return STARTS_PER_CORE * (os.cpu_count() or 1)


@dataclass
class _Lowered:
    pid: int
    cgroup: WorkloadCgroup | None
    weighed: bool
    """Its cgroup's CPU weight is lowered."""
    idle: bool
    """Its processes' class is lowered (those of its cgroup, or else of its process tree)."""


class CrowdLauncher(Wrapper):
    """Launches through ``inner``, lowering the CPU share of a start made in a crowd until the crowd ends.

    :param inner: the launch path (a contained launcher, for :attr:`How.CGROUP`)
    :param choice: how to lower, from :func:`choose`
    :param crowd: running workloads from which a start is crowded
    :param starts: starts within ``window`` seconds from which a start is crowded; 0: no crowd of starts
    :param clock: what the window is measured on
    """

    def __init__(
        self,
        inner: Launcher,
        choice: Choice,
        *,
        crowd: int,
        starts: int = 0,
        window: float = START_WINDOW,
        clock: Clock = SYSTEM,
    ) -> None:
        super().__init__(inner)
        self._how = choice.how
        self.threshold = crowd
        # Where nothing can be lowered, no start is counted either (nothing would ever prune them).
        self.starts = starts if choice.how is not How.NONE else 0
        self.window = window
        self._clock = clock
        self._running = 0
        self._started: collections.deque[float] = collections.deque()  # when each recent start began
        self._lowered: dict[int, _Lowered] = {}
        self._let_go: list[_Lowered] = []  # lowered ones released, whose share is not given back yet
        self._serials = 0
        self._wake = anyio.Event()  # something was lowered: the end of the crowd of starts gives it back
        self._tasks: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> Self:
        await super().__aenter__()
        if self.starts:
            tasks = anyio.create_task_group()
            try:
                await tasks.__aenter__()
            except BaseException as exc:
                await super().__aexit__(type(exc), exc, exc.__traceback__)
                raise
            self._tasks = tasks
            tasks.start_soon(self._disperse_starts)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        try:
            if self._tasks is not None:
                tasks, self._tasks = self._tasks, None
                tasks.cancel_scope.cancel()
                await tasks.__aexit__(None, None, None)
        finally:
            # The launch path is left whatever happened above (an outer cancellation re-raised there).
            result = await super().__aexit__(exc_type, exc, tb)
        return result

    @property
    def lowered(self) -> int:
        """Running workloads whose share is lowered now."""
        return len(self._lowered)

    def _crowded(self) -> bool:
        return self._how is not How.NONE and self._running >= self.threshold

    def _starts_crowd_until(self) -> float | None:
        """When the crowd of starts ends if no other starts (on :attr:`_clock`), or None when it is not on."""
        if not self.starts:
            return None
        now = self._clock.monotonic()
        while self._started and self._started[0] <= now - self.window:
            self._started.popleft()
        if len(self._started) < self.starts:
            return None
        return self._started[-self.starts] + self.window

    def _crowd_on(self) -> bool:
        if self._how is How.NONE:
            return False
        starting = self._starts_crowd_until() is not None  # first: it also forgets starts past the window
        return starting or self._crowded()

    async def launch(self, request: LaunchRequest) -> Child:
        if request.takeover is not None:
            return await self._take_over(request, request.takeover)
        crowded = self._crowd_on()
        if self.starts:
            # Counted from the fork on, a failed start too: its cost is paid until it fails.
            self._started.append(self._clock.monotonic())
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
                await self._lower(serial, _Lowered(child.pid, cgroup, weighed=weighed, idle=not weighed))
        return self._watched(child, serial)

    async def _take_over(self, request: LaunchRequest, takeover: Takeover) -> Child:
        """A process another executor launched, counted from now; its share given back unless crowded."""
        child = await self._inner.launch(request)
        crowded = self._crowded()
        self._running += 1
        serial = self._serials = self._serials + 1
        try:
            # Shielded: once counted, it must be watched, or the count would never come down again.
            with anyio.CancelScope(shield=True):
                kept = await anyio.to_thread.run_sync(_taken_over, child.pid, takeover.cgroup_dir, crowded)
            if kept is not None:
                await self._lower(serial, kept)
        except Exception:
            # Its process runs and is ours: supervised as it is, not watched and so uncounted (or every
            # start after it would be judged in a crowd one too large).
            log.exception("taking over workload process %d into the crowd failed", child.pid)
            self._running -= 1
            return child
        except BaseException:
            self._running -= 1
            raise
        return self._watched(child, serial)

    async def _lower(self, serial: int, lowered: _Lowered) -> None:
        if not self._crowd_on():
            # The crowd ended while this one started (or was taken over), before the list its end gives
            # back held it: nothing else would.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_raise, [lowered])
            return
        if not self._lowered:
            log.info(
                "%d workloads running, %d started in the last %gs: the ones starting now get the lowest CPU "
                "share until fewer than %d run and fewer than %d start",
                self._running - 1,
                len(self._started),
                self.window,
                self.threshold,
                self.starts,
            )
        self._lowered[serial] = lowered
        self._wake.set()

    async def _disperse_starts(self) -> None:
        """Gives back what a crowd of starts lowered once it ends, unless a crowd of running ones keeps it."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            # Its end is a time (the window past the start that keeps it on), known only by looking again.
            while (until := self._starts_crowd_until()) is not None:
                await self._clock.sleep(max(0.0, until - self._clock.monotonic()))
            if not self._lowered or self._crowd_on():
                continue
            raising, running = dict(self._lowered), self._running
            try:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_raise, list(raising.values()))
            except Exception:
                # This task's group encloses every workload's supervision: a failure here must cost no
                # more than these workloads' share, which stays lowered until the next end retries it.
                log.exception(
                    "could not give %d workloads started in a crowd their CPU share back", len(raising)
                )
                continue
            for serial in raising:
                self._lowered.pop(serial, None)
            # Said once given back (a test, or an operator watching `ps`, may look at once).
            log.info(
                "%d workloads running and fewer than %d starting: %d started in the crowd got their "
                "CPU share back",
                running,
                self.starts,
                len(raising),
            )

    def _watched(self, child: Child, serial: int) -> CrowdChild:
        return CrowdChild(child, lambda: self._ended(serial), lambda: self._released(serial))

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

    def _released(self, serial: int) -> None:
        # Its share goes back as its wait() unwinds (see _ended), off the loop: a release lets every
        # running workload go at once, and each tree is read from /proc.
        lowered = self._lowered.pop(serial, None)
        if lowered is not None:
            self._let_go.append(lowered)

    async def _ended(self, serial: int) -> None:
        self._running -= 1
        self._lowered.pop(serial, None)
        raising, self._let_go = self._let_go, []
        if raising:
            log.info("%d workloads handed over get back the CPU share the crowd lowered", len(raising))
        if self._lowered and self._running < self.threshold:
            if self._starts_crowd_until() is not None:
                self._wake.set()  # a crowd of starts is still on: its end gives them back
            else:
                log.info(
                    "%d workloads running: %d started in the crowd get their CPU share back",
                    self._running,
                    len(self._lowered),
                )
                raising += self._lowered.values()
                self._lowered = {}
        if raising:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_raise, raising)


def _raise(lowered: list[_Lowered]) -> None:
    """Worker thread: undo each lowering; a failure is logged and leaves the others to be raised."""
    pending = list(lowered)
    # A workload may fork while its tree is read: the child is born with the class its parent had then.
    # Once the parent is back, what it forks later is born back too, so another read finds the few that
    # were not, and soon none.
    for _ in range(_TREE_PASSES):
        trees = _trees([each.pid for each in pending if each.idle and each.cgroup is None])
        again = []
        for each in pending:
            try:
                if each.weighed and each.cgroup is not None:
                    each.cgroup.restore_cpu()
                if each.idle:
                    # The cgroup's members include what left the process tree (a daemon, a double fork).
                    members = each.cgroup.members() if each.cgroup is not None else []
                    if cpu_priority.restore(members or trees.get(each.pid, [each.pid])):
                        again.append(replace(each, weighed=False))
            except FileNotFoundError:
                continue  # it ended meanwhile, and its cgroup went with it
            except OSError as exc:
                log.warning("could not give workload process %d its CPU share back: %s", each.pid, exc)
        if not again:
            return
        pending = again


_TREE_PASSES = 5


def _taken_over(pid: int, cgroup_dir: str | None, crowded: bool) -> _Lowered | None:
    """Worker thread: how an adopted workload arrives lowered; its share is given back unless ``crowded``.

    :returns: the lowering it keeps, for the crowd's end to undo; None when it has its share
    """
    try:
        cgroup = _handed_over_cgroup(pid, Path(cgroup_dir)) if cgroup_dir else None
        weighed = cgroup is not None and _weight_lowered(cgroup)
        members = cgroup.members() if cgroup is not None else []
        idle = cpu_priority.idle(members or _trees([pid])[pid])
    except OSError as exc:
        log.warning("could not read the CPU share of adopted workload process %d: %s", pid, exc)
        return None
    if not (weighed or idle):
        return None
    lowered = _Lowered(pid, cgroup, weighed=weighed, idle=idle)
    if crowded:
        return lowered
    log.info("adopted workload process %d arrived with the lowest CPU share: it gets it back", pid)
    _raise([lowered])
    return None


def _handed_over_cgroup(pid: int, directory: Path) -> WorkloadCgroup:
    """The cgroup of a workload another executor launched, with its cgroup v1 cpu directory if it has one.

    A v1 cpu directory of its own is one of the same name as its cgroup2 one (``ale-<instance>/<name>``):
    its predecessor made it to limit or weigh its CPU, beside the scheduler's own v1 cpu cgroup, where
    workloads with neither run (so that is where a restored one goes back to, unless a CPU limit keeps
    it there).
    """
    inside = own_cgroups(f"/proc/{pid}/cgroup").get("cpu")
    point = v1_mounts().get("cpu")
    v1: dict[str, Path] = {}
    home: Path | None = None
    if point is not None and inside is not None and PurePosixPath(inside).parts[-2:] == directory.parts[-2:]:
        v1["cpu"] = own = directory_of(point, mount_root(point), inside)
        if not _v1_cpu_limited(own):
            home = own.parent.parent
    return WorkloadCgroup(directory.name, directory, v1, Limits(), "", cpu_home=home)


def _v1_cpu_limited(directory: Path) -> bool:
    try:
        return (directory / "cpu.cfs_quota_us").read_text().strip() != "-1"
    except OSError:
        return False


def _weight_lowered(cgroup: WorkloadCgroup) -> bool:
    v1 = cgroup.v1.get("cpu")
    weight, lowest = (
        (v1 / "cpu.shares", LOWEST_SHARES) if v1 is not None else (cgroup.path / "cpu.weight", LOWEST_WEIGHT)
    )
    try:
        return int(weight.read_text()) <= lowest
    except FileNotFoundError:
        return False  # no cpu controller there: nothing weighs it


def _trees(roots: list[int]) -> dict[int, list[int]]:
    """Each of ``roots`` with its live descendants, from one pass over /proc (not one per root)."""
    if not roots:
        return {}
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                raw = stat.read()
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) state ppid ...": comm may hold anything, but nothing after its last ')' does.
        fields = raw[raw.rfind(b")") + 1 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    trees: dict[int, list[int]] = {}
    for root in roots:
        tree, todo = [root], [root]
        while todo:
            below = children.get(todo.pop(), [])
            tree += below
            todo += below
        trees[root] = tree
    return trees


class CrowdChild:
    """A launched (or adopted) workload that tells the crowd when it has ended or been let go; otherwise
    the child it wraps."""

    def __init__(
        self, child: Child, ended: Callable[[], Awaitable[None]], released: Callable[[], None]
    ) -> None:
        self._child = child
        self._ended: Callable[[], Awaitable[None]] | None = ended
        self._released = released

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
        # Handed over, it leaves with what it had before the crowd: the successor cannot tell a lowering
        # of ours from one of its own crowd's. wait() then raises Released, and its finally gives the share
        # back (before the release's wait for every workload ends) and tells the crowd this one is gone.
        if self._child.releasable and self._ended is not None:
            self._released()
        self._child.release()

    async def wait(self) -> int:
        try:
            return await self._child.wait()
        finally:
            ended, self._ended = self._ended, None  # counted once, however often it is awaited
            if ended is not None:
                await ended()
