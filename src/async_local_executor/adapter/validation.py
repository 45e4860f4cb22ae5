"""Every value a task hands the executor, checked in one place before anything reads it.

A task carries values its DAG author chose (``executor_config``, the queue) and ones the scheduler built
(the workload, Airflow 2's command). Any of them can be of a shape nothing downstream expects, and one
that raised on the scheduler's thread would stop the scheduler. So each is checked here, and the result
is either everything a launch needs (:class:`Checked`) or the reason, a string, that fails this one task
unlaunched. Nothing here raises for a value a task carries.

``executor_config`` belongs to every executor; only our section (``executor_config["async_local_executor"]``)
is ours to judge. A top level that is not a dict cannot hold that section, so it is left alone, as
before. Our section, when present and not None, must be a dict; keys in it that this version does not
know are ignored, as they always were (a DAG written for a later version still runs), and reported in
:attr:`Checked.ignored` for a warning.
"""

from __future__ import annotations

import decimal
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from async_local_executor.adapter import dag_files
from async_local_executor.adapter.config import SECTION, limits_from
from async_local_executor.adapter.workload import airflow2 as airflow2_entry
from async_local_executor.adapter.workload import airflow3 as airflow3_entry
from async_local_executor.core.cgroups import Limits

LIMIT_KEYS = ("task_memory_limit", "task_cpu_limit", "task_pids_limit")
KNOWN_KEYS = ("task_timeout", *LIMIT_KEYS)
_SHOWN_MAX = 200  # characters of a rejected value a reason quotes


class _Rejected(Exception):
    """A value is invalid; the message is the task's reason."""


@dataclass(frozen=True)
class Checked:
    """What a valid task launches with.

    :param timeout: seconds its process may run; None for no limit
    :param group: the admission group (its queue for a task, ``""`` for anything else)
    :param payload: what its process reads on stdin
    :param ignored: keys of our ``executor_config`` section this version does not know, as :func:`shown`
    :param limits: its own memory, CPU and process limits (over the executor's)
    :param source: the DAG file its process parses, where known (what it imports may be preloaded)
    """

    timeout: float | None
    group: str
    payload: bytes
    ignored: tuple[str, ...] = ()
    limits: Limits = Limits()  # noqa: RUF009 - frozen
    source: str | None = None


def shown(value: object) -> str:
    """``repr(value)`` for a reason, short, and never raising (a 5000-digit int's repr does)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        return f"an integer of about {int(value.bit_length() * math.log10(2))} digits"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a value that cannot be shown is still named by its type
        return f"<unprintable {type(value).__name__}>"
    return text if len(text) <= _SHOWN_MAX else text[:_SHOWN_MAX] + "..."


def _seconds(value: object) -> float:
    """A number of seconds >= 0 from a number or a numeric string, as ``float`` reads it."""
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Real, decimal.Decimal)):
        raise _Rejected("not a number")  # True is an int to Python, not a number of seconds to anyone
    try:
        seconds = float(value)
    except (ArithmeticError, TypeError, ValueError):  # OverflowError: an int beyond a float's range
        raise _Rejected("not a number") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise _Rejected("out of range")
    return seconds


def task_options(executor_config: object, default_timeout: float) -> tuple[float | None, tuple[str, ...]]:
    """The task's timeout (None: none) and the unknown keys of our section.

    :raises ValueError: naming the entry when our section or its ``task_timeout`` is invalid
    """
    try:
        return _task_options(executor_config, default_timeout)
    except _Rejected as exc:
        raise ValueError(str(exc)) from None


def _task_options(executor_config: object, default_timeout: float) -> tuple[float | None, tuple[str, ...]]:
    ours = executor_config.get(SECTION) if isinstance(executor_config, dict) else None
    if ours is None:
        return default_timeout or None, ()
    if not isinstance(ours, dict):
        raise _Rejected(
            f'executor_config["{SECTION}"] must be a dict such as {{"task_timeout": 3600}}, got {shown(ours)}'
        )
    ignored = tuple(shown(key) for key in ours if key not in KNOWN_KEYS)
    if "task_timeout" not in ours:
        return default_timeout or None, ignored
    value = ours["task_timeout"]
    try:
        seconds = _seconds(value)
    except _Rejected:
        raise _Rejected(
            f'executor_config["{SECTION}"]["task_timeout"] must be a number of seconds >= 0, '
            f"got {shown(value)}"
        ) from None
    return seconds or None, ignored


def task_limits(executor_config: object) -> Limits:
    """The task's own limits (none: ``Limits()``).

    :raises ValueError: naming the entry when one is invalid
    """
    try:
        return _task_limits(executor_config)
    except _Rejected as exc:
        raise ValueError(str(exc)) from None


def _task_limits(executor_config: object) -> Limits:
    ours = executor_config.get(SECTION) if isinstance(executor_config, dict) else None
    if not isinstance(ours, dict):  # a section that is no dict is rejected by _task_options
        return Limits()
    try:
        return limits_from({key: ours.get(key) for key in LIMIT_KEYS}, f'executor_config["{SECTION}"]')
    except ValueError as exc:
        raise _Rejected(str(exc)) from None


def _queue(queue: object) -> str:
    if queue is None:
        return "default"
    if not isinstance(queue, str):
        raise _Rejected(f"queue must be a string, got {shown(queue)}")
    return queue or "default"


def _checked(build: Callable[[], Checked]) -> Checked | str:
    try:
        return build()
    except _Rejected as exc:
        return str(exc)


def airflow3(
    workload: Any, *, is_task: bool, default_timeout: float, server: str, prefix: str
) -> Checked | str:
    """Check an Airflow 3 workload.

    :param is_task: it is a task; only a task has a queue (callbacks and connection tests are limited by
        parallelism alone), and only a task an executor_config (the others get ``task_timeout``)
    :param prefix: its process title's start; the workload's display name follows
    """

    def build() -> Checked:
        ti = getattr(workload, "ti", None) if is_task else None
        executor_config = getattr(ti, "executor_config", None)
        timeout, ignored = _task_options(executor_config, default_timeout)
        limits = _task_limits(executor_config)
        group = _queue(getattr(ti, "queue", None)) if is_task else ""
        try:
            title = f"{prefix} {workload.display_name}"
            payload = airflow3_entry.encode_payload(workload.model_dump_json(), server, title)
        except Exception as exc:  # noqa: BLE001 - whatever cannot be written cannot reach its process
            raise _Rejected(f"cannot write the workload for its process: {shown(exc)}") from None
        source = dag_files.airflow3(workload) if is_task else None
        return Checked(timeout, group, payload, ignored, limits, source)

    return _checked(build)


def airflow2(
    command: object, queue: object, executor_config: object, *, default_timeout: float, title: str
) -> Checked | str:
    """Check an Airflow 2 hand-over: an ``airflow tasks run`` command, its queue and its executor_config."""

    def build() -> Checked:
        if not isinstance(command, list) or not all(isinstance(part, str) for part in command):
            raise _Rejected(f"not an `airflow tasks run` command (a list of strings): {shown(command)}")
        try:
            airflow2_entry.tasks_run_command(command)
        except ValueError:
            raise _Rejected(f"not an `airflow tasks run` command: {shown(command)}") from None
        timeout, ignored = _task_options(executor_config, default_timeout)
        limits = _task_limits(executor_config)
        payload = airflow2_entry.encode_payload(command, title)
        return Checked(timeout, _queue(queue), payload, ignored, limits, dag_files.airflow2(command))

    return _checked(build)
