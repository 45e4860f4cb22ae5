"""The ``[async_local_executor]`` options as one typed object.

Read through Airflow's configuration, so ``AIRFLOW__ASYNC_LOCAL_EXECUTOR__<OPTION>`` environment
variables work, and through the executor's team-aware ``ExecutorConf`` when there is one.
"""

from __future__ import annotations

import difflib
import enum
import math
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from async_local_executor.adapter.options import OPTIONS, SECTION, OptionDoc
from async_local_executor.core import cpu_priority
from async_local_executor.core.cgroups import Limits, parse_cpu, parse_memory, parse_pids

__all__ = [
    "OPTIONS",
    "SECTION",
    "ConfSource",
    "ContainmentKind",
    "EventLoop",
    "ExecutorConfig",
    "LauncherKind",
    "OnStop",
    "OptionDoc",
    "OptionNames",
    "PreloadMode",
    "Unknown",
    "unknown_options",
]


class EventLoop(enum.Enum):
    AUTO = "auto"  # uvloop when it is installed, else asyncio
    ASYNCIO = "asyncio"
    UVLOOP = "uvloop"


class LauncherKind(enum.Enum):
    FORKSERVER = "forkserver"  # fork a preloaded helper: milliseconds per launch
    SUBPROCESS = "subprocess"  # a fresh interpreter per workload, which imports Airflow anew at each launch


class PreloadMode(enum.Enum):
    AUTO = "auto"  # learn what tasks import, and preload what is safe of it (and preload_modules)
    EXPLICIT = "explicit"  # preload_modules only
    OFF = "off"  # nothing beyond what every task needs


class OnStop(enum.Enum):
    HANDOVER = "handover"  # running workloads live on for the next scheduler to adopt
    TERMINATE = "terminate"  # end() waits shutdown_timeout, then terminates them


class ContainmentKind(enum.Enum):
    AUTO = "auto"  # a cgroup per workload where the host allows it, else process groups and markers
    OFF = "off"


class ConfSource(Protocol):
    def get(self, section: str, key: str, fallback: str = ...) -> str | None: ...


_DEFAULTS = {option.name: option.default for option in OPTIONS}


class OptionNames(Protocol):
    """What of Airflow's configuration parser tells which options a config file sets."""

    def has_section(self, section: str) -> bool: ...

    def options(self, section: str) -> list[str]: ...


@dataclass(frozen=True)
class Unknown:
    """An option set where this executor reads its options that is none of them (a typo, most often)."""

    name: str  # as written
    where: str  # the config file's section, or the environment variable
    closest: str | None  # the valid option it is closest to, if any is close

    def describe(self) -> str:
        hint = (
            f"did you mean {self.closest}?"
            if self.closest
            else f"the options are listed by `airflow config list --section {SECTION}`"
        )
        return f"{self.name} ({self.where}) is not an option of [{SECTION}] and is ignored; {hint}"


_AIRFLOW_OPTIONS = ("parallelism",)


def unknown_options(file: OptionNames, environ: Mapping[str, str], team: str | None = None) -> list[Unknown]:
    """What is set where this executor reads its options and is none of them, config file first.

    Where it reads them: ``[async_local_executor]`` and ``AIRFLOW__ASYNC_LOCAL_EXECUTOR__*``, or, for a
    team's executor, only ``[<team>=async_local_executor]`` and ``AIRFLOW__<TEAM>___ASYNC_LOCAL_EXECUTOR__*``
    (Airflow reads a team's options there alone). Airflow matches names exactly as it builds them:
    lower case in the file, upper case in a variable; and it runs no ``_CMD`` nor ``_SECRET`` variable
    for an option that is not a secret, which none of these is. Each of those is reported too.
    """
    known = [option.name for option in OPTIONS]
    section = f"{team}={SECTION}" if team else SECTION
    found: list[tuple[str, str, bool]] = []  # (name as written, where, whether Airflow reads it)
    if file.has_section(section):
        found.extend((name, f"airflow.cfg [{section}]", name in known) for name in file.options(section))
    prefix = f"AIRFLOW__{team.upper()}___" if team else "AIRFLOW__"
    prefix += SECTION.upper() + "__"
    for variable in sorted(environ):
        if variable.startswith(prefix):
            name = variable[len(prefix) :]
            found.append((name, variable, name.lower() in known and name == name.upper()))
    # Airflow's options people look for here: the executor's limit is [core] parallelism.
    candidates = {name: name for name in known} | {name: f"[core] {name}" for name in _AIRFLOW_OPTIONS}
    unknown = []
    for name, where, read in found:
        if read:
            continue
        close = difflib.get_close_matches(name.lower(), candidates, n=1)
        unknown.append(Unknown(name, where, candidates[close[0]] if close else None))
    return unknown


# end() waits on threads for shutdown_timeout + termination_grace_period + this margin (for reaping).
SHUTDOWN_MARGIN = 30.0
# A thread wait (Future.result, Thread.join) longer than threading.TIMEOUT_MAX raises OverflowError, and
# end() waits for both of these plus the margin: half the rest each keeps the sum within it.
_THREAD_WAIT_MAX = math.floor((threading.TIMEOUT_MAX - SHUTDOWN_MARGIN) / 2)

# The number options. Event-loop timers and comparisons take any finite number >= 0; where what consumes
# an option takes less, its limit, with the unit and the reason an error gives.
_FLOATS = (
    "shutdown_timeout",
    "handover_timeout",
    "termination_grace_period",
    "forkserver_idle_timeout",
    "prefetch_multiplier",
    "task_timeout",
    "min_available_memory_mb",
    "health_loop_lag_limit",
    "health_wait_limit",
    "preload_interval",
)
_THREAD_LIMIT = (
    _THREAD_WAIT_MAX,
    (
        "seconds: end() waits on a thread for shutdown_timeout + termination_grace_period + 30 s, and "
        "Python limits a thread wait to threading.TIMEOUT_MAX"
    ),
)
_LIMITS: dict[str, tuple[float, str]] = {
    "shutdown_timeout": _THREAD_LIMIT,
    # A workload's watchdog waits it out on a thread, and a record's age is compared with it.
    "handover_timeout": (_THREAD_WAIT_MAX, "seconds: a workload waits it out on a thread"),
    "termination_grace_period": _THREAD_LIMIT,
    # Far beyond any host, but the guard counts bytes in a float (a round number under max / 1 MB).
    "min_available_memory_mb": (1e302, "MB: the memory guard counts it in bytes, and that must stay finite"),
}


def _check_range(name: str, value: float, raw: object) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"[{SECTION}] {name} must be a finite number >= 0, got {raw!r}")
    limit, why = _LIMITS.get(name, (math.inf, ""))
    if value > limit:
        raise ValueError(f"[{SECTION}] {name} must be at most {limit:.15g} {why}, got {raw!r}")
    return value


def _float(conf: ConfSource, name: str) -> float:
    raw = conf.get(SECTION, name, fallback=_DEFAULTS[name]) or _DEFAULTS[name]
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"[{SECTION}] {name} must be a number, got {raw!r}") from None
    return _check_range(name, value, raw)


def _names(conf: ConfSource, name: str) -> tuple[str, ...]:
    raw = conf.get(SECTION, name, fallback="") or ""
    return tuple(m.strip() for m in raw.split(",") if m.strip())


def _size(conf: ConfSource, name: str) -> int:
    raw = conf.get(SECTION, name, fallback=_DEFAULTS[name]) or _DEFAULTS[name]
    try:
        return parse_memory(raw)
    except ValueError:
        raise ValueError(f"[{SECTION}] {name} must be a size such as 512MiB or 2G, got {raw!r}") from None


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


_LIMIT_PARSERS = {
    "task_memory_limit": parse_memory,
    "task_cpu_limit": parse_cpu,
    "task_pids_limit": parse_pids,
}


def limits_from(values: dict[str, object], where: str) -> Limits:
    """The limits named by ``task_memory_limit``, ``task_cpu_limit`` and ``task_pids_limit`` in ``values``.

    :param where: names the source in an error (``[async_local_executor]`` or a task's executor_config)
    :raises ValueError: naming the key and the value when one is no such limit
    """
    parsed: dict[str, float | int | None] = {}
    for name, parse in _LIMIT_PARSERS.items():
        raw = values.get(name)
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            parsed[name] = None
            continue
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            # ValueError like every other invalid value here; the type, as a repr could raise or be huge.
            raise ValueError(f"{where} {name} must be a string or a number, got a {type(raw).__name__}")  # noqa: TRY004
        try:
            parsed[name] = parse(str(raw))
        except ValueError as exc:
            raise ValueError(f"{where} {name}: {exc}") from None
    memory, pids = parsed["task_memory_limit"], parsed["task_pids_limit"]
    return Limits(
        memory=None if memory is None else int(memory),
        cpu=parsed["task_cpu_limit"],
        pids=None if pids is None else int(pids),
    )


def _boolean(conf: ConfSource, name: str) -> bool:
    raw = (conf.get(SECTION, name, fallback=_DEFAULTS[name]) or _DEFAULTS[name]).strip().lower()
    if raw in ("true", "1", "yes", "on"):
        return True
    if raw in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"[{SECTION}] {name} must be True or False, got {raw!r}")


@dataclass(frozen=True)
class ExecutorConfig:
    shutdown_timeout: float = float(_DEFAULTS["shutdown_timeout"])
    on_stop: OnStop = OnStop.HANDOVER
    handover_timeout: float = float(_DEFAULTS["handover_timeout"])
    termination_grace_period: float = float(_DEFAULTS["termination_grace_period"])
    event_loop: EventLoop = EventLoop.AUTO
    launcher: LauncherKind = LauncherKind.FORKSERVER
    forkserver_idle_timeout: float = float(_DEFAULTS["forkserver_idle_timeout"])
    prefetch_multiplier: float = float(_DEFAULTS["prefetch_multiplier"])
    task_timeout: float = float(_DEFAULTS["task_timeout"])
    preload: PreloadMode = PreloadMode.AUTO
    preload_modules: tuple[str, ...] = ()
    preload_exclude: tuple[str, ...] = ()
    preload_memory_budget: int = parse_memory(_DEFAULTS["preload_memory_budget"])
    preload_interval: float = float(_DEFAULTS["preload_interval"])
    queue_limits: tuple[tuple[str, int], ...] = ()
    min_available_memory_mb: float = float(_DEFAULTS["min_available_memory_mb"])
    state_dir: str = ""
    health_loop_lag_limit: float = float(_DEFAULTS["health_loop_lag_limit"])
    health_wait_limit: float = float(_DEFAULTS["health_wait_limit"])
    workload_cpu_priority: str = _DEFAULTS["workload_cpu_priority"]
    containment: ContainmentKind = ContainmentKind.AUTO
    cgroup_root: str = ""
    limits: Limits = Limits()  # noqa: RUF009 - frozen
    kill_leftover_processes: bool = True

    def __post_init__(self) -> None:
        for name in _FLOATS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"[{SECTION}] {name} must be a number, got {value!r}")
            _check_range(name, float(value), value)

    @property
    def hands_over(self) -> bool:
        """Whether a stop hands running workloads over (a timeout of 0 means they die with us)."""
        return self.on_stop is OnStop.HANDOVER and self.handover_timeout > 0

    def prefetch(self, parallelism: int) -> int:
        """How many workloads beyond ``parallelism`` the executor accepts.

        :raises ValueError: naming prefetch_multiplier when the product is no count of workloads
        """
        product = parallelism * self.prefetch_multiplier
        if not product <= sys.maxsize:  # inf has no ceiling, and no host holds more workloads than this
            raise ValueError(
                f"[{SECTION}] prefetch_multiplier x parallelism must be at most {sys.maxsize}, got "
                f"{self.prefetch_multiplier!r} x {parallelism}"
            )
        return math.ceil(product)

    @classmethod
    def from_conf(cls, conf: ConfSource) -> ExecutorConfig:
        """Read every option, falling back to its default.

        :raises ValueError: naming the option and the value when one is invalid
        """
        return cls(
            shutdown_timeout=_float(conf, "shutdown_timeout"),
            on_stop=_choice(conf, "on_stop", OnStop),
            handover_timeout=_float(conf, "handover_timeout"),
            termination_grace_period=_float(conf, "termination_grace_period"),
            event_loop=_choice(conf, "event_loop", EventLoop),
            launcher=_choice(conf, "launcher", LauncherKind),
            forkserver_idle_timeout=_float(conf, "forkserver_idle_timeout"),
            prefetch_multiplier=_float(conf, "prefetch_multiplier"),
            task_timeout=_float(conf, "task_timeout"),
            queue_limits=_queue_limits(conf.get(SECTION, "queue_limits", fallback="") or ""),
            min_available_memory_mb=_float(conf, "min_available_memory_mb"),
            preload=_choice(conf, "preload", PreloadMode),
            preload_modules=_names(conf, "preload_modules"),
            preload_exclude=_names(conf, "preload_exclude"),
            preload_memory_budget=_size(conf, "preload_memory_budget"),
            preload_interval=_float(conf, "preload_interval"),
            state_dir=(conf.get(SECTION, "state_dir", fallback="") or "").strip(),
            health_loop_lag_limit=_float(conf, "health_loop_lag_limit"),
            health_wait_limit=_float(conf, "health_wait_limit"),
            workload_cpu_priority=_priority(conf),
            containment=_choice(conf, "containment", ContainmentKind),
            cgroup_root=(conf.get(SECTION, "cgroup_root", fallback="") or "").strip(),
            limits=limits_from(
                {name: conf.get(SECTION, name, fallback="") for name in _LIMIT_PARSERS}, f"[{SECTION}]"
            ),
            kill_leftover_processes=_boolean(conf, "kill_leftover_processes"),
        )
