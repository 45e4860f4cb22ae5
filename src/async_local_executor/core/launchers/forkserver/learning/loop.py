"""The fork server's learning loop: when what workloads import has grown, a new helper preloads it.

Scans (in a worker thread: they read files) run every few seconds, and at once when a workload names a
file not seen before. A new helper is started when there are names no helper has tried yet that the
serving helper does not have already (it is asked first: most of a DAG file's imports are the task
SDK's, which every helper imports), or a preloaded module's file changed (an upgrade), at most once
per ``interval``; the first one as soon as
there is something to try, so a burst of tasks from a new DAG benefits within seconds. Starting it is
the launcher's (:meth:`ForkServerLauncher._grow`): the old helper keeps serving until the new one is
ready, then takes no new launch and exits, costing no running workload.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence

import anyio
import anyio.to_thread

from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.launchers.base import PreloadSummary
from async_local_executor.core.launchers.forkserver import LOGGER
from async_local_executor.core.launchers.forkserver.learning.learned import Learned, few
from async_local_executor.core.launchers.forkserver.protocol import Checked, PreloadReport

log = logging.getLogger(LOGGER)

SCAN_EVERY = 5.0
# After a helper refused a learned module, the next try (without it) may come this much sooner.
RETRY_AFTER_REFUSAL = 5.0

Grow = Callable[[list[str]], Awaitable[bool]]
# What the serving helper says of these names (``None``: it cannot tell).
Have = Callable[[list[str]], Awaitable[Checked | None]]


class Learning:
    """Decides when a helper with a grown set is worth starting.

    :param learned: what was learned so far (and where workloads record their imports)
    :param interval: at least this many seconds between two helpers started for learned modules
    :param memory_budget: bytes the learned modules may add to a helper (0: no limit)
    :param discover: files workloads are expected to run, listed once in a worker thread at the start
        (the DAG files already on the host), so their imports are preloaded before their first workload
    :param clock: what the scans' period and the interval between helpers are measured on (the
        launcher's)
    """

    def __init__(
        self,
        learned: Learned,
        *,
        interval: float,
        memory_budget: int = 0,
        discover: Callable[[], Iterable[str]] | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        self.learned = learned
        self._discover = discover
        self.interval = interval
        self.memory_budget = memory_budget
        self._clock = clock
        self._wake = anyio.Event()
        self._updated = anyio.Event()
        self.stopped = anyio.Event()  # set if the learning failed and stopped

    def saw(self, path: str | None) -> None:
        """A workload will run ``path`` (its DAG file): read its imports soon if it is new."""
        if self.learned.saw_file(path):
            self._wake.set()

    def refuse(self, module: str, reason: str) -> None:
        log.warning("fork server: not preloading %s any more: %s", module, reason)
        self.learned.refuse(module, reason, self._clock.monotonic())
        self._notify()

    def unfit_later(self, why: str) -> None:
        """A helper with learned modules found a thread running after its start: which module started
        it cannot be told, so none of them is preloaded again (rather than no fork server at all)."""
        now = self._clock.monotonic()
        for module in list(self.learned.preloaded):
            self.learned.refuse(
                module, f"a thread started in the fork server after it preloaded this: {why}", now
            )
        log.warning(
            "fork server: a thread started after it preloaded what tasks import (%s); preloading none of it",
            why,
        )
        self._notify()

    def took(self, report: PreloadReport, tried: list[str]) -> str | None:
        """A helper that tried ``tried`` took over; what changed, in words, or ``None``."""
        change = self.learned.took(report, tried, self._clock.monotonic())
        self._notify()
        return change

    async def updated(self) -> None:
        """Return once a helper took over or a module was refused (what the status shows changed)."""
        await self._updated.wait()

    def _notify(self) -> None:
        self._updated.set()
        self._updated = anyio.Event()

    async def run(self, grow: Grow, have: Have) -> None:
        """Learn until cancelled; a failure here stops the learning alone, never the launcher."""
        try:
            await self._learn(grow, have)
        except Exception:  # preloading is a speed-up: the helper serving now goes on
            log.exception("fork server: learning what tasks import stopped; what is preloaded now stays")
            self.stopped.set()

    async def _wanted(self, have: Have) -> bool:
        """Whether a new helper would add anything: what the serving one has, or what no helper would
        ever preload (the DAGs folder's modules), is not worth one."""
        answer = await have(list(self.learned.pending)) if self.learned.pending else None
        if answer is not None and (refused := self.learned.checked(answer, self._clock.monotonic())):
            reasons = [f"{m} ({self.learned.refused[m]})" for m in refused]
            log.info("fork server: not preloading %s", few(reasons))
            self._notify()
        return self.learned.wanted

    async def _learn(self, grow: Grow, have: Have) -> None:
        last: float | None = None
        pause = self.interval
        if (discover := self._discover) is not None:
            for path in await anyio.to_thread.run_sync(lambda: list(discover())):
                self.learned.saw_file(path)
            self._wake.set()
        while True:
            with self._clock.move_on_after(SCAN_EVERY):
                await self._wake.wait()
            self._wake = anyio.Event()
            found = await anyio.to_thread.run_sync(self.learned.scan)
            wanted = self.learned.apply(found) | self.learned.retry_due(self._clock.monotonic())
            if found.more:  # the rest of a large DAGs folder: read next, a slice at a time
                self._wake.set()
            if not (wanted and await self._wanted(have)):
                continue
            if last is not None and (wait := last + pause - self._clock.monotonic()) > 0:
                await self._clock.sleep(wait)
                self.learned.apply(await anyio.to_thread.run_sync(self.learned.scan))
                if not await self._wanted(have):
                    continue
            last = self._clock.monotonic()
            refused = len(self.learned.refused)
            took = await grow(self.learned.plan())
            # A refusal shrinks the set: the helper without that module need not wait a whole interval.
            pause = RETRY_AFTER_REFUSAL if not took and len(self.learned.refused) > refused else self.interval


def describe(learning: Learning | None, explicit: Sequence[str]) -> PreloadSummary | None:
    """What a launcher's helpers preload beyond their target's own imports, for the status report."""
    if learning is not None:
        return learning.learned.as_dict()
    return {"mode": "explicit", "modules": list(explicit)} if explicit else None
