"""An executor's start: Airflow's configuration read and checked (:func:`prepare`), then what a running
executor is made of built from it (:func:`build`), the core through ``core.wiring``.

Rule: every option is checked before anything is reclaimed, opened or started, so a bad value stops
the start with nothing to undo; the descriptor limit is raised before the fork server and the first
launch, which inherit it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from async_local_executor.adapter import adoption, dag_files, intake, scheduler_helpers
from async_local_executor.adapter.compat import ClientTimeout, client_timeout, execution_api_url
from async_local_executor.adapter.config import (
    ConfSource,
    ContainmentKind,
    ExecutorConfig,
    LauncherKind,
    PreloadMode,
    unknown_options,
)
from async_local_executor.adapter.diagnostics import status_meta
from async_local_executor.adapter.output_relay import OutputRelay
from async_local_executor.adapter.submissions import Mailbox, describe
from async_local_executor.core import cpu_priority, descriptors
from async_local_executor.core.cgroups import Containment
from async_local_executor.core.clock import Clock
from async_local_executor.core.health import Report
from async_local_executor.core.wiring import Plan, Wired, wire
from async_local_executor.ops import custody_dir, journal, recovery, state_dir, status
from async_local_executor.ops.instance_cgroups import open_containment
from async_local_executor.ops.status_format import ControlFields

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class Settings:
    """What a start reads from Airflow's configuration, every option checked."""

    config: ExecutorConfig
    state_dir: Path
    plan: Plan
    room: descriptors.Room
    argv: tuple[str, ...]
    """The command that runs one workload; it reads its workload from stdin."""
    title_prefix: str
    task_log_folder: str
    server: str
    """The execution API's URL (Airflow 3)."""
    owner_key: str
    hold_bound: float
    timeout: ClientTimeout | None
    """The execution-API client timeout task processes get (Airflow 3), if this executor sets one."""


def prepare(
    conf: ConfSource, deployment: Any, *, parallelism: int, team: str | None, fork_target: str
) -> Settings:
    """Read and check every option, and raise the descriptor limit.

    :param conf: the executor's configuration (its team's, where it has one)
    :param deployment: the deployment's own configuration, which holds what is not a team's
        (``[workers]``, ``[database]``, ``[scheduler]``)
    :param parallelism: Airflow's; 0 (Airflow 2) means unlimited
    :raises ValueError: naming the option whose value is wrong
    """
    # Said first: a misspelt option beside an invalid value is as much the operator's to know.
    for unknown in unknown_options(deployment, os.environ, team):
        log.warning("%s", unknown.describe())
    config = ExecutorConfig.from_conf(conf)
    directory = state_dir.resolve(config.state_dir)
    made = plan(
        config,
        parallelism=parallelism,
        queued_timeout=queued_timeout(conf),
        fork_target=fork_target,
        learn_dir=learn_dir(directory, team),
    )
    argv = intake.entry_argv(
        os.getpid(),
        config.workload_cpu_priority,
        made.learn_dir,
        sys.path[0] if sys.path else None,
        handover_timeout=config.handover_timeout if config.hands_over else 0.0,
        custody_dir=str(custody_dir.path(directory)) if config.hands_over else "",
    )
    title_prefix = f"airflow worker -- AsyncLocalExecutor{f' [{team}]' if team else ''}:"
    task_log_folder = conf.get("logging", "base_log_folder", fallback="") or ""
    server = execution_api_url(conf)
    owner = adoption.owner_key(deployment, team)
    bound = adoption.hold_bound(deployment)
    timeout = client_timeout(deployment, os.environ)
    # Last, once every option was read: the only step here that changes the process.
    room = descriptors.make_room(parallelism or None)
    if room.raised:
        made = dataclasses.replace(made, workload_nofile=room.before)
    if not room.enough:  # the table will fill: launches stop short of it, for the scheduler's own needs
        made = dataclasses.replace(made, descriptor_reserve=descriptors.reserve(room.after))
    return Settings(
        config=config,
        state_dir=directory,
        plan=made,
        room=room,
        argv=argv,
        title_prefix=title_prefix,
        task_log_folder=task_log_folder,
        server=server,
        owner_key=owner,
        hold_bound=bound,
        timeout=timeout,
    )


@dataclass(frozen=True)
class Callbacks:
    """What the core and the status writer call back in the executor."""

    mailbox: Mailbox
    output: OutputRelay
    on_report: Callable[[Report], None]
    launch_record: Callable[[object], dict[str, object] | None]
    """A task launch's record for a successor (:meth:`~adoption.Handovers.launch_record`)."""
    claimed: Callable[[int], bool]
    """Whether a held workload's process was adopted (:meth:`~adoption.Adoptions.claimed_pid`)."""
    control: Callable[[], ControlFields]
    """The live control applied (:meth:`~live_control.LiveControl.fields`)."""


@dataclass(frozen=True)
class Built:
    """A started executor's parts; the runtime is wired, not started."""

    journal: journal.LaunchJournal
    held: list[recovery.Held]
    """What a stopped or crashed predecessor handed over, to hold once the runtime runs."""
    containment: Containment
    status: status.StatusWriter
    wired: Wired


def build(
    settings: Settings,
    callbacks: Callbacks,
    *,
    team: str | None,
    executor: str,
    parallelism: int,
    clock: Clock,
) -> Built:
    """Reclaim what dead predecessors left, open the journal, the cgroups and the status file, and wire
    the core; before anything launches, so no try can run beside a survivor of its previous attempt."""
    config, plan_ = settings.config, settings.plan
    owner = f"scheduler pid {os.getpid()}" + (f" team {team}" if team else "")
    recovered = recovery.reclaim_then_open(
        settings.state_dir,
        owner=owner,
        owner_key=settings.owner_key,
        companions=scheduler_helpers.companions(),
    )
    launches = recovered.journal
    if plan_.learn_dir:  # in the state directory, which the journal has just made sure is ours alone
        os.makedirs(plan_.learn_dir, mode=0o700, exist_ok=True)
    containment = open_containment(
        launches.instance,
        enabled=config.containment is ContainmentKind.AUTO,
        root=config.cgroup_root,
        limits=config.limits,
        journals=launches.directory,
        # What a stopped predecessor handed over runs on in its cgroups until it is adopted.
        spare=frozenset(held.cgroup for held in recovered.held if held.cgroup),
        reclaimed=recovered.reclaimed,
    )
    writer = status.StatusWriter(
        status.status_path(launches.directory, launches.instance),
        status_meta(
            launches.instance,
            team=team,
            executor=executor,
            parallelism=parallelism,
            launcher=config.launcher.value,
            containment=containment,
        ),
        # Descendants the status walk sees (workloads without a cgroup) are journalled for a reclaim.
        on_seen=launches.seen,
        claimed=callbacks.claimed,
        control=callbacks.control,
    )
    timeout = settings.timeout
    wired = wire(
        plan_,
        listener=journal.RecordingListener(
            callbacks.mailbox,
            launches,
            describe,
            # Recorded with each launch, so a crash hands over too: a successor finds what it ran.
            handover_timeout=config.handover_timeout if config.hands_over else 0.0,
            info=callbacks.launch_record if config.hands_over else None,
        ),
        output=callbacks.output,
        env={**launches.child_env(os.environ), **(timeout.env if timeout is not None else {})},
        on_report=callbacks.on_report,
        write=writer.write,
        clock=clock,
        containment=containment,
    )
    return Built(launches, recovered.held, containment, writer, wired)
