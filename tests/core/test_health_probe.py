"""The health probe on a FakeClock: its lag, its cadence, and each verdict's threshold to the step.

Every time here is a sum of powers of two, so each comparison with a threshold is exact: STEP is the
smallest step taken, and "just below" a threshold is STEP short of it. At a limit the executor is still
healthy; one STEP beyond, it is not.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import pytest

from async_local_executor.core.health import (
    LAG_WINDOW,
    Health,
    Probe,
    Report,
    Thresholds,
    Verdict,
    stale,
    write_due,
)
from async_local_executor.core.state import LaunchFailure, SupervisorState
from tests.core.helpers import GUARD, FakeClock
from tests.states import quiet

pytestmark = pytest.mark.asyncio

INTERVAL = 0.5
STEP = 2.0**-10


@dataclass
class Driven:
    """A probe on a FakeClock: its reports come when the test moves time, not when time passes."""

    probe: Probe
    clock: FakeClock

    @property
    def report(self) -> Report:
        assert self.probe.report is not None
        return self.probe.report

    async def tick(self, seconds: float) -> Report:
        """Move time on; once a probe that woke has reported and parked again, its latest report."""
        self.clock.advance(seconds)
        await self.clock.sleepers(1)
        return self.report


def driven(
    state: Callable[[], SupervisorState] = quiet, clock: FakeClock | None = None, **options: Any
) -> Driven:
    clock = clock or FakeClock()
    return Driven(Probe(state, interval=INTERVAL, clock=clock, **options), clock)


@asynccontextmanager
async def running(d: Driven) -> AsyncIterator[Driven]:
    """The probe running, with its first report made and parked in its first sleep."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.probe.run)
        await d.clock.sleepers(1)
        yield d
        tg.cancel_scope.cancel()


async def test_the_probe_measures_how_late_it_woke_and_keeps_the_peak_for_the_lag_window() -> None:
    async with running(driven()) as d:
        first = d.report
        assert (first.at, first.written) == (d.clock.monotonic(), d.clock.time())
        assert (first.lag, first.health) == (0.0, Health(Verdict.HEALTHY))
        spike = await d.tick(INTERVAL + 3.0)  # the loop was blocked 3 s past the probe's wake-up
        assert (spike.lag, spike.peak_lag) == (3.0, 3.0)
        assert spike.health.reasons == ("event loop lagging 3.0s (limit 1s)",)
        # Later probes are on time again, but the spike stays in the verdict for LAG_WINDOW seconds...
        for _ in range(int(LAG_WINDOW / INTERVAL)):
            report = await d.tick(INTERVAL)
        assert report.at - spike.at == LAG_WINDOW
        assert (report.lag, report.peak_lag, report.health.verdict) == (0.0, 3.0, Verdict.UNHEALTHY)
        # ...and not one probe longer.
        report = await d.tick(INTERVAL)
        assert (report.peak_lag, report.health) == (0.0, Health(Verdict.HEALTHY))


async def test_the_probe_sleeps_its_interval_on_its_clock() -> None:
    async with running(driven()) as d:
        first = d.report
        assert await d.tick(INTERVAL - STEP) is first
        assert (await d.tick(STEP)).at == first.at + INTERVAL


async def test_lag_up_to_the_limit_is_healthy_and_beyond_it_is_not() -> None:
    async with running(driven(thresholds=Thresholds(max_lag=1.0))) as d:
        assert (await d.tick(INTERVAL + 1.0 - STEP)).health == Health(Verdict.HEALTHY)
        at_limit = await d.tick(INTERVAL + 1.0)
        assert (at_limit.lag, at_limit.health) == (1.0, Health(Verdict.HEALTHY))
        beyond = await d.tick(INTERVAL + 1.0 + STEP)
        assert beyond.health == Health(Verdict.UNHEALTHY, ("event loop lagging 1.0s (limit 1s)",))


async def test_no_report_is_unknown_and_one_older_than_the_stall_limit_means_a_stuck_loop() -> None:
    d = driven(thresholds=Thresholds(stall=5.0))

    def read() -> Health | None:
        return stale(d.probe.report, d.probe.thresholds, d.clock.monotonic())

    assert read() == Health(Verdict.UNKNOWN, ("no health report yet",))
    d.probe.refresh(0.0)  # its last report: the loop stops answering here
    d.clock.advance(5.0 - STEP)
    assert read() is None
    d.clock.advance(STEP)
    assert read() is None
    d.clock.advance(STEP)
    assert read() == Health(Verdict.UNHEALTHY, ("event loop has not answered for 5s",))


async def test_a_wait_up_to_the_limit_is_healthy_and_beyond_it_is_not() -> None:
    clock = FakeClock()
    since = clock.time()
    d = driven(
        lambda: quiet(waiting=2, oldest_waiting_since=since), clock, thresholds=Thresholds(max_wait=600.0)
    )
    clock.advance(600.0 - STEP)
    assert d.probe.refresh(0.0).health == Health(Verdict.HEALTHY)
    clock.advance(STEP)
    assert d.probe.refresh(0.0).health == Health(Verdict.HEALTHY)
    clock.advance(STEP)
    assert d.probe.refresh(0.0).health == Health(
        Verdict.UNHEALTHY, ("2 workload(s) waiting to launch, the oldest for 600s (limit 600s)",)
    )


async def test_launch_failures_count_from_the_threshold_and_until_the_window_has_passed() -> None:
    clock = FakeClock()
    failures = [LaunchFailure(clock.time(), f"t{i}", "Too many open files") for i in range(3)]
    seen = 2
    d = driven(
        lambda: quiet(recent_failures=tuple(failures[:seen])),
        clock,
        thresholds=Thresholds(failures=3, failure_window=300.0),
    )
    assert d.probe.refresh(0.0).health == Health(Verdict.HEALTHY)
    seen = 3
    failing = Health(
        Verdict.UNHEALTHY, ("3 launch failures in the last 300s (last: t2: Too many open files)",)
    )
    assert d.probe.refresh(0.0).health == failing
    clock.advance(300.0)
    assert d.probe.refresh(0.0).health == failing
    clock.advance(STEP)
    assert d.probe.refresh(0.0).health == Health(Verdict.HEALTHY)


async def test_probe_writes_off_the_loop_every_write_every_and_a_failed_write_does_not_stop_it() -> None:
    written: list[tuple[float, bool]] = []
    loop_thread = threading.get_ident()

    def write(report: Report) -> None:
        written.append((report.at, threading.get_ident() != loop_thread))
        if len(written) == 1:
            raise OSError("disk full")

    d = driven(write=write, write_every=2.0)
    start = d.clock.monotonic()
    async with running(d):
        with anyio.fail_after(GUARD):
            # A write still running when the next is due is skipped: move time on until three landed.
            while len(written) < 3:
                await d.tick(INTERVAL)
    assert all(off_loop for _, off_loop in written)
    ats = [at for at, _ in written]
    assert ats[0] == start
    assert all(later - earlier >= 2.0 for earlier, later in itertools.pairwise(ats))


@pytest.mark.parametrize(
    ("at", "last", "changed", "due"),
    [
        (0.0, None, False, True),  # the first report is always written
        (1.5, 0.0, False, False),  # within the period, the same verdict waits
        (2.0, 0.0, False, True),  # the period is up
        (0.5, 0.0, True, False),  # a change within half a period of the last write waits...
        (1.0, 0.0, True, True),  # ...and is written once half a period has passed
        (1.5, 1.0, True, False),  # a verdict flapping every probe: one write per half period at most
    ],
)
async def test_a_changed_verdict_is_written_early_but_not_more_than_twice_a_period(
    at: float, last: float | None, changed: bool, due: bool
) -> None:
    assert write_due(at, last, 2.0, changed) is due
