"""Who may launch now: a slot under the executor-wide limit, one under its group's limit, memory, and
room in the descriptor table.

Waiting here is the only queue there is: an accepted workload holds no slot until every limit lets it
through, and low memory delays launches but never fails them. Nor does a full descriptor table: a launch
that finds it full waits, with its slot, for a running workload to end (:meth:`Admission.hold_back`). A process that already runs (one adopted
from a stopped executor) never waits: it takes its slot at once, on credit when none is free, and the
limit is that much lower until it ends.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterator, Mapping

import anyio
import anyio.lowlevel
import psutil

from async_local_executor.core import descriptors
from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.errors import DescriptorsFull
from async_local_executor.core.launchers.base import LaunchRequest

log = logging.getLogger(__name__)

MB = 1024 * 1024
# How often a launch held back by a full descriptor table tries again when no workload has ended: the
# process's other descriptors (the scheduler's own) may have been closed meanwhile.
DESCRIPTOR_RETRY = 1.0


def host_available_memory() -> int:
    return int(psutil.virtual_memory().available)


class Slots:
    """At most ``limit`` held at once, handed out in the order they were asked for, except that a running
    process takes one at once, over the limit if none is free. Loop thread only.

    Counted here, not by an anyio ``CapacityLimiter`` whose limit is lowered for each slot taken on credit:
    anyio 4.7 to 4.11 (which pyproject allows) refuses a limit below
    1, and when a limit is raised wakes as many waiters as it rose, however many tokens are borrowed.
    """

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.held = 0
        self._waiters: dict[anyio.Event, None] = {}  # first come, first served

    @property
    def free(self) -> float:
        """Slots free now; below 0 while slots taken on credit hold the count over the limit."""
        return self.limit - self.held

    async def acquire(self) -> None:
        """Wait for a slot; the caller must :meth:`release` it."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        if not self._waiters and self.held < self.limit:
            self.held += 1
            try:
                # As a lock would: whoever gets a slot at once still lets the others run first.
                await anyio.lowlevel.cancel_shielded_checkpoint()
            except BaseException:
                self.release()
                raise
            return
        handed = anyio.Event()
        self._waiters[handed] = None
        try:
            await handed.wait()
        except BaseException:
            if handed.is_set():
                self.release()  # handed one as it was cancelled: it goes to the next in line
            else:
                del self._waiters[handed]
            raise

    def take(self) -> None:
        """One slot at once, over the limit if none is free; the caller must :meth:`release` it."""
        self.held += 1

    def release(self) -> None:
        self.held -= 1
        self._hand_on()

    def set_limit(self, limit: float) -> None:
        """A new limit, live: raised, it hands slots to waiters at once; lowered, what holds slots keeps
        them, and waiters get one only once the count is under the new limit."""
        self.limit = limit
        self._hand_on()

    def _hand_on(self) -> None:
        # Counted as held when handed on, not when the waiter runs: nothing that asks in between can
        # take it too.
        while self._waiters and self.held < self.limit:
            handed = next(iter(self._waiters))
            del self._waiters[handed]
            self.held += 1
            handed.set()


@contextlib.asynccontextmanager
async def _held(slots: Slots | None) -> AsyncIterator[None]:
    if slots is None:
        yield
        return
    await slots.acquire()
    try:
        yield
    finally:
        slots.release()


@contextlib.contextmanager
def _taken(slots: Slots | None) -> Iterator[None]:
    if slots is None:
        yield
        return
    slots.take()
    try:
        yield
    finally:
        slots.release()


class Admission:
    """The limits one supervisor's workloads pass before they launch. Loop thread only.

    :param limit: at most this many workloads hold a slot (launching or running) at once; ``None`` for
        no limit
    :param group_limits: at most this many workloads of each named group hold a slot at once
    :param memory_floor: bytes of available memory below which admitted workloads wait before launching;
        0 turns the guard off
    :param available_memory: reads the host's available memory in bytes
    :param memory_poll: seconds between two reads while memory is low
    :param clock: what the memory guard sleeps on between reads
    :param descriptor_table: reads the descriptor table's fill, for what a hold says
    :param descriptor_reserve: launches wait while fewer than this many descriptors are free, as if the
        table were full; 0: only a full table holds them back
    """

    def __init__(
        self,
        *,
        limit: int | None,
        group_limits: Mapping[str, int] | None = None,
        memory_floor: int = 0,
        available_memory: Callable[[], int] = host_available_memory,
        memory_poll: float = 1.0,
        clock: Clock = SYSTEM,
        descriptor_table: Callable[[], descriptors.Table] = descriptors.table,
        descriptor_reserve: int = 0,
    ) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {limit}")
        for group, group_limit in (group_limits or {}).items():
            if group_limit < 1:
                raise ValueError(f"limit of group {group!r} must be >= 1, got {group_limit}")
        self._slots = Slots(math.inf if limit is None else limit)
        self._group_slots = {group: Slots(group_limit) for group, group_limit in (group_limits or {}).items()}
        self._saturated: set[str] = set()
        self.memory_floor = memory_floor
        self._available_memory = available_memory
        self._memory_poll = memory_poll
        self._clock = clock
        self.memory_low = False
        self.last_available: int | None = None  # bytes, as last read by the guard
        self.memory_waits_total = 0  # workloads that had to wait for memory
        self._descriptor_table = descriptor_table
        self.descriptor_reserve = descriptor_reserve
        self._ended = anyio.Event()  # set when a workload ends, which frees its descriptors
        self._held_back = 0  # launches waiting now for descriptors
        self.descriptors_full: descriptors.Table | None = None  # the table when a launch last found it full
        self.descriptor_waits_total = 0  # launches that found the table full and waited
        self._resumed: anyio.Event | None = None  # set while paused; set (and dropped) on resume

    @contextlib.asynccontextmanager
    async def slot(self, request: LaunchRequest, *, running: bool = False) -> AsyncIterator[None]:
        """Hold a slot in ``request``'s group and one executor-wide, for as long as the body runs.

        :param running: the workload's process runs already (it was adopted): it takes its slots at once,
            without waiting. Where a limit has none free, it takes one on credit: the count goes over that
            limit, so workloads waiting to launch go only once enough others have ended to bring it back
            under. Nothing that runs is held back, or stopped, for it.
        """
        group = self._group_slots.get(request.group)
        if running:
            with _taken(group), _taken(self._slots):
                yield
            return
        while True:
            if request.pausable:
                await self._unpaused()
            # The group's slot before the executor-wide one, so a workload held back by its group's limit
            # does not also hold a slot another group could use.
            if group is not None:
                self._note_saturation(request.group, group)
            async with _held(group), _held(self._slots):
                if self.holds(request):
                    # Paused while it waited for its slots: they go to the next in line (a workload the
                    # pause does not hold), and it waits for the resume again.
                    continue
                yield
                return

    def holds(self, request: LaunchRequest) -> bool:
        """Whether the pause holds ``request`` back now (after a wait, before its launch)."""
        return request.pausable and self._resumed is not None

    @property
    def paused(self) -> bool:
        """No pausable workload starts: the pause or a drain is in force."""
        return self._resumed is not None

    @property
    def held(self) -> int:
        """Workloads holding an executor-wide slot: launching or running."""
        return self._slots.held

    @property
    def limit(self) -> int | None:
        """The executor-wide limit in force; None for none."""
        limit = self._slots.limit
        return None if limit == math.inf else int(limit)

    @property
    def group_limits(self) -> dict[str, int]:
        """Each group's limit in force."""
        return {name: int(slots.limit) for name, slots in self._group_slots.items()}

    def pause(self) -> None:
        """No pausable workload launches from now until :meth:`resume`; what runs goes on, and what was
        launching already (past its slots) finishes its launch."""
        if self._resumed is None:
            self._resumed = anyio.Event()

    def resume(self) -> None:
        resumed, self._resumed = self._resumed, None
        if resumed is not None:
            resumed.set()

    async def _unpaused(self) -> None:
        while (resumed := self._resumed) is not None:
            await resumed.wait()

    def resize(self, limit: int | None, group_limits: Mapping[str, int]) -> None:
        """New limits, live (see :meth:`Slots.set_limit`): lowering one stops nothing that runs.

        :param group_limits: each group's new limit; a group not named keeps its own, and one not limited
            before is limited from its next workload on
        :raises ValueError: a limit below 1
        """
        for name, value in {"": 1 if limit is None else limit, **group_limits}.items():
            if value < 1:
                raise ValueError(f"limit of {'group ' + repr(name) if name else 'the executor'} must be >= 1")
        self._slots.set_limit(math.inf if limit is None else limit)
        for name, value in group_limits.items():
            slots = self._group_slots.get(name)
            if slots is None:
                self._group_slots[name] = Slots(value)
            else:
                slots.set_limit(value)
                self._saturated.discard(name)

    def _note_saturation(self, name: str, group: Slots) -> None:
        if group.free < 1:
            if name not in self._saturated:
                self._saturated.add(name)
                log.info(
                    "queue %r is at its limit of %d running workloads; its next ones wait", name, group.limit
                )
        else:
            self._saturated.discard(name)

    async def wait_for_memory(self, request: LaunchRequest) -> None:
        """Return once available memory is at or above the floor; at once if the guard is off."""
        if not self.memory_floor:
            return
        waited = False
        while (available := self._available_memory()) < self.memory_floor:
            self.last_available = available
            if not waited:
                waited = True
                self.memory_waits_total += 1
            if not self.memory_low:
                self.memory_low = True
                log.warning(
                    "available memory %d MB is below the floor of %d MB; workload %s and the ones "
                    "after it wait to launch",
                    available // MB,
                    self.memory_floor // MB,
                    request.label or request.key,
                )
            await self._clock.sleep(self._memory_poll)
        self.last_available = available
        if self.memory_low:
            self.memory_low = False
            log.warning("available memory is back above %d MB; launching again", self.memory_floor // MB)

    def workload_ended(self) -> None:
        """A workload ended: the descriptors it held are free, for a launch held back to try again."""
        self._ended.set()
        self._ended = anyio.Event()

    def short_of_descriptors(self) -> DescriptorsFull | None:
        """Before a launch, where a reserve is kept: the table's room down to the reserve, as a full table
        (the process's own work, its journal and its database connections, needs those descriptors)."""
        if not self.descriptor_reserve:
            return None
        table = self._descriptor_table()
        if table.soft == descriptors.UNLIMITED or table.open + self.descriptor_reserve < table.soft:
            return None
        return DescriptorsFull(
            f"the last {self.descriptor_reserve} descriptors are kept for the scheduler itself"
        )

    async def hold_back(
        self, request: LaunchRequest, full: DescriptorsFull, others: int, *, again: bool
    ) -> None:
        """Wait, after ``request``'s launch found the descriptor table full, until it may try again:
        until a workload ends, or :data:`DESCRIPTOR_RETRY` seconds have passed. The caller then tries
        again, and once it launched or gave up says so with :meth:`held_back_ended` (once, if it was
        held back at all).

        :param others: workloads with a process, or launching, besides this one, whose ends would free
            descriptors
        :param again: it was held back before, and its last try found the table full again
        :raises DescriptorsFull: ``full``, with the table's fill, when none runs: nothing would free any
        """
        if others == 0:
            raise DescriptorsFull(
                f"{full} (descriptor table full: {self._descriptor_table().describe()}, and no other "
                "workload runs to free one)"
            ) from full
        if not again:
            self._held_back += 1
            self.descriptor_waits_total += 1
            log.debug("workload %s held back: descriptor table full", request.label or request.key)
        if self.descriptors_full is None:
            table = self._descriptor_table()
            log.warning(
                "launches held back: descriptor table full (%s); workload %s and the ones after it wait "
                "for a running workload to end (%s)",
                table.describe(),
                request.label or request.key,
                full,
            )
            self.descriptors_full = table
        with self._clock.move_on_after(DESCRIPTOR_RETRY):
            await self._ended.wait()

    def held_back_ended(self, *, launched: bool) -> None:
        """A workload held back for descriptors launched, or will not (it failed, or was stopped)."""
        self._held_back -= 1
        if self.descriptors_full is not None and not self._held_back:
            if launched:
                log.warning(
                    "launching again: the descriptor table has room (%s)", self._descriptor_table().describe()
                )
            self.descriptors_full = None
