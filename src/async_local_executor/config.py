"""The ``[async_local_executor]`` options as one typed object.

Read through Airflow's configuration, so ``AIRFLOW__ASYNC_LOCAL_EXECUTOR__<OPTION>`` environment
variables work, and through the executor's team-aware ``ExecutorConf`` when there is one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

SECTION = "async_local_executor"


class EventLoop(enum.Enum):
    AUTO = "auto"  # uvloop when it is installed, else asyncio
    ASYNCIO = "asyncio"
    UVLOOP = "uvloop"


class ConfSource(Protocol):
    def get(self, section: str, key: str, fallback: str = ...) -> str | None: ...


@dataclass(frozen=True)
class OptionDoc:
    name: str
    default: str
    description: str


OPTIONS: tuple[OptionDoc, ...] = (
    OptionDoc(
        "shutdown_timeout",
        "60",
        "Seconds end() (scheduler shutdown on SIGTERM/SIGINT) waits for running workloads to finish "
        "before terminating them.",
    ),
    OptionDoc(
        "termination_grace_period",
        "10",
        "Seconds between SIGTERM and SIGKILL when a workload's process group is terminated.",
    ),
    OptionDoc("event_loop", "auto", "auto (uvloop when installed), asyncio or uvloop."),
)
_DEFAULTS = {option.name: option.default for option in OPTIONS}


def _float(conf: ConfSource, name: str) -> float:
    raw = conf.get(SECTION, name, fallback=_DEFAULTS[name]) or _DEFAULTS[name]
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"[{SECTION}] {name} must be a number, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"[{SECTION}] {name} must be >= 0, got {raw!r}")
    return value


@dataclass(frozen=True)
class ExecutorConfig:
    shutdown_timeout: float = float(_DEFAULTS["shutdown_timeout"])
    termination_grace_period: float = float(_DEFAULTS["termination_grace_period"])
    event_loop: EventLoop = EventLoop.AUTO

    @classmethod
    def from_conf(cls, conf: ConfSource) -> ExecutorConfig:
        """Read every option, falling back to its default.

        :raises ValueError: naming the option and the value when one is invalid
        """
        raw_loop = (
            (conf.get(SECTION, "event_loop", fallback=_DEFAULTS["event_loop"]) or "auto").strip().lower()
        )
        try:
            event_loop = EventLoop(raw_loop)
        except ValueError:
            choices = ", ".join(e.value for e in EventLoop)
            raise ValueError(f"[{SECTION}] event_loop must be one of {choices}, got {raw_loop!r}") from None
        return cls(
            shutdown_timeout=_float(conf, "shutdown_timeout"),
            termination_grace_period=_float(conf, "termination_grace_period"),
            event_loop=event_loop,
        )
