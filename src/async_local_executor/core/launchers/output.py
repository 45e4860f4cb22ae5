"""Turns a child's output bytes into lines for the sink; shared by every launch path."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Hashable

import anyio
import anyio.abc

from async_local_executor.core.clock import SYSTEM, Clock
from async_local_executor.core.launchers.base import OutputSink

log = logging.getLogger(__name__)

# A line longer than this is split: one runaway line must not hold unbounded memory.
MAX_LINE = 64 * 1024
# After the leader exits we kill the rest of its group, so EOF on the output pipe follows at once;
# this only guards against a descendant that left the group but kept the pipe open.
DRAIN_AFTER_EXIT = 5.0


class LineSplitter:
    """Cuts a child's output into lines for ``sink``; a sink that raises loses the line, nothing more.

    The sink runs while the child's output is read, inside the wait for its exit: an exception let out
    of it would end that wait, and with it the supervision of a workload whose only fault was a line.
    """

    def __init__(self, key: Hashable, sink: OutputSink, label: str = "") -> None:
        self._key = key
        self._label = label or str(key)  # what the log calls the workload
        self._sink = sink
        self._pending = b""
        self._sink_failed = False

    def feed(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            self._emit(line)
        while len(self._pending) > MAX_LINE:
            self._emit(self._pending[:MAX_LINE])
            self._pending = self._pending[MAX_LINE:]

    def close(self) -> None:
        if self._pending:
            self._emit(self._pending)
            self._pending = b""

    def _emit(self, line: bytes) -> None:
        try:
            self._sink(self._key, line.decode("utf-8", "replace").rstrip("\r"))
        except Exception:
            if not self._sink_failed:  # once per workload: the next lines would likely fail alike
                self._sink_failed = True
                log.exception(
                    "output of workload %s: the output sink failed; lines it fails on are lost", self._label
                )


def discard(key: Hashable, line: str) -> None:
    """The default sink: output is read (so the child never blocks) and dropped."""


async def drain_stream(stream: anyio.abc.ByteReceiveStream | None, splitter: LineSplitter) -> None:
    """Read ``stream`` to EOF into ``splitter``; a stream closed under us ends the read like EOF."""
    try:
        if stream is not None:
            async for chunk in stream:
                splitter.feed(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
    finally:
        splitter.close()


async def drain_after_exit(
    signal_group: Callable[[int], None], drained: anyio.Event, clock: Clock = SYSTEM
) -> None:
    """Once the leader has exited: kill what it left in its group, then wait (bounded) for EOF.

    Whatever the leader left in its group would outlive the workload and could hold the pipe open; a
    group id stays reserved while any member lives, so the kill cannot hit a stranger.

    :param signal_group: signals the workload's group (and the groups its descendants made)
    :param drained: set once the output reader reached EOF
    :param clock: what the bound of :data:`DRAIN_AFTER_EXIT` seconds is measured on (the launcher's)
    """
    signal_group(signal.SIGKILL)
    with clock.move_on_after(DRAIN_AFTER_EXIT):
        await drained.wait()
