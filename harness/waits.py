"""Waiting on a sandbox: the errors, one polling loop with a deadline, and the waits built on it.

Every wait checks the long-running processes on each round, so a crashed scheduler fails the wait at
once (:class:`SandboxError`) instead of letting it run into its deadline (:class:`SandboxTimeout`).
A timeout names what it waited for and shows the tail of the log of the process most likely at fault.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from harness.metadata import CallbackRow, TaskInstanceRow

__all__ = [
    "TERMINAL_CALLBACK_STATES",
    "TERMINAL_RUN_STATES",
    "HasCallbacks",
    "HasDags",
    "HasHealth",
    "HasRuns",
    "Polling",
    "SandboxError",
    "SandboxTimeout",
    "poll_until",
    "wait_for_callbacks",
    "wait_for_dag",
    "wait_for_run",
    "wait_healthy",
]

TERMINAL_RUN_STATES: Final[frozenset[str]] = frozenset({"success", "failed"})
TERMINAL_CALLBACK_STATES: Final[frozenset[str]] = frozenset({"success", "failed"})
# The parts of /api/v2/monitor/health that must all say "healthy" before the deployment serves.
_HEALTH_PARTS: Final[tuple[str, ...]] = ("metadatabase", "scheduler", "dag_processor")


class SandboxError(RuntimeError):
    """Raised when the sandbox cannot start, a process dies, or a wait runs out of time."""


class SandboxTimeout(SandboxError):
    """A wait ran out of time (the processes were still alive)."""


def poll_until(
    what: str,
    probe: Callable[[], bool],
    timeout: float,
    *,
    check: Callable[[], None],
    log_name: str,
    log_tail: Callable[[str], str],
    interval: float = 0.25,
    detail: Callable[[], str] | None = None,
) -> None:
    """Call ``check`` then ``probe`` every ``interval`` seconds until ``probe`` is true.

    :raises SandboxTimeout: after ``timeout`` seconds, with ``detail()`` and the tail of ``log_name``
    """
    deadline = time.monotonic() + timeout
    while True:
        check()
        if probe():
            return
        if time.monotonic() >= deadline:
            extra = f"\n{detail()}" if detail is not None else ""
            raise SandboxTimeout(
                f"timed out after {timeout:.0f}s waiting for {what}{extra}\n"
                f"{log_name} log tail:\n{log_tail(log_name)}"
            )
        time.sleep(interval)


class Polling(Protocol):
    """A sandbox's own polling loop (``poll_until`` with its process check) and its process logs."""

    def _wait(
        self,
        what: str,
        probe: Callable[[], bool],
        timeout: float,
        log_name: str,
        interval: float = ...,
        detail: Callable[[], str] | None = ...,
    ) -> None: ...

    def log_tail(self, name: str, lines: int = ...) -> str: ...


class HasHealth(Polling, Protocol):
    def health(self) -> dict[str, Any] | None: ...


class HasDags(Polling, Protocol):
    startup_timeout: float

    def dag_is_parsed(self, dag_id: str) -> bool: ...

    def import_errors(self) -> list[tuple[str, str]]: ...


class HasRuns(Polling, Protocol):
    def run_state(self, dag_id: str, run_id: str) -> str | None: ...

    def task_instances(self, dag_id: str, run_id: str) -> list[TaskInstanceRow]: ...


class HasCallbacks(Polling, Protocol):
    def callbacks(self, dag_id: str | None = ..., run_id: str | None = ...) -> list[CallbackRow]: ...


def wait_healthy(sandbox: HasHealth, timeout: float) -> dict[str, Any]:
    """Wait until the api-server answers and reports scheduler and dag-processor healthy."""
    last: dict[str, Any] | None = None

    def probe() -> bool:
        nonlocal last
        last = sandbox.health()
        if last is None:
            return False
        return all((last.get(part) or {}).get("status") == "healthy" for part in _HEALTH_PARTS)

    def which_log() -> str:
        if last is None:
            return "api-server"
        if (last.get("scheduler") or {}).get("status") != "healthy":
            return "scheduler"
        return "dag-processor"

    try:
        # A refused connection or one small document per round: every tenth of a second costs nothing,
        # and a test starts as soon as the deployment serves.
        sandbox._wait("a healthy deployment", probe, timeout, "api-server", interval=0.1)
    except SandboxTimeout:
        name = which_log()
        raise SandboxTimeout(
            f"timed out after {timeout:.0f}s waiting for a healthy deployment; "
            f"last health: {json.dumps(last)}\n{name} log tail:\n{sandbox.log_tail(name)}"
        ) from None
    assert last is not None
    return last


def wait_for_dag(sandbox: HasDags, dag_id: str, timeout: float | None) -> None:
    """Wait until the dag-processor has serialized ``dag_id`` into the metadata DB."""

    def detail() -> str:
        errors = sandbox.import_errors()
        if not errors:
            return "no import errors recorded"
        return "import errors:\n" + "\n".join(f"{f}:\n{t[-1500:]}" for f, t in errors)

    sandbox._wait(
        f"dag {dag_id} to be parsed",
        lambda: sandbox.dag_is_parsed(dag_id),
        timeout if timeout is not None else sandbox.startup_timeout,
        "dag-processor",
        interval=0.2,
        detail=detail,
    )


def wait_for_run(sandbox: HasRuns, dag_id: str, run_id: str, timeout: float, poll_interval: float) -> str:
    """Poll the metadata DB until the run is success/failed; return that state."""
    state: str | None = None

    def probe() -> bool:
        nonlocal state
        state = sandbox.run_state(dag_id, run_id)
        return state in TERMINAL_RUN_STATES

    def detail() -> str:
        rows = sandbox.task_instances(dag_id, run_id)
        summary = ", ".join(f"{r.task_id}[{r.map_index}]={r.state}" for r in rows)
        return f"run state {state}; task instances: {summary}"

    sandbox._wait(
        f"run {dag_id}/{run_id} to finish",
        probe,
        timeout,
        "scheduler",
        interval=poll_interval,
        detail=detail,
    )
    assert state is not None
    return state


def wait_for_callbacks(
    sandbox: HasCallbacks,
    dag_id: str,
    run_id: str,
    *,
    count: int,
    timeout: float,
    states: Iterable[str],
) -> list[CallbackRow]:
    """Wait until at least ``count`` deadline callbacks of the run are in one of ``states``."""
    wanted = frozenset(states)
    rows: list[CallbackRow] = []

    def probe() -> bool:
        nonlocal rows
        rows = sandbox.callbacks(dag_id, run_id)
        return sum(1 for row in rows if row.state in wanted) >= count

    def detail() -> str:
        return "callbacks: " + ", ".join(f"{row.id}={row.state}" for row in rows)

    sandbox._wait(
        f"{count} callback(s) of {dag_id}/{run_id} in {sorted(wanted)}",
        probe,
        timeout,
        "scheduler",
        detail=detail,
    )
    return rows
