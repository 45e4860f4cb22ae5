"""The executor's health: healthy, unhealthy with reasons, or unknown, from live signals.

The shape follows Airflow's executor-health proposal (a verdict and a reason, ``unknown`` by default).
The verdict is computed on the event loop, by a probe that wakes every ``interval`` seconds and also
measures how late it woke (the loop's lag); the latest :class:`Report` is one attribute, so reading it
from any thread is a single reference read that never waits. A loop that stops answering leaves an old
report behind, which the reader turns into ``unhealthy`` itself. Every time is read from the probe's
:class:`~async_local_executor.core.clock.Clock`, so a test can drive the thresholds by hand. Nothing here
knows Airflow.
"""

from __future__ import annotations

import collections
import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import anyio
import anyio.to_thread
from typing_extensions import Required, TypedDict

from async_local_executor.core.admission import MB
from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.state import SupervisorState

log = logging.getLogger(__name__)


# Seconds over which the worst loop lag is kept for the verdict.
LAG_WINDOW = 10.0


class Verdict(enum.Enum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


# What a verdict may say to whoever asks unauthenticated (a load balancer's health check): a fixed code per
# reason, and fixed words for it. The reasons themselves name tasks, pids, modules and exception text,
# and stay with whoever may see the status.
WITHHELD = "reasons_withheld"
PUBLIC_REASONS: Mapping[str, str] = MappingProxyType(
    {
        "loop_lagging": "the executor's event loop is lagging",
        "loop_stalled": "the executor's event loop has stopped answering",
        "launcher_degraded": "the launch path is degraded",
        "launch_failures": "launches keep failing",
        "memory_low": "the memory guard is holding workloads until memory frees up",
        "descriptors_full": "launches are held back until the descriptor table has room",
        "waiting_too_long": "workloads have waited too long to launch",
        "no_report": "no health report yet",
        WITHHELD: "the reasons are in the authenticated status",
    }
)


class HealthFields(TypedDict):
    """A verdict as the status file holds it (:class:`~async_local_executor.ops.status_format.StatusFile`)."""

    status: Required[str]
    reason: str | None
    reasons: list[str]
    public_reasons: list[str]
    public_codes: list[str]


@dataclass(frozen=True)
class Health:
    """:param codes: the code of each reason (:data:`PUBLIC_REASONS`), for whoever may ask unauthenticated;
    empty: :data:`WITHHELD`, if there are reasons
    """

    verdict: Verdict
    reasons: tuple[str, ...] = ()
    codes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def reason(self) -> str | None:
        return "; ".join(self.reasons) or None

    @property
    def public_codes(self) -> tuple[str, ...]:
        """The codes of the reasons, each a key of :data:`PUBLIC_REASONS` and nothing else."""
        if not self.reasons:
            return ()
        known = tuple(code if code in PUBLIC_REASONS else WITHHELD for code in self.codes)
        return tuple(dict.fromkeys(known)) or (WITHHELD,)

    @property
    def public_reasons(self) -> tuple[str, ...]:
        """The reasons in fixed words: nothing from a task, a module, a path or an exception."""
        return tuple(PUBLIC_REASONS[code] for code in self.public_codes)

    def as_dict(self) -> HealthFields:
        return {
            "status": self.verdict.value,
            "reason": self.reason,
            "reasons": list(self.reasons),
            "public_reasons": list(self.public_reasons),
            "public_codes": list(self.public_codes),
        }


@dataclass(frozen=True)
class Thresholds:
    """When a signal turns the verdict to unhealthy.

    :param max_lag: seconds the loop may wake late (a loop this late delays every exit and launch);
        judged on the worst lag of the last ``LAG_WINDOW`` seconds
    :param stall: seconds without a fresh report before the loop counts as stuck
    :param failures: launch failures within ``failure_window`` seconds, with no launch since
    :param max_wait: seconds a workload may wait for a slot or for memory
    """

    max_lag: float = 1.0
    stall: float = 5.0
    failures: int = 3
    failure_window: float = 300.0
    max_wait: float = 600.0


@dataclass(frozen=True)
class Report:
    """One probe's findings. ``at`` is monotonic, every other time the wall clock."""

    at: float
    lag: float  # how late this probe woke, seconds
    peak_lag: float  # the worst over the last LAG_WINDOW seconds: one spike stays visible a while
    health: Health
    state: SupervisorState
    written: float = field(default_factory=SYSTEM.time)


def assess(state: SupervisorState, lag: float, thresholds: Thresholds, now: float) -> Health:
    """The verdict from one snapshot; ``now`` is the wall clock."""
    found: list[tuple[str, str]] = []  # each reason, then its code (PUBLIC_REASONS)
    if lag > thresholds.max_lag:
        found.append((f"event loop lagging {lag:.1f}s (limit {thresholds.max_lag:g}s)", "loop_lagging"))
    if state.launcher_problem:
        # Its words may name preloaded modules, pids or an exception's text: the code alone goes public.
        found.append((state.launcher_problem, "launcher_degraded"))
    # A launch that worked since the failures shows the cause has passed (a burst of EMFILE, say);
    # an executor that keeps failing with nothing launching in between is what this is for.
    since = max(now - thresholds.failure_window, state.last_launched_at or 0.0)
    recent = [f for f in state.recent_failures if f.at >= since]
    if len(recent) >= thresholds.failures:
        last = recent[-1]
        failures = f"{len(recent)} launch failures in the last {thresholds.failure_window:.0f}s"
        found.append((f"{failures} (last: {last.label}: {last.reason})", "launch_failures"))
    if state.memory_low:
        available = "?" if state.available_memory is None else f"{state.available_memory // MB}"
        said = (
            f"memory guard holding {state.waiting} workload(s): {available} MB available, "
            f"floor {state.memory_floor // MB} MB"
        )
        found.append((said, "memory_low"))
    if state.descriptors_full is not None:
        said = f"launches held back: descriptor table full ({state.descriptors_full.describe()})"
        found.append((said, "descriptors_full"))
    # Held back by an operator's pause, waiting is what they asked for.
    if state.oldest_waiting_since is not None and not state.paused:
        waited = now - state.oldest_waiting_since
        if waited > thresholds.max_wait:
            said = (
                f"{state.waiting} workload(s) waiting to launch, the oldest for {waited:.0f}s "
                f"(limit {thresholds.max_wait:.0f}s)"
            )
            found.append((said, "waiting_too_long"))
    return Health(
        Verdict.UNHEALTHY if found else Verdict.HEALTHY,
        tuple(full for full, _ in found),
        codes=tuple(code for _, code in found),
    )


def stale(report: Report | None, thresholds: Thresholds, now: float) -> Health | None:
    """The verdict a reader must give instead of ``report``'s, if the loop has stopped refreshing it."""
    if report is None:
        return Health(Verdict.UNKNOWN, ("no health report yet",), codes=("no_report",))
    silent = now - report.at
    if silent > thresholds.stall:
        return Health(
            Verdict.UNHEALTHY, (f"event loop has not answered for {silent:.0f}s",), codes=("loop_stalled",)
        )
    return None


def write_due(at: float, last: float | None, every: float, changed: bool) -> bool:
    """Whether a report made at ``at`` is written, the last write having started at ``last``.

    Every ``every`` seconds, and early when the verdict changed (whoever watches the file, a monitor or
    the dashboard, learns of a fork server gone within a probe, not at the next period), but never
    within ``every / 2`` of the last write: a verdict flapping under load, when the host has the least
    CPU to spare, costs at most twice the writes.
    """
    if last is None:
        return True
    since = at - last
    return since >= every or (changed and since >= every / 2)


class Probe:
    """Runs on the loop: measures its lag and keeps :attr:`report` current.

    :param state: reads the supervisor's state (called on the loop)
    :param on_report: called on the loop with each new report; must not block
    :param write: called in a worker thread with a report every ``write_every`` seconds and whenever
        the verdict changes (a status file, say); a write still running when the next is due makes that
        one be skipped
    :param clock: every time the probe reads, and its sleep between probes
    """

    def __init__(
        self,
        state: Callable[[], SupervisorState],
        *,
        interval: float = 0.5,
        thresholds: Thresholds | None = None,
        on_report: Callable[[Report], None] | None = None,
        write: Callable[[Report], None] | None = None,
        write_every: float = 2.0,
        clock: Clock = SYSTEM,
    ) -> None:
        self._state = state
        self._clock = clock
        self.interval = interval
        self.thresholds = thresholds or Thresholds()
        self._on_report = on_report
        self._write = write
        self._write_every = write_every
        self._writing = False
        self._lags: collections.deque[tuple[float, float]] = collections.deque()
        self.report: Report | None = None

    def refresh(self, lag: float) -> Report:
        now = self._clock.monotonic()
        self._lags.append((now, lag))
        while self._lags[0][0] < now - LAG_WINDOW:
            self._lags.popleft()
        peak = max(recent for _, recent in self._lags)
        state = self._state()
        wall = self._clock.time()
        report = Report(now, lag, peak, assess(state, peak, self.thresholds, wall), state, written=wall)
        self.report = report
        return report

    async def run(self) -> None:
        lag = 0.0
        last: float | None = None  # when the last write was started
        written: Verdict | None = None
        async with anyio.create_task_group() as tg:
            while True:
                report = self.refresh(lag)
                if self._on_report is not None:
                    self._on_report(report)
                changed = report.health.verdict is not written
                if (
                    self._write is not None
                    and not self._writing
                    and write_due(report.at, last, self._write_every, changed)
                ):
                    last, written = report.at, report.health.verdict
                    self._writing = True
                    tg.start_soon(self._write_off_loop, report)
                woke = self._clock.monotonic()
                await self._clock.sleep(self.interval)
                lag = max(0.0, self._clock.monotonic() - woke - self.interval)

    async def _write_off_loop(self, report: Report) -> None:
        assert self._write is not None
        try:
            await anyio.to_thread.run_sync(self._write, report)
        except Exception:  # a status file is a convenience: it must never stop the probe
            log.exception("cannot write the status report")
        finally:
            self._writing = False
