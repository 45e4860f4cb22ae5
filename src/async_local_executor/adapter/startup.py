"""Airflow's configuration turned into the plain values the core is built from (see ``core.wiring``)."""

from __future__ import annotations

import hashlib
import math
import re
from datetime import timedelta
from pathlib import Path

from async_local_executor.adapter import dag_files
from async_local_executor.adapter.config import ConfSource, ExecutorConfig, LauncherKind, PreloadMode
from async_local_executor.core import cpu_priority
from async_local_executor.core.wiring import Plan

# The scheduler subtracts timedelta(seconds=task_queued_timeout) from now: beyond this it raises itself.
_QUEUED_TIMEOUT_MAX = timedelta.max.total_seconds()


def queued_timeout(conf: ConfSource) -> float:
    """``[scheduler] task_queued_timeout``: how long the scheduler lets a task wait in queued.

    :raises ValueError: naming the option when it is no number the prefetch budget can divide
    """
    raw = conf.get("scheduler", "task_queued_timeout", fallback="600") or "600"
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not abs(value) <= _QUEUED_TIMEOUT_MAX:  # NaN and inf too: the prefetch budget floors a quotient
        raise ValueError(
            f"[scheduler] task_queued_timeout must be a number of seconds of at most "
            f"{_QUEUED_TIMEOUT_MAX:.15g} (the largest timedelta), got {raw!r}"
        )
    return value


def learn_dir(state_dir: Path, team: str | None) -> str:
    """Where one executor's tasks record what they import, and its learned set is kept.

    A directory per team: two teams' executors in one scheduler share the state directory, and each
    must read only what its own tasks recorded and keep its own learned set.
    """
    name = f"team-{team}" if team else "no-team"
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", name) or name.startswith("."):
        name = "team-" + hashlib.sha256(str(team).encode()).hexdigest()[:16]
    return str(state_dir / "imports" / name)


def plan(
    config: ExecutorConfig, *, parallelism: int, queued_timeout: float, fork_target: str, learn_dir: str = ""
) -> Plan:
    """:param parallelism: Airflow's; 0 (Airflow 2) means unlimited, as it does to the core
    :param learn_dir: where tasks record what they import (with ``preload = auto``)
    """
    mode = config.preload
    return Plan(
        parallelism=parallelism,
        prefetch=config.prefetch(parallelism),
        queued_timeout=queued_timeout,
        launcher=config.launcher.value,
        fork_target=fork_target,
        preload=() if mode is PreloadMode.OFF else config.preload_modules,
        learn_dir=learn_dir
        if mode is PreloadMode.AUTO and config.launcher is LauncherKind.FORKSERVER
        else "",
        preload_exclude=config.preload_exclude,
        preload_memory_budget=config.preload_memory_budget,
        preload_interval=config.preload_interval,
        discover_sources=dag_files.local_dag_files,
        forkserver_idle_timeout=config.forkserver_idle_timeout,
        termination_grace=config.termination_grace_period,
        group_limits=dict(config.queue_limits),
        memory_floor_mb=config.min_available_memory_mb,
        event_loop=config.event_loop.value,
        max_lag=config.health_loop_lag_limit,
        max_wait=config.health_wait_limit,
        limits=config.limits,
        kill_leftovers=config.kill_leftover_processes,
        crowd=config.workload_cpu_priority == cpu_priority.AUTO,
        idle_workloads=config.workload_cpu_priority == cpu_priority.IDLE,
    )
