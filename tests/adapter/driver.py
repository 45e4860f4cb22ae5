"""Drives an executor the way the scheduler's loop does, and records what it reports."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from async_local_executor.adapter.executor import AsyncLocalExecutor
from async_local_executor.adapter.workload import entry
from async_local_executor.core.health import Report
from async_local_executor.ops import custody_dir
from tests.adapter.stub_workload import CUSTODY

GUARD = 60.0
STUB = str(Path(__file__).with_name("stub_workload.py"))


class RecordingExecutor(AsyncLocalExecutor):
    """The real executor with the stub workload entry (no api-server here), a record of change_state calls, and
    a condition that each health report notifies, for a test to wait on."""

    argv: tuple[str, ...] = (sys.executable, STUB)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.changes: list[tuple[Hashable, Any, Any, bool]] = []
        self.reports = 0
        self._reported = threading.Condition()

    def _child_argv(self) -> tuple[str, ...]:
        return self.argv

    def _fork_target(self) -> str:
        return "tests.adapter.stub_workload:forked"

    def change_state(self, key: Any, state: Any, info: Any = None, remove_running: bool = True) -> None:
        self.changes.append((key, state, info, remove_running))
        super().change_state(key, state, info, remove_running)

    def _on_report(self, report: Report) -> None:
        super()._on_report(report)
        with self._reported:
            self.reports += 1
            self._reported.notify_all()

    def _reported_since(self, seen: int) -> bool:
        return self.reports != seen

    def until_reported(self, done: Callable[[], bool], guard: float = GUARD) -> None:
        """Return once ``done()`` holds, checked now and again after each health report.

        The probe reports every half second on the loop (or each time a test's fake clock passes its
        sleep): a test waits on that tick instead of sleeping. ``done`` runs on the calling thread,
        outside the condition's lock, so it never holds up the loop.
        """
        deadline = time.monotonic() + guard
        while True:
            with self._reported:
                seen = self.reports
            if done():
                return
            with self._reported:
                arrived = self._reported.wait_for(
                    functools.partial(self._reported_since, seen), deadline - time.monotonic()
                )
            assert arrived, f"no health report within the {guard:g}s guard"


class CustodyExecutor(RecordingExecutor):
    """A :class:`RecordingExecutor` whose stub workloads run in custody as the real entry's do: with the
    flags the executor adds for a handover (``--handover-timeout``, ``--custody-dir``), they outlive a
    stop and record their exit code for whichever executor adopts them (tests/adapter/stub_workload.py).

    :attr adopted: the pids of the adopted workloads its supervisor runs, as of its last health report
    """

    adopted: frozenset[int] = frozenset()

    def _on_report(self, report: Report) -> None:
        self.adopted = frozenset(w.pid for w in report.state.running if w.adopted)
        super()._on_report(report)

    def _child_argv(self) -> tuple[str, ...]:
        config = self._config
        assert self._settings is not None
        flags = entry.argv_flags(
            os.getpid(),
            config.workload_cpu_priority,
            handover_timeout=config.handover_timeout if config.hands_over else 0.0,
            custody_dir=str(custody_dir.path(self._settings.state_dir)) if config.hands_over else "",
        )
        return (sys.executable, STUB, CUSTODY, *flags)

    def _fork_target(self) -> str:
        return "tests.adapter.stub_workload:forked_custody"


class Scheduler:
    """The calls the scheduler makes each loop, in its order; collects the event buffer."""

    def __init__(self, executor: AsyncLocalExecutor) -> None:
        self.executor = executor
        self.events: dict[Any, tuple[Any, Any]] = {}
        self.heartbeat_seconds: list[float] = []

    def loop_once(self) -> None:
        started = time.perf_counter()
        self.executor.heartbeat()
        self.heartbeat_seconds.append(time.perf_counter() - started)
        self.events.update(self.executor.get_event_buffer())

    def run_until(self, done: Callable[[], bool], guard: float = GUARD) -> None:
        deadline = time.monotonic() + guard
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"guard expired; events so far: {len(self.events)}")
            self.loop_once()
            time.sleep(0.005)  # the scheduler's own loop pacing, not synchronisation


def loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "async-local-executor-loop"]


def queue(ex: AsyncLocalExecutor, *items: object) -> None:
    for item in items:
        ex.queue_workload(item, session=None)  # type: ignore[arg-type]


def holding(gate: Path) -> int:
    """How many stub children have started holding on ``gate`` (each leaves a marker file)."""
    return len(list(gate.parent.glob(f"{gate.name}.*.started")))


def held_pid(gate: Path) -> int:
    """The pid of the one stub child holding on ``gate`` (its marker file is named after it)."""
    [marker] = gate.parent.glob(f"{gate.name}.*.started")
    return int(marker.name.split(".")[1])


def final_events(ex: RecordingExecutor) -> Counter[Any]:
    return Counter(key for key, _, _, removes_running in ex.changes if removes_running)
