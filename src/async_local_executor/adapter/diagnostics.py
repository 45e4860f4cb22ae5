"""What the executor says about itself: its health verdict, the status file's header, and SIGUSR2's dump.

Rule: nothing here waits or starts anything; it judges the reports the event loop's probe publishes,
so it is safe from any thread, the api-server's included.
"""

from __future__ import annotations

import logging
from typing import cast

from airflow.utils.net import get_hostname

from async_local_executor.core.cgroups import Containment
from async_local_executor.core.clock import Clock
from async_local_executor.core.health import Health, Report, Thresholds, Verdict, stale
from async_local_executor.core.runtime import Runtime
from async_local_executor.ops.instance_cgroups import status_of
from async_local_executor.ops.status import Meta

log = logging.getLogger(__name__)


class Diagnostics:
    """Judges the executor's runtime for Airflow's health check and for SIGUSR2.

    :ivar thresholds: what the probe judges by (the executor sets them when it starts), for a report
        that stopped coming
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.thresholds = Thresholds()

    def health(self, runtime: Runtime | None, *, stopped: bool) -> Health:
        """Healthy, unhealthy (with reasons) or unknown; never waits.

        The verdict comes from the event loop's probe (loop lag, the launch path, recent launch
        failures, the memory guard, workloads waiting too long); a loop thread that died or stopped
        refreshing it is judged here.
        """
        if runtime is None:
            return Health(Verdict.UNKNOWN, ("executor stopped" if stopped else "executor not started",))
        if not runtime.alive:
            return Health(Verdict.UNHEALTHY, (f"event loop thread is dead: {runtime.failure!r}",))
        report = runtime.report
        return stale(report, self.thresholds, self._clock.monotonic()) or cast("Report", report).health

    def dump(self, health: Health, runtime: Runtime | None) -> None:
        """Log the verdict, then what the loop runs and how it fares (SIGUSR2 to the scheduler)."""
        log.info(
            "async_local_executor health: %s%s",
            health.verdict.value,
            f" ({health.reason})" if health.reason else "",
        )
        report = runtime.report if runtime is not None else None
        if report is not None:
            now = self._clock.time()
            state = report.state
            log.info(
                "async_local_executor: %d running, %d waiting, loop lag %.1f ms, launched %d, outcomes %s\n\t%s",
                len(state.running),
                state.waiting,
                report.lag * 1000,
                state.launched_total,
                dict(state.outcomes_total),
                "\n\t".join(f"{w.label} pid {w.pid} age {now - w.launched:.0f}s" for w in state.running),
            )


def status_meta(
    instance: str,
    *,
    team: str | None,
    executor: str,
    parallelism: int,
    launcher: str,
    containment: Containment | None,
) -> Meta:
    """Who writes the status file, beside what each report says."""
    return Meta(
        instance=instance,
        # The dashboard compares it with its own: it cannot judge another host's scheduler.
        hostname=get_hostname(),  # type: ignore[no-untyped-call]
        team=team,
        executor=executor,
        parallelism=parallelism,
        launcher=launcher,
        containment=None if containment is None else status_of(containment),
    )
