"""What the executor says about itself: its health verdict, and SIGUSR2's dump."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, cast

from airflow.utils.net import get_hostname

from async_local_executor.adapter.executor_base import ExecutorBase
from async_local_executor.core.health import Health, Report, Verdict, stale
from async_local_executor.ops.instance_cgroups import status_of

log = logging.getLogger(__name__)


class ExecutorHealth(ExecutorBase):
    def get_health(self) -> Health:
        """Healthy, unhealthy (with reasons) or unknown; never waits, safe from any thread.

        The verdict comes from the event loop's probe (loop lag, the launch path, recent launch
        failures, the memory guard, workloads waiting too long); a loop thread that died or stopped
        refreshing it is judged here.
        """
        runtime = self._runtime
        if runtime is None:
            return Health(Verdict.UNKNOWN, ("executor stopped" if self._stopped else "executor not started",))
        if not runtime.alive:
            return Health(Verdict.UNHEALTHY, (f"event loop thread is dead: {runtime.failure!r}",))
        report = runtime.report
        health = stale(report, self._thresholds, self.clock.monotonic()) or cast("Report", report).health
        if self._containment is None:
            return health
        return dataclasses.replace(health, details=(("containment", self._containment.describe()),))

    def _status_meta(self, instance: str) -> dict[str, Any]:
        """Who writes the status file, beside what each report says."""
        return {
            "instance": instance,
            # The dashboard compares it with its own: it cannot judge another host's scheduler.
            "hostname": get_hostname(),  # type: ignore[no-untyped-call]
            "pid": os.getpid(),
            "team": self.team_name,
            "executor": type(self).__name__,
            "parallelism": self.parallelism,
            "launcher": self._config.launcher.value,
            "containment": None if self._containment is None else status_of(self._containment),
        }

    def debug_dump(self) -> None:
        """SIGUSR2 to the scheduler: Airflow's queues, then this executor's health and workloads."""
        super().debug_dump()  # type: ignore[no-untyped-call]
        health = self.get_health()
        log.info(
            "async_local_executor health: %s%s",
            health.verdict.value,
            f" ({health.reason})" if health.reason else "",
        )
        report = self._runtime.report if self._runtime is not None else None
        if report is not None:
            now = self.clock.time()
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
