"""An executor class that times every ``heartbeat()`` of the executor it wraps.

Airflow 3.3 measures ``scheduler.executor_heartbeat_duration`` only as a StatsD/OTel timer, and the
StatsD client is not installed here; subclassing the executor under test is the least invasive way to
read the same interval (the scheduler calls exactly this method, once per executor per loop). The
deployment sets ``[core] executor`` to ``benchmarks.timed_executor.TimedExecutor`` and names the real
class in ``ALE_BENCH_EXECUTOR``; both variants get the same wrapper, so its cost (two line writes per
heartbeat) cancels out in the ratios.

Each heartbeat writes ``b <unix time>`` before and ``e <unix time> <seconds>`` after, flushed at once,
so a heartbeat that never returns (the stock executor blocked in a pipe write) still shows as an open
``b`` line.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import IO, Any, Final

TARGET_ENV: Final[str] = "ALE_BENCH_EXECUTOR"
LOG_ENV: Final[str] = "ALE_BENCH_HEARTBEAT_LOG"
CLASS_PATH: Final[str] = "benchmarks.timed_executor.TimedExecutor"
_CORE_ALIASES: Final[dict[str, str]] = {
    "LocalExecutor": "airflow.executors.local_executor.LocalExecutor",
}


def resolve(path: str) -> type[Any]:
    """Import an executor class from its path or core alias."""
    module_name, _, class_name = _CORE_ALIASES.get(path, path).rpartition(".")
    if not module_name:
        raise ValueError(f"not an executor class path: {path!r}")
    cls: type[Any] = getattr(importlib.import_module(module_name), class_name)
    return cls


class _Recorder:
    def __init__(self, path: str | None) -> None:
        self._path = path
        self._handle: IO[str] | None = None

    def _write(self, line: str) -> None:
        if self._path is None:
            return
        if self._handle is None:
            # Opened on first use: the api-server builds executors too but never heartbeats them.
            self._handle = open(self._path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self._handle.write(line)

    def begin(self) -> float:
        self._write(f"b {time.time():.6f}\n")
        return time.perf_counter()

    def end(self, started: float) -> None:
        self._write(f"e {time.time():.6f} {time.perf_counter() - started:.6f}\n")


_recorder = _Recorder(os.environ.get(LOG_ENV))
_base = resolve(os.environ.get(TARGET_ENV, "LocalExecutor"))


def _heartbeat(self: Any) -> None:
    started = _recorder.begin()
    try:
        _base.heartbeat(self)
    finally:
        _recorder.end(started)


# Built with type() because the base class is only known at import time.
TimedExecutor: type[Any] = type("TimedExecutor", (_base,), {"heartbeat": _heartbeat, "__module__": __name__})
