"""Builds the supervision core an executor starts with, from plain values.

The adapter turns Airflow's configuration into a :class:`Plan`; from there on (the launcher, the
supervisor, the event loop it runs on, the health probe beside it, the prefetch budget) everything is
wired here, so it can be built and tested without Airflow. Nothing is started: the caller starts
:attr:`Wired.runtime` once whatever must happen before the first launch (reclaiming a crashed
predecessor's processes) has happened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from async_local_executor.core.admission import MB
from async_local_executor.core.cgroups import Containment, Limits
from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.descriptors import GiveBackLimit
from async_local_executor.core.health import Probe, Report, Thresholds
from async_local_executor.core.launchers import crowd
from async_local_executor.core.launchers.base import Launcher, OutputSink, TakesOver
from async_local_executor.core.launchers.contained import ContainedLauncher
from async_local_executor.core.launchers.forkserver.launcher import ForkServerLauncher
from async_local_executor.core.launchers.forkserver.learning.learned import Learned
from async_local_executor.core.launchers.forkserver.learning.loop import Learning
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.prefetch import PrefetchBudget
from async_local_executor.core.runtime import Runtime, uvloop_available
from async_local_executor.core.stopping import TerminationPolicy
from async_local_executor.core.supervisor import Listener, Supervisor

log = logging.getLogger(__name__)

LAUNCHERS = ("forkserver", "subprocess")
EVENT_LOOPS = ("auto", "asyncio", "uvloop")


@dataclass(frozen=True)
class Plan:
    """What to build.

    :param parallelism: workloads holding a slot at once; 0 for no limit (the memory guard still applies)
    :param prefetch: workloads accepted beyond the free slots, at most
    :param queued_timeout: seconds a workload may wait before its scheduler gives up on it; 0 for never
    :param launcher: ``forkserver`` (with the plain launcher as its fallback) or ``subprocess``
    :param fork_target: ``module:function`` a fork-server child runs
    :param preload: modules the fork server imports before it forks
    :param learn_dir: where workloads record what they import, for the fork server to learn it and
        preload it too; empty: nothing is learned
    :param preload_exclude: modules (with their submodules) never learned
    :param preload_memory_budget: bytes learned modules may add to the fork server; 0 for no limit
    :param preload_interval: seconds at least between two fork servers started for learned modules
    :param discover_sources: lists, once at start, the files workloads will run (read in a worker thread)
    :param forkserver_idle_timeout: seconds without a workload after which the fork server exits;
        0: it starts with the executor and stays
    :param termination_grace: seconds between the first signal and SIGKILL when a workload is stopped
    :param group_limits: at most this many workloads of each named group hold a slot at once
    :param memory_floor_mb: below this much available memory, workloads wait to launch; 0 for no guard
    :param event_loop: ``auto`` (uvloop when it is installed), ``asyncio`` or ``uvloop``
    :param max_lag: health: seconds the loop may wake late
    :param max_wait: health: seconds a workload may wait to launch
    :param limits: every workload's memory, CPU and process limits (they need containment)
    :param kill_leftovers: when a contained workload's main process exits, kill what is left in its cgroup
    :param workload_nofile: the soft ``RLIMIT_NOFILE`` each workload gets before it runs (what the process
        had before :func:`~async_local_executor.core.descriptors.make_room` raised it); None: its own
    :param descriptor_reserve: launches wait while fewer descriptors than this are free (where the limit
        is below what parallelism needs); 0: only while the table is full
    """

    parallelism: int
    fork_target: str
    prefetch: int = 0
    queued_timeout: float = 0.0
    launcher: str = "forkserver"
    preload: tuple[str, ...] = ()
    learn_dir: str = ""
    preload_exclude: tuple[str, ...] = ()
    preload_memory_budget: int = 0
    preload_interval: float = 60.0
    discover_sources: Callable[[], Iterable[str]] | None = field(default=None, compare=False)
    forkserver_idle_timeout: float = 0.0
    termination_grace: float = TerminationPolicy.grace
    group_limits: Mapping[str, int] | None = None
    memory_floor_mb: float = 0.0
    event_loop: str = "auto"
    max_lag: float = Thresholds.max_lag
    max_wait: float = Thresholds.max_wait
    limits: Limits = Limits()  # noqa: RUF009 - frozen
    kill_leftovers: bool = True
    workload_nofile: int | None = None
    descriptor_reserve: int = 0
    crowd: bool = False
    """Lower the CPU share of workloads that start in a crowd, until it ends (``core/launchers/crowd.py``)."""
    idle_workloads: bool = False
    """Workloads put themselves in ``SCHED_IDLE`` (``workload_cpu_priority = idle``): an adopted one that
    arrives there keeps it; under any other setting it gets its share back."""

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}")
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"event_loop must be one of {', '.join(EVENT_LOOPS)}, got {self.event_loop!r}")

    @property
    def use_uvloop(self) -> bool:
        return self.event_loop == "uvloop" or (self.event_loop == "auto" and uvloop_available())


@dataclass(frozen=True)
class Wired:
    """What :func:`wire` built; the runtime is not started."""

    runtime: Runtime
    budget: PrefetchBudget
    thresholds: Thresholds
    use_uvloop: bool


def wire(
    plan: Plan,
    *,
    listener: Listener,
    output: OutputSink,
    env: Mapping[str, str] | None = None,
    on_report: Callable[[Report], None] | None = None,
    write: Callable[[Report], None] | None = None,
    clock: Clock = SYSTEM,
    containment: Containment | None = None,
) -> Wired:
    """Build the runtime (its supervisor, launcher and probe are made on its loop thread when it starts).

    :param listener: told of each workload's start and end, on the loop thread
    :param output: receives each line a workload prints, on the loop thread
    :param env: every child's environment
    :param on_report: called on the loop with each health report; must not block
    :param write: called in a worker thread with a health report every few seconds (a status file)
    :param clock: the time every built component reads
    :param containment: the instance's cgroups, opened by the caller; None: workloads are not contained
    """
    policy = TerminationPolicy(grace=plan.termination_grace)
    thresholds = Thresholds(max_lag=plan.max_lag, max_wait=plan.max_wait)
    group_limits = dict(plan.group_limits or {})

    def make_supervisor() -> Supervisor:
        # Built on the loop thread: anyio objects bind to the loop that creates them.
        launcher: Launcher = SubprocessLauncher(output=output, env=env, clock=clock)
        if plan.launcher == "forkserver":
            learning = None
            if plan.learn_dir:
                learned = Learned(plan.learn_dir, exclude=plan.preload_exclude)
                learning = Learning(
                    learned,
                    interval=plan.preload_interval,
                    memory_budget=plan.preload_memory_budget,
                    discover=plan.discover_sources,
                    clock=clock,
                )
            launcher = ForkServerLauncher(
                target=plan.fork_target,
                preload=plan.preload,
                output=output,
                fallback=launcher,
                env=env,
                idle_timeout=plan.forkserver_idle_timeout or None,
                clock=clock,
                learning=learning,
            )
        # Innermost: a handed-over workload's process is taken here, and every wrapper takes it in.
        launcher = TakesOver(launcher)
        if plan.workload_nofile is not None:
            launcher = GiveBackLimit(launcher, plan.workload_nofile)
        if containment is not None:
            launcher = ContainedLauncher(
                launcher, containment, limits=plan.limits, kill_leftovers=plan.kill_leftovers
            )
        if plan.crowd:
            choice = crowd.choose(containment is not None and containment.weighs_cpu)
            launcher = crowd.CrowdLauncher(
                launcher, choice, crowd=crowd.threshold(), starts=crowd.start_threshold(), clock=clock
            )
            log.info(
                "CPU share: %s",
                choice.describe(crowd.threshold(), crowd.start_threshold(), crowd.START_WINDOW),
            )
        elif not plan.idle_workloads:
            # Lowers nothing; there only to give an adopted workload back the share a predecessor's crowd
            # lowered (a crash undoes nothing).
            launcher = crowd.CrowdLauncher(launcher, crowd.Choice(crowd.How.NONE, "crowd off"), crowd=0)
        return Supervisor(
            launcher,
            listener,
            limit=plan.parallelism or None,
            policy=policy,
            group_limits=group_limits,
            memory_floor=int(plan.memory_floor_mb * MB),
            clock=clock,
            descriptor_reserve=plan.descriptor_reserve,
        )

    def make_probe(supervisor: Supervisor) -> Probe:
        return Probe(supervisor.state, thresholds=thresholds, on_report=on_report, write=write, clock=clock)

    use_uvloop = plan.use_uvloop
    runtime = Runtime(make_supervisor, use_uvloop=use_uvloop, make_probe=make_probe)
    budget = PrefetchBudget(
        parallelism=plan.parallelism, maximum=plan.prefetch, queued_timeout=plan.queued_timeout
    )
    return Wired(runtime, budget, thresholds, use_uvloop)
