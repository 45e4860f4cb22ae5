"""A chatty workload's output is relayed within a budget; its failure tail stays whole."""

from __future__ import annotations

import logging
from collections.abc import Hashable

import anyio
import pytest

from async_local_executor.adapter.output_relay import (
    DROP_NOTICE_INTERVAL,
    RELAY_BURST,
    RELAY_LINE_CHARS,
    RELAY_RATE,
    TAIL_LINES,
    OutputRelay,
)
from async_local_executor.core.launchers.base import LaunchRequest
from async_local_executor.core.launchers.subprocess import SubprocessLauncher
from async_local_executor.core.supervisor import Supervisor
from tests.core.helpers import GUARD, FakeClock, Recorder, py

LOGGER = "async_local_executor.child"
CHATTY = "import sys\nfor i in range(100_000):\n    print(f'line {i}')\nsys.exit(1)\n"


def describe(key: Hashable) -> str:
    return f"task {key}"


def relayed(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.DEBUG]


def notices(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]


@pytest.mark.asyncio
async def test_a_child_printing_100k_lines_relays_one_burst_counts_the_rest_and_keeps_the_true_tail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    output = OutputRelay(describe, clock=FakeClock())  # time stands still: no refill
    recorder = Recorder()
    supervisor = Supervisor(SubprocessLauncher(output=output), recorder, limit=None)
    async with anyio.create_task_group() as tg:
        await tg.start(supervisor.serve)
        supervisor.submit(LaunchRequest("k", py(CHATTY)))
        await recorder.until(lambda: recorder.outcomes)
        with anyio.fail_after(GUARD):
            await supervisor.shutdown(wait=GUARD)
    assert recorder.outcome("k").returncode == 1
    tail = output.pop("k")
    lines = relayed(caplog)
    assert len(lines) == RELAY_BURST
    assert lines[0] == "[task k] line 0"
    assert lines[-1] == f"[task k] line {RELAY_BURST - 1}"
    dropped = 100_000 - RELAY_BURST
    assert notices(caplog) == [
        f"[task k] {dropped} output lines dropped (limit {RELAY_RATE:g} lines/s, bursts of {RELAY_BURST})"
    ]
    assert tail == [f"line {i}" for i in range(100_000 - TAIL_LINES, 100_000)]


def test_the_budget_refills_with_the_clock_and_drops_are_said_once_an_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    clock = FakeClock()
    output = OutputRelay(describe, clock=clock, rate=10.0, burst=5)
    for i in range(8):
        output("k", f"a{i}")
    assert len(relayed(caplog)) == 5
    assert notices(caplog) == []  # not yet: once an interval, not once a line
    clock.advance(1.0)  # ten lines' worth, capped at the burst
    for i in range(7):
        output("k", f"b{i}")
    assert [line for line in relayed(caplog) if "] b" in line] == [f"[task k] b{i}" for i in range(5)]
    assert notices(caplog) == []
    clock.advance(DROP_NOTICE_INTERVAL)
    output("k", "c")
    assert notices(caplog) == ["[task k] 5 output lines dropped (limit 10 lines/s, bursts of 5)"]
    assert relayed(caplog)[-1] == "[task k] c"
    assert output.pop("k")[-3:] == ["b5", "b6", "c"]
    assert len(notices(caplog)) == 1  # nothing dropped since the notice: nothing more to say


def test_nothing_is_counted_as_dropped_while_debug_is_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    output = OutputRelay(describe, clock=FakeClock(), burst=1)
    for i in range(50):
        output("k", f"line {i}")
    assert output.pop("k") == [f"line {i}" for i in range(50 - TAIL_LINES, 50)]
    assert [r for r in caplog.records if r.name == LOGGER] == []


def test_a_long_line_is_cut_where_it_is_relayed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    output = OutputRelay(describe, clock=FakeClock())
    output("k", "x" * (RELAY_LINE_CHARS + 500))
    [line] = relayed(caplog)
    assert line == f"[task k] {'x' * RELAY_LINE_CHARS} [500 more characters cut]"
