"""A supervisor's state with nothing going on, for tests of what reads it (health, status, overview); who
writes a status file (:func:`meta`); and a status file with every kind of record in it (:func:`write_full`)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from async_local_executor.core.admission import MB
from async_local_executor.core.health import Health, Report, Thresholds, Verdict, assess
from async_local_executor.core.state import FinishedWorkload, LaunchFailure, RunningWorkload, SupervisorState
from async_local_executor.ops.status import Meta, StatusWriter, status_path


def quiet(**changes: object) -> SupervisorState:
    base: dict[str, object] = {
        "running": (),
        "waiting": 0,
        "oldest_waiting_since": None,
        "memory_low": False,
        "memory_floor": 256 * MB,
        "available_memory": 8000 * MB,
        "launcher_problem": None,
        "recent_failures": (),
        "launched_total": 0,
        "last_launched_at": None,
        "memory_waits_total": 0,
        "outcomes_total": {},
    }
    return SupervisorState(**{**base, **changes})  # type: ignore[arg-type]


def quiet_report() -> Report:
    """A healthy report of an idle supervisor without a memory guard, taken now."""
    state = quiet(memory_floor=0, available_memory=None)
    return Report(time.monotonic(), 0.0, 0.0, Health(Verdict.HEALTHY), state)


def meta(instance: str = "a", **changes: object) -> Meta:
    """Who writes a status file: an executor on this host with parallelism 4, unless ``changes`` say else."""
    base = Meta(
        instance=instance,
        hostname=os.uname().nodename,
        team=None,
        executor="AsyncLocalExecutor",
        parallelism=4,
        launcher="subprocess",
        containment=None,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def write_full(directory: Path, hostname: str) -> Path:
    """A status file with every field filled in: a running workload, finished ones, failures, a preload."""
    now = time.time()
    state = quiet(
        running=(RunningWorkload("etl.load[3] try 2", os.getpid(), now - 5, "default"),),
        waiting=1,
        oldest_waiting_since=now - 3,
        recent_failures=(LaunchFailure(now - 2, "etl.bad try 1", "boom"),),
        recent_finished=(FinishedWorkload(now - 1, "etl.done try 1", "ok", 0, "", 1.5),),
        launcher_state="fork server running",
        preload={
            "mode": "auto",
            "preloaded": [{"module": "pandas", "distribution": "pandas", "version": "2", "kib": 2048}],
            "refused": [{"module": "torch", "reason": "too big", "retried": False}],
            "pending": ["numpy"],
            "generation": 1,
        },
        outcomes_total={"ok": 1, "launch_failed": 1},
    )
    health = assess(state, 0.0, Thresholds(), now)
    writer = StatusWriter(
        status_path(directory, "a"),
        meta(
            "a",
            hostname=hostname,
            launcher="forkserver",
            containment={"mode": "off", "detail": "not contained"},
        ),
    )
    writer.write(Report(time.monotonic(), 0.0, 0.0, health, state))
    return writer.path
