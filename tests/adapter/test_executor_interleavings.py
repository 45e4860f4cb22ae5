"""Random interleavings of what the scheduler and the children do, checked with hypothesis.

Real child processes (the stub child, since no api-server runs here) and the real executor; the
invariant: every accepted workload gets exactly one final event (none when the scheduler revoked it,
as Airflow's revoke_task contract requires), `running` ends empty and no child process remains.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.adapter import workloads
from tests.adapter.driver import RecordingExecutor, Scheduler


class Interleavings(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="ale-interleave-"))
        self.ex = RecordingExecutor(parallelism=2)
        self.ex.start()
        self.scheduler = Scheduler(self.ex)
        self.items: list[Any] = []
        self.revoked: set[Any] = set()
        # Still in queued_tasks when the executor stopped: the scheduler queued them but never handed
        # them over (no heartbeat since), so the executor never accepted them; the next scheduler's
        # orphan handling owns them, as with stock.
        self.never_handed_over: set[Any] = set()
        self.stopped = False

    def gate(self, i: int) -> Path:
        return self.dir / f"gate{i}"

    def started_pid(self, i: int) -> int | None:
        markers = list(self.dir.glob(f"gate{i}.*.started"))
        return int(markers[0].name.split(".")[1]) if markers else None

    @precondition(lambda self: not self.stopped)
    @rule()
    def queue(self) -> None:
        i = len(self.items)
        self.gate(i).touch()
        item = workloads.task(f"hold:{self.gate(i)}", map_index=i)
        self.items.append(item)
        self.ex.queue_workload(item, session=None)  # type: ignore[arg-type]

    @precondition(lambda self: not self.stopped)
    @rule()
    def queue_invalid(self) -> None:
        i = len(self.items)
        item = workloads.task(
            "ok", map_index=i, executor_config={"async_local_executor": {"task_timeout": "x"}}
        )
        self.items.append(item)
        self.ex.queue_workload(item, session=None)  # type: ignore[arg-type]

    @rule()
    def time_passes(self) -> None:
        """Nothing happens; keeps a rule available once the executor has stopped."""

    @precondition(lambda self: not self.stopped)
    @rule()
    def heartbeat(self) -> None:
        self.scheduler.loop_once()

    @precondition(lambda self: bool(self.items))
    @rule(data=st.data(), code=st.sampled_from([0, 0, 1, 3]))
    def child_exits(self, data: st.DataObject, code: int) -> None:
        i = data.draw(st.integers(0, len(self.items) - 1))
        (self.dir / f"gate{i}.code").write_text(str(code))
        self.gate(i).unlink(missing_ok=True)

    @precondition(lambda self: bool(self.items))
    @rule(data=st.data())
    def child_killed(self, data: st.DataObject) -> None:
        pid = self.started_pid(data.draw(st.integers(0, len(self.items) - 1)))
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    @precondition(lambda self: bool(self.items) and not self.stopped)
    @rule(data=st.data())
    def revoke(self, data: st.DataObject) -> None:
        item = self.items[data.draw(st.integers(0, len(self.items) - 1))]
        if item.key not in self.finals() and item.key not in self.revoked:
            self.revoked.add(item.key)
            self.ex.revoke_task(ti=workloads.Revoked(item.key))  # type: ignore[arg-type]

    @precondition(lambda self: not self.stopped)
    @rule(graceful=st.booleans())
    def stop(self, graceful: bool) -> None:
        self.never_handed_over = set(self.ex.queued_tasks)
        # end() waits for running workloads: let them go first; terminate() stops them at once.
        if graceful:
            for i in range(len(self.items)):
                self.gate(i).unlink(missing_ok=True)
            self.ex.end()
        else:
            self.ex.terminate()
        self.stopped = True
        self.scheduler.events.update(self.ex.get_event_buffer())

    def finals(self) -> dict[Any, int]:
        counts: dict[Any, int] = {}
        for key, _, _, remove_running in self.ex.changes:
            if remove_running:  # a final state; running_state changes keep the key in `running`
                counts[key] = counts.get(key, 0) + 1
        return counts

    @invariant()
    def never_two_final_events_and_none_after_a_revoke(self) -> None:
        finals = self.finals()
        assert all(n == 1 for n in finals.values()), finals
        assert not set(finals) & self.revoked, finals

    def teardown(self) -> None:
        try:
            if not self.stopped:
                self.stop(graceful=False)
            expected = {item.key for item in self.items} - self.revoked - self.never_handed_over
            assert set(self.finals()) == expected
            assert self.ex.running == set()
            alive = [
                p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE
            ]
            assert alive == [], [p.cmdline() for p in alive]
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.usefixtures("launcher")
def test_every_accepted_workload_gets_exactly_one_final_event() -> None:
    run_state_machine_as_test(
        Interleavings,
        settings=settings(
            max_examples=25,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
