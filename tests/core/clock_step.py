"""A wall-clock step (NTP step, VM resume, ``date -s``) as psutil sees it, staged without changing the clock.

psutil's ``create_time`` is a process's start in ticks since boot plus the boot time, which it reads from
``btime`` in ``/proc/stat`` on every call (older versions once, into ``BOOT_TIME``). The kernel moves
``btime`` when the wall clock is stepped, so shifting what psutil reads is exactly what a step looks like
to code that recognises processes by ``create_time``. Linux only, like psutil's module it patches.
"""

from __future__ import annotations

import psutil
import pytest
from psutil import _pslinux


def step_wall_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Make every later ``create_time`` read ``seconds`` later, as after a step of the wall clock."""
    before = psutil.Process().create_time()
    stepped = float(_pslinux.boot_time()) + seconds
    monkeypatch.setattr(_pslinux, "boot_time", lambda: stepped)
    if getattr(_pslinux, "BOOT_TIME", None) is not None:  # psutil before 6 caches it
        monkeypatch.setattr(_pslinux, "BOOT_TIME", stepped)
    # Otherwise a test would pass for not staging anything.
    assert psutil.Process().create_time() == pytest.approx(before + seconds, abs=0.01)
