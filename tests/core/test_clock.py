"""The fake clock the timing tests run on: time moves only when the test says so."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from async_local_executor.core.clock import SYSTEM
from tests.core.helpers import GUARD, FakeClock


@pytest.mark.asyncio
async def test_a_sleeper_wakes_only_when_time_passes_its_deadline() -> None:
    clock = FakeClock()
    woke = anyio.Event()

    async def sleeper() -> None:
        await clock.sleep(5.0)
        woke.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper)
        await clock.sleepers(1)
        clock.advance(4.9)
        await anyio.wait_all_tasks_blocked()
        assert not woke.is_set()
        clock.advance(0.1)
        with anyio.fail_after(GUARD):
            await woke.wait()
    assert clock.sleeping == 0


@pytest.mark.asyncio
async def test_a_timeout_fires_only_when_time_passes_its_deadline() -> None:
    clock = FakeClock()
    with clock.move_on_after(5.0) as outer:
        with clock.move_on_after(3.0, shield=True) as shielded:
            advanced = False

            async def advance_when_parked() -> None:
                nonlocal advanced
                await clock.sleepers(2)
                clock.advance(2.9)
                await anyio.wait_all_tasks_blocked()
                assert not shielded.cancel_called
                clock.advance(0.1)
                advanced = True

            async with anyio.create_task_group() as tg:
                tg.start_soon(advance_when_parked)
                await anyio.sleep_forever()
        assert advanced
        assert shielded.cancelled_caught
        assert not outer.cancel_called
    assert clock.sleeping == 0


def test_the_system_clock_times_out_on_real_time() -> None:
    async def main() -> bool:
        with SYSTEM.move_on_after(0.01) as scope:
            await anyio.sleep_forever()
        return scope.cancelled_caught

    assert anyio.run(main)


def test_a_sleeper_on_another_threads_loop_is_woken_from_this_one() -> None:
    clock = FakeClock()
    start = clock.monotonic()
    done = threading.Event()

    def loop_thread() -> None:
        anyio.run(clock.sleep, 30.0)
        done.set()

    thread = threading.Thread(target=loop_thread)
    thread.start()
    clock.wait_for_sleepers(1)
    clock.advance(30.0)
    assert done.wait(GUARD)
    thread.join(GUARD)
    assert clock.monotonic() - start == 30.0
    assert clock.time() - clock.monotonic() == FakeClock().time() - FakeClock().monotonic()


def test_the_system_clock_reads_the_real_clocks() -> None:
    assert abs(SYSTEM.time() - time.time()) < 60
    assert SYSTEM.monotonic() <= time.monotonic()
