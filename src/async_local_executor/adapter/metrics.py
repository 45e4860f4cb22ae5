"""The executor's own metrics, sent through Airflow's Stats (StatsD or OpenTelemetry, as configured).

Every name starts with ``async_local_executor.``; on Airflow 3 the executor makes it team-aware the way
Airflow names its own executor metrics. None of these calls waits: a gauge is one UDP datagram
(StatsD) or an in-memory update (OpenTelemetry), so they are safe on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from airflow.utils.helpers import prune_dict

from async_local_executor.adapter.compat import AIRFLOW_V3, stats
from async_local_executor.core.admission import MB
from async_local_executor.core.health import Report, Verdict
from async_local_executor.core.outcome import Cleanup, Outcome, OutcomeKind

# Metric name suffixes of final events that are not a success.
_OUTCOME_NAMES = {OutcomeKind.EXITED: "failed", OutcomeKind.SIGNALLED: "killed"}


class Metrics:
    """
    :param executor_class: the ``executor_class_name`` tag
    :param team: the ``team_name`` tag (none without a team)
    :param qualify: turns a metric name into the executor's own (Airflow 3's per-team names)
    """

    def __init__(
        self,
        *,
        executor_class: str | None = None,
        team: str | None = None,
        qualify: Callable[[str], str] | None = None,
    ) -> None:
        self._tags: dict[str, str] = prune_dict({"executor_class_name": executor_class, "team_name": team})
        self._qualify = qualify
        self._memory_waits_seen = 0
        self._descriptor_waits_seen = 0

    def name(self, name: str) -> str:
        name = f"async_local_executor.{name}"
        if not AIRFLOW_V3 or self._qualify is None:
            return name  # Airflow 2 has no per-team metric names
        return str(self._qualify(name))

    def launch_latency(self, seconds: float) -> None:
        """From the scheduler's hand-over to the workload's process running."""
        stats.timing(self.name("launch_latency"), timedelta(seconds=max(0.0, seconds)), tags=self._tags)

    def final_event(self, outcome: Outcome, *, gone: bool = False) -> None:
        """Count one workload's end; ``gone``: its task instance was cleared under it (Airflow 3), which
        is no failure, and every clear of a running task instance ends its workload so."""
        kind = "success" if outcome.ok else _OUTCOME_NAMES.get(outcome.kind, outcome.kind.value)
        if gone:
            kind = "gone"
        stats.incr(self.name(f"final_events.{kind}"), tags=self._tags)
        if outcome.cleanup is not None:
            self._cleanup(outcome.cleanup)

    def _cleanup(self, cleanup: Cleanup) -> None:
        """What a contained workload's cgroup used and held once its main process had exited."""
        tags = self._tags
        if cleanup.memory_peak is not None:
            stats.gauge(self.name("workload.memory_peak_mb"), round(cleanup.memory_peak / MB, 1), tags=tags)
        if cleanup.cpu_seconds is not None:
            stats.timing(self.name("workload.cpu_time"), timedelta(seconds=cleanup.cpu_seconds), tags=tags)
        if cleanup.leftovers:
            stats.incr(self.name("workload.leftover_processes"), count=cleanup.leftovers, tags=tags)
        if cleanup.oom_kills:
            stats.incr(self.name("workload.oom_kills"), count=cleanup.oom_kills, tags=tags)

    def control(self, mode: str, parallelism: int) -> None:
        """A change of live control: which mode is in force (one gauge each, 0 or 1), and the limit."""
        for each in ("paused", "draining"):
            stats.gauge(self.name(f"control.{each}"), int(mode == each), tags=self._tags)
        stats.gauge(self.name("parallelism"), parallelism, tags=self._tags)

    def report(self, report: Report) -> None:
        """Gauges from one health probe; on the loop thread, every probe."""
        state, tags = report.state, self._tags
        stats.gauge(self.name("loop_lag"), report.lag * 1000, tags=tags)
        stats.gauge(self.name("waiting"), state.waiting, tags=tags)
        stats.gauge(self.name("memory_guard_holding"), int(state.memory_low), tags=tags)
        stats.gauge(self.name("descriptors_holding"), int(state.descriptors_full is not None), tags=tags)
        stats.gauge(self.name("healthy"), int(report.health.verdict is Verdict.HEALTHY), tags=tags)
        stats.gauge(self.name("paused"), int(state.paused), tags=tags)
        if state.limit is not None:
            stats.gauge(self.name("parallelism"), state.limit, tags=tags)
        if waits := state.memory_waits_total - self._memory_waits_seen:
            self._memory_waits_seen = state.memory_waits_total
            stats.incr(self.name("memory_guard_waits"), waits, tags=tags)
        if waits := state.descriptor_waits_total - self._descriptor_waits_seen:
            self._descriptor_waits_seen = state.descriptor_waits_total
            stats.incr(self.name("descriptor_waits"), waits, tags=tags)
