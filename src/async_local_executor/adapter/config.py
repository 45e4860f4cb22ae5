"""The ``[async_local_executor]`` options as one typed object.

Read through Airflow's configuration, so ``AIRFLOW__ASYNC_LOCAL_EXECUTOR__<OPTION>`` environment
variables work, and through the executor's team-aware ``ExecutorConf`` when there is one.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from async_local_executor.core import cpu_priority

SECTION = "async_local_executor"


class EventLoop(enum.Enum):
    AUTO = "auto"  # uvloop when it is installed, else asyncio
    ASYNCIO = "asyncio"
    UVLOOP = "uvloop"


class LauncherKind(enum.Enum):
    FORKSERVER = "forkserver"  # fork a preloaded helper: milliseconds per launch
    SUBPROCESS = "subprocess"  # a fresh interpreter per workload: about 2 s of CPU per launch


class ConfSource(Protocol):
    def get(self, section: str, key: str, fallback: str = ...) -> str | None: ...


@dataclass(frozen=True)
class OptionDoc:
    """One option, described once: the provider info, ``airflow config list`` and the reference derive from it."""

    name: str
    type: Literal["string", "integer", "float", "boolean"]
    default: str
    example: str
    description: str
    version_added: str = "0.1.0"


OPTIONS: tuple[OptionDoc, ...] = (
    OptionDoc(
        "shutdown_timeout",
        "float",
        "60",
        "120",
        "Seconds end() (scheduler shutdown on SIGTERM/SIGINT) waits for running workloads to finish "
        "before terminating them.",
    ),
    OptionDoc(
        "termination_grace_period",
        "float",
        "10",
        "30",
        "Seconds between SIGTERM and SIGKILL when a workload's process group is terminated.",
    ),
    OptionDoc("event_loop", "string", "auto", "uvloop", "auto (uvloop when installed), asyncio or uvloop."),
    OptionDoc(
        "launcher",
        "string",
        "forkserver",
        "subprocess",
        "How a workload becomes a process: forkserver (a helper that imported Airflow once forks each "
        "workload: milliseconds per launch) or subprocess (a fresh interpreter per workload: about 1.5 "
        "to 2 s of CPU per launch).",
    ),
    OptionDoc(
        "forkserver_idle_timeout",
        "float",
        "0",
        "300",
        "0: the fork server starts with the executor and stays. A number of seconds: it starts with "
        "the first workload and exits after that long with no workload running, giving back its "
        "memory (about 125 MB) on an idle host; the next workload then waits for a new one to start "
        "(2 to 3 s).",
    ),
    OptionDoc(
        "task_timeout",
        "float",
        "0",
        "3600",
        "Seconds a task's process may run before the executor terminates it (SIGTERM, then SIGKILL "
        "after termination_grace_period), as a backstop for execution_timeout (which the task enforces "
        "itself, and cannot when it hangs in C code or ignores signals). 0: no limit. A task overrides "
        'it with executor_config={"async_local_executor": {"task_timeout": SECONDS}}; an invalid value '
        "fails that task, unlaunched, with the reason.",
    ),
    OptionDoc(
        "queue_limits",
        "string",
        "",
        "reports:4,default:28",
        "Per-queue limits on running tasks, as queue:N pairs (a task's queue is its operator's queue "
        "argument). A task held back by its queue's limit does not hold one of parallelism's slots. "
        "Queues not listed are limited by parallelism alone.",
    ),
    OptionDoc(
        "min_available_memory_mb",
        "float",
        "256",
        "1024",
        "While the host's available memory (MemAvailable) is below this many MB, workloads wait to "
        "launch (they do not fail), with one warning in the scheduler log when that starts and one "
        "when it ends. 0 turns the guard off.",
    ),
    OptionDoc(
        "prefetch_multiplier",
        "float",
        "1",
        "0.5",
        "Workloads the executor accepts beyond parallelism, as a multiple of parallelism. They wait "
        "in the executor (state queued) and start the moment a slot frees, instead of one scheduler "
        "loop later; the number of running workloads never exceeds parallelism. 0 accepts only as "
        "many as there are free slots. Lower it when several executors share the work, so none holds "
        "tasks another could start. The executor lowers it itself while tasks run long enough for a "
        "waiting one to reach [scheduler] task_queued_timeout.",
    ),
    OptionDoc(
        "health_loop_lag_limit",
        "float",
        "1",
        "2",
        "get_health() reports unhealthy while the event loop has woken more than this many seconds "
        "late in the last 10 s (a late loop delays every launch and every exit it reports).",
    ),
    OptionDoc(
        "health_wait_limit",
        "float",
        "600",
        "1800",
        "get_health() reports unhealthy while a workload has waited longer than this many seconds "
        "for a slot, a queue limit or memory.",
    ),
    OptionDoc(
        "state_dir",
        "string",
        "",
        "/var/lib/airflow/async_local_executor",
        "Where each executor keeps its journal of running launches (pid, process start time, task) "
        "and its status file, 0600 in a 0700 directory. A scheduler that starts kills what a crashed "
        "one left running, found through these journals, before it launches anything. Empty: "
        "{AIRFLOW_HOME}/async_local_executor.",
    ),
    OptionDoc(
        "workload_cpu_priority",
        "string",
        "auto",
        "idle",
        "CPU priority of each workload process (and all it starts) against the scheduler, the "
        "api-server and the dag-processor. auto: the scheduler's own priority, except for a workload "
        "that starts while the scheduler has more than 24 children per CPU core, which runs idle, so a "
        "burst of task starts cannot starve the scheduler's loop. idle: Linux SCHED_IDLE for every "
        "workload (tasks get every cycle Airflow's processes do not want; the scheduler then loops more "
        "often and ordinary throughput drops). A nice increment from 1 to 19. normal: the scheduler's "
        "own priority, as the stock LocalExecutor runs tasks.",
    ),
    OptionDoc(
        "preload_modules",
        "string",
        "",
        "pandas,numpy",
        "Comma-separated modules the fork server imports before forking, such as heavy libraries "
        "your DAGs use, so every task shares them instead of importing them again. A module that "
        "fails to import is logged and skipped.",
    ),
)
_DEFAULTS = {option.name: option.default for option in OPTIONS}


def _float(conf: ConfSource, name: str) -> float:
    raw = conf.get(SECTION, name, fallback=_DEFAULTS[name]) or _DEFAULTS[name]
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"[{SECTION}] {name} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"[{SECTION}] {name} must be a finite number >= 0, got {raw!r}")
    return value


def _queue_limits(raw: str) -> tuple[tuple[str, int], ...]:
    limits: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        queue, sep, number = item.rpartition(":")
        try:
            limit = int(number) if sep and queue.strip() else 0
        except ValueError:
            limit = 0
        if limit < 1:
            raise ValueError(
                f"[{SECTION}] queue_limits must look like queue:N,queue:N with N >= 1, got {item!r}"
            )
        limits[queue.strip()] = limit
    return tuple(limits.items())


def _priority(conf: ConfSource) -> str:
    name = "workload_cpu_priority"
    raw = conf.get(SECTION, name, fallback=_DEFAULTS[name]) or _DEFAULTS[name]
    try:
        return cpu_priority.parse(raw)
    except ValueError as exc:
        raise ValueError(f"[{SECTION}] {name} {exc}") from None


_E = TypeVar("_E", bound=enum.Enum)


def _choice(conf: ConfSource, name: str, kind: type[_E]) -> _E:
    raw = (conf.get(SECTION, name, fallback=_DEFAULTS[name]) or _DEFAULTS[name]).strip().lower()
    try:
        return kind(raw)
    except ValueError:
        choices = ", ".join(str(e.value) for e in kind)
        raise ValueError(f"[{SECTION}] {name} must be one of {choices}, got {raw!r}") from None


@dataclass(frozen=True)
class ExecutorConfig:
    shutdown_timeout: float = float(_DEFAULTS["shutdown_timeout"])
    termination_grace_period: float = float(_DEFAULTS["termination_grace_period"])
    event_loop: EventLoop = EventLoop.AUTO
    launcher: LauncherKind = LauncherKind.FORKSERVER
    forkserver_idle_timeout: float = float(_DEFAULTS["forkserver_idle_timeout"])
    prefetch_multiplier: float = float(_DEFAULTS["prefetch_multiplier"])
    task_timeout: float = float(_DEFAULTS["task_timeout"])
    preload_modules: tuple[str, ...] = ()
    queue_limits: tuple[tuple[str, int], ...] = ()
    min_available_memory_mb: float = float(_DEFAULTS["min_available_memory_mb"])
    state_dir: str = ""
    health_loop_lag_limit: float = float(_DEFAULTS["health_loop_lag_limit"])
    health_wait_limit: float = float(_DEFAULTS["health_wait_limit"])
    workload_cpu_priority: str = _DEFAULTS["workload_cpu_priority"]

    def timeout_for(self, executor_config: object) -> float | None:
        """A task's hard timeout: its own ``executor_config`` entry, else ``task_timeout``; None: none.

        :raises ValueError: naming the entry when the task's value is not a number >= 0
        """
        value: object = self.task_timeout
        if isinstance(executor_config, dict):
            ours = executor_config.get(SECTION)
            if isinstance(ours, dict) and "task_timeout" in ours:
                value = ours["task_timeout"]
        try:
            seconds = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            seconds = -1.0
        if not seconds >= 0 or math.isinf(seconds):  # NaN compares false: not a timeout either
            raise ValueError(
                f'executor_config["{SECTION}"]["task_timeout"] must be a number of seconds >= 0, '
                f"got {value!r}"
            )
        return seconds or None

    def prefetch(self, parallelism: int) -> int:
        """How many workloads beyond ``parallelism`` the executor accepts."""
        return math.ceil(parallelism * self.prefetch_multiplier)

    @classmethod
    def from_conf(cls, conf: ConfSource) -> ExecutorConfig:
        """Read every option, falling back to its default.

        :raises ValueError: naming the option and the value when one is invalid
        """
        preload = conf.get(SECTION, "preload_modules", fallback="") or ""
        return cls(
            shutdown_timeout=_float(conf, "shutdown_timeout"),
            termination_grace_period=_float(conf, "termination_grace_period"),
            event_loop=_choice(conf, "event_loop", EventLoop),
            launcher=_choice(conf, "launcher", LauncherKind),
            forkserver_idle_timeout=_float(conf, "forkserver_idle_timeout"),
            prefetch_multiplier=_float(conf, "prefetch_multiplier"),
            task_timeout=_float(conf, "task_timeout"),
            queue_limits=_queue_limits(conf.get(SECTION, "queue_limits", fallback="") or ""),
            min_available_memory_mb=_float(conf, "min_available_memory_mb"),
            preload_modules=tuple(m.strip() for m in preload.split(",") if m.strip()),
            state_dir=(conf.get(SECTION, "state_dir", fallback="") or "").strip(),
            health_loop_lag_limit=_float(conf, "health_loop_lag_limit"),
            health_wait_limit=_float(conf, "health_wait_limit"),
            workload_cpu_priority=_priority(conf),
        )
